#!/usr/bin/env python3
"""serve_step_ab.py - A/B of kipp-serve's step time target (--step-ms) on
serve_bench.py's workload (~110-token prompts, 64 streamed tokens each, every
stream starting at once), interleaved: each round runs every setting once, in
an order that rotates per round, so a neighbour's load hits all alike.

    .venv/bin/python tools/serve_step_ab.py --settings 0,auto,150 --streams 8 --reps 3
    .venv/bin/python tools/serve_step_ab.py --settings 0@512,auto@2048 --streams 16

A setting is a --step-ms value, optionally @ a --step-tokens budget.

Per setting: aggregate tok/s, TTFT p50/p99 and ITL p50/p99 (ms) per round and
their medians over the rounds, plus the load average before and after. JSON on
stdout's last line; a table above it. --stagger S starts stream k S*k seconds
after the first (arrivals while others decode: where a prefill stalls them).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import serve_bench  # noqa: E402
from serve_harness import Server  # noqa: E402

KEYS = ("tok_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99")


def staggered(port: int, conc: int, max_tokens: int, stagger: float) -> dict:
    """serve_bench.level with stream k started stagger*k seconds after the first."""
    if stagger <= 0:
        return serve_bench.level(port, conc, max_tokens)
    res: list = [None] * conc

    def go(k: int) -> None:
        time.sleep(stagger * k)
        serve_bench.one_stream(port, res, k, max_tokens)

    ts = [threading.Thread(target=go, args=(k,)) for k in range(conc)]
    [t.start() for t in ts]
    [t.join(timeout=900) for t in ts]
    bad = [k for k, r in enumerate(res) if not r or "error" in r]
    if bad:
        raise RuntimeError(f"streams {bad} failed: {[res[k] for k in bad][:2]}")
    return serve_bench.round_figures(res)


def phase_means(text: str) -> dict:
    """Mean ms per scheduler step of each kipp_step_seconds phase, the whole step, and the capped steps
    (warm-up included)."""
    import re
    out = {}
    for ph in ("plan", "engine", "sample", "lock", "publish"):
        s = re.search(rf'^kipp_step_seconds_sum{{phase="{ph}"}} (\S+)$', text, re.M)
        n = re.search(rf'^kipp_step_seconds_count{{phase="{ph}"}} (\S+)$', text, re.M)
        out[ph] = 1e3 * float(s.group(1)) / max(1.0, float(n.group(1)))
    out["steps"] = float(re.search(r"^kipp_scheduler_steps_total (\S+)$", text, re.M).group(1))
    out["capped"] = float(re.search(r"^kipp_step_prefill_capped_total (\S+)$", text, re.M).group(1))
    burst = re.search(r"^kipp_step_prefill_burst_total (\S+)$", text, re.M)  # absent before the burst rule
    if burst:
        out["burst"] = float(burst.group(1))
        for kind in ("decode", "prefill", "mixed"):
            out[kind] = float(re.search(rf'^kipp_step_kind_total{{kind="{kind}"}} (\S+)$', text, re.M).group(1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "synthetic-0.6b.gguf")
    ap.add_argument("--settings", default="0,auto", help="comma list of --step-ms values, each optionally "
                    "@ a --step-tokens budget (auto@2048)")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=640)
    ap.add_argument("--stagger", type=float, default=0, help="seconds between stream starts (0: all at once)")
    args = ap.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    got: dict[str, list[dict]] = {s: [] for s in settings}
    load = [os.getloadavg()[0]]
    for r in range(args.reps):
        order = settings[r % len(settings):] + settings[:r % len(settings)]
        for st in order:
            ms, _, tokens = st.partition("@")
            with Server(args.model, "--ctx", str(args.ctx), "--max-batch", str(max(16, args.streams)), "--threads",
                        str(args.threads), "--no-spec", "--step-ms", ms, *(("--step-tokens", tokens) if tokens else ())) as srv:
                serve_bench.level(srv.port, 1, 4)  # warm-up: page in the weights
                f = staggered(srv.port, args.streams, args.max_tokens, args.stagger)
                f["load1"] = os.getloadavg()[0]
                f["step_ms_mean"] = phase_means(srv.metrics())
            got[st].append(f)
            print(f"round {r + 1} --step-ms {st}: " + ", ".join(f"{k} {f[k]:.1f}" for k in KEYS) +
                  f" (load {f['load1']:.2f}); per step ms: " +
                  ", ".join(f"{k} {v:.2f}" for k, v in f["step_ms_mean"].items()), flush=True)
    load.append(os.getloadavg()[0])
    out = {"streams": args.streams, "max_tokens": args.max_tokens, "stagger_s": args.stagger, "reps": args.reps, "load1_start_end": load,
           "settings": {st: {"median": {k: statistics.median(x[k] for x in got[st]) for k in KEYS}, "rounds": got[st]}
                        for st in settings}}
    print(f"{'--step-ms':>10} " + " ".join(f"{k:>12}" for k in KEYS))
    for st in settings:
        print(f"{st:>10} " + " ".join(f"{out['settings'][st]['median'][k]:12.1f}" for k in KEYS))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
