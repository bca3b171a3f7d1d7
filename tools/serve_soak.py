#!/usr/bin/env python3
"""serve_soak.py - `make soak`: kipp-serve under 32 concurrent clients for a
bounded time (SOAK_SECONDS, default 300), loopback only.

Each client loops until the deadline: it picks one of a fixed set of prompts,
sends it greedy (temperature 0) streamed or not, and in about one request of
five hangs up part-way. Every completed response must equal that prompt's
isolated greedy output, measured alone before the soak. The KV pool is small
(--pool-mib, default 2: 256 positions of the tiny model), so choices are
preempted and recomputed all along. At the end the server must hold zero
active choices and zero KV blocks; then a drain: SIGTERM with requests in
flight, each of which must still get a complete reply (a prefix of its
isolated text, streams ending with [DONE]) before the server exits 0.
Prints one JSON summary; exit 1 on any mismatch, error status, leak or a
drain that lost a reply.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from serve_harness import Server, parse_sse  # noqa: E402

PROMPTS = [("word " * k).strip() for k in (1, 5, 17, 40, 70, 100)] + ["The quick brown fox", "Once upon a time"]


def body(i: int, stream: bool) -> dict:
    return {"prompt": PROMPTS[i], "max_tokens": 8 + 12 * (i % 5), "temperature": 0, "stream": stream}


def stream_text(raw: bytes) -> str:
    chunks = parse_sse(raw)
    return "".join(ch["text"] for c in chunks for ch in c["choices"])


def hang_up(port: int, b: dict, rng: random.Random) -> None:
    data = json.dumps(b).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    time.sleep(rng.random() * 0.3)
    s.close()


def client(srv: Server, want: list, deadline: float, seed: int, stats: dict, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    while time.time() < deadline:
        i, stream = rng.randrange(len(PROMPTS)), rng.random() < 0.5
        if rng.random() < 0.2:
            hang_up(srv.port, body(i, True), rng)
            with lock:
                stats["hangups"] += 1
            continue
        st, raw = srv.request("POST", "/v1/completions", body(i, stream), timeout=300)
        ok = st == 200 and (stream_text(raw) if stream else json.loads(raw)["choices"][0]["text"]) == want[i]
        with lock:
            stats["completed"] += 1
            if not ok:
                stats["mismatches"] += 1
                stats.setdefault("first_mismatch", {"prompt": i, "status": st, "body": raw[:300].decode("utf-8", "replace")})


def drain_check(srv: Server, want: list, n: int) -> dict:
    """n requests in flight (half streamed), then SIGTERM: every one must end
    complete, with a prefix of its isolated text; the server must exit 0."""
    out = [None] * n

    def go(k):
        i, stream = k % len(PROMPTS), k % 2 == 0
        st, raw = srv.request("POST", "/v1/completions", body(i, stream), timeout=120)
        text = stream_text(raw) if st == 200 and stream else json.loads(raw)["choices"][0]["text"] if st == 200 else None
        done = not stream or raw.rstrip().endswith(b"data: [DONE]")
        out[k] = st == 200 and done and text is not None and want[i].startswith(text)

    ts = [threading.Thread(target=go, args=(k,)) for k in range(n)]
    [t.start() for t in ts]
    time.sleep(0.3)
    srv.proc.send_signal(signal.SIGTERM)
    [t.join(timeout=120) for t in ts]
    rc = srv.proc.wait(timeout=60)
    return {"drain_requests": n, "drain_complete": sum(1 for o in out if o), "drain_exit": rc}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "build/models/synthetic-tiny.gguf")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--pool-mib", type=int, default=2, help="KV pool (--kv-pool-mib); small, so choices are preempted")
    args = ap.parse_args()
    stats = {"completed": 0, "mismatches": 0, "hangups": 0}
    lock = threading.Lock()
    with Server(args.model, "--ctx", "512", "--max-batch", "32", "--max-queue", "256", "--kv-pool-mib",
                str(args.pool_mib)) as srv:
        want = [json.loads(srv.request("POST", "/v1/completions", body(i, False))[1])["choices"][0]["text"]
                for i in range(len(PROMPTS))]
        deadline = time.time() + args.seconds
        threads = [threading.Thread(target=client, args=(srv, want, deadline, k, stats, lock), daemon=True)
                   for k in range(args.clients)]
        [t.start() for t in threads]
        [t.join(timeout=args.seconds + 600) for t in threads]
        idle = srv.wait_idle(timeout=30)
        stats.update(active_choices=srv.gauge("kipp_active_choices"), kv_blocks=srv.gauge("kipp_kv_blocks_in_use"),
                     cancelled=srv.gauge("kipp_cancelled_total"), seconds=args.seconds, clients=args.clients,
                     preemptions=srv.gauge("kipp_preemptions_total"),
                     server_errors=srv.metrics().count('status="5xx"} 0') != 2)
        stats.update(drain_check(srv, want, 16))
    print(json.dumps(stats, indent=1))
    drained = stats["drain_complete"] == stats["drain_requests"] and stats["drain_exit"] == 0
    return 0 if idle and drained and stats["mismatches"] == 0 and not stats["server_errors"] and stats["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
