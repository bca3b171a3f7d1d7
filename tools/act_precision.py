#!/usr/bin/env python3
"""act_precision.py - what activation rounding alone does to the logits of one GGUF.

The question behind tests/test_quant_forward.c's outlier gate: how far does
rounding the projections' inputs move a model's logits, when the weights are
the same? This runs tools/np_forward.py's FP32 transcription of the Qwen3
forward over the file's dequantized weights, once as the oracle (FP32
activations, K and V rounded to BF16 as the KV cache stores them: the ref
backend's arithmetic) and once per variant, where each projection input
(qkv, o, gate_up, down) is rounded as a kernel would read it:

  q8          the cpu backend's Q8 activations (kernels/cpu/kernels.h
              k_act_q8_block; a numpy transcription of k_quant_q8_ref):
              int8 per 32-block with d = amax / 127, the block's largest |x|
              kept in FP32 when it is more than 4x the second largest
  q8-plain    the same without the FP32 outlier (the per-block int8 of before)
  bf16        every input rounded to BF16 (RNE), as KIPP_BF16_ACT=bf16 reads it
  q8-2digit   two int8 digits per value, x ~ d (q_hi + q_lo / 254): twice the
              integer dots of q8
  kv-fp32     FP32 activations and an FP32 KV cache: how far the oracle's own
              BF16 KV is from a full FP32 forward

Rows: each prompt's prefill row, then DECODE rows teacher-forced with the
oracle's greedy tokens (as the test feeds the ref backend's argmax to both).
Per variant it prints the worst prefill row, the median and worst decode row,
how many decode rows are above --bound, and the argmax flips. The prompts are
tests/test_quant_forward.c's outlier_prompts, tokenized by the `tokenizers`
package from data/qwen3/qwen3-tokenizer/tokenizer.json (no Kipp code).

Usage:
  .venv/bin/python tools/act_precision.py build/models/synthetic-tiny-outliers-q8_0.gguf [--rows]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import np_forward as F

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "data" / "qwen3" / "qwen3-tokenizer" / "tokenizer.json"
PROMPTS = (
    "The quick brown fox jumps over the lazy dog, and then it runs back home across the field.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n",
    "<|im_start|>user\nWrite a short poem about the autumn rain.<|im_end|>\n<|im_start|>assistant\n",
)
OUTLIER_RATIO = np.float32(4.0)  # kernels.h K_Q8_OUTLIER_RATIO


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to BF16, nearest-even (vcvtneps2bf16 on finite values)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).reshape(x.shape)


def q8(x: np.ndarray, outliers: bool = True, digits: int = 1) -> np.ndarray:
    """x as the Q8 blocks of k_quant_q8_ref represent it: d * q, plus the FP32 outlier.

    The outlier is the first largest |x| (compared on the bit patterns) when it
    is more than OUTLIER_RATIO times the second largest. digits=2 adds a second
    int8 digit, the residual in steps of d / 254."""
    xb = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 32)
    bits = xb.view(np.uint32) & np.uint32(0x7FFFFFFF)
    rows = np.arange(len(xb))
    i1 = bits.argmax(axis=1)
    rest = bits.copy()
    rest[rows, i1] = 0
    a1 = bits[rows, i1].view(np.float32)
    a2 = rest.max(axis=1).view(np.float32)
    has = (bits[rows, i1] < 0x7F800000) & (a1 > OUTLIER_RATIO * a2) if outliers else np.zeros(len(xb), bool)
    xq = xb.copy()
    xq[rows[has], i1[has]] = 0
    amax = (xq.view(np.uint32) & np.uint32(0x7FFFFFFF)).max(axis=1).view(np.float32)[:, None]
    ok = (amax > 1e-30) & np.isfinite(amax)
    inv = np.where(ok, np.float32(127) / np.where(ok, amax, 1), 0).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(xq * inv), -128, 127)
    y = (q * d).astype(np.float32)
    if digits == 2:
        q2 = np.clip(np.rint((xq - y) * inv * np.float32(254)), -127, 127)
        y = (y + q2 * (d / np.float32(254))).astype(np.float32)
    y[rows[has], i1[has]] = xb[rows[has], i1[has]]
    return y.reshape(x.shape)


VARIANTS = {
    "q8": (lambda _k, x: q8(x), bf16),
    "q8-plain": (lambda _k, x: q8(x, outliers=False), bf16),
    "bf16": (lambda _k, x: bf16(x), bf16),
    "q8-2digit": (lambda _k, x: q8(x, digits=2), bf16),
    "kv-fp32": (lambda _k, x: x, None),
}


def nmse(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-row sum (a - ref)^2 / sum ref^2, in float64."""
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    return ((a - ref) ** 2).sum(axis=-1) / (ref ** 2).sum(axis=-1)


