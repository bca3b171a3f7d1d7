#!/usr/bin/env python3
"""tool_call_check.py - issue 51's forced-call check against any model.

With tool_choice "required" or a named function, at temperature 0 and 1, every
request must return a parsed call whose arguments validate against the tool's
schema with the `jsonschema` package (the oracle, not the server's parser).
The tools: one without arguments ("ping", `properties: {}` as LangChain sends
it), one whose strings carry maxLength <= 16 ("lookup"), one with integers, an
enum and a nested object ("book"). Each request's user message carries its
number, so the temperature-0 requests differ too.

The requests (--requests per max_tokens value, 200 by default) are spread
evenly over the 8 cells (choice x temperature: required, ping, lookup, book x
0, 1), seeds 0, 1, ... per cell; every 4th asks for parallel_tool_calls. They
are sent --workers at a time to one kipp-serve (started here on --model, or the
synthetic registry id --checkpoint, made with tools/bench_models.py when
missing). Writes results/<YYYYMMDD>-<host>-<cpu id>-toolcalls-<sha>.json
(kipp.bench.v1, kind "toolcalls"): one row per (choice, temperature,
max_tokens) with the requests, the valid calls, the finish reasons and up to
3 failures. Exit status 1 when a request failed the check.

tests/test_tool_grammar.py runs the same check (run_check) on synthetic-tiny
in `make test`.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import datetime as dt
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

CHAT = "/v1/chat/completions"
NO_THINK = {"enable_thinking": False}
CHOICES = ["required", "ping", "lookup", "book"]
TEMPERATURES = [0.0, 1.0]


def fn(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": parameters}}


TOOLS = [
    fn("ping", {"type": "object", "properties": {}}),  # no arguments, as LangChain sends it
    fn("lookup", {"type": "object", "properties": {"query": {"type": "string", "maxLength": 16},
                                                  "lang": {"type": "string", "maxLength": 2}},
                  "required": ["query"], "additionalProperties": False}),
    fn("book", {"type": "object", "properties": {
        "count": {"type": "integer"}, "unit": {"enum": ["c", "f", 3]},
        "where": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "floor": {"type": "integer"},
                                                   "open": {"type": ["boolean", "null"]}},
                  "required": ["city", "open"]}},
        "required": ["count", "unit", "where"]}),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def body(model_id: str, choice: str, temperature: float, seed: int, max_tokens: int, **extra) -> dict:
    """The chat request of one check: request number seed of its cell."""
    tc = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    user = [{"role": "user", "content": f"Use a tool. This is request {seed}."}]
    return dict(model=model_id, messages=user, tools=TOOLS, tool_choice=tc, temperature=temperature, seed=seed,
                max_tokens=max_tokens, chat_template_kwargs=NO_THINK, **extra)


def verdict(status: int, reply, choice: str) -> str | None:
    """None when the reply holds at least one call, every call names an allowed tool and its arguments validate
    (jsonschema; the argument-less tool's only call is {}); else what is wrong."""
    import jsonschema
    if status != 200:
        return f"HTTP {status}: {str(reply)[:200]}"
    ch = reply["choices"][0]
    calls = ch["message"].get("tool_calls") or []
    if not calls:
        return f"no call: finish {ch['finish_reason']}, content {str(ch['message'].get('content'))[:200]!r}"
    for c in calls:
        name = c["function"]["name"]
        if choice != "required" and name != choice:
            return f"called {name}, expected {choice}"
        if name not in SCHEMAS:
            return f"called an unknown tool {name}"
        try:
            args = json.loads(c["function"]["arguments"])
            jsonschema.validate(args, SCHEMAS[name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{name}: arguments {c['function']['arguments'][:200]!r}: {str(e)[:200]}"
        if name == "ping" and args != {}:
            return f"ping with arguments {args}"
    return None


def run_check(post, model_id: str, requests: int, max_tokens: int, workers: int = 4) -> list[dict]:
    """requests spread over the cells, sent workers at a time through post(path, body) -> (status, reply).
    One row per cell: requests, valid, finish reasons, names called, the first failures."""
    cells = [(c, t) for c in CHOICES for t in TEMPERATURES]
    jobs = [(c, t, k) for k in range((requests + len(cells) - 1) // len(cells)) for c, t in cells][:requests]

    def one(job):
        c, t, k = job
        st, r = post(CHAT, body(model_id, c, t, k, max_tokens, parallel_tool_calls=k % 4 == 3))
        why = verdict(st, r, c)
        fin = r["choices"][0]["finish_reason"] if st == 200 else None
        names = [x["function"]["name"] for x in (r["choices"][0]["message"].get("tool_calls") or [])] if st == 200 else []
        return c, t, k, why, fin, names

    with ThreadPoolExecutor(workers) as pool:
        got = list(pool.map(one, jobs))
    rows = []
    for c, t in cells:
        mine = [g for g in got if g[0] == c and g[1] == t]
        fins: dict[str, int] = {}
        called: dict[str, int] = {}
        for g in mine:
            fins[str(g[4])] = fins.get(str(g[4]), 0) + 1
            for n in g[5]:
                called[n] = called.get(n, 0) + 1
        fails = [{"seed": g[2], "why": g[3]} for g in mine if g[3]]
        rows.append({"name": f"{c}-t{t:g}-max{max_tokens}", "choice": c, "temperature": t, "max_tokens": max_tokens,
                     "requests": len(mine), "valid": len(mine) - len(fails), "finish_reasons": fins,
                     "calls_by_tool": called, "failures": fails[:3]})
    return rows


def git_sha() -> str:
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    import machine
    from serve_harness import Server
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="synthetic-0.6b", help="synthetic registry id (models/<id>.gguf)")
    ap.add_argument("--quant", default="bf16", help="with --checkpoint: bf16, q8_0 or affine4_gs32")
    ap.add_argument("--model", type=Path, help="a GGUF path instead of --checkpoint")
    ap.add_argument("--requests", type=int, default=200, help="requests per max_tokens value (default 200)")
    ap.add_argument("--max-tokens", default="64", help="comma list of max_tokens values (default 64)")
    ap.add_argument("--workers", type=int, default=8, help="requests in flight at once (default 8)")
    ap.add_argument("--threads", type=int, default=0, help="kipp-serve --threads (0 = its default)")
    ap.add_argument("--ctx", type=int, default=1024, help="kipp-serve --ctx (default 1024)")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    maxes = [int(x) for x in args.max_tokens.split(",") if x]
    if args.requests < 1 or not maxes or min(maxes) < 1:
        ap.error("--requests and every --max-tokens value must be >= 1")
    if args.model:
        gguf, mid = args.model, args.model.stem
    else:
        import bench_models
        mid = args.checkpoint
        gguf = bench_models.ensure_model(mid, ROOT / "models", False, args.quant)
    serve_args = ["--ctx", str(args.ctx), "--max-batch", str(min(64, max(8, args.workers)))]
    if args.threads:
        serve_args += ["--threads", str(args.threads)]
    load0, t0 = os.getloadavg()[0], time.time()
    rows = []
    with Server(gguf, *serve_args) as srv:
        served = json.loads(srv.request("GET", "/v1/models")[1])["data"][0]["id"]  # what requests must name
        for mt in maxes:
            post = lambda path, b: srv.post(path, b, timeout=3600)  # noqa: E731  (a loaded CPU queues requests long)
            got = run_check(post, served, args.requests, mt, args.workers)
            for r in got:
                print(f"tool_call_check.py: {mid} {r['choice']} t={r['temperature']:g} max_tokens={mt}: "
                      f"{r['valid']}/{r['requests']} valid, finish {r['finish_reasons']}", flush=True)
            rows += got
    sha = git_sha()
    cpu = machine.cpu_facts()
    config = {"model": str(gguf), "model_id": mid, "served_id": served, "quant": args.quant if not args.model else
              next((q for q in ("q8_0", "affine4_gs32") if f"-{q}" in gguf.name), "bf16") + " (by the file name)",
              "requests_per_max_tokens": args.requests, "max_tokens": maxes, "workers": args.workers,
              "kipp_serve_args": serve_args, "tools": TOOLS, "choices": CHOICES, "temperatures": TEMPERATURES,
              "oracle": "python jsonschema " + importlib.metadata.version("jsonschema"),
              "wall_s": round(time.time() - t0, 1), "load_avg_1min_at_start": round(load0, 2),
              "load_avg_1min_at_end": round(os.getloadavg()[0], 2)}
    doc = {"schema": "kipp.bench.v1", "kind": "toolcalls", "git_sha": sha,
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": os.uname().nodename,
           "cpu": cpu, "config": config, "results": rows}
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{dt.datetime.now(dt.timezone.utc):%Y%m%d}-{machine.host_tag()}-toolcalls-{sha}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    total, valid = sum(r["requests"] for r in rows), sum(r["valid"] for r in rows)
    print(f"tool_call_check.py: {valid}/{total} valid; wrote {path}")
    return 0 if valid == total else 1


if __name__ == "__main__":
    sys.exit(main())
