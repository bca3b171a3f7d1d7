#!/usr/bin/env python3
"""bench_kv_disk.py - `make bench-kv-disk`: the KV disk tier's restart row
(issue 54). TTFT of a request whose ~4K-token prompt prefix is

  cold      on an empty pool and an empty --kv-cache-dir (the prefix is prefilled),
  ram       on the same server right after (the prefix adopted from the RAM pool),
  disk      on a restarted server over the same directory (read back from disk,
            the files in the page cache),
  disk_dropped  the same after `echo 3 > /proc/sys/vm/drop_caches` (true disk
            reads), where this machine allows it (else recorded as why not).

The ITL row (--itl-reps rounds, default 2) is an interleaved A/B, tier off and on
(order swapped each round), of a --itl-tokens (128) greedy stream's inter-token
latency while another client sends requests of distinct 257-token prompts one
after another until the stream ends (at most --itl-writers, 16: 128 blocks, ~470 MB
on the 0.6B) (their blocks published, and with the tier
written to disk, while the stream decodes): medians over rounds of each arm's p50
and p99. `make bench-serve` runs both rows too (tools/serve_bench.py --kv-disk).

TTFT is the latency of a non-streamed request with max_tokens 1 (its one
token is the first). Every request carries a distinct last-block suffix, so
only the shared prefix can be adopted. Rounds (--reps, default 3) each run the
four in that order on a fresh directory; the medians over rounds are recorded
with the disk/cold and ram/cold ratios, the blocks read (/metrics), and the
time the writes took to drain. The machine's load (uptime) at start and end
goes in the document: on a shared machine only the ratios are comparable.

Writes results/<YYYYMMDD>-<host>-<cpu id>-kvdisk-<sha>.json (kipp.bench.v1,
kind "kvdisk").
"""
from __future__ import annotations

import argparse
import http.client
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from serve_harness import Server  # noqa: E402
import machine  # noqa: E402


def prompt(seed: int, n: int, shared: list[int] | None = None) -> list[int]:
    out = list(shared or [])
    x = seed * 7919 + 13
    while len(out) < n:
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(1000 + x % 50000)
    return out


