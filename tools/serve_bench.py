#!/usr/bin/env python3
"""serve_bench.py - `make bench-serve`: kipp-serve throughput and latency with
1, 4, 8 and 16 concurrent streams of a ~110-token prompt and 64 generated
tokens each (EOS suppressed with logit_bias so every stream runs to 64),
loopback only. Writes results/<YYYYMMDD>-<host>-<cpu id>-serve-<sha>.json
(kipp.bench.v1, kind "serve"): aggregate tok/s, TTFT p50/p99 and ITL p50/p99
per concurrency level, median/min/max over --reps rounds.

The prefix-sharing rows (issue 10, --prefix, on by default) run a pooled
server with a shared ~1,000-token system prompt: one cold request on an
empty pool, then 8 concurrent clients with different ~20-token user turns,
then one more warm request alone. They record cold and warm TTFT, the
warm/cold ratio, the KV pool hit rate (cached / prompt tokens of the warm
requests, from usage.prompt_tokens_details.cached_tokens) and the prefill
tokens saved, plus the server's pool counters from /metrics.

The model defaults to the synthetic-0.6b shape (models/synthetic-0.6b.gguf,
made with make_checkpoint + convert when missing, as `make bench` does).
A llama-server side-by-side is not part of this script.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from serve_harness import Server  # noqa: E402
import bench_models  # noqa: E402  (profile_rel)
import machine  # noqa: E402  (cpu_facts, host_tag)

PROMPT = "The " + "quick brown fox jumps over the lazy dog. " * 11  # ~110 tokens
NO_EOS = {"151643": -100, "151645": -100}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def one_stream(port: int, out: list, k: int, max_tokens: int) -> None:
    import http.client
    body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "logit_bias": NO_EOS})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        print(f"serve_bench.py: stream {k}: HTTP {r.status} {r.read()[:300]!r}", file=sys.stderr)
    stamps, usage, buf = [], None, b""
    while True:
        line = r.readline()
        if not line:
            break
        buf = line.strip()
        if not buf.startswith(b"data: ") or buf == b"data: [DONE]":
            continue
        ch = json.loads(buf[6:])
        if "error" in ch:
            print(f"serve_bench.py: stream {k}: {ch['error']['message']}", file=sys.stderr)
            continue
        if ch.get("usage"):
            usage = ch["usage"]
        if any(x.get("text") for x in ch["choices"]):
            stamps.append(time.perf_counter())
    t1 = time.perf_counter()
    c.close()
    out[k] = {"t0": t0, "t1": t1, "ttft": stamps[0] - t0 if stamps else float("nan"),
              "itl": [b - a for a, b in zip(stamps, stamps[1:])], "tokens": usage["completion_tokens"] if usage else 0,
              "prompt_tokens": usage["prompt_tokens"] if usage else 0}


def level(port: int, conc: int, max_tokens: int) -> dict:
    res = [None] * conc
    ts = [threading.Thread(target=one_stream, args=(port, res, k, max_tokens)) for k in range(conc)]
    [t.start() for t in ts]
    [t.join(timeout=900) for t in ts]
    wall = max(r["t1"] for r in res) - min(r["t0"] for r in res)
    toks = sum(r["tokens"] for r in res)
    return {"tok_s": toks / wall, "ttft": [r["ttft"] for r in res], "itl": [x for r in res for x in r["itl"]],
            "tokens": toks, "prompt_tokens": res[0]["prompt_tokens"], "wall_s": wall}


SYSTEM = ("You are a careful assistant for a logistics company. Answer in short sentences, cite the rule you use, "
          "and never invent shipment numbers. ") * 37  # about 1,000 tokens with the Qwen3 tokenizer
TURNS = ["Where is parcel {k} now and when will it arrive at the northern depot?",
         "Can shipment {k} be rerouted to the harbour office before Friday noon?",
         "What does status code {k} mean for a pallet waiting at customs today?",
         "Please summarise the delay rules that apply to order {k} in two lines."]


def prefix_prompt(k: int) -> str:
    return f"{SYSTEM}\nUser: {TURNS[k % len(TURNS)].format(k=1000 + k)}\nAssistant:"


def prefix_request(port: int, k: int, out: list, max_tokens: int) -> None:
    """One streamed completion of prefix_prompt(k); TTFT and usage into out[k]."""
    import http.client
    body = json.dumps({"prompt": prefix_prompt(k), "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "logit_bias": NO_EOS})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, usage = None, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ch = json.loads(line[6:])
        if ch.get("usage"):
            usage = ch["usage"]
        if first is None and any(x.get("text") for x in ch.get("choices", [])):
            first = time.perf_counter()
    c.close()
    u = usage or {}
    out[k] = {"ttft_ms": (first - t0) * 1e3 if first else float("nan"), "prompt_tokens": u.get("prompt_tokens", 0),
              "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)}


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def prefix_rows(gguf: Path, mid: str, threads: int, clients: int, max_tokens: int) -> list[dict]:
    """Cold, then `clients` concurrent warm requests, then one warm request alone, on a pooled server."""
    rows = []
    with Server(gguf, "--ctx", "2048", "--kv-pool-mib", "2048", "--max-batch", str(max(16, clients)), "--threads",
                str(threads)) as srv:
        cold = [None]
        prefix_request(srv.port, 0, cold, max_tokens)
        warm = [None] * (clients + 1)
        ts = [threading.Thread(target=prefix_request, args=(srv.port, k, warm, max_tokens)) for k in range(1, clients + 1)]
        [t.start() for t in ts]
        [t.join(timeout=1800) for t in ts]
        alone = [None] * (clients + 2)
        prefix_request(srv.port, clients + 1, alone, max_tokens)
        met = srv.metrics()
    conc = [w for w in warm[1:] if w]
    c_ttft, a_ttft = cold[0]["ttft_ms"], alone[clients + 1]["ttft_ms"]
    w_ttft = [w["ttft_ms"] for w in conc]
    prompt = sum(w["prompt_tokens"] for w in conc) + alone[clients + 1]["prompt_tokens"]
    cached = sum(w["cached_tokens"] for w in conc) + alone[clients + 1]["cached_tokens"]
    base = {"model": mid, "format": "bf16", "unit": "ms", "reps": 1, "prompt_tokens": cold[0]["prompt_tokens"],
            "shared_prefix_tokens_approx": 1000, "max_tokens": max_tokens}
    rows.append({**base, "name": "serve_prefix_cold_ttft", "concurrency": 1, "median": c_ttft, "min": c_ttft, "max": c_ttft,
                 "cached_tokens": cold[0]["cached_tokens"]})
    rows.append({**base, "name": "serve_prefix_warm_ttft", "concurrency": 1, "median": a_ttft, "min": a_ttft, "max": a_ttft,
                 "cached_tokens": alone[clients + 1]["cached_tokens"], "warm_over_cold": a_ttft / c_ttft})
    rows.append({**base, "name": f"serve_prefix_warm_c{clients}_ttft", "concurrency": clients,
                 "median": statistics.median(w_ttft), "min": min(w_ttft), "max": max(w_ttft),
                 "ttft_ms_p99": pct(w_ttft, 0.99), "warm_over_cold": statistics.median(w_ttft) / c_ttft,
                 "cached_tokens": [w["cached_tokens"] for w in conc], "hit_rate": cached / prompt if prompt else 0.0,
                 "prefill_tokens_saved": cached, "warm_prompt_tokens": prompt,
                 "pool": {k: metric(met, n) for k, n in (("hits", "kipp_kv_pool_hits_total"),
                                                         ("misses", "kipp_kv_pool_misses_total"),
                                                         ("evictions", "kipp_kv_pool_evictions_total"),
                                                         ("cached_tokens_total", "kipp_prompt_tokens_cached_total"))}})
    for r in rows:
        print(json.dumps(r), flush=True)
    return rows


def llama_request(port: int, k: int, max_tokens: int) -> dict:
    """prefix_prompt(k) through llama-server's native /completion with its prompt cache."""
    import http.client
    body = json.dumps({"prompt": prefix_prompt(k), "n_predict": max_tokens, "temperature": 0, "stream": True,
                       "cache_prompt": True, "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, last = None, {}
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        ch = json.loads(line[6:])
        if first is None and ch.get("content"):
            first = time.perf_counter()
        last = ch
    c.close()
    tm = last.get("timings", {})
    n_prompt = last.get("tokens_evaluated", 0)
    return {"ttft_ms": (first - t0) * 1e3 if first else float("nan"), "prompt_tokens": n_prompt,
            "evaluated_tokens": tm.get("prompt_n"), "cached_tokens": tm.get("cache_n")}


def llama_rows(server_bin: Path, model: Path, threads: int, max_tokens: int) -> list[dict]:
    """llama-server with one slot and its prompt cache: cold, then a different user turn (warm)."""
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    nth = threads or len(os.sched_getaffinity(0))
    proc = subprocess.Popen([str(server_bin), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096",
                             "-np", "1", "-t", str(nth), "-tb", str(nth)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import http.client
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        cold = llama_request(port, 0, max_tokens)
        warm = llama_request(port, 9, max_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rows = []
    for name, r in (("llama_server_prefix_cold_ttft", cold), ("llama_server_prefix_warm_ttft", warm)):
        rows.append({"name": name, "model": model.stem, "format": "bf16", "unit": "ms", "concurrency": 1, "reps": 1,
                     "median": r["ttft_ms"], "min": r["ttft_ms"], "max": r["ttft_ms"], "prompt_tokens": r["prompt_tokens"],
                     "evaluated_tokens": r["evaluated_tokens"], "cached_tokens": r["cached_tokens"], "max_tokens": max_tokens,
                     "server": "llama-server -np 1, cache_prompt"})
    rows[1]["warm_over_cold"] = warm["ttft_ms"] / cold["ttft_ms"]
    for r in rows:
        print(json.dumps(r), flush=True)
    return rows


def git_sha() -> str:
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="synthetic-0.6b", help="synthetic registry id (models/<id>.gguf)")
    ap.add_argument("--model", type=Path, help="a GGUF path instead of --checkpoint")
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--prefix", type=int, default=8, metavar="CLIENTS",
                    help="prefix-sharing rows with this many warm clients (0 = skip them)")
    ap.add_argument("--prefix-max-tokens", type=int, default=8)
    ap.add_argument("--llama-server", type=Path, help="llama-server binary for the optional prefix-cache comparison "
                    "(default: build/peers/*/bin/llama-server when `make bench-peers` built it)")
    ap.add_argument("--llama-model", type=Path, help="the model in llama.cpp's layout (default: build/peers/models/<id>.gguf)")
    args = ap.parse_args()
    if args.model:
        gguf, mid = args.model, args.model.stem
    else:
        from bench_models import ensure_model
        gguf, mid = ensure_model(args.checkpoint, ROOT / "models", False), args.checkpoint
    levels = [int(x) for x in args.levels.split(",") if x]
    load_start = os.getloadavg()[0]
    results = []
    with Server(gguf, "--ctx", "256", "--max-batch", str(max(16, max(levels, default=1))), "--threads", str(args.threads)) as srv:
        level(srv.port, 1, 4)  # warm-up: page in the weights
        for conc in levels:
            reps = [level(srv.port, conc, args.max_tokens) for _ in range(args.reps)]
            tps = [r["tok_s"] for r in reps]
            ttft = [x * 1e3 for r in reps for x in r["ttft"]]
            itl = [x * 1e3 for r in reps for x in r["itl"]]
            row = {"name": f"serve_c{conc}", "model": mid, "format": "bf16", "unit": "tok/s", "concurrency": conc,
                   "median": statistics.median(tps), "min": min(tps), "max": max(tps), "reps": args.reps,
                   "prompt_tokens": reps[0]["prompt_tokens"], "max_tokens": args.max_tokens,
                   "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99),
                   "itl_ms_p50": pct(itl, 0.5), "itl_ms_p99": pct(itl, 0.99)}
            print(json.dumps(row), flush=True)
            results.append(row)
    peers = "none (the llama-server side-by-side belongs to the peers issue)"
    if args.prefix > 0:
        results += prefix_rows(gguf, mid, args.threads, args.prefix, args.prefix_max_tokens)
        lbin = args.llama_server or next(iter(sorted((ROOT / "build" / "peers").glob("*/bin/llama-server"))), None)
        lmodel = args.llama_model or ROOT / "build" / "peers" / "models" / f"{mid}.gguf"
        if lbin and lbin.exists() and lmodel.exists():
            results += llama_rows(lbin, lmodel, args.threads, args.prefix_max_tokens)
            peers = f"llama-server ({lbin}) on the prefix rows only, one slot, same weights ({lmodel.name})"
        else:
            print("serve_bench.py: no llama-server/model under build/peers (make bench-peers): prefix rows without the peer")
    host = os.uname().nodename
    cpu = machine.cpu_facts()
    sha = git_sha()
    doc = {"schema": "kipp.bench.v1", "kind": "serve", "git_sha": sha,
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": host,
           "cpu": cpu, "profile": bench_models.profile_rel(),
           "config": {"backend": "cpu", "threads": args.threads, "cpu": cpu["model"], "isa_flags": cpu["flags"], "server": "kipp-serve",
                      "peers": peers,
                      "load_avg_1min_at_start": round(load_start, 2), "load_avg_1min_at_end": round(os.getloadavg()[0], 2)},
           "results": results}
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{dt.datetime.now(dt.timezone.utc):%Y%m%d}-{machine.host_tag()}-serve-{sha}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"serve_bench.py: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
