#!/usr/bin/env python3
"""bench_stream.py - driver of `make bench-stream`: a model larger than its memory limit.

It makes a memory cgroup (tools/memcg.py: v2 memory.max, else v1
memory.limit_in_bytes) with a limit below the model file (default: half of it)
and runs `kipp generate` inside it with default flags, so the engine sees the
limit and streams the layers from the file (backends/cpu/cpu_stream.c), with
the prefetch thread and with --no-prefetch, interleaved, --reps times each; the
file's page cache is dropped before every run, so each starts cold as a model
larger than RAM does. Beside them: `kipp plan` in the same cgroup (its streamed
decode prediction) and, unless --no-resident, one unconstrained resident run
(decode rate and the greedy tokens every streamed run must reproduce).

Writes results/<YYYYMMDD>-<host>-<cpu id>-stream-<sha>.json (kipp.bench.v1,
kind "stream"): per variant the median/min/max decode tok/s over the reps
(unit tok/s), prefill tok/s, TTFT, the limit, the plan's prediction and
pred_over_measured. The machine is shared and loaded: read the spread.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_models  # noqa: E402  (ensure_model, profile_rel, load_avg)
import machine  # noqa: E402
from memcg import Cgroup, drop_cache  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KIPP = ROOT / "build" / "kipp"
PROMPT = "Explain in one paragraph why the sky is blue"
TIMING = re.compile(r"prefill ([0-9.]+) tok/s, decode ([0-9.]+) tok/s, TTFT ([0-9.]+) ms")


def gen(run, model: Path, tokens: int, threads: int, *extra: str, env: dict | None = None) -> dict:
    args = [str(KIPP), "generate", "--model", str(model), "--prompt", PROMPT, "--max-tokens", str(tokens),
            "--show-ids", "--threads", str(threads), *extra]
    r = run(args, env) if env else run(args)
    m = TIMING.search(r.stderr)
    ids = [l for l in r.stderr.splitlines() if l.startswith("ids:")]
    if r.returncode != 0 or not m:
        raise SystemExit(f"bench_stream: {' '.join(args)} failed (rc {r.returncode}):\n{r.stderr[-2000:]}")
    return {"prefill": float(m.group(1)), "decode": float(m.group(2)), "ttft_ms": float(m.group(3)),
            "ids": ids[-1] if ids else "", "streamed": "streamed from the file" in r.stderr}


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "reps": len(xs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="synthetic-4b", help="registry id (models/<id>.gguf, made when missing)")
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--limit-gb", type=float, default=0.0, help="cgroup limit in GB; default half the file")
    ap.add_argument("--tokens", type=int, default=8, help="decode tokens per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-resident", action="store_true", help="skip the unconstrained resident run")
    ap.add_argument("--drop-ab", action="store_true",
                    help="add a third variant: prefetch with KIPP_STREAM_DROP=0 (nothing dropped behind use)")
    ap.add_argument("--out", default=str(ROOT / "results"))
    a = ap.parse_args(argv)

    gguf = bench_models.ensure_model(a.model, Path(a.models_dir), keep_hf=False)
    size = gguf.stat().st_size
    limit = int(a.limit_gb * 1e9) if a.limit_gb > 0 else size // 2
    cg = Cgroup(limit)
    if cg.dir is None:
        print(f"bench_stream: no memory cgroup: {cg.reason}", file=sys.stderr)
        return 1
    plain = lambda args: subprocess.run(args, capture_output=True, text=True, timeout=3600)  # noqa: E731
    inside = lambda args, env=None: cg.run(args, timeout=3600, env=env)  # noqa: E731
    try:
        pr = inside([str(KIPP), "plan", "--model", str(gguf), "--json"])
        plan = json.loads(pr.stdout) if pr.returncode == 0 else None
        pred = None
        if plan:
            f = next((x for x in plan["formats"] if x["format"] == plan["file_format"]), None)
            pred = f and f["decode_tok_s"]
        print(f"bench_stream: {gguf.name} {size / 1e9:.2f} GB under a {limit / 1e9:.2f} GB "
              f"{'v2' if cg.v2 else 'v1'} cgroup; plan: streamed={plan and plan['streamed']} "
              f"predicted decode {pred} tok/s; load {bench_models.load_avg()}", flush=True)
        variants = [("prefetch", (), None), ("no_prefetch", ("--no-prefetch",), None)]
        if a.drop_ab:
            variants.append(("prefetch_no_drop", (), {**os.environ, "KIPP_STREAM_DROP": "0"}))
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
        for rep in range(a.reps):  # interleaved A/B, cold page cache each
            for name, extra, env in variants:
                drop_cache(gguf)
                cg.reset_peak()
                r = gen(inside, gguf, a.tokens, a.threads, *extra, env=env)
                r["reached_limit"] = cg.reached_limit(limit)
                runs[name].append(r)
                print(f"  rep {rep} {name}: decode {r['decode']:.3f} tok/s, prefill {r['prefill']:.2f} tok/s, "
                      f"streamed={r['streamed']} reached_limit={r['reached_limit']} load {bench_models.load_avg()}",
                      flush=True)
        resident = None
        if not a.no_resident:
            resident = gen(plain, gguf, a.tokens, a.threads, "--stream", "off")
            print(f"  resident (no limit): decode {resident['decode']:.3f} tok/s", flush=True)
    finally:
        cg.remove()

    all_ids = {r["ids"] for v in runs.values() for r in v} | ({resident["ids"]} if resident else set())
    results = []
    for name, rs in runs.items():
        d = stats([r["decode"] for r in rs])
        results.append({
            "name": f"{a.model} tg{a.tokens} streamed under {limit / 1e9:.2f} GB, {name.replace('_', ' ')}",
            "unit": "tok/s", **d, "tok_s": d["median"], "model": a.model, "format": "bf16",
            "test": f"tg{a.tokens}_streamed", "prefetch": name != "no_prefetch", "drop_behind": name != "prefetch_no_drop",
            "prefill_tok_s": stats([r["prefill"] for r in rs]), "ttft_ms": stats([r["ttft_ms"] for r in rs]),
            "limit_bytes": limit, "file_bytes": size, "cgroup": "v2" if cg.v2 else "v1",
            "streamed": all(r["streamed"] for r in rs), "reached_limit": all(r["reached_limit"] for r in rs),
            "predicted_tok_s": pred, "pred_over_measured": pred / d["median"] if pred and d["median"] else None,
        })
    if resident:
        results.append({"name": f"{a.model} tg{a.tokens} resident, no limit", "unit": "tok/s",
                        "median": resident["decode"], "min": resident["decode"], "max": resident["decode"],
                        "reps": 1, "tok_s": resident["decode"], "model": a.model, "format": "bf16",
                        "test": f"tg{a.tokens}", "prefill_tok_s": resident["prefill"]})
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = {"schema": "kipp.bench.v1", "kind": "stream", "git_sha": sha, "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": socket.gethostname(), "cpu": machine.cpu_facts(), "profile": bench_models.profile_rel(),
           "config": {"model": a.model, "tokens": a.tokens, "reps": a.reps, "threads": a.threads,
                      "limit_bytes": limit, "load_avg_end": bench_models.load_avg(),
                      "greedy_tokens_equal": len(all_ids) == 1,
                      "note": "shared 2-core machine under load from other jobs: A/B interleaved, medians"},
           "results": results}
    out = Path(a.out) / f"{now.strftime('%Y%m%d')}-{machine.host_tag()}-stream-{sha}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"bench_stream: wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}; "
          f"greedy tokens equal across runs: {len(all_ids) == 1}")
    return 0 if len(all_ids) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
