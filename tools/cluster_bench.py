#!/usr/bin/env python3
"""cluster_bench.py - `make bench-cluster`: N kipp-serve replicas on loopback
behind vllm-router (tests/cluster_harness.py says why that
router), a shared-prefix multi-tenant workload, round-robin against
cache-aware routing, and a fault run that kills one replica mid-load.
Writes results/<YYYYMMDD>-<host>-<cpu id>-cluster-<sha>.json (kipp.bench.v1,
kind "cluster", bench/README.md).

Workload: --tenants tenants, each with its own long system prefix
(--prefix-words words), and --users requests per tenant, each with its own
question after the prefix; the requests are shuffled with a fixed seed and
sent by --concurrency clients through the router as streamed
/v1/completions (temperature 0, EOS suppressed, --max-tokens each).

Every policy run starts fresh replicas (empty KV pools), each under taskset on
its own share of the CPUs (config.replica_cpus). Each replica's pool
is sized (--pool-share) to hold only part of all tenants' prefixes plus the
running requests, as on a real machine where the pool is the scarce thing:
that is where routing decides how much prefill is repeated. Per run the row
records aggregate tok/s (completion tokens over the wall time of the whole
load), TTFT p50/p99 as the clients saw it, the clients' hit rate (cached over
prompt tokens from usage) and each replica's own figures from /metrics
(requests, prompt and cached tokens, hit rate, pool hits/misses/evictions).
--kv-aware adds vllm-router's kv_aware policy, fed by the replicas' own
KV events (kipp-serve --kv-events ... --kv-events-format map). --reps rounds
alternate the order of the policies; the row keeps the median,
min and max of tok/s and each round's figures.

The fault run (cache_aware) kills one replica with SIGKILL once a third of the
requests have finished and records what every client saw, split into requests
that finished before the kill, were in flight at the kill, and started after
it: answered in full, refused with a status, or cut off (no [DONE]).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from cluster_harness import (Replicas, Router, core_sets, env_threads, free_port, http_json,  # noqa: E402
                             stream_completion, tenant_prompt)
import bench_models  # noqa: E402  (profile_rel, ensure_model)
import machine  # noqa: E402  (cpu_facts, host_tag)

NO_EOS = {"151643": -100, "151645": -100}
POLICIES = ("round_robin", "cache_aware")


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else None


def plan(args) -> list[tuple[int, int]]:
    reqs = [(t, u) for t in range(args.tenants) for u in range(args.users)]
    random.Random(args.seed).shuffle(reqs)
    return reqs


def body(args, t: int, u: int) -> dict:
    return {"prompt": tenant_prompt(t, u, args.prefix_words), "max_tokens": args.max_tokens, "temperature": 0,
            "logit_bias": NO_EOS}


def run_load(port: int, args, reqs, on_done=None) -> tuple[list[dict], float]:
    """reqs through the router by args.concurrency clients; each result gets its
    start and end times. on_done(n_finished) is called after each answer."""
    out: list = [None] * len(reqs)
    nxt, lock, finished = [0], threading.Lock(), [0]

    def client():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(reqs):
                return
            t0 = time.time()
            r = stream_completion(port, body(args, *reqs[i]))
            r.update(start=t0, end=time.time(), tenant=reqs[i][0])
            out[i] = r
            with lock:
                finished[0] += 1
                n = finished[0]
            if on_done:
                on_done(n)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client) for _ in range(args.concurrency)]
    [t.start() for t in ts]
    [t.join(timeout=3600) for t in ts]
    return out, time.perf_counter() - t0


def ok(r: dict) -> bool:
    return r is not None and r["status"] == 200 and r["done"] and r["finish"] is not None and not r["error"]


def server_args(args, pool_mib: int) -> tuple[str, ...]:
    return ("--ctx", str(args.ctx), "--kv-pool-mib", str(pool_mib), "--threads", str(args.threads), "--no-spec",
            "--max-batch", str(max(16, args.concurrency)))


def size_pool(gguf: Path, args) -> tuple[int, dict]:
    """MiB per replica: --pool-share of all tenants' prefix blocks plus room for
    the running requests, from a probe replica's block size and token counts."""
    with Replicas(gguf, 1, "--ctx", str(args.ctx), "--kv-pool-mib", "64", "--threads", "1") as probe:
        s = probe.servers[0]
        m = re.search(r'num_gpu_blocks="(\d+)"', s.metrics())
        block_mib = 64 / int(m.group(1))
        n0 = http_json(s.port, "POST", "/tokenize", {"prompt": tenant_prompt(0, 0, args.prefix_words)})[1]["count"]
        n1 = http_json(s.port, "POST", "/tokenize", {"prompt": tenant_prompt(0, 1, args.prefix_words)})[1]["count"]
    prefix_blocks = min(n0, n1) // 32  # full blocks two users of one tenant share (about)
    running = -(-(max(n0, n1) + args.max_tokens) // 32) * args.concurrency
    blocks = int(args.pool_share * prefix_blocks * args.tenants) + running
    facts = {"prompt_tokens": max(n0, n1), "shared_prefix_blocks": prefix_blocks, "pool_blocks_per_replica": blocks,
             "block_mib": round(block_mib, 4)}
    return max(1, int(blocks * block_mib + 0.999)), facts


def policy_round(gguf: Path, args, policy: str, pool_mib: int) -> dict:
    reps = Replicas(gguf, args.replicas, *server_args(args, pool_mib), pin=True)
    events = [free_port() for _ in reps.servers] if policy == "kv_aware" else []
    for s, port in zip(reps.servers, events):  # kv_aware: the router indexes each replica's KV events
        s.cmd += ["--kv-events", f"tcp://*:{port}", "--kv-events-format", "map"]
    with reps:
        extra = []
        for url, port in zip(reps.urls, events):
            extra += ["--kv-event-source", f"{url}=tcp://127.0.0.1:{port}"]
        if events:
            extra += ["--kv-event-block-size", "32", "--kv-event-model", gguf.stem]
        with Router(reps.urls, policy, *extra) as router:
            res, wall = run_load(router.port, args, plan(args))
            figs = reps.pool_figures()
    good = [r for r in res if ok(r)]
    toks = sum(r["usage"]["completion_tokens"] for r in good if r["usage"])
    prompt = sum(r["usage"]["prompt_tokens"] for r in good if r["usage"])
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in good if r["usage"])
    ttft = [r["ttft"] * 1e3 for r in good if r["ttft"] is not None]
    return {"tok_s": toks / wall, "wall_s": wall, "completion_tokens": toks, "requests": len(res), "ok": len(good),
            "errors": sorted({str(r and (r["error"] or r["status"]))[:120] for r in res if not ok(r)}),
            "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99), "prompt_tokens": prompt,
            "cached_tokens": cached, "hit_rate": cached / prompt if prompt else None, "replicas": figs}


