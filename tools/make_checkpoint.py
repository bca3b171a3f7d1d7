#!/usr/bin/env python3
"""make_checkpoint.py - write a synthetic Qwen3 checkpoint in the exact Hugging Face layout.

For a synthetic registry entry (tools/checkpoints.py) it writes into --out:
  config.json, generation_config.json      as transformers 4.51 writes them
  model.safetensors  or  model-0000i-of-0000N.safetensors + model.safetensors.index.json
  tokenizer.json, tokenizer_config.json    copied from data/qwen3/qwen3-tokenizer/
  modules.json, 1_Pooling/config.json,     embedding entries only: the sentence-transformers
  config_sentence_transformers.json        files of Qwen3-Embedding (last-token pooling)

Retrieval entries take their real counterparts' Hub layout (tools/checkpoints.py hub_*):
an embedding file is a Qwen3Model (tensor names without "model.", no lm_head), and both
roles hold 151669 embedding rows, not 151936; the converter pads them.

Weights are BF16 and byte-deterministic across runs and machines: element e of
tensor t is a function of (seed, t, e) only, through the splitmix64 finaliser
in numpy uint64 arithmetic (a counter-based generator: no state, no libm). The
64-bit hash is split into four 16-bit uniforms whose sum (Irwin-Hall, n=4) gives
a bell-shaped value; norm weights are uniform in [0.8, 1.2]. Floats are formed
with single IEEE float32 operations and rounded to BF16 with integer
round-to-nearest-even, so no transcendental function is involved.

Scales (why): projections use std 1/sqrt(fan_in) so activations keep unit RMS
through the layers; the output head (the embedding when tied) uses std
4/sqrt(d_model), so that after the final RMSNorm the logits have a std of about
4, like a trained model's. Each head row is further scaled by 1 + 3*u^8 (u a
per-row uniform, renormalised to keep the std): a heavy tail of "frequent
tokens" with larger norms, as trained heads have. With iid rows the top-1 margin
would be the gap between the two largest of 151,936 Gaussians (median ~0.14
std, 14% of positions under 0.1); the tail raises the median margin to ~0.5 std
while the argmax still varies with the input.

Outlier entries (registry weights="outliers", e.g. synthetic-tiny-outliers): every
projection is "heavy" instead of "normal": the same bell value times an element tail
factor (1 + 2v^16)/rms (v a second per-element uniform; up to 3x, rms-renormalised)
and a row factor 1 + 60w^256 (w a per-row uniform: ~1.6% of rows louder than 2x, up
to 61x, not renormalised). Loud output rows put a few outlier channels into the
activations the next projection reads (massive activations, as trained checkpoints
have), heavy tails widen every row. Gaussian entries never take this path, so their
bytes are unchanged.

Real checkpoints are not generated: tools/download_model.sh fetches them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints as reg  # noqa: E402
import safe_io  # noqa: E402
import st_config  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
QWEN3_TOKENIZER = REPO_ROOT / "data" / "qwen3" / "qwen3-tokenizer"  # vendored: data/qwen3/README.md
DEFAULT_SHARD_BYTES = 100_000_000   # 100 MB, decimal as transformers' max_shard_size
CHUNK = 1 << 22                     # elements generated per numpy batch (bounded memory)

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15         # splitmix64 increment (golden ratio)
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_IH_STD = math.sqrt((2 ** 32 - 1) / 3)  # std of the centred sum of four uniform 16-bit lanes
_ROW_FLAG = 1 << 39                   # counter bit that separates per-row draws from elements
_HEAD_RMS = math.sqrt(1 + 6 / 9 + 9 / 17)  # sqrt(E[(1 + 3u^8)^2]) for u ~ U[0,1)
_ELEM_FLAG = 1 << 38                  # counter bit of the per-element tail draws ("heavy")
_TAIL_A, _LOUD_A, _LOUD_K = 2.0, 60.0, 8  # "heavy": element tail 1 + _TAIL_A v^16, loud rows 1 + _LOUD_A w^(2^_LOUD_K)


class UserError(Exception):
    """A bad argument or environment: printed as one line, exit status 1."""


@dataclass(frozen=True)
class TensorSpec:
    """One weight: HF name, row-major shape, global index t, and its distribution."""
    name: str
    shape: tuple[int, ...]
    index: int          # position in state-dict order; part of the generator counter
    kind: str           # "normal" (Irwin-Hall, mean 0), "head" (normal, per-row tail scale),
                        # "heavy" (normal, element tail and loud rows) or "norm" (uniform [0.8, 1.2])
    std: float          # target std for "normal"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return 2 * self.numel


def mix64_int(z: int) -> int:
    """splitmix64 finaliser on a Python int (the scalar oracle for mix64_np)."""
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    return z ^ (z >> 31)


def mix64_np(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array, in place (wrapping uint64 arithmetic)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    return z


def hash_block(seed: int, t: int, start: int, count: int) -> np.ndarray:
    """64-bit hashes of elements start..start+count-1 of tensor t: [count] uint64.

    Counter = (t << 40) | element, stepped by the splitmix64 gamma from a
    seed-dependent origin, then finalised.
    """
    base = mix64_int(seed & _M64)
    z = np.arange(start, start + count, dtype=np.uint64)
    z |= np.uint64(t << 40)
    z *= np.uint64(_GAMMA)
    z += np.uint64(base)
    return mix64_np(z)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bits by integer round-to-nearest-even ([n] uint16; inputs finite)."""
    bits = x.astype(np.float32).view(np.uint32)
    rounding = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def generate(spec: TensorSpec, seed: int, start: int, count: int) -> np.ndarray:
    """Elements start..start+count-1 (row-major) of one tensor as BF16 bits: [count] uint16."""
    z = hash_block(seed, spec.index, start, count)
    if spec.kind == "norm":
        u24 = (z >> np.uint64(40)).astype(np.float32) - np.float32(1 << 23)
        vals = np.float32(1.0) + u24 * np.float32(0.4 / (1 << 24))
    else:
        m = np.uint64(0xFFFF)
        lanes = (z & m) + ((z >> np.uint64(16)) & m) + ((z >> np.uint64(32)) & m) + (z >> np.uint64(48))
        centred = lanes.astype(np.int64) - 2 * 0xFFFF   # symmetric, |x| <= 131070: exact in f32
        vals = centred.astype(np.float32) * np.float32(spec.std / _IH_STD)
        if spec.kind == "head":
            vals *= _row_scales(spec, seed, start, count)
        elif spec.kind == "heavy":
            vals *= _heavy_scales(spec, seed, start, count)
    return f32_to_bf16(vals)