def measure(path: Path, names: list[str], decode: int, show_rows: bool, bound: float) -> None:
    """Print the per-variant table for one GGUF (and every row with show_rows). Runs
    1 + decode + len(names) + 1 forwards per prompt over the whole sequence (no KV cache);
    the gguf package's errors on a damaged file propagate to main()."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TOKENIZER))
    meta, w = F.load_weights(path)
    per = {n: {"prefill": [], "decode": [], "flips": 0} for n in names}
    for p, text in enumerate(PROMPTS):
        ids = tok.encode(text, add_special_tokens=False).ids
        n = len(ids)
        for _ in range(decode):
            ids.append(int(np.argmax(F.forward(meta, w, ids, [len(ids) - 1], kv_store=bf16)[0])))
        rows = list(range(n - 1, n + decode))
        ref = F.forward(meta, w, ids, rows, kv_store=bf16)
        for name in names:
            act, kv = VARIANTS[name]
            lg = F.forward(meta, w, ids, rows, act=act, kv_store=kv)
            e = nmse(lg, ref)
            flips = lg.argmax(axis=1) != ref.argmax(axis=1)
            per[name]["prefill"].append(e[0])
            per[name]["decode"].extend(e[1:])
            per[name]["flips"] += int(flips[1:].sum())
            if flips[0]:
                per[name]["prefill_flip"] = True
            if show_rows:
                print(f"  prompt {p} {name:9s} " + " ".join(f"{v:.1e}{'*' if f else ''}" for v, f in zip(e, flips)))
    print(f"{path.name}: NMSE against FP32 activations with a BF16 KV cache; {len(PROMPTS)} prompts, "
          f"{decode} teacher-forced decode row{'s' if decode != 1 else ''} each"
          + ("; * marks an argmax flip" if show_rows else "") + "\n")
    print(f"| activations | prefill worst | decode median | decode worst | decode rows > {bound:g} | decode flips |")
    print("|---|---|---|---|---|---|")
    for name in names:
        r = per[name]
        dec = np.array(r["decode"])
        pre = f"{max(r['prefill']):.1e}" + (" (flip)" if r.get("prefill_flip") else "")
        print(f"| {name} | {pre} | {np.median(dec):.1e} | {dec.max():.1e} | {(dec > bound).sum()} of {len(dec)} | "
              f"{r['flips']} |")
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", type=Path, nargs="+", help="GGUF files (any weight format the gguf package reads)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--decode", type=int, default=6, help="teacher-forced decode rows per prompt (default 6)")
    ap.add_argument("--bound", type=float, default=5e-4, help="the per-row NMSE bound counted (default 5e-4)")
    ap.add_argument("--rows", action="store_true", help="print every row's NMSE")
    args = ap.parse_args(argv)
    np.seterr(over="ignore")  # SiLU's exp(-g) overflows to inf for g < -88, and g / (1 + inf) is the right 0
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        ap.error(f"--variants {args.variants!r}: {', '.join(map(repr, bad)) or 'nothing'} is not a variant; "
                 f"expected a comma list of {', '.join(VARIANTS)}")
    if len(set(names)) != len(names):
        ap.error(f"--variants {args.variants!r}: a variant named twice; expected each at most once")
    if args.decode < 1:
        ap.error(f"--decode {args.decode}: expected at least 1")
    if not (np.isfinite(args.bound) and args.bound > 0):
        ap.error(f"--bound {args.bound}: expected a finite number above 0")
    from gguf import GGUFReader
    for path in args.gguf:  # every file checked before the first (long) measurement
        if not path.is_file():
            ap.error(f"{path}: {'not a regular file' if path.exists() else 'no such file'} (run `make models-test`)")
        try:
            fields = GGUFReader(str(path)).fields
        except (ValueError, IndexError, OSError, KeyError) as e:
            ap.error(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})")
        if "kipp.quant.head" in fields:
            ap.error(f"{path}: has kipp.quant.head; expected a file with a BF16 head (the cpu backend quantizes a "
                     f"quantized head's input too, which this tool does not model)")
    for path in args.gguf:
        try:
            measure(path, names, args.decode, args.rows, args.bound)
        except (ValueError, IndexError, KeyError) as e:
            print(f"act_precision.py: {path}: cannot run the forward on this file ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
