#!/usr/bin/env python3
"""step_limit.py - the step limit of a batched kipp-bench row (batchB, pp8x128).

A step of a batched row reads bytes_per_step and does FLOPs in three parts,
all counted by kipp-bench (bench/bench_batch.c) from the model's dimensions
and the file's real tensor bytes, the head included (every decode row
samples; a prefill row samples the last position of each prompt):
  layers     flops_per_step_layers,    at the peak of the file's arithmetic
  head       flops_per_step_head,      at the peak of the head's arithmetic
  attention  flops_per_step_attention, at the BF16 dot peak (the KV cache is BF16)
A format's arithmetic: BF16 dot (vdpbf16ps) for bf16, int8 VNNI dot (vpdpbusd)
for q8_0 and affine4_gs32, each where the machine profile records it (the CPU
has it), else the FP32 FMA peak. Peaks come from the machine profile
(profiles/<host>-<level>-<cpu id>.json, `make profile`: peaks.*_all, the
all-core figures); the read bandwidth is the one kipp-bench measured beside the
row (its `roofline` when `roofline_ref` is read_gbps_adjacent: the median of the
read probes around its reps), else the profile's (the larger of its all-core and
one-core figures, as kipp-bench takes it).

    read_s    = bytes_per_step / (read GB/s x 1e9)
    compute_s = sum over the parts of FLOPs / (peak GFLOP/s x 1e9)
    limit     = tokens_per_step / max(read_s, compute_s)      [tok/s]
    share     = the row's median tok/s / limit

The step is assumed to overlap reading and computing perfectly, so the limit
is an upper bound no implementation can pass on this machine.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

# Profile peaks (GFLOP/s, or Gop/s at 2 ops per byte product) by arithmetic.
PEAK_KEYS = {"bf16_dot": "bf16_dot_gflops_all", "int8_vnni": "int8_dot_gops_all", "fp32_fma": "fp32_fma_gflops_all"}
# The arithmetic whose peak bounds each Kipp weight format.
FORMAT_ARITHMETIC = {"bf16": "bf16_dot", "q8_0": "int8_vnni", "affine4_gs32": "int8_vnni"}


def _pos(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def load_profile(path: str | Path | None, root: Path) -> dict | None:
    """The profile a kipp-bench document cites (relative to root), or None when absent or unreadable."""
    if not path:
        return None
    p = Path(path) if Path(path).is_absolute() else root / path
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def peak_for(fmt: str, profile: dict) -> tuple[str, float]:
    """(arithmetic, peak GFLOP/s) bounding format fmt on the profile's machine: its own
    arithmetic where the profile records a peak for it, else FP32 FMA. ValueError for a
    format without an arithmetic, or a profile without the FP32 FMA peak."""
    if fmt not in FORMAT_ARITHMETIC:
        raise ValueError(f"format {fmt!r} has no arithmetic here; expected one of {', '.join(FORMAT_ARITHMETIC)}")
    peaks = profile.get("peaks") or {}
    want = FORMAT_ARITHMETIC[fmt]
    isa = profile.get("isa") or {}
    has = _pos(peaks.get(PEAK_KEYS[want])) and (want != "int8_vnni" or isa.get("avx512_vnni", True) is not False)
    arith = want if has else "fp32_fma"
    if not _pos(peaks.get(PEAK_KEYS[arith])):
        raise ValueError(f"the profile has no {PEAK_KEYS[arith]} (peaks: {sorted(peaks)})")
    return arith, float(peaks[PEAK_KEYS[arith]])


def read_gbps(row: dict, profile: dict | None) -> tuple[float, str]:
    """(GB/s, where it came from) for a row: its own probes, else the profile's read figure."""
    if row.get("roofline_ref") == "read_gbps_adjacent" and _pos(row.get("roofline")):
        return float(row["roofline"]), "read_gbps_adjacent"
    bw = (profile or {}).get("bandwidth") or {}
    cands = [(float(bw[k]), k) for k in ("read_gbps_all", "read_gbps_1t") if _pos(bw.get(k))]
    if not cands:
        raise ValueError("no read bandwidth: the row has no read probe and the profile no bandwidth.read_gbps_all")
    best = max(cands)
    return best[0], "profile " + best[1]


def step_limit(row: dict, fmt: str, head_fmt: str, profile: dict) -> dict:
    """The step limit of one batched kipp-bench row (see the module text) for a file of
    format fmt whose head is head_fmt: limit_tok_s, share (the row's median over it),
    bound ("read" or "compute"), both times per step and what they came from. ValueError
    when the row lacks the step keys of bench/bench_batch.c."""
    need = ("tokens_per_step", "bytes_per_step", "flops_per_step_layers", "flops_per_step_head",
            "flops_per_step_attention")
    missing = [k for k in need if not isinstance(row.get(k), (int, float)) or isinstance(row.get(k), bool)]
    if missing:
        raise ValueError(f"row {row.get('name')!r} lacks {', '.join(missing)} (a kipp-bench without bench_batch.c?)")
    bw, bw_src = read_gbps(row, profile)
    parts = {"layers": (row["flops_per_step_layers"], fmt), "head": (row["flops_per_step_head"], head_fmt),
             "attention": (row["flops_per_step_attention"], "bf16")}
    compute_s, used = 0.0, {}
    for part, (flops, f) in parts.items():
        arith, peak = peak_for(f, profile)
        compute_s += flops / (peak * 1e9)
        used[part] = {"flops": flops, "arithmetic": arith, "peak_gflops": peak}
    read_s = row["bytes_per_step"] / (bw * 1e9)
    limit = row["tokens_per_step"] / max(read_s, compute_s)
    med = row.get("median")
    return {"limit_tok_s": limit, "share": med / limit if _pos(med) else None,
            "bound": "read" if read_s >= compute_s else "compute", "read_s_per_step": read_s,
            "compute_s_per_step": compute_s, "read_gbps": bw, "read_gbps_source": bw_src,
            "bytes_per_step": row["bytes_per_step"], "tokens_per_step": row["tokens_per_step"],
            "flops_per_step": sum(p["flops"] for p in used.values()), "parts": used}
