#!/usr/bin/env python3
"""report.py - draw results/report.png from results/*.json.

Reads only kipp.bench.v1 documents (bench/README.md); any other JSON under
results/ is skipped with a note. Two panels:
  * left: model throughput (tok/s, median with min-max bars) per benchmark
    (pp512, tg128, tg4k), model and format, over commits in date order;
  * right: a roofline of the kernels from the newest kernel results: the
    machine profile's read bandwidth and compute peaks (profiles/<host>-<level>-<cpu id>.json,
    cited by each result document) as ceilings, each kernel at its arithmetic
    intensity (FLOP / byte) and achieved GFLOP/s; the newest model results are
    added as hollow markers so the forward pass sits on the same chart.
A third panel plots Kipp / llama.cpp ratios from the peers documents
(tools/bench_peers.py) over commits. With --table FILE it also rewrites the full
performance tables between `<!-- perf-table:begin -->` and `<!-- perf-table:end -->`
in FILE (docs/PERFORMANCE.md) from the newest results, so the figures are
generated, never typed: the model table, the quantized peer cells, the batched
peer cells (kipp-bench's batchB and pp8x128 against llama-batched-bench, with
Kipp's step limit) and the serve table (tools/serve_bench.py: kipp-serve and llama-server per stream count, same
run) when a serve document with the side-by-side exists. With --headline FILE it
rewrites only the few rows between `<!-- perf-headline:begin -->` and
`<!-- perf-headline:end -->` in FILE (README.md); text outside the markers is kept
byte for byte. --readme FILE is the old name of --table.
Usage: .venv/bin/python tools/report.py [--results DIR] [--out results/report.png]
       [--table docs/PERFORMANCE.md] [--headline README.md]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "kipp.bench.v1"


def _num(x) -> bool:
    """Whether x is a finite JSON number (not a bool, NaN or infinity)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def doc_problem(d: dict) -> str | None:
    """What makes a kipp.bench.v1 document unusable for the plots and the table, or None.
    Our own tools write these files, so a malformed one is a defect to stop on, not to
    draw around: a row built from it would be silently wrong."""
    try:  # documents sort by date as text: only ISO 8601 text sorts as time does
        datetime.fromisoformat(d["date"])
    except (KeyError, TypeError, ValueError):
        return f"date is {d.get('date')!r}, expected an ISO 8601 time such as 2026-12-04T01:00:00Z"
    res = d.get("results", [])
    if not isinstance(res, list):
        return f"results is {type(res).__name__}, expected a list"
    cells: dict[tuple, int] = {}  # a table cell -> the result that fills it
    for i, r in enumerate(res):
        if not isinstance(r, dict):
            return f"results[{i}] is {type(r).__name__}, expected an object"
        for k in ("name", "model") if d.get("kind") in ("model", "peers") else ("name",):
            if not isinstance(r.get(k), str) or not r[k]:
                return f"results[{i}].{k} is {r.get(k)!r}, expected a non-empty string"
        if d.get("kind") == "model" and r.get("unit") == "tok/s":
            for k in ("median", "min", "max"):
                if not _num(r.get(k)):
                    return f"results[{i}] ({r['name']} {r['model']}).{k} is {r.get(k)!r}, expected a number"
            for k in ("roofline_share", "vs_pp512"):
                if r.get(k) is not None and not _num(r[k]):
                    return f"results[{i}] ({r['name']} {r['model']}).{k} is {r[k]!r}, expected a number or null"
        if d.get("kind") == "peers":
            for k in ("kipp", "llama_cpp"):
                if not isinstance(r.get(k), dict) or not _num(r[k].get("median")):
                    return f"results[{i}] ({r['name']} {r['model']}).{k}.median is missing or not a number"
            if not _num(r.get("ratio")):
                return f"results[{i}] ({r['name']} {r['model']}).ratio is {r.get('ratio')!r}, expected a number"
            lim = r.get("step_limit")
            if lim is not None and (not isinstance(lim, dict) or not _num(lim.get("limit_tok_s"))
                                    or not (lim.get("share") is None or _num(lim["share"]))):
                return (f"results[{i}] ({r['name']} {r['model']}).step_limit is {lim!r}, expected null or an object "
                        "with a number limit_tok_s and a number or null share")
        if d.get("kind") == "serve" and isinstance(r.get("kipp"), dict):  # the side-by-side rows (tools/serve_bench.py)
            why = serve_row_problem(r)
            if why:
                return f"results[{i}] ({r['name']}).{why}"
            cell = (r.get("model"), r["name"], r.get("format", "bf16"))
            if cell in cells:
                return f"results[{cells[cell]}] and results[{i}] are both {' '.join(map(str, cell))}"
            cells[cell] = i
        if d.get("kind") in ("model", "peers") and r.get("unit", "tok/s") == "tok/s":
            cell = (r["model"], r["name"], r.get("format", "bf16"), r.get("kipp_head", "bf16"), r.get("peer_format"),
                    r.get("peer_head"), r.get("kv_type", "bf16"))
            if cell in cells:  # newest() would keep the last one without a word
                return (f"results[{cells[cell]}] and results[{i}] are both {' '.join(map(str, cell))}: "
                        "one document holds one result per model, bench and format (and peer format and heads)")
            cells[cell] = i
    return None


