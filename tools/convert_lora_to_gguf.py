#!/usr/bin/env python3
"""convert_lora_to_gguf.py - a PEFT LoRA directory -> llama.cpp-layout GGUF adapter.

Input: adapter_config.json + adapter_model.safetensors as `peft` saves them for
Qwen3. Output: the GGUF that llama.cpp's convert_lora_to_gguf.py writes, which
`--lora` in every Kipp front end reads (engine/lora.c):

  general.architecture = "qwen3", general.type = "adapter", adapter.type = "lora",
  adapter.lora.alpha (f32), plus kipp.checkpoint.id (the registry entry it was
  converted for; llama.cpp-made files lack it and are checked by shape only)
  blk.<i>.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>.weight.lora_a
      GGUF dims [n_in, r]   (row-major [r][n_in], PEFT lora_A as is)
  ....weight.lora_b    GGUF dims [r, n_out]  (row-major [n_out][r], PEFT lora_B)
  token_embd.weight.lora_a  GGUF dims [r, vocab]  (PEFT lora_embedding_A transposed,
                            as llama.cpp does for its row lookup)
  token_embd.weight.lora_b  GGUF dims [r, d_model] (PEFT lora_embedding_B)

Tensors are F32 (llama.cpp's default --outtype), or F16/BF16 with --outtype.
use_rslora scales by alpha/sqrt(r); it is folded into the written alpha
(alpha*sqrt(r)), so the consumer's alpha/r gives the same factor. Refused, each
with a message naming the field: DoRA, rank/alpha patterns, fan_in_fan_out,
trained biases, modules_to_save, any tensor that is not a lora_A/lora_B pair of
a known target, a shape that does not match the checkpoint.

Usage:
  .venv/bin/python tools/convert_lora_to_gguf.py --checkpoint synthetic-tiny --input build/lora/tiny \
      --out build/lora/tiny.gguf [--outtype f32|f16|bf16]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints as reg  # noqa: E402
from make_lora import MODULES, module_shape  # noqa: E402


class ConvertError(Exception):
    """A refusal; the message names the field or tensor and what was expected."""


ST_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2)}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """name -> float32 array of a safetensors file holding F32/F16/BF16 tensors."""
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ConvertError(f"{path}: {len(raw)} bytes, shorter than the 8-byte safetensors header length")
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8:
        raise ConvertError(f"{path}: header length {n} runs past the file's {len(raw)} bytes")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        if dt not in ST_DTYPES:
            raise ConvertError(f"tensor '{name}' has dtype {dt}, expected one of {', '.join(ST_DTYPES)}")
        npt, size = ST_DTYPES[dt]
        b0, b1 = info["data_offsets"]
        shape = tuple(info["shape"])
        if b1 - b0 != size * math.prod(shape) or base + b1 > len(raw):
            raise ConvertError(f"tensor '{name}': data_offsets [{b0}, {b1}) do not hold {dt} {list(shape)}")
        a = np.frombuffer(raw, dtype=npt, count=math.prod(shape), offset=base + b0).reshape(shape)
        if dt == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float32)
    return out


def check_config(cfg: dict) -> tuple[int, float]:
    """(r, alpha as written to the GGUF) from adapter_config.json; refuses what a merge cannot express."""
    if cfg.get("peft_type") != "LORA":
        raise ConvertError(f"adapter_config.json peft_type is {cfg.get('peft_type')!r}, expected 'LORA'")
    for key, ok in (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none")):
        if cfg.get(key, ok) != ok:
            raise ConvertError(f"adapter_config.json {key} is {cfg.get(key)!r}, expected {ok!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise ConvertError(f"adapter_config.json {key} is {cfg[key]!r}, expected empty (one r and alpha)")
    if cfg.get("modules_to_save"):
        raise ConvertError(f"adapter_config.json modules_to_save is {cfg['modules_to_save']!r}: full-weight "
                           "modules are not a LoRA delta; expected null")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(r, int) or r < 1:
        raise ConvertError(f"adapter_config.json r is {r!r}, expected an integer >= 1")
    if not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ConvertError(f"adapter_config.json lora_alpha is {alpha!r}, expected a finite number")
    if cfg.get("use_rslora"):
        alpha = alpha * math.sqrt(r)  # rsLoRA's alpha/sqrt(r) == (alpha*sqrt(r))/r
    return r, float(alpha)


PEFT_RE = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
EMBED_RE = re.compile(r"^base_model\.model\.model\.embed_tokens\.lora_embedding_([AB])$")


def plan(c: reg.Checkpoint, tensors: dict[str, np.ndarray], r: int) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, row-major array) pairs in layer order; every check names the PEFT tensor."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    shapes: dict[str, tuple[int, int]] = {}
    for name, a in tensors.items():
        m, e = PEFT_RE.match(name), EMBED_RE.match(name)
        if m:
            layer, parent, mod, ab = int(m.group(1)), m.group(2), m.group(3), m.group(4)
            if mod not in MODULES or MODULES[mod][0] != parent:
                raise ConvertError(f"tensor '{name}': unknown target module '{parent}.{mod}', expected one of "
                                   + ", ".join(f"{p}.{k}" for k, (p, _) in MODULES.items()))
            if layer >= c.n_layer:
                raise ConvertError(f"tensor '{name}': layer {layer}, but {c.id} has layers 0..{c.n_layer - 1}")
            base = f"blk.{layer}.{MODULES[mod][1]}.weight"
            n_out, n_in = module_shape(c, mod)
            want = (r, n_in) if ab == "A" else (n_out, r)
        elif e:
            ab, base = e.group(1), "token_embd.weight"
            want = (r, c.vocab_size) if ab == "A" else (c.d_model, r)
        else:
            raise ConvertError(f"tensor '{name}' is not a lora_A/lora_B weight of a Qwen3 projection or "
                               "embed_tokens lora_embedding_A/B; expected only LoRA factors")
        if a.shape != want:
            raise ConvertError(f"tensor '{name}' has shape {list(a.shape)}, expected {list(want)} "
                               f"(r={r}, checkpoint {c.id})")
        if not np.all(np.isfinite(a)):
            raise ConvertError(f"tensor '{name}' holds NaN or Inf; expected finite values")
        pairs.setdefault(base, {})[ab] = a
        shapes[base] = want
    out = []
    order = ["token_embd.weight"] + [f"blk.{i}.{g}.weight" for i in range(c.n_layer) for _, g in MODULES.values()]
    for base in order:
        if base not in pairs:
            continue
        p = pairs[base]
        for ab in "AB":
            if ab not in p:
                raise ConvertError(f"target '{base}' has lora_{'BA'[ab == 'B']} but no lora_{ab}; expected a pair")
        a, b = p["A"], p["B"]
        if base == "token_embd.weight":
            a = a.T  # llama.cpp looks rows of lora_a up by token id: row-major [vocab][r]
        out += [(base + ".lora_a", np.ascontiguousarray(a)), (base + ".lora_b", np.ascontiguousarray(b))]
    if not out:
        raise ConvertError("the adapter holds no LoRA factors; expected at least one lora_A/lora_B pair")
    return out


def write_gguf(out: Path, c: reg.Checkpoint, alpha: float, tensors: list[tuple[str, np.ndarray]],
               outtype: str) -> None:
    """The adapter GGUF through the gguf package's writer (the one llama.cpp's converter uses)."""
    import gguf
    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    w.add_string("kipp.checkpoint.id", c.id)
    for name, a in tensors:
        if outtype == "f32":
            w.add_tensor(name, a.astype(np.float32))
        elif outtype == "f16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
            u16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            w.add_tensor(name, u16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def convert(c: reg.Checkpoint, indir: Path, out: Path, outtype: str = "f32") -> int:
    """Convert indir to out; returns the number of tensors written. Raises ConvertError."""
    cfg_path, st_path = indir / "adapter_config.json", indir / "adapter_model.safetensors"
    for p in (cfg_path, st_path):
        if not p.is_file():
            raise ConvertError(f"{p} is missing; expected a PEFT adapter directory "
                               "(adapter_config.json + adapter_model.safetensors)")
    r, alpha = check_config(json.loads(cfg_path.read_text()))
    tensors = plan(c, read_safetensors(st_path), r)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(out, c, alpha, tensors, outtype)
    return len(tensors)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="registry id of the base model the adapter was trained on")
    ap.add_argument("--input", required=True, type=Path, help="PEFT adapter directory")
    ap.add_argument("--out", required=True, type=Path, help="output .gguf")
    ap.add_argument("--outtype", choices=("f32", "f16", "bf16"), default="f32")
    a = ap.parse_args(argv)
    try:
        n = convert(reg.by_id(a.checkpoint), a.input, a.out, a.outtype)
    except (ConvertError, KeyError, ValueError) as e:
        print(f"convert_lora_to_gguf: {e}", file=sys.stderr)
        return 1
    print(f"convert_lora_to_gguf: {n} tensors ({a.outtype}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
