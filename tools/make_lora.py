#!/usr/bin/env python3
"""make_lora.py - a tiny synthetic PEFT LoRA adapter for a registry checkpoint.

Writes what `peft` saves for a Qwen3 LoraConfig: adapter_config.json and
adapter_model.safetensors with PEFT's tensor names,

  base_model.model.model.layers.<i>.self_attn.<q|k|v|o>_proj.lora_A.weight  [r][n_in]
  base_model.model.model.layers.<i>.self_attn.<q|k|v|o>_proj.lora_B.weight  [n_out][r]
  base_model.model.model.layers.<i>.mlp.<gate|up|down>_proj.lora_{A,B}.weight
  base_model.model.model.embed_tokens.lora_embedding_A  [r][vocab]   (--embed)
  base_model.model.model.embed_tokens.lora_embedding_B  [d_model][r] (--embed)

so the adapter takes the same path a trained one takes (tools/convert_lora_to_gguf.py,
then --lora). Values are N(0, std) from numpy's PCG64 seeded by --seed; unlike a
freshly initialised PEFT adapter (B = 0) both factors are non-zero, so the delta
is visible. --std sets the factors' deviation: the delta's per-element
deviation is about alpha/r * std^2 * sqrt(r).

Usage:
  .venv/bin/python tools/make_lora.py --checkpoint synthetic-tiny --out build/lora/tiny \
      [--rank 8] [--alpha 16] [--seed 1] [--std 0.05] [--targets q,k,v,o,gate,up,down] [--embed]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints as reg  # noqa: E402

# PEFT module name -> (HF parent, GGUF short name); the order PEFT lists targets in does not matter.
MODULES = {
    "q_proj": ("self_attn", "attn_q"), "k_proj": ("self_attn", "attn_k"), "v_proj": ("self_attn", "attn_v"),
    "o_proj": ("self_attn", "attn_output"), "gate_proj": ("mlp", "ffn_gate"), "up_proj": ("mlp", "ffn_up"),
    "down_proj": ("mlp", "ffn_down"),
}
SHORT = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
         "down": "down_proj"}


def module_shape(c: reg.Checkpoint, module: str) -> tuple[int, int]:
    """(n_out, n_in) of one projection of checkpoint c (HF Linear weight [out][in])."""
    d, a, kv, ff = c.d_model, c.attn_width, c.n_kv_head * c.head_dim, c.d_ff
    return {"q_proj": (a, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, a),
            "gate_proj": (ff, d), "up_proj": (ff, d), "down_proj": (d, ff)}[module]


def make_tensors(c: reg.Checkpoint, modules: list[str], rank: int, seed: int, std: float,
                 embed: bool, dtype: str = "float32") -> dict[str, np.ndarray]:
    """PEFT state dict (name -> array) for every layer and module; deterministic in seed."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out: dict[str, np.ndarray] = {}
    for i in range(c.n_layer):
        for mod in modules:
            parent, _ = MODULES[mod]
            n_out, n_in = module_shape(c, mod)
            p = f"base_model.model.model.layers.{i}.{parent}.{mod}."
            out[p + "lora_A.weight"] = (rng.standard_normal((rank, n_in)) * std).astype(np.float32)
            out[p + "lora_B.weight"] = (rng.standard_normal((n_out, rank)) * std).astype(np.float32)
    if embed:
        p = "base_model.model.model.embed_tokens."
        out[p + "lora_embedding_A"] = (rng.standard_normal((rank, c.vocab_size)) * std).astype(np.float32)
        out[p + "lora_embedding_B"] = (rng.standard_normal((c.d_model, rank)) * std).astype(np.float32)
    if dtype == "bfloat16":  # round to BF16 (RNE) but keep float32 storage for the writer below
        for k, v in out.items():
            u = v.view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            out[k] = u.astype(np.uint32).view(np.float32)
    return out


def adapter_config(c: reg.Checkpoint, modules: list[str], rank: int, alpha: float, embed: bool) -> dict:
    """adapter_config.json as peft.LoraConfig.save_pretrained writes it (the fields converters read)."""
    return {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": c.repository,
        "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
        "layers_pattern": None, "layers_to_transform": None, "lora_alpha": alpha, "lora_dropout": 0.0,
        "modules_to_save": None, "peft_type": "LORA", "r": rank, "rank_pattern": {}, "revision": None,
        "target_modules": sorted(modules + (["embed_tokens"] if embed else [])), "task_type": "CAUSAL_LM",
        "use_dora": False, "use_rslora": False,
    }


def write_adapter(out: Path, cfg: dict, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """adapter_config.json + adapter_model.safetensors (float32 or bfloat16) under out."""
    from safetensors.numpy import save_file
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if dtype == "float32":
        save_file(tensors, str(out / "adapter_model.safetensors"))
        return
    # safetensors.numpy has no bfloat16: write the header by hand (the format is 8-byte length + JSON + data).
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = (tensors[name].view(np.uint32) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out / "adapter_model.safetensors", "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="registry id whose shapes the adapter targets")
    ap.add_argument("--out", required=True, type=Path, help="output directory (PEFT layout)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--std", type=float, default=0.05)
    ap.add_argument("--targets", default="q,k,v,o,gate,up,down",
                    help="comma list of q,k,v,o,gate,up,down (or PEFT names q_proj, ...)")
    ap.add_argument("--embed", action="store_true", help="also target embed_tokens (lora_embedding_A/B)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    a = ap.parse_args(argv)
    try:
        c = reg.by_id(a.checkpoint)
    except KeyError as e:
        print(f"make_lora: {e}", file=sys.stderr)
        return 2
    if a.rank < 1:
        print(f"make_lora: --rank {a.rank}: expected a rank of 1 or more", file=sys.stderr)
        return 2
    modules = []
    for t in a.targets.split(","):
        m = SHORT.get(t.strip(), t.strip())
        if m not in MODULES:
            print(f"make_lora: --targets entry '{t}': expected one of {', '.join(SHORT)}", file=sys.stderr)
            return 2
        if m not in modules:
            modules.append(m)
    tensors = make_tensors(c, modules, a.rank, a.seed, a.std, a.embed, a.dtype)
    write_adapter(a.out, adapter_config(c, modules, a.rank, a.alpha, a.embed), tensors, a.dtype)
    print(f"make_lora: {len(tensors)} tensors, rank {a.rank}, alpha {a.alpha:g} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