def ttft(s: Server, ids: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    st, body = s.post("/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0}, timeout=600)
    dt_s = time.perf_counter() - t0
    assert st == 200, body
    return dt_s, body["usage"]["prompt_tokens_details"]["cached_tokens"]


def drain(s: Server, timeout: float = 300) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout and s.gauge("kipp_kv_disk_queued") > 0:
        time.sleep(0.05)
    time.sleep(0.2)
    return time.time() - t0


def drop_caches() -> str | None:
    """None when the page cache was dropped, else why not."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return None
    except OSError as e:
        return f"cannot drop the page cache here: {e}"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def one_round(model: Path, args, k: int, shared: list[int]) -> dict:
    d = Path(tempfile.mkdtemp(prefix="kvdisk-", dir=args.dir))
    kv = d / "kv"
    srv = ("--ctx", str(args.prefix + 256), "--kv-pool-mib", str(args.pool_mib), "--threads", str(args.threads),
           "--kv-cache-dir", str(kv), "--kv-cache-disk-mib", str(args.disk_mib))
    row: dict = {}
    try:
        with Server(model, *srv) as s:
            row["cold_s"], c0 = ttft(s, prompt(1000 + 4 * k, args.prefix + 40, shared))
            row["ram_s"], c1 = ttft(s, prompt(1001 + 4 * k, args.prefix + 40, shared))
            row["write_drain_s"] = drain(s)
            row["blocks_written"] = s.gauge("kipp_kv_disk_writes_total")
        with Server(model, *srv) as s:
            row["disk_s"], c2 = ttft(s, prompt(1002 + 4 * k, args.prefix + 40, shared))
            row["blocks_read"] = s.gauge("kipp_kv_disk_reads_total")
            row["disk_rejects"] = s.gauge("kipp_kv_disk_rejects_total")
        row["cached_tokens"] = {"cold": c0, "ram": c1, "disk": c2}
        why = drop_caches()
        if why is None:
            with Server(model, *srv) as s:
                row["disk_dropped_s"], c3 = ttft(s, prompt(1003 + 4 * k, args.prefix + 40, shared))
                row["cached_tokens"]["disk_dropped"] = c3
        else:
            row["disk_dropped_why_not"] = why
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return row


NO_EOS = {"151643": -100, "151645": -100}  # <|endoftext|>, <|im_end|>: the stream runs to its budget


def stream_gaps(port: int, ids: list[int], max_tokens: int, started: threading.Event) -> list[float]:
    """Inter-token gaps (s) of one streamed greedy completion; sets started at its first token."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                                                     "stream": True, "logit_bias": NO_EOS}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    times = []
    for line in r:
        if line.startswith(b"data: {") and b'"text"' in line:
            times.append(time.perf_counter())
            started.set()
    c.close()
    started.set()
    return [b - a for a, b in zip(times, times[1:])]


def itl_arm(model: Path, args, tier: bool, k: int) -> dict:
    """One arm of the ITL A/B: a --itl-tokens greedy stream decodes while a client sends
    requests of distinct 257-token prompts (8 full blocks each, max_tokens 1), one after
    another, until the stream ends or --itl-writers were sent; with the tier every one of
    their blocks is new and written to disk while the stream runs. Both arms get the same
    prompts in the same order. (The server's exit finishes the queued writes.)"""
    d = Path(tempfile.mkdtemp(prefix="kvdisk-itl-", dir=args.dir))
    srv = ["--ctx", str(max(1024, args.itl_tokens + 128)), "--kv-pool-mib", str(args.pool_mib), "--threads",
           str(args.threads), "--no-spec"]
    if tier:
        srv += ["--kv-cache-dir", str(d / "kv"), "--kv-cache-disk-mib", str(args.disk_mib)]
    try:
        with Server(model, *srv) as s:
            started, out = threading.Event(), {}
            t = threading.Thread(target=lambda: out.__setitem__(
                "gaps", stream_gaps(s.port, prompt(5000 + k, 40), args.itl_tokens, started)))
            t.start()
            started.wait(600)
            sent = 0
            while t.is_alive() and sent < args.itl_writers:
                ttft(s, prompt(6000 + 1000 * k + sent, 257))
                sent += 1
            t.join(600)
            writes = s.gauge("kipp_kv_disk_writes_total") if tier else 0.0
    finally:
        shutil.rmtree(d, ignore_errors=True)
    gaps = sorted(out["gaps"])
    return {"tier": tier, "itl_ms_p50": 1e3 * gaps[len(gaps) // 2], "itl_ms_p99": 1e3 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
            "tokens": len(gaps) + 1, "writer_requests": sent, "blocks_written_during": writes}


def itl_row(model: Path, args) -> dict:
    arms = []
    for k in range(args.itl_reps):
        for tier in ((False, True) if k % 2 == 0 else (True, False)):  # interleaved, order swapped each round
            arms.append(itl_arm(model, args, tier, k))
            print(f"itl round {k}: {json.dumps(arms[-1])}", flush=True)
    med = {}
    for tier in (False, True):
        a = [x for x in arms if x["tier"] == tier]
        med["on" if tier else "off"] = {q: statistics.median(x[q] for x in a) for q in ("itl_ms_p50", "itl_ms_p99")}
    return {"name": "itl_while_writing", "itl_median_over_rounds": med,
            "p99_on_over_off": med["on"]["itl_ms_p99"] / med["off"]["itl_ms_p99"], "arms": arms}


def restart_row(model: Path, args, shared: list[int]) -> dict:
    rounds = []
    for k in range(args.reps):
        rounds.append(one_round(model, args, k, shared))
        print(f"round {k}: {json.dumps(rounds[-1])}", flush=True)
    med = {key: statistics.median(r[key] for r in rounds) for key in ("cold_s", "ram_s", "disk_s")}
    if all("disk_dropped_s" in r for r in rounds):
        med["disk_dropped_s"] = statistics.median(r["disk_dropped_s"] for r in rounds)
    row = {"name": f"restart_prefix{args.prefix}", "ttft_s_median": med,
           "disk_over_cold": med["disk_s"] / med["cold_s"], "ram_over_cold": med["ram_s"] / med["cold_s"],
           "rounds": rounds}
    if "disk_dropped_s" in med:
        row["disk_dropped_over_cold"] = med["disk_dropped_s"] / med["cold_s"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "synthetic-0.6b.gguf"))
    ap.add_argument("--prefix", type=int, default=4096, help="shared prompt tokens (default 4096)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pool-mib", type=int, default=1024)
    ap.add_argument("--disk-mib", type=int, default=2048)
    ap.add_argument("--dir", default=None, help="parent of the per-round --kv-cache-dir (default: the system temp dir)")
    ap.add_argument("--itl-reps", type=int, default=2, help="rounds of the ITL A/B (0: skip it)")
    ap.add_argument("--itl-tokens", type=int, default=128, help="tokens of the ITL row's stream")
    ap.add_argument("--itl-writers", type=int, default=16,
                    help="at most this many 257-token requests during the stream (8 blocks written each)")
    ap.add_argument("--no-restart", action="store_true", help="skip the restart row")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args()
    model = Path(args.model)
    shared = prompt(7, args.prefix)
    load0, t0 = uptime(), time.time()
    rows = []
    if not args.no_restart:
        rows.append(restart_row(model, args, shared))
    if args.itl_reps:
        rows.append(itl_row(model, args))
    sha = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    now = dt.datetime.now(dt.timezone.utc)
    doc = {"schema": "kipp.bench.v1", "kind": "kvdisk", "git_sha": sha, "date": f"{now:%Y-%m-%dT%H:%M:%SZ}",
           "host": machine.host_tag().rsplit("-", 3)[0], "cpu": machine.cpu_facts(),
           "config": {"model": str(model.relative_to(ROOT) if model.is_relative_to(ROOT) else model),
                      "prefix_tokens": args.prefix, "reps": args.reps, "threads": args.threads,
                      "kv_pool_mib": args.pool_mib, "kv_cache_disk_mib": args.disk_mib,
                      "ttft": "latency of a non-streamed max_tokens 1 request",
                      "uptime_at_start": load0, "uptime_at_end": uptime(), "wall_s": round(time.time() - t0, 1)},
           "results": rows}
    out = Path(args.results) / f"{now:%Y%m%d}-{machine.host_tag()}-kvdisk-{sha}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        if "ttft_s_median" in row:
            med = row["ttft_s_median"]
            print(f"cold {med['cold_s']:.2f} s, ram {med['ram_s']:.2f} s, disk after restart {med['disk_s']:.2f} s "
                  f"({row['disk_over_cold']:.3f}x cold)")
        else:
            med = row["itl_median_over_rounds"]
            print(f"ITL p99 while writing: tier off {med['off']['itl_ms_p99']:.0f} ms, on {med['on']['itl_ms_p99']:.0f} ms "
                  f"({row['p99_on_over_off']:.2f}x)")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