def fault_round(gguf: Path, args, pool_mib: int) -> dict:
    reqs = plan(args)
    kill_at, killed = max(1, len(reqs) // 3), {}
    with Replicas(gguf, args.replicas, *server_args(args, pool_mib), pin=True) as reps, \
            Router(reps.urls, "cache_aware") as router:
        def on_done(n):
            if n == kill_at and not killed:
                killed["t"] = time.time()
                reps.kill(args.replicas - 1)
        res, wall = run_load(router.port, args, reqs, on_done)
        figs = reps.pool_figures()
    t_kill = killed.get("t", float("inf"))
    phases = {"finished_before_kill": [r for r in res if r["end"] <= t_kill],
              "in_flight_at_kill": [r for r in res if r["start"] <= t_kill < r["end"]],
              "started_after_kill": [r for r in res if r["start"] > t_kill]}

    def what(r) -> str:
        if r["status"] is None:
            return f"no connection: {r['error']}"[:200]
        if r["status"] != 200:
            return f"HTTP {r['status']}: {r['error']}"[:200]
        return f"stream cut off after {len(r['text'])} characters (finish {r['finish']}, [DONE] {r['done']})" + \
            (f": {r['error']}"[:120] if r["error"] else "")

    def seen(rs):
        return {"requests": len(rs), "answered": sum(ok(r) for r in rs),
                "refused": sum(1 for r in rs if r["status"] not in (None, 200)),
                "cut_off": sum(1 for r in rs if r["status"] == 200 and not ok(r)),
                "no_connection": sum(1 for r in rs if r["status"] is None),
                "errors": sorted({what(r) for r in rs if not ok(r)})}

    failed_after = [r["start"] - t_kill for r in phases["started_after_kill"] if not ok(r)]
    return {"killed_replica": args.replicas - 1, "killed_after_requests": kill_at, "wall_s": wall,
            "phases": {k: seen(v) for k, v in phases.items()},
            # how long after the kill the router still sent new requests to the dead replica
            "last_failed_start_after_kill_s": max(failed_after) if failed_after else None,
            "replicas": figs}


def git_sha() -> str:
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="synthetic-0.6b", help="synthetic registry id (models/<id>.gguf)")
    ap.add_argument("--model", type=Path, help="a GGUF path instead of --checkpoint")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="threads per replica (0 = the cores split between replicas)")
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--users", type=int, default=4, help="requests per tenant")
    ap.add_argument("--prefix-words", type=int, default=80, help="words of each tenant's shared system prefix")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--pool-share", type=float, default=0.5,
                    help="share of all tenants' prefix blocks one replica's pool can hold besides the running requests")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--no-fault", dest="fault", action="store_false")
    ap.add_argument("--kv-aware", action="store_true",
                    help="also run vllm-router's kv_aware policy on the replicas' --kv-events (format map)")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    for name in ("replicas", "tenants", "users", "concurrency", "reps", "prefix_words", "max_tokens"):
        if getattr(args, name) < 1 or (name == "replicas" and args.replicas < 2):
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected an integer >= "
                     f"{2 if name == 'replicas' else 1}")
    if not 0 < args.pool_share <= 4:
        ap.error(f"--pool-share {args.pool_share}: expected a share in (0, 4]")
    args.threads = args.threads or env_threads(args.replicas)
    if args.model:
        gguf, mid = args.model, args.model.stem
    else:
        gguf, mid = bench_models.ensure_model(args.checkpoint, ROOT / "models", False), args.checkpoint
    cpu = machine.cpu_facts()
    load_start = os.getloadavg()[0]
    pool_mib, pool_facts = size_pool(gguf, args)
    print(f"cluster_bench.py: {args.replicas} replicas x {args.threads} threads, pool {pool_mib} MiB each {pool_facts}",
          flush=True)
    policies = POLICIES + (("kv_aware",) if args.kv_aware else ())
    got: dict[str, list[dict]] = {p: [] for p in policies}
    for r in range(args.reps):
        for policy in (policies if r % 2 == 0 else policies[::-1]):
            one = policy_round(gguf, args, policy, pool_mib)
            print(f"cluster_bench.py: round {r + 1} {policy}: {one['tok_s']:.1f} tok/s, TTFT p50 {one['ttft_ms_p50']:.0f} ms "
                  f"p99 {one['ttft_ms_p99']:.0f} ms, hit rate {one['hit_rate']:.2f}, {one['ok']}/{one['requests']} ok",
                  flush=True)
            got[policy].append(one)
    results = []
    for policy in policies:
        rounds = got[policy]
        tps = [x["tok_s"] for x in rounds]
        results.append({"name": f"cluster_{policy}", "model": mid, "unit": "tok/s", "policy": policy,
                        "median": statistics.median(tps), "min": min(tps), "max": max(tps), "reps": len(rounds),
                        "ttft_ms_p50": statistics.median(x["ttft_ms_p50"] for x in rounds),
                        "ttft_ms_p99": statistics.median(x["ttft_ms_p99"] for x in rounds),
                        "hit_rate": statistics.median(x["hit_rate"] for x in rounds),
                        "replicas": rounds[-1]["replicas"], "rounds": rounds})
    rr = results[0]
    for row in results[1:]:
        row["vs_round_robin"] = {"tok_s": row["median"] / rr["median"],
                                 "ttft_ms_p50": row["ttft_ms_p50"] / rr["ttft_ms_p50"],
                                 "ttft_ms_p99": row["ttft_ms_p99"] / rr["ttft_ms_p99"]}
    if args.fault:
        f = fault_round(gguf, args, pool_mib)
        after = f["phases"]["started_after_kill"]
        share = after["answered"] / after["requests"] if after["requests"] else None
        results.append({"name": "cluster_fault_cache_aware", "model": mid, "unit": "share answered (started after kill)",
                        "median": share, "min": share, "max": share, "reps": 1, **f})
        print(f"cluster_bench.py: fault run: {json.dumps(f['phases'])}", flush=True)
    version = metadata.version("vllm-router")
    config = {"backend": "cpu", "replicas": args.replicas, "threads_per_replica": args.threads,
              "replica_cpus": [",".join(map(str, c)) or "all" for c in core_sets(args.replicas)], "cpu": cpu["model"],
              "isa_flags": cpu["flags"], "router": f"vllm-router {version}",
              "router_args": ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"],
              "kipp_serve_args": list(server_args(args, pool_mib)), "pool": pool_facts, "rounds": args.reps,
              "order": "alternating: the policies in order in odd-numbered rounds, reversed in even ones; fresh replicas "
                       "for every run",
              "policies": list(policies),
              "workload": {"tenants": args.tenants, "users_per_tenant": args.users, "prefix_words": args.prefix_words,
                           "max_tokens": args.max_tokens, "concurrency": args.concurrency, "temperature": 0,
                           "logit_bias": NO_EOS, "seed": args.seed, "endpoint": "/v1/completions, streamed"},
              "load_avg_1min_at_start": round(load_start, 2), "load_avg_1min_at_end": round(os.getloadavg()[0], 2)}
    sha = git_sha()
    doc = {"schema": "kipp.bench.v1", "kind": "cluster", "git_sha": sha,
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": os.uname().nodename,
           "cpu": cpu, "profile": bench_models.profile_rel(), "config": config, "results": results}
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{dt.datetime.now(dt.timezone.utc):%Y%m%d}-{machine.host_tag()}-cluster-{sha}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    print(f"cluster_bench.py: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
