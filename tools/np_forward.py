#!/usr/bin/env python3
"""np_forward.py - an FP32 numpy Qwen3 forward over a GGUF's dequantized weights.

The independent oracle of the quantized gates: torch is not installed here,
so this is a transcription of Hugging Face's Qwen3 forward
(transformers/models/qwen3/modeling_qwen3.py: Qwen3RMSNorm, rotate-half RoPE
with inv_freq and angles in float32, eager causal GQA attention with an FP32
softmax, SwiGLU MLP, tied or untied lm_head), every operation in float32. It
shares no code with the C engine: the weights come from the `gguf` PyPI
reader and are dequantized by its own `gguf.quants.dequantize` (GGML's Q8_0 /
Q4_1 / BF16 definitions), the token ids from the transformers vectors
(tests/vectors/MANIFEST.json), so the only input in common with Kipp is the
file.

For each quantized file and each prompt it records the final prompt
position's logits and, after appending the oracle's own greedy tokens, the
next DECODE_ROWS positions' logits (a full causal recompute: no KV cache on
the oracle side). Output: tests/vectors/quant/<gguf stem>.bin (float32 rows)
and tests/vectors/quant/MANIFEST.json. The C gate is tests/test_quant_forward.c.

Usage:
  .venv/bin/python tools/np_forward.py --models build/models --out tests/vectors/quant \
      --gguf synthetic-tiny-q8_0.gguf [--gguf ...]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DECODE_ROWS = 3
PROMPTS = ("short", "long")
# Logit NMSE bounds of tests/test_quant_forward.c; why each: MANIFEST.json "tolerance_notes".
TOLERANCES = {"ref_nmse": 5e-5, "cpu_nmse": 1e-3, "quant_loss_q8_0": 2e-3, "quant_loss_affine4_gs32": 0.2}
# Prompts whose greedy path leaves the BF16 reference's (argmax differs): only
# the FP32-oracle gate applies to them.
BF16_ARGMAX_EXEMPT = ["synthetic-tiny-affine4_gs32/long"]
TOLERANCE_NOTES = {
    "ref_nmse": "the ref backend's bound: it dequantizes inside an FP32 matvec; only BF16 KV rounding "
                "remains (measured <= 1.2e-5)",
    "cpu_nmse": "recalibrated from the 1e-4 first asked for: Q8 activations (int8 per 32-block) on all seven projections "
                "cost 2.9e-4..3.4e-4 on synthetic-tiny; a numpy simulation of the same activation rounding (no Kipp "
                "code) gives 4.3e-4 on the short prompt, so 1e-4 is out of reach for any int8-activation kernel on "
                "this checkpoint; bound 1e-3 (3x margin)",
    "quant_loss_q8_0": "logit NMSE vs the BF16 file's transformers vectors: measured 1.3e-4..2.9e-4 (ref, weights "
                       "only) and up to 6.0e-4 (cpu, weights + Q8 activations); bound 2e-3 (3.4x margin)",
    "quant_loss_affine4_gs32": "4-bit min/max blocks on synthetic-tiny's random weights (per-tensor weight NMSE "
                               "5.7e-3): logit NMSE vs BF16 2.6e-2..5.2e-2 on the short prompt; bound 0.2. On the "
                               "long prompt the BF16 reference's top-2 margin is 0.93 logits and the 4-bit model "
                               "picks another token (BF16_ARGMAX_EXEMPT): seed 000's 'argmax must match the BF16 "
                               "reference' does not hold there for affine4_gs32"}


YARN_KEYS = ("qwen3.rope.scaling.type", "qwen3.rope.scaling.factor", "qwen3.rope.scaling.original_context_length",
             "qwen3.rope.scaling.yarn_beta_fast", "qwen3.rope.scaling.yarn_beta_slow")


def load_weights(path: Path) -> tuple[dict, dict]:
    """(metadata, name -> float32 array) through the gguf package."""
    from gguf import GGUFReader, quants
    r = GGUFReader(str(path))
    meta = {}
    for k in ("kipp.d_model", "kipp.n_layer", "kipp.n_q_head", "kipp.n_kv_head", "kipp.head_dim",
              "kipp.d_ff", "kipp.rope_theta", "kipp.rms_norm_eps", "kipp.tied_embeddings",
              "kipp.quant.scheme", "kipp.checkpoint.id"):
        meta[k] = r.fields[k].contents()
    for k in YARN_KEYS:  # docs/FORMAT.md "RoPE scaling": all five or none
        if k in r.fields:
            meta[k] = r.fields[k].contents()
    w = {t.name: np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
         for t in r.tensors}
    return meta, w


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3RMSNorm in float32: x * rsqrt(mean(x^2) + eps), times the weight."""
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (w * (x * (np.float32(1.0) / np.sqrt(var + np.float32(eps))))).astype(np.float32)