def serve_row_problem(r: dict) -> str | None:
    """What makes a serve side-by-side row unusable for the serve table, or None:
    kipp.tok_s.median must be a number, llama_server null or the same shape, and
    each ratio a number or null."""
    for k in ("kipp", "llama_server"):
        v = r.get(k)
        if v is None and k == "llama_server":
            continue
        if not isinstance(v, dict) or not isinstance(v.get("tok_s"), dict) or not _num(v["tok_s"].get("median")):
            return f"{k}.tok_s.median is missing or not a number"
    q = r.get("ratio")
    if q is not None and (not isinstance(q, dict) or any(x is not None and not _num(x) for x in q.values())):
        return f"ratio is {q!r}, expected an object of numbers or nulls, or null"
    return None


def load_docs(results_dir: Path) -> list[dict]:
    """Every kipp.bench.v1 document in results_dir (not recursive), oldest first.
    Files of other schemas are skipped with a note; a file that is not JSON, or a
    kipp.bench.v1 document that doc_problem rejects, stops the report (SystemExit
    naming the file), since a table generated without it would quietly show older
    figures as the newest."""
    if not results_dir.is_dir():
        raise SystemExit(f"report.py: results directory {results_dir} does not exist")
    docs = []
    for p in sorted(results_dir.glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SystemExit(f"report.py: {p}: not readable JSON ({e}); fix or remove it")
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            print(f"report.py: skipping {p.name}: schema is not {SCHEMA}", file=sys.stderr)
            continue
        why = doc_problem(d)
        if why:
            raise SystemExit(f"report.py: {p}: {why}")
        d["_file"] = p.name
        docs.append(d)
    docs.sort(key=lambda d: d.get("date", ""))
    return docs


def load_profile(doc: dict) -> dict | None:
    """The machine profile a result document cites, or None."""
    path = doc.get("profile")
    if not path:
        return None
    p = Path(path) if Path(path).is_absolute() else ROOT / path
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def ceilings(profile: dict) -> dict:
    """Read bandwidth (GB/s) and compute peaks (GFLOP/s) from a profile."""
    bw = (profile.get("bandwidth") or {}).get("read_gbps_all")
    peaks = profile.get("peaks") or {}
    out = {"bw": bw}
    if peaks.get("fp32_fma_gflops_all"):
        out["FP32 FMA peak"] = peaks["fp32_fma_gflops_all"]
    if peaks.get("bf16_dot_gflops_all"):
        out["BF16 dot peak"] = peaks["bf16_dot_gflops_all"]
    if peaks.get("int8_dot_gops_all"):
        out["int8 VNNI dot peak"] = peaks["int8_dot_gops_all"]
    return out


def plot_models(ax, docs: list[dict]) -> int:
    """tok/s over commits, one line per (bench, model, format). Returns lines drawn."""
    series = defaultdict(list)  # (name, model, format) -> [(commit index, med, lo, hi)]
    commits = []
    for d in docs:
        if d.get("kind") != "model":
            continue
        key = f"{d.get('git_sha', '?')}\n{d.get('date', '')[:10]}"
        if key not in commits:
            commits.append(key)
        for r in d.get("results", []):
            if r.get("unit") != "tok/s":
                continue
            k = (r.get("name"), r.get("model"), r.get("format", "bf16"))
            series[k].append((commits.index(key), r["median"], r["min"], r["max"]))
    for (name, model, fmt), pts in sorted(series.items()):
        pts.sort()
        xs = [p[0] for p in pts]
        med = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=f"{name} {model} {fmt}")
    ax.set_xticks(range(len(commits)))
    ax.set_xticklabels(commits, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("tok/s (median, min-max)")
    ax.set_title("Model throughput over commits")
    if series:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no model results yet", ha="center", transform=ax.transAxes)
    return len(series)


def plot_roofline(ax, docs: list[dict]) -> int:
    """Kernels (newest kernel document) and models (newest model document) on the profile's roofline."""
    kern = next((d for d in reversed(docs) if d.get("kind") == "kernel"), None)
    model = next((d for d in reversed(docs) if d.get("kind") == "model"), None)
    newest, kernels = {}, {}  # newest result per (name, model) / per kernel name, across documents
    for d in docs:
        for r in d.get("results", []):
            if d.get("kind") == "model":
                newest[(r.get("name"), r.get("model"))] = r
            elif d.get("kind") == "kernel":
                kernels[r.get("name")] = r
    prof = load_profile(kern or model or {}) or {}
    c = ceilings(prof)
    xs = [2.0 ** e for e in range(-6, 13)]
    if c.get("bw"):
        for label, peak in c.items():
            if label == "bw":
                continue
            ax.plot(xs, [min(peak, c["bw"] * x) for x in xs], label=f"{label} {peak:.0f} GFLOP/s, "
                    f"read {c['bw']:.1f} GB/s")
    n = 0
    for _, r in sorted(kernels.items()):
        fl, by, gf = r.get("flops") or 0, r.get("bytes") or 0, r.get("gflops")
        if fl > 0 and by > 0 and gf:
            ax.plot(fl / by, gf, "o")
            ax.annotate(r.get("name", "?"), (fl / by, gf), fontsize=6)
            n += 1
    for _, r in sorted(newest.items()):
        fl, by = r.get("flops_per_token") or 0, r.get("bytes_per_token") or 0
        if fl > 0 and by > 0 and r.get("gflops"):
            ax.plot(fl / by, r["gflops"], "s", mfc="none")
            ax.annotate(f"{r['name']} {r['model']}", (fl / by, r["gflops"]), fontsize=6)
            n += 1
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP/s")
    host = prof.get("host", "?") if prof else "no profile"
    ax.set_title(f"Roofline ({host}; newest kernel results up to {kern['git_sha'] if kern else 'none'}, "
                 f"models {model['git_sha'] if model else 'none'})", fontsize=9)
    if n or c.get("bw"):
        ax.legend(fontsize=7, loc="lower right")
    return n


def plot_peers(ax, docs: list[dict]) -> int:
    """Kipp / llama.cpp median ratio per (model, bench) over commits; returns series drawn."""
    series: dict[tuple, list] = defaultdict(list)
    for d in docs:
        if d.get("kind") != "peers":
            continue
        for r in d.get("results", []):
            if not batched_cell(r) and not long_cell(r):  # those have their own tables; more lines would hide these
                series[(r.get("model"), r.get("name"))].append((d.get("git_sha", "?"), r.get("ratio")))
    for (model, bench), pts in sorted(series.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{model} {bench}")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_title("Kipp / llama.cpp, same run (tools/bench_peers.py)")
    ax.set_xlabel("commit")
    ax.set_ylabel("ratio of median tok/s")
    if series:
        ax.legend(fontsize=7)
    return len(series)


TARGETS = {"pp512": 0.80, "tg128": 0.95, "tg4k": 0.90, "pp4096": 0.80, "pp8x128": 0.80,
           # batched decode (the target is stated for B = 8): share of B * read BW / bytes per step
           "batch1": 0.70, "batch2": 0.70, "batch4": 0.70, "batch8": 0.70, "batch16": 0.70, "batch32": 0.70}
BENCH_ORDER = {b: i for i, b in enumerate(("pp512", "tg128", "tg4k", "pp4096", "batch1", "batch2", "batch4", "batch8",
                                           "batch16", "batch32", "pp8x128"))}


def batched_cell(r: dict) -> bool:
    """Whether a peers cell is a batched one (llama-batched-bench beside kipp-bench's batched rows)."""
    return r.get("peer_tool") == "llama-batched-bench"


def long_cell(r: dict) -> bool:
    """Whether a peers cell is a long-context one (tools/bench_peers.py --long: kipp-bench's pplong/tglong)."""
    return "long_context" in r


def newest(docs: list[dict], kind: str, by_cpu: bool = False) -> dict[tuple, tuple[dict, dict]]:
    """(model, bench, format) -> (result, its document) from the newest documents of kind;
    with by_cpu the key also holds the document's cpu_key, so each CPU keeps its own newest."""
    out: dict[tuple, tuple[dict, dict]] = {}
    for d in docs:  # oldest first: later documents overwrite
        if d.get("kind") == kind:
            for r in d.get("results", []):
                if r.get("unit", "tok/s") != "tok/s":
                    continue  # the table's columns are token rates
                if "peer_format" in r or batched_cell(r) or long_cell(r):
                    continue  # a quantized, batched or long peer cell: their own tables
                key = (r.get("model"), r.get("name"), r.get("format", "bf16"))
                out[key + (cpu_key(d),) if by_cpu else key] = (r, d)
    return out


ROOF_NAMES = {"fp32_gflops_all": "FP32 FMA peak", "bf16_gflops_all": "BF16 dot peak", "int8_gops_all": "int8 dot peak",
              "read_gbps_all": "read BW", "read_gbps_1t": "1-core read BW",
              "read_gbps_adjacent": "read BW probed beside the row"}


def cpu_of(d: dict) -> str:
    """A result document's CPU as "model cpu_id (best ISA level)": every host here is "vm",
    the model name alone does not tell the AVX2 EPYC from a Zen 4 one, and the Zen 4 and
    Zen 5 share both name and level (tools/machine.py); documents from before the cpu_id
    was recorded show the name and level only, and "?" when they record no CPU (or one
    in a shape no writer uses: such a field is read as absent, never trusted)."""
    c = d.get("cpu")
    if not isinstance(c, dict):
        c = {}
    flags = c.get("flags")
    f = set(x for x in flags if isinstance(x, str)) if isinstance(flags, list) else set()
    level = c.get("best_level") if isinstance(c.get("best_level"), str) else (
        "avx512_bf16" if c.get("avx512_bf16") is True or "avx512_bf16" in f else
        "avx512" if c.get("avx512") is True or {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= f else
        "avx2" if c.get("avx2") is True or "avx2" in f else "")
    name = " ".join(str(x) for x in (c.get("model", "?"), c.get("cpu_id")) if x is not None and x != "")
    return f"{name} ({level})" if level else (name or "?")


def cpu_known(d: dict) -> bool:
    """Whether d records its CPU's id: only then may its figures pair with another
    document's (two documents that both lack it may come from two machines)."""
    c = d.get("cpu")
    return isinstance(c, dict) and isinstance(c.get("cpu_id"), str) and bool(c["cpu_id"])


def cpu_key(d: dict) -> str:
    """The CPU a document's rows belong to: its cpu_id where it records one (so a model
    and a peers file of one CPU pair even if their writers name its level differently),
    else cpu_of's description."""
    return "id:" + d["cpu"]["cpu_id"] if cpu_known(d) else cpu_of(d)


def floor_fmt(x: float, places: int) -> str:
    """x rounded down to places decimals, as text: a figure just under its target never
    prints as the target (0.7996 -> "0.79" at 2). The 1e-9 keeps a figure that float
    arithmetic puts a hair below a round value (0.29 * 100 = 28.999...) on that value."""
    q = 10 ** places
    return f"{math.floor(x * q + 1e-9) / q:.{places}f}"


def fmt_share(r: dict) -> str:
    share, target = r.get("roofline_share"), TARGETS.get(r.get("name"))
    if share is None or target is None:
        return "n/a"
    peak = ROOF_NAMES.get(r.get("roofline_ref", ""), "")
    if r.get("batch") is not None:  # the batch rows' roofline is B tokens per read of the weights
        peak = "the one-read-per-step limit"
    text = f"{floor_fmt(100 * share, 1)}%{' of ' + peak if peak else ''} (target {100 * target:.0f}%, {'met' if share >= target else 'not met'})"
    if r.get("vs_pp512") is not None:  # pp4096: its token rate against pp512 from the same run
        t = r.get("target_vs_pp512", 0.7)
        text += f"; {floor_fmt(r['vs_pp512'], 2)}x the pp512 rate (target {t:.2f}x, {'met' if r['vs_pp512'] >= t else 'not met'})"
    return text


def readme_table(docs: list[dict]) -> str:
    """Markdown: per (model, format, bench) and per CPU, Kipp's newest tok/s and
    roofline share with its target, beside llama.cpp's figure and the ratio from the
    newest peers run on the same CPU (a peers run of another CPU is not paired with
    it: the machines of this kind differ, and a ratio across two of them means
    nothing). Each CPU keeps its own rows, newest CPU first, so a run on one machine
    kind never hides another's figures. Documents that record no CPU id make rows only
    where no document with one covers that (model, format, bench)."""
    models, peers = newest(docs, "model", by_cpu=True), newest(docs, "peers", by_cpu=True)
    entries = list(models.items()) + list(peers.items())  # ((model, bench, format, cpu), (result, doc))
    covered = {k[:3] for k, (_, d) in entries if cpu_known(d)}
    keys = {k for k, (_, d) in entries if cpu_known(d) or k[:3] not in covered}
    marked: dict[str, str] = {}
    rows = ["| model | format | bench | CPU (level) | Kipp tok/s (bench run) | share of this machine's roofline (bench run) | llama.cpp tok/s (peers run) | Kipp / llama.cpp (peers run: Kipp's figure in it) | files |",
            "|---|---|---|---|---|---|---|---|---|"]
    order = BENCH_ORDER

    def date_of(k: tuple) -> str:
        return max(str(x[1].get("date", "")) for x in (models.get(k), peers.get(k)) if x)

    keys_sorted = sorted(keys, key=date_of, reverse=True)  # newest CPU first within a bench (stable sort below)
    for key in sorted(keys_sorted, key=lambda k: (str(k[0]), str(k[2]), order.get(k[1], 9))):
        m, p = models.get(key), peers.get(key)
        if m and p and not cpu_known(m[1]):
            p = None  # no CPU id: the two files may come from two machines
        kipp = f"{m[0]['median']:.2f}" if m else "-"
        share = fmt_share(m[0]) if m else "-"
        llama = f"{p[0]['llama_cpp']['median']:.2f}" if p else "not run on this CPU"
        ratio = f"**{p[0]['ratio']:.2f}x** (Kipp {p[0]['kipp']['median']:.2f})" if p else "-"
        pnote = p[1].get("config", {}).get("note") if p and isinstance(p[1].get("config"), dict) else None
        if pnote:  # a run its writer marked (reduced, loaded machine): say so where the ratio stands
            ratio += " (marked run: see its note below)"
            marked[p[1]["_file"]] = pnote
        files = ", ".join(f"`{x[1]['_file']}`" for x in (m, p) if x)
        rows.append(f"| {key[0]} | {key[2]} | {key[1]} | {cpu_of((m or p)[1])} | {kipp} | {share} | {llama} | {ratio} | {files} |")
    note = ("\nEach row's llama.cpp figure comes from the newest peers run on the CPU that row names; "
            "\"not run on this CPU\" means no peers run of that row exists there yet (or the row's\n"
            "file records no CPU id: results from before it was recorded pair with nothing).\n")
    note += "".join(f"\nMarked run `{f}`: {n}\n" for f, n in sorted(marked.items()))
    return "\n".join(rows) + "\n" + note


def _ms(x) -> str:
    return f"{x:.0f}" if _num(x) else "-"


def _ms1(x) -> str:
    return f"{x:.1f}" if _num(x) else "-"


def serve_table(docs: list[dict]) -> str:
    """Markdown: per model, CPU and stream count, kipp-serve's and llama-server's aggregate
    tok/s from the newest serve run with the side-by-side on that CPU (tools/serve_bench.py:
    one run, alternating rounds), the ratio, and TTFT / ITL p50 of both; the 512-token
    prefill row shows prompt tok/s and latency. Empty text when no such run exists."""
    rows_of: dict[tuple, tuple[dict, dict]] = {}
    for d in docs:  # oldest first: later documents overwrite
        if d.get("kind") != "serve":
            continue
        for r in d.get("results", []):
            if isinstance(r.get("kipp"), dict):
                rows_of[(str(r.get("model")), cpu_key(d), str(r.get("format", "bf16")), r["name"])] = (r, d)
    if not rows_of:
        return ""
    out = ["| model | format | streams | CPU (level) | kipp-serve tok/s | llama-server tok/s | kipp / llama-server | "
           "TTFT p50 ms (kipp / llama) | TTFT p99 ms (kipp / llama) | ITL p50 ms (kipp / llama) | "
           "ITL p99 ms (kipp / llama) | file |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    newest_cpu = {}
    for (model, cpu, _, _), (_, d) in rows_of.items():
        newest_cpu[(model, cpu)] = max(newest_cpu.get((model, cpu), ""), str(d.get("date", "")))

    fmt_order = {"bf16": 0, "q8_0": 1, "affine4_gs32": 2}

    def order(key: tuple) -> tuple:
        r = rows_of[key][0]
        prefill = r["name"].startswith("serve_prefill")
        return (key[0], [-ord(c) for c in newest_cpu[key[:2]]], key[1], fmt_order.get(key[2], 9), key[2], prefill,
                r.get("concurrency") or 0)

    for key in sorted(rows_of, key=order):
        r, d = rows_of[key]
        k, l, q = r["kipp"], r.get("llama_server"), r.get("ratio") or {}
        prefill = r["name"].startswith("serve_prefill")
        streams = f"1 ({r.get('prompt_tokens', '?')}-token prefill)" if prefill else str(r.get("concurrency", "?"))
        kipp = f"{k['tok_s']['median']:.2f}"
        if prefill and _num(r.get("vs_pp512")):
            kipp += f" ({floor_fmt(r['vs_pp512'], 2)}x pp512)"
        llama = f"{l['tok_s']['median']:.2f}" if l else "not run"
        ratio = f"**{q['tok_s']:.2f}x**" if _num(q.get("tok_s")) else "-"
        lat = "latency_ms" if prefill else "ttft_ms_p50"
        first = f"{_ms(k.get(lat))} / {_ms(l.get(lat) if l else None)}" + (" (latency)" if prefill else "")
        ttft99 = "-" if prefill else f"{_ms(k.get('ttft_ms_p99'))} / {_ms(l.get('ttft_ms_p99') if l else None)}"
        itl = ["-" if prefill else f"{_ms1(k.get(m))} / {_ms1(l.get(m) if l else None)}" for m in ("itl_ms_p50", "itl_ms_p99")]
        fmt = key[2] + (f" / {r['peer_format']}" if r.get("peer_format") else "")
        out.append(f"| {key[0]} | {fmt} | {streams} | {cpu_of(d)} | {kipp} | {llama} | {ratio} | {first} | {ttft99} | "
                   f"{itl[0]} | {itl[1]} | `{d['_file']}` |")
    note = ("\nServe rows: `make bench-serve` (tools/serve_bench.py), kipp-serve and llama-server in one run, rounds "
            "alternating which server goes first; medians over the rounds; tok/s is aggregate over all streams. "
            "Format: Kipp's file / llama-server's llama-quantize type (the quantized rows: Kipp's head quantized "
            "like its layers, llama-quantize's default head).\n")
    return "\n".join(out) + "\n" + note


def quant_peers_table(docs: list[dict]) -> str:
    """Markdown: the quantized peer cells (tools/bench_peers.py --formats), each cell
    (model, bench, Kipp format and head, llama.cpp type and head, CPU) from the newest
    peers run that has it: both figures and the ratio from that one run, with its rounds
    and the machine's load. Empty text when no run has them."""
    newest: dict[tuple, tuple[dict, dict]] = {}
    for d in docs:  # oldest first: later documents overwrite
        if d.get("kind") != "peers":
            continue
        for r in d.get("results", []):
            if "peer_format" in r and not batched_cell(r):
                key = (cpu_key(d), r["model"], r["name"], r["format"], r.get("kipp_head", "bf16"), r["peer_format"],
                       r.get("peer_head", "default"))
                newest[key] = (r, d)
    if not newest:
        return ""
    out = ["| model | bench | Kipp format (head) | llama.cpp type (head) | CPU (level) | Kipp tok/s (min-max) | "
           "llama.cpp tok/s (min-max) | Kipp / llama.cpp | run | file |", "|---|---|---|---|---|---|---|---|---|---|"]

    def fig(x: dict) -> str:  # median, and the spread over the rounds where recorded
        spread = f" ({x['min']:.2f}-{x['max']:.2f})" if _num(x.get("min")) and _num(x.get("max")) else ""
        return f"{x['median']:.2f}{spread}"

    order = {"pp512": 0, "tg128": 1, "tg4k": 2, "pp4096": 3}
    fmt_order = {"q8_0": 0, "affine4_gs32": 1}
    notes: dict[str, str] = {}

    def sort_key(item):
        r, d = item
        return (str(cpu_of(d)), str(r["model"]), order.get(r["name"], 9), fmt_order.get(r["format"], 9),
                str(r["peer_format"]), r.get("kipp_head") != "bf16", r.get("peer_head") != "default")

    for r, d in sorted(newest.values(), key=sort_key):
        cfg = d.get("config", {}) if isinstance(d.get("config"), dict) else {}
        load = [cfg.get(k) for k in ("load_avg_1min_at_start", "load_avg_1min_at_end")]
        run = f"{cfg.get('rounds', '?')} rounds, load {'/'.join(f'{x:.1f}' for x in load if _num(x)) or '?'}"
        if cfg.get("note"):
            run += "; marked (note below)"
            notes[d["_file"]] = f"\nMarked run `{d['_file']}`: {cfg['note']}\n"
        out.append(f"| {r['model']} | {r['name']} | {r['format']} ({r.get('kipp_head', 'bf16')} head) | "
                   f"{r['peer_format']} ({r['peer_head']} head) | {cpu_of(d)} | {fig(r['kipp'])} | "
                   f"{fig(r['llama_cpp'])} | **{r['ratio']:.2f}x** | {run} | `{d['_file']}` |")
    note = ("\nQuantized peer cells: `make bench-peers PEERS_ARGS=--formats=bf16,q8_0,affine4_gs32` "
            "(tools/bench_peers.py), one run, every engine configuration once per round, Kipp and llama.cpp "
            "alternating; medians over the rounds. Each cell comes from the newest run that has it (the file "
            "column), so cells of one table may come from different runs; a ratio is always from one run. "
            "*default head*: llama-quantize's choice (Q6_K for the tied "
            "head of Q4_0/Q4_1, Q8_0 for Q8_0); *bf16 head*: `--token-embedding-type bf16 --output-tensor-type bf16`, "
            "the same bytes per token as Kipp's BF16 head; Kipp's quantized head is `--quant-head` (docs/FORMAT.md).\n")
    return "\n".join(out) + "\n" + note + "".join(notes[k] for k in sorted(notes))


def batched_peers_table(docs: list[dict]) -> str:
    """Markdown: the batched peer cells (tools/bench_peers.py: kipp-bench's batchB and pp8x128
    against llama-batched-bench's S_TG and S_PP), each cell from the newest peers run that has
    it: both figures and the ratio from that one run, and Kipp's step limit (tools/step_limit.py)
    with its bound and the share of it Kipp reached. Empty text when no run has them."""
    cells: dict[tuple, tuple[dict, dict]] = {}
    for d in docs:  # oldest first: later documents overwrite
        if d.get("kind") != "peers":
            continue
        for r in d.get("results", []):
            if batched_cell(r):
                cells[(cpu_key(d), r["model"], r["name"], r.get("format", "bf16"), r.get("kipp_head", "bf16"),
                       r.get("peer_format", "BF16"), r.get("peer_head", "bf16"))] = (r, d)
    if not cells:
        return ""
    out = ["| model | Kipp format (head) vs llama.cpp type (head) | bench | CPU (level) | Kipp tok/s | "
           "llama.cpp tok/s | Kipp / llama.cpp | Kipp's step limit tok/s (bound) | share of it | run | file |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt_order = {"bf16": 0, "q8_0": 1, "affine4_gs32": 2}
    notes: dict[str, str] = {}

    def sort_key(k: tuple) -> tuple:
        return (str(cpu_of(cells[k][1])), k[1], fmt_order.get(k[3], 9), k[4] != "bf16", k[5], k[6] != "default",
                BENCH_ORDER.get(k[2], 99))

    for k in sorted(cells, key=sort_key):
        r, d = cells[k]
        cfg = d.get("config", {}) if isinstance(d.get("config"), dict) else {}
        load = [cfg.get(x) for x in ("load_avg_1min_at_start", "load_avg_1min_at_end")]
        run = f"{cfg.get('rounds', '?')} rounds, load {'/'.join(f'{x:.1f}' for x in load if _num(x)) or '?'}"
        if cfg.get("note"):
            run += "; marked (note below)"
            notes[d["_file"]] = f"\nMarked run `{d['_file']}`: {cfg['note']}\n"
        lim = r.get("step_limit")
        limit = f"{lim['limit_tok_s']:.1f} ({lim.get('bound', '?')})" if lim else "-"
        share = f"{floor_fmt(100 * lim['share'], 1)}%" if lim and _num(lim.get("share")) else "-"
        what = f"{k[3]} ({k[4]} head) vs {k[5]} ({k[6]} head)"
        out.append(f"| {k[1]} | {what} | {k[2]} | {cpu_of(d)} | {r['kipp']['median']:.2f} | "
                   f"{r['llama_cpp']['median']:.2f} | **{r['ratio']:.2f}x** | {limit} | {share} | {run} | `{d['_file']}` |")
    note = ("\nBatched cells: `make bench-peers` (tools/bench_peers.py), kipp-bench's batchB (B sequences after a "
            "16-token prompt each, 32 steps of one batched call, every row sampled) against `llama-batched-bench -npp 16 "
            "-ntg 32 -npl B -fa on` (S_TG), and pp8x128 (8 prompts of 128 tokens in one call) against `-npp 128 -npl 8` "
            "(S_PP); same weights, threads and machine, interleaved rounds, medians. Kipp's step limit: tokens per step over "
            "the larger of the step's bytes over the read bandwidth probed beside the row and its FLOPs (head included) "
            "over the profile's peak of each part's arithmetic (BF16 dot for bf16, int8 VNNI for q8_0 and affine4_gs32 "
            "where the CPU has them; bound: which of the two is larger); share: the median over the rounds of each "
            "round's rate over its own limit.\n")
    return "\n".join(out) + "\n" + note + "".join(notes[x] for x in sorted(notes))


def long_peers_table(docs: list[dict]) -> str:
    """Markdown: the long-context peer cells (tools/bench_peers.py --long: a prefill of N tokens and
    decode with N in the cache, against llama-bench with -fa on and the same KV type), each from the
    newest peers run that has it: both figures and the ratio, the step limit with its bound, the
    share of it each engine reached and attention's share of the limit. Empty text when none."""
    cells: dict[tuple, tuple[dict, dict]] = {}
    for d in docs:  # oldest first: later documents overwrite
        if d.get("kind") == "peers":
            for r in d.get("results", []):
                if long_cell(r):
                    cells[(cpu_key(d), r["model"], r.get("kv_type", "bf16"), int(r["long_context"]),
                           r["name"].startswith("tg"))] = (r, d)
    if not cells:
        return ""
    out = ["| model | KV type | bench | CPU (level) | Kipp tok/s | llama.cpp tok/s | Kipp / llama.cpp | "
           "step limit tok/s (bound) | Kipp's share | llama.cpp's share | attention's share of the limit | run | file |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes: dict[str, str] = {}
    for k in sorted(cells, key=lambda k: (str(cpu_of(cells[k][1])), k[1], k[2] != "bf16", k[2], k[3], k[4])):
        r, d = cells[k]
        cfg = d.get("config", {}) if isinstance(d.get("config"), dict) else {}
        load = [cfg.get(x) for x in ("load_avg_1min_at_start", "load_avg_1min_at_end")]
        run = f"{cfg.get('long_rounds', '?')} rounds, load {'/'.join(f'{x:.1f}' for x in load if _num(x)) or '?'}"
        if cfg.get("note"):
            run += "; marked (note below)"
            notes[d["_file"]] = f"\nMarked run `{d['_file']}`: {cfg['note']}\n"
        lim = r.get("step_limit") or {}

        def pct(x) -> str:
            return f"{floor_fmt(100 * x, 1)}%" if _num(x) else "-"

        limit = f"{lim['limit_tok_s']:.2f} ({lim.get('bound', '?')})" if _num(lim.get("limit_tok_s")) else "-"
        out.append(f"| {r['model']} | {k[2]} | {r['name']} | {cpu_of(d)} | {r['kipp']['median']:.2f} | "
                   f"{r['llama_cpp']['median']:.2f} | **{r['ratio']:.2f}x** | {limit} | {pct(lim.get('share'))} | "
                   f"{pct(lim.get('peer_share'))} | {pct(lim.get('attention_share'))} | {run} | `{d['_file']}` |")
    note = ("\nLong-context cells: `make bench-peers PEERS_ARGS=\"--long-only --kv-types bf16,q8_0\"` (tools/bench_peers.py "
            "section 7), kipp-bench's ppN (one prefill of N tokens from an empty cache) and tgNk (32 decode steps with N "
            "tokens in the cache) against `llama-bench -p N -n 0` and `-p 0 -n 32 -d N`, both `-fa on -ctk T -ctv T` at "
            "the same KV type T, `--no-warmup`, same BF16 weights, threads and machine, rounds interleaved. Step limit: "
            "decode's weight and KV bytes over the read bandwidth probed beside Kipp's row; prefill's FLOPs (attention's "
            "causal quadratic term included) over the profile's peak of each part's arithmetic. Attention's share of the "
            "limit comes from that FLOP/byte split (Kipp has no per-op profile): decode, the KV bytes over the step's "
            "bytes; prefill, attention's FLOPs at their peak over the compute time.\n")
    return "\n".join(out) + "\n" + note + "".join(notes[x] for x in sorted(notes))


HEADLINE_MODELS = ("synthetic-0.6b", "synthetic-1.7b")
HEADLINE_BENCHES = ("pp512", "tg128", "tg4k")


def headline_table(docs: list[dict]) -> str:
    """Markdown: the README's few rows. Per (model, bench) of HEADLINE_MODELS x
    HEADLINE_BENCHES, bf16, the newest peers run that records its CPU id and carries
    no note (a note marks a reduced or loaded run, not one to headline): Kipp's and
    llama.cpp's tok/s and their ratio, all three from that one run. Cells without
    such a run are left out; the text says where the full tables are."""
    best: dict[tuple, tuple[dict, dict]] = {}
    for d in docs:  # oldest first: later documents overwrite
        cfg = d.get("config") if isinstance(d.get("config"), dict) else {}
        if d.get("kind") != "peers" or not cpu_known(d) or cfg.get("note"):
            continue
        for r in d.get("results", []):
            if "peer_format" in r or r.get("format", "bf16") != "bf16" or r.get("unit", "tok/s") != "tok/s":
                continue
            if r.get("model") in HEADLINE_MODELS and r.get("name") in HEADLINE_BENCHES:
                best[(r["model"], r["name"])] = (r, d)
    rows = ["| model | bench | Kipp tok/s | llama.cpp tok/s | Kipp / llama.cpp | CPU (level) | file |",
            "|---|---|---|---|---|---|---|"]
    for m in HEADLINE_MODELS:
        for b in HEADLINE_BENCHES:
            if (m, b) in best:
                r, d = best[(m, b)]
                rows.append(f"| {m} | {b} | {r['kipp']['median']:.2f} | {r['llama_cpp']['median']:.2f} | "
                            f"**{r['ratio']:.2f}x** | {cpu_of(d)} | `{d['_file']}` |")
    if len(rows) == 2:
        rows = ["No unmarked `make bench-peers` run of these shapes yet."]
    note = ("\nEach row: the newest `make bench-peers` run of that shape (bf16) on a CPU that records its "
            "id, both figures and the ratio from that one run. Every CPU, the roofline shares, the quantized "
            "cells and kipp-serve against llama-server: [docs/PERFORMANCE.md](docs/PERFORMANCE.md#performance-tables-generated).\n")
    return "\n".join(rows) + "\n" + note


TABLE_MARKERS = ("<!-- perf-table:begin -->", "<!-- perf-table:end -->")
HEADLINE_MARKERS = ("<!-- perf-headline:begin -->", "<!-- perf-headline:end -->")


def check_markers(path: Path, begin: str, end: str) -> str:
    """path's text; SystemExit naming the file when it is unreadable or lacks begin ... end in that order."""
    try:
        text = path.read_text()
    except OSError as e:
        raise SystemExit(f"report.py: {path}: {e.strerror}")
    if begin not in text or end not in text or text.index(end) < text.index(begin):
        raise SystemExit(f"report.py: {path} has no {begin} ... {end} markers (in that order)")
    return text


def rewrite_between(path: Path, begin: str, end: str, body: str) -> None:
    """Replace the text between the markers begin and end in path with body, keeping
    every byte outside them; SystemExit when the markers are missing or out of order."""
    text = check_markers(path, begin, end)
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + begin + "\n" + body + end + tail)


def rewrite_readme(path: Path, docs: list[dict]) -> None:
    """The full tables (model, quantized, batched and long-context peer cells, serve) between the perf-table markers."""
    serve, quant, batched, long = serve_table(docs), quant_peers_table(docs), batched_peers_table(docs), \
        long_peers_table(docs)
    rewrite_between(path, *TABLE_MARKERS,
                    readme_table(docs) + "".join("\n" + t for t in (quant, batched, long, serve) if t))


def rewrite_headline(path: Path, docs: list[dict]) -> None:
    """The headline rows (headline_table) between the perf-headline markers in path."""
    rewrite_between(path, *HEADLINE_MARKERS, headline_table(docs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--out", type=Path, default=None, help="default: <results>/report.png")
    ap.add_argument("--table", type=Path, default=None,
                    help="rewrite the full tables between the perf-table markers in this file (docs/PERFORMANCE.md)")
    ap.add_argument("--readme", type=Path, default=None, help="the old name of --table")
    ap.add_argument("--headline", type=Path, default=None,
                    help="rewrite the headline rows between the perf-headline markers in this file (README.md)")
    args = ap.parse_args()
    out = args.out or args.results / "report.png"
    if args.table and args.readme:
        ap.error("--readme is the old name of --table: give one of them")
    table = args.table or args.readme
    for path, marks in ((table, TABLE_MARKERS), (args.headline, HEADLINE_MARKERS)):
        if path:  # before anything is written: one missing marker leaves every file as it was
            check_markers(path, *marks)
    docs = load_docs(args.results)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(21, 6))
    lines = plot_models(a1, docs)
    points = plot_roofline(a2, docs)
    plot_peers(a3, docs)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"report.py: wrote {out} ({len(docs)} result files, {lines} model series, {points} roofline points)")
    if table:
        rewrite_readme(table, docs)
        print(f"report.py: rewrote the perf tables in {table}")
    if args.headline:
        rewrite_headline(args.headline, docs)
        print(f"report.py: rewrote the perf headline in {args.headline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
