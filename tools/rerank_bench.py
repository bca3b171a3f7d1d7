#!/usr/bin/env python3
"""rerank_bench.py - rerank documents/s: Kipp (engine, bench_rerank) against llama-server --reranking.

Both engines score B documents of --doc-tokens tokens under one query, on the
same weights: Kipp on --model (a Kipp GGUF of the 0.6B shape), llama-server on
tools/peer_gguf.py --rerank's rewrite of that file (cls.output = the head's
"yes" and "no" rows, rank pooling, the card's prompt as its rerank template), so
both compute P(yes) over the same prompt. Each repetition asks a new query
(its number first), so neither engine finds the query in a cache; both may
reuse the system prompt's first tokens (Kipp's KV pool, llama-server's slot
cache). Rounds interleave the engines. Kipp's rows carry its prefix counters:
the query's prefix evaluated once per request, forked into every document.

Writes results/<date>-<host>-<cpu id>-rerank-<sha>.json with the load average
before and after (the machine may be shared: ratios from the same round are
the numbers to read).

    .venv/bin/python tools/rerank_bench.py [--model build/models/synthetic-0.6b.gguf] [--docs 1,16,64]
        [--doc-tokens 128] [--reps 3] [--rounds 2] [--threads 2] [--no-peer]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # noqa: E402
import peer_gguf  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LLAMA = REPO / "build" / "peers" / "11434.0.0" / "bin" / "llama-server"
# bench_rerank.c's words: the same documents for both engines
WORDS = ["the", "city", "river", "north", "water", "house", "people", "time", "world", "light", "market", "bridge",
         "winter", "school", "garden", "music", "history", "paper", "summer", "forest", "road", "island", "church",
         "train", "field", "stone", "power", "book", "money", "night", "story", "place"]


def doc(d: int, n: int) -> str:
    return " ".join(WORDS[(d + 7 * k) % len(WORDS)] for k in range(n))


def query(i: int) -> str:
    return f"(query {i}) Which passage describes the river that runs north of the old market?"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def kipp_round(a, qbase: int) -> dict:
    cmd = [str(REPO / "build" / "bin" / "bench_rerank"), "--model", str(a.model), "--docs", a.docs, "--doc-tokens",
           str(a.doc_tokens), "--reps", str(a.reps), "--threads", str(a.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


class Llama:
    """llama-server --reranking on the peer file; a context for every document of the largest batch."""

    def __init__(self, a, peer: Path, max_docs: int):
        per = 64 * ((a.doc_tokens + 140) // 64 + 1)  # prompt: ~80 template+query tokens, the document, the suffix
        self.port = 18700 + os.getpid() % 200
        self.cmd = [str(LLAMA), "-m", str(peer), "--reranking", "--port", str(self.port), "-t", str(a.threads),
                    "-np", str(max_docs), "-c", str(per * max_docs), "-b", "4096", "-ub", "4096", "--no-webui"]
        self.proc = None

    def __enter__(self):
        import requests
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"rerank_bench_llama_{os.getpid()}.log", "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        end = time.time() + 120
        while time.time() < end:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited; its log: {self.log.name}")
            time.sleep(0.5)
        raise SystemExit("llama-server did not become healthy in 120 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def rerank(self, q: str, docs: list[str]) -> tuple[float, dict]:
        import requests
        t0 = time.perf_counter()
        r = requests.post(f"http://127.0.0.1:{self.port}/v1/rerank", json={"query": q, "documents": docs}, timeout=600)
        t = time.perf_counter() - t0
        r.raise_for_status()
        return t, r.json()


def llama_round(srv: Llama, a, qbase: int) -> dict:
    rows = []
    qn = qbase
    for b in [int(x) for x in a.docs.split(",")]:
        docs = [doc(d, a.doc_tokens) for d in range(b)]
        ts, usage = [], None
        for _ in range(a.reps):
            t, j = srv.rerank(query(qn), docs)
            qn += 1
            ts.append(t)
            usage = j.get("usage")
        med = statistics.median(ts)
        rows.append({"documents": b, "median_s": med, "min_s": min(ts), "max_s": max(ts), "docs_per_s": b / med,
                     "reps": a.reps, "usage": usage})
    return {"engine": "llama-server", "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "build" / "models" / "synthetic-0.6b.gguf")
    ap.add_argument("--docs", default="1,16,64")
    ap.add_argument("--doc-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--results", type=Path, default=REPO / "results")
    a = ap.parse_args(argv)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    doc_out = {"schema": "kipp-rerank-bench-v1", "git_sha": sha, "date": dt.datetime.now(dt.timezone.utc).isoformat(),
               "host": machine.host_tag(), "cpu": machine.cpu_facts(), "load_before": load(),
               "config": {"model": a.model.name, "docs": a.docs, "doc_tokens": a.doc_tokens, "reps": a.reps,
                          "rounds": a.rounds, "threads": a.threads},
               "rounds": []}
    peer = None
    if not a.no_peer and LLAMA.is_file():
        peer = REPO / "build" / "peers" / "models" / (a.model.stem + "-rerank.gguf")
        if not peer.is_file():
            peer_gguf.write_peer(a.model, peer, rerank=True)
        ver = subprocess.run([str(LLAMA), "--version"], capture_output=True, text=True)
        doc_out["peer"] = {"binary": str(LLAMA.relative_to(REPO)), "file": peer.name,
                           "version": (ver.stdout + ver.stderr).strip().splitlines()}
    qbase = 0
    for rnd in range(a.rounds):
        entry = {"round": rnd, "load_before": load(), "kipp": kipp_round(a, qbase)}
        doc_out["rounds"].append(entry)
        print(json.dumps({"round": rnd, "kipp": entry["kipp"]["rows"]}), file=sys.stderr, flush=True)
        if peer:
            entry["load_between"] = load()
            try:
                with Llama(a, peer, max(int(x) for x in a.docs.split(","))) as srv:
                    srv.rerank(query(10**6 + rnd), [doc(0, a.doc_tokens)])  # warm-up
                    entry["llama_server"] = llama_round(srv, a, 1000 * (rnd + 1))
            except Exception as e:  # noqa: BLE001 - a peer failure is recorded, not fatal
                entry["llama_server_error"] = f"{type(e).__name__}: {e}"
        entry["load_after"] = load()
        print(json.dumps({"round": rnd, "kipp": [(r["documents"], round(r["docs_per_s"], 2)) for r in entry["kipp"]["rows"]],
                          "llama": [(r["documents"], round(r["docs_per_s"], 2)) for r in
                                    entry.get("llama_server", {}).get("rows", [])]}), file=sys.stderr)
    doc_out["load_after"] = load()
    summary = []
    for i, b in enumerate(int(x) for x in a.docs.split(",")):
        k = statistics.median(r["kipp"]["rows"][i]["docs_per_s"] for r in doc_out["rounds"])
        row = {"documents": b, "kipp_docs_per_s": k}
        lls = [r["llama_server"]["rows"][i]["docs_per_s"] for r in doc_out["rounds"] if "llama_server" in r]
        if lls:
            ll = statistics.median(lls)
            row.update({"llama_server_docs_per_s": ll, "ratio": k / ll, "llama_server_rounds": len(lls)})
        row["kipp_prefix"] = doc_out["rounds"][-1]["kipp"]["rows"][i]["last_stats"]
        summary.append(row)
    doc_out["summary"] = summary
    a.results.mkdir(parents=True, exist_ok=True)
    path = a.results / f"{dt.datetime.now(dt.timezone.utc):%Y%m%d}-{machine.host_tag()}-rerank-{sha}.json"
    path.write_text(json.dumps(doc_out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"rerank_bench: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