def rope_tables(n: int, theta: float, dim: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """HF default RoPE: inv_freq = 1 / theta^(arange(0, dim, 2)/dim) in float32, angle = pos * inv_freq."""
    inv = (np.float32(1.0) / (np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))
    ang = np.arange(n, dtype=np.float32)[:, None] * inv[None, :].astype(np.float32)
    emb = np.concatenate([ang, ang], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def yarn_parameters(theta: float, dim: int, factor: float, original_max_position_embeddings: int,
                    beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True) -> tuple[np.ndarray, float]:
    """(inv_freq, attention_factor) of Hugging Face transformers' _compute_yarn_parameters
    (src/transformers/modeling_rope_utils.py, the version with `truncate`), transcribed from its source:
    get_mscale(factor) = 0.1 ln(factor) + 1 as the attention factor (no attention_factor / mscale in the
    config); find_correction_dim / find_correction_range in Python floats, floor/ceil'd when truncate
    (the default; Qwen3 configs do not set it); linear_ramp_factor over dim // 2 in float32;
    pos_freqs = base ** (arange(0, dim, 2) / dim) in float32; inv_freq blends
    1 / (factor * pos_freqs) (interpolation) and 1 / pos_freqs (extrapolation) by 1 - ramp."""
    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    def find_correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: "Prevent singularity"
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    pos_freqs = np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv_extrapolation = np.float32(1.0) / pos_freqs
    inv_interpolation = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    extrapolation_factor = np.float32(1.0) - ramp.astype(np.float32)
    inv = (inv_interpolation * (np.float32(1.0) - extrapolation_factor)
           + inv_extrapolation * extrapolation_factor).astype(np.float32)
    return inv, get_mscale(factor)


def yarn_of(meta: dict) -> Optional[dict]:
    """The file's YaRN keys as yarn_parameters' keyword arguments, or None."""
    if "qwen3.rope.scaling.type" not in meta:
        return None
    assert meta["qwen3.rope.scaling.type"] == "yarn", meta["qwen3.rope.scaling.type"]
    return {"factor": float(meta["qwen3.rope.scaling.factor"]),
            "original_max_position_embeddings": int(meta["qwen3.rope.scaling.original_context_length"]),
            "beta_fast": float(meta["qwen3.rope.scaling.yarn_beta_fast"]),
            "beta_slow": float(meta["qwen3.rope.scaling.yarn_beta_slow"])}


def rope_tables_yarn(n: int, theta: float, dim: int, yarn: dict) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3RotaryEmbedding.forward with rope_type "yarn": angle = pos * inv_freq in float32, then
    cos and sin each multiplied by attention_scaling (the attention factor), in float32."""
    inv, att = yarn_parameters(theta, dim, **yarn)
    ang = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    return ((np.cos(emb) * np.float32(att)).astype(np.float32), (np.sin(emb) * np.float32(att)).astype(np.float32))


def rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _same(_kind: str, x: np.ndarray) -> np.ndarray:
    return x


def forward(meta: dict, w: dict, ids: list[int], rows: list[int], act=_same, kv_store=None) -> np.ndarray:
    """Logits [len(rows)][vocab] at the given positions of the causal forward over ids
    (hidden() below, then the tied or untied lm_head)."""
    xs = hidden(meta, w, ids, rows, act, kv_store)
    head = w["token_embd.weight"] if meta["kipp.tied_embeddings"] else w["output.weight"]
    return (xs @ head.T).astype(np.float32)


def hidden(meta: dict, w: dict, ids: list[int], rows: list[int], act=_same, kv_store=None) -> np.ndarray:
    """Final-RMSNormed hidden states [len(rows)][d_model] at the given positions of the causal
    forward over ids: transformers' last_hidden_state rows (Qwen3Model ends with its norm), the
    embedding before pooling, and the head's input.

    act(kind, x) returns a projection's input as a kernel would read it; kind is
    "qkv", "o", "gate_up" or "down" (the four inputs of seed 000's seven
    projections). kv_store(x) returns K or V (after RoPE) as a KV cache stores it.
    The defaults leave both in FP32: the oracle. tools/act_precision.py passes
    rounding functions to measure what activation rounding alone costs."""
    d, nl, hq, hk, hd = (meta[k] for k in ("kipp.d_model", "kipp.n_layer", "kipp.n_q_head",
                                           "kipp.n_kv_head", "kipp.head_dim"))
    eps = float(meta["kipp.rms_norm_eps"])
    n = len(ids)
    x = w["token_embd.weight"][np.asarray(ids)].astype(np.float32)
    yarn = yarn_of(meta)
    cos, sin = (rope_tables_yarn(n, float(meta["kipp.rope_theta"]), hd, yarn) if yarn
                else rope_tables(n, float(meta["kipp.rope_theta"]), hd))
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    group = hq // hk
    for i in range(nl):
        p = f"blk.{i}."
        h = act("qkv", rmsnorm(x, w[p + "attn_norm.weight"], eps))
        q = (h @ w[p + "attn_q.weight"].T).reshape(n, hq, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(n, hk, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, hk, hd)
        q = rmsnorm(q, w[p + "attn_q_norm.weight"], eps)
        k = rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
        k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
        if kv_store is not None:
            k, v = kv_store(k), kv_store(v)
        out = np.empty((n, hq, hd), dtype=np.float32)
        scale = np.float32(1.0 / np.sqrt(hd))
        for hh in range(hq):
            kv = hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask
            s = s - s.max(axis=-1, keepdims=True)
            e = np.exp(s, dtype=np.float32)
            out[:, hh, :] = (e / e.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
        x = x + act("o", out.reshape(n, hq * hd)) @ w[p + "attn_output.weight"].T
        h = act("gate_up", rmsnorm(x, w[p + "ffn_norm.weight"], eps))
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        a = (g / (np.float32(1.0) + np.exp(-g, dtype=np.float32))) * u
        x = x + act("down", a) @ w[p + "ffn_down.weight"].T
    return rmsnorm(x[np.asarray(rows)], w["output_norm.weight"], eps)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=REPO / "build" / "models")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "vectors" / "quant")
    ap.add_argument("--gguf", action="append", required=True, help="quantized GGUF file name under --models")
    args = ap.parse_args(argv)
    hf = json.loads((REPO / "tests" / "vectors" / "MANIFEST.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    man = {"schema": "kipp-quant-vectors-v1",
           "reference": "tools/np_forward.py: numpy FP32 transcription of HF Qwen3 (eager attention, no KV cache) "
                        "over the GGUF's weights dequantized by the gguf package (gguf.quants.dequantize)",
           "commands": [f".venv/bin/python tools/np_forward.py --models build/models --out tests/vectors/quant "
                        + " ".join(f"--gguf {g}" for g in args.gguf)],
           "tools": {"python": platform.python_version(), "numpy": np.__version__},
           "tolerances": TOLERANCES, "tolerance_notes": TOLERANCE_NOTES,
           "bf16_argmax_exempt": BF16_ARGMAX_EXEMPT, "decode_rows": DECODE_ROWS, "files": {}}
    for name in args.gguf:
        path = args.models / name
        meta, w = load_weights(path)
        cid = meta["kipp.checkpoint.id"]
        rows_out, entry = [], {"checkpoint": cid, "scheme": meta["kipp.quant.scheme"],
                               "gguf_sha256": sha256(path), "prompts": {}}
        off = 0
        for pname in PROMPTS:
            ids = list(hf["checkpoints"][cid]["prompts"][pname]["ids"])
            seq, logits, greedy = list(ids), [], []
            for step in range(DECODE_ROWS + 1):
                row = forward(meta, w, seq, [len(seq) - 1])[0]
                logits.append({"n_tokens": len(seq), "argmax": int(np.argmax(row)), "offset": off,
                               "count": int(row.size)})
                rows_out.append(row)
                off += row.size * 4
                nxt = int(np.argmax(row))
                greedy.append(nxt)
                seq.append(nxt)
            entry["prompts"][pname] = {"ids": ids, "greedy": greedy[:DECODE_ROWS], "logits": logits}
            print(f"np_forward: {name} {pname}: {len(ids)} ids, argmax {greedy}", file=sys.stderr)
        stem = Path(name).stem
        (args.out / f"{stem}.bin").write_bytes(b"".join(r.astype("<f4").tobytes() for r in rows_out))
        entry["bin"] = f"{stem}.bin"
        man["files"][stem] = entry
    (args.out / "MANIFEST.json").write_text(json.dumps(man, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