def _row_scales(spec: TensorSpec, seed: int, start: int, count: int) -> np.ndarray:
    """Per-element row factor (1 + 3u^8)/rms for elements start..start+count-1: [count] float32."""
    cols = spec.shape[1]
    row0, row1 = start // cols, (start + count - 1) // cols
    h = hash_block(seed, spec.index, _ROW_FLAG + row0, row1 - row0 + 1)
    u = (h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    u8 = u * u
    u8 *= u8
    u8 *= u8
    r = (np.float32(1.0) + np.float32(3.0) * u8) * np.float32(1.0 / _HEAD_RMS)
    rows = np.arange(start, start + count, dtype=np.int64) // cols - row0
    return r[rows]


def _pow2k(u: np.ndarray, k: int) -> np.ndarray:
    """u^(2^k) by k squarings in float32 (no libm)."""
    for _ in range(k):
        u = u * u
    return u


def _heavy_scales(spec: TensorSpec, seed: int, start: int, count: int) -> np.ndarray:
    """Per-element factor (1 + a v^16)/rms * (1 + b w^(2^k)) of a "heavy" tensor: [count] float32."""
    h = hash_block(seed, spec.index, _ELEM_FLAG + start, count)
    v = (h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    tail_rms = math.sqrt(1 + 2 * _TAIL_A / 17 + _TAIL_A * _TAIL_A / 33)  # sqrt(E[(1 + a v^16)^2])
    f = (np.float32(1.0) + np.float32(_TAIL_A) * _pow2k(v, 4)) * np.float32(1.0 / tail_rms)
    cols = spec.shape[1]
    row0, row1 = start // cols, (start + count - 1) // cols
    hr = hash_block(seed, spec.index, _ROW_FLAG + row0, row1 - row0 + 1)
    w = (hr >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    r = np.float32(1.0) + np.float32(_LOUD_A) * _pow2k(w, _LOUD_K)
    rows = np.arange(start, start + count, dtype=np.int64) // cols - row0
    return f * r[rows]


def tensor_specs(c: reg.Checkpoint) -> list[TensorSpec]:
    """All weights in transformers' state-dict order (which also decides sharding)."""
    d, a, kv, ff = c.d_model, c.attn_width, c.n_kv_head * c.head_dim, c.d_ff
    # Scales use sqrt and division only: IEEE correctly rounded, unlike pow() in some libms.
    head_std = 4.0 / math.sqrt(d)
    sd, sa, sf = 1.0 / math.sqrt(d), 1.0 / math.sqrt(a), 1.0 / math.sqrt(ff)
    out: list[TensorSpec] = []

    proj = "heavy" if c.weights == "outliers" else "normal"

    def add(name: str, shape: tuple[int, ...], kind: str = proj, std: float = 0.0) -> None:
        out.append(TensorSpec(name, shape, len(out), kind, std))

    # The Hub layout of the entry (tools/checkpoints.py): Qwen3-Embedding files are a Qwen3Model
    # (no "model." prefix, no lm_head) with 151669 rows; Qwen3-Reranker files a Qwen3ForCausalLM
    # with 151669 rows; the generation checkpoints a Qwen3ForCausalLM with 151936.
    m, rows = c.hub_prefix, c.hub_rows
    add(m + "embed_tokens.weight", (rows, d), "head" if c.hub_tie else "normal", head_std)
    for i in range(c.n_layer):
        p = f"{m}layers.{i}."
        add(p + "self_attn.q_proj.weight", (a, d), std=sd)
        add(p + "self_attn.k_proj.weight", (kv, d), std=sd)
        add(p + "self_attn.v_proj.weight", (kv, d), std=sd)
        add(p + "self_attn.o_proj.weight", (d, a), std=sa)
        add(p + "self_attn.q_norm.weight", (c.head_dim,), "norm")
        add(p + "self_attn.k_norm.weight", (c.head_dim,), "norm")
        add(p + "mlp.gate_proj.weight", (ff, d), std=sd)
        add(p + "mlp.up_proj.weight", (ff, d), std=sd)
        add(p + "mlp.down_proj.weight", (d, ff), std=sf)
        add(p + "input_layernorm.weight", (d,), "norm")
        add(p + "post_attention_layernorm.weight", (d,), "norm")
    add(m + "norm.weight", (d,), "norm")
    if c.hub_lm_head:
        add("lm_head.weight", (rows, d), "head", head_std)
    return out


def plan_shards(specs: list[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    """Split like transformers' save_pretrained: in order, never splitting a tensor;
    a new shard starts when the next tensor would push a non-empty shard past shard_bytes."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def shard_names(n: int) -> list[str]:
    """File names of n shards, as transformers names them."""
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def safetensors_header(specs: list[TensorSpec]) -> tuple[bytes, list[TensorSpec]]:
    """The 8-byte length + JSON header of one file, and its tensors in data order.

    Layout follows the safetensors format: tensors sorted by name (what the
    reference serializer does for one dtype), contiguous data offsets, header
    JSON padded with spaces to a multiple of 8 bytes.
    """
    ordered = sorted(specs, key=lambda s: s.name)
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for s in ordered:
        header[s.name] = {"dtype": "BF16", "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, ordered


def _write_tensor(f: BinaryIO, spec: TensorSpec, seed: int, bar, budget: Optional[list[int]]) -> bool:
    """Stream one tensor chunk by chunk; returns False once the test byte budget is spent."""
    for start in range(0, spec.numel, CHUNK):
        n = min(CHUNK, spec.numel - start)
        data = generate(spec, seed, start, n).astype("<u2").tobytes()
        if budget is not None:
            data = data[:budget[0]]
            budget[0] -= len(data)
        f.write(data)
        if bar is not None:
            bar.update(len(data))
        if budget is not None and budget[0] <= 0:
            return False
    return True


def _write_text(path: Path, text: str) -> None:
    """Write via a temporary file + rename, so an interrupted run leaves no half file."""
    safe_io.write_text(path, text)


def _copy_tokenizer(c: reg.Checkpoint, out: Path) -> None:
    """tokenizer.json and the chat-kind tokenizer_config.json from data/qwen3/qwen3-tokenizer/."""
    src_cfg = QWEN3_TOKENIZER / reg.tokenizer_config_source(c)
    for src, dst in ((QWEN3_TOKENIZER / "tokenizer.json", out / "tokenizer.json"),
                     (src_cfg, out / "tokenizer_config.json")):
        if not src.is_file():
            raise UserError(f"tokenizer file {src} is missing (expected the vendored Qwen3 tokenizer "
                            f"in {QWEN3_TOKENIZER})")
        safe_io.copy_file(src, dst)  # refuses --out pointing at the vendored tokenizer itself


def write_checkpoint(c: reg.Checkpoint, out: Path, shard_bytes: int = DEFAULT_SHARD_BYTES,
                     quiet: bool = True, stop_after_bytes: Optional[int] = None) -> list[str]:
    """Write the whole synthetic checkpoint into `out`; returns the file names written.

    stop_after_bytes (tests only) stops after that many bytes of tensor data of the
    first shard, leaving its .part file, so the big shapes can be smoke-tested.
    """
    if not c.synthetic:
        raise UserError(f"checkpoint '{c.id}' is a real checkpoint ({c.repository}); make_checkpoint "
                        "only writes synthetic entries (expected a synthetic-* id). Download real "
                        f"weights with: tools/download_model.sh --checkpoint {c.id}")
    if shard_bytes <= 0:
        raise UserError(f"--shard-bytes is {shard_bytes}; expected a positive byte count")
    if out.exists() and QWEN3_TOKENIZER.exists() and os.path.samefile(out, QWEN3_TOKENIZER):  # (st_dev, st_ino)
        raise UserError(f"--out {out} is the vendored tokenizer directory {QWEN3_TOKENIZER}, an input; "
                        "expected another directory")
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()  # a different sharding from an earlier run must not linger
    specs = tensor_specs(c)
    shards = plan_shards(specs, shard_bytes)
    names = shard_names(len(shards))
    total = sum(s.nbytes for s in specs)
    bar = None
    if not quiet:
        from tqdm import tqdm
        bar = tqdm(total=total, unit="B", unit_scale=True, desc=c.id)
    budget = [stop_after_bytes] if stop_after_bytes is not None else None
    try:
        for name, shard in zip(names, shards):
            header, ordered = safetensors_header(shard)
            part = out / (name + ".part")
            with open(part, "wb") as f:
                f.write(header)
                for spec in ordered:
                    if not _write_tensor(f, spec, c.seed, bar, budget):
                        return [name + ".part"]
            os.replace(part, out / name)
    finally:
        if bar is not None:
            bar.close()
    written = list(names)
    if len(shards) > 1:
        weight_map = {s.name: n for n, shard in zip(names, shards) for s in shard}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_text(out / "model.safetensors.index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append("model.safetensors.index.json")
    _write_text(out / "config.json", reg.hf_config_text(c))
    _write_text(out / "generation_config.json",
                json.dumps(reg.hf_generation_config(c), indent=2, sort_keys=True) + "\n")
    _copy_tokenizer(c, out)
    side = st_config.files(c)
    for name, text in side.items():
        (out / name).parent.mkdir(exist_ok=True)
        _write_text(out / name, text)
    return sorted(written + list(side) + ["config.json", "generation_config.json", "tokenizer.json",
                                          "tokenizer_config.json"])


def update_manifest(path: Path, c: reg.Checkpoint, out: Path, files: list[str]) -> None:
    """Record sha256 and size of every written file of `c` in the JSON manifest at `path`
    (tests/checkpoints.sha256.json), keeping the other entries."""
    import hashlib
    man = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if man.get("generator", reg.SYNTH_GENERATOR) != reg.SYNTH_GENERATOR:
        man = {}  # a new generator version invalidates every old hash
    man["generator"] = reg.SYNTH_GENERATOR
    man["shard_bytes"] = DEFAULT_SHARD_BYTES
    entry = {"revision": c.revision, "files": {}}
    for name in files:
        data = (out / name).read_bytes()
        entry["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    man.setdefault("checkpoints", {})[c.id] = entry
    safe_io.write_text(path, json.dumps(man, indent=1, sort_keys=True) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Write a deterministic synthetic Qwen3 checkpoint "
                                 "(Hugging Face layout, BF16 safetensors).")
    ap.add_argument("--checkpoint", required=True, help="synthetic registry id, e.g. synthetic-tiny")
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES,
                    help=f"shard threshold in bytes (default {DEFAULT_SHARD_BYTES})")
    ap.add_argument("--update-manifest", type=Path, metavar="FILE",
                    help="record the written files' sha256 in FILE (tests/checkpoints.sha256.json)")
    args = ap.parse_args(argv)
    if args.update_manifest and args.shard_bytes != DEFAULT_SHARD_BYTES:
        print("make_checkpoint: --update-manifest needs the default --shard-bytes "
              f"{DEFAULT_SHARD_BYTES} (found {args.shard_bytes})", file=sys.stderr)
        return 1
    try:
        c = reg.by_id(args.checkpoint)
        files = write_checkpoint(c, args.out, args.shard_bytes, args.quiet)
        if args.update_manifest:
            update_manifest(args.update_manifest, c, args.out, files)
    except KeyError as e:
        print(f"make_checkpoint: {e.args[0]}", file=sys.stderr)
        return 1
    except (UserError, safe_io.SameFileError, OSError) as e:
        print(f"make_checkpoint: {safe_io.term_escape(str(e))}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"make_checkpoint: wrote {len(files)} files of {c.id} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
