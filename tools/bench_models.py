#!/usr/bin/env python3
"""bench_models.py - driver of `make bench BACKEND=cpu [MODEL=...]`.

For each benchmark model (default: synthetic-0.6b, synthetic-1.7b, synthetic-4b,
the real Qwen3 shapes with deterministic random weights) it:
  1. makes models/<id>.gguf when missing, with tools/make_checkpoint.py and
     tools/convert_to_gguf.py (the Hugging Face directory models/<id>/ is
     deleted after conversion unless --keep-hf; an existing GGUF is reused);
     With --quant q8_0,affine4_gs32 each model is also converted to
     models/<id>-<scheme>.gguf (the HF directory is kept until the last scheme);
  2. runs build/kipp-bench on it (pp512, tg128, tg4k, pp4096 and the batched-decode rows
     batch1, batch2, batch4, batch8, batch16, batch32; warm-up + N reps) in its
     own process, so one model's memory is released before the next loads.
Before the first model it re-measures the machine profile (build/bin/kipp_profile
-> profiles/<host>-<level>-<cpu id>.json) so the roofline shares compare rates measured in the
same run (a profile from another load would skew them); --reuse-profile keeps an existing one. Before each
benchmark it runs `kipp plan` on the file and, after it, writes the plan's
predicted tok/s beside the measured median of the tg128 and pp512 rows
(predicted_tok_s, pred_over_measured; the planner's accuracy targets: decode
within 15%, prefill within 25%).
kipp-bench writes results/<YYYYMMDD>-<host>-<cpu id>-<backend>-<sha>.json (kipp.bench.v1,
bench/README.md), replacing earlier results of the same (bench, model) in that
file. Models run smallest first: the 4B shape needs ~8 GB for the packed
weights plus the page cache of its 8 GB file, so it runs last and alone, and is
refused with a message when MemAvailable cannot hold it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from safe_io import parse_names  # noqa: E402

BENCH_NAMES = ("pp512", "tg128", "tg4k", "pp4096", "batch1", "batch2", "batch4", "batch8", "batch16", "batch32")  # bench/bench_model.c BENCH_NAMES

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ["synthetic-0.6b", "synthetic-1.7b", "synthetic-4b"]
BENCH_MODELS = set(DEFAULT_MODELS) | {"synthetic-tiny", "synthetic-tiny-untied"}


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo in bytes (0 when unreadable)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def profile_key() -> str | None:
    """The machine profile's file name without .json: "<host>-<best ISA level>-<cpu id>"
    (build/bin/kipp_profile --key), since every machine here is called "vm"
    while their CPUs differ. None when that binary is missing or fails."""
    try:
        out = subprocess.run([str(ROOT / "build/bin/kipp_profile"), "--key"], capture_output=True, text=True,
                             check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def profile_rel() -> str | None:
    """What a result cites as its profile: `profiles/<host>-<level>-<cpu id>.json` when that
    file exists, else None (the result then cites none rather than another CPU's)."""
    key = profile_key()
    return f"profiles/{key}.json" if key and (ROOT / "profiles" / f"{key}.json").exists() else None


def rel(c: object) -> str:
    """Paths inside the repository become relative to it (commands run there), so
    results cite `profiles/<host>-<level>-<cpu id>.json` rather than one machine's absolute path."""
    if isinstance(c, Path) and c.is_absolute():
        try:
            return str(c.relative_to(ROOT))
        except ValueError:
            pass
    return str(c)


def run(cmd: list[object]) -> None:
    print("+", " ".join(rel(c) for c in cmd), flush=True)
    subprocess.run([rel(c) for c in cmd], cwd=ROOT, check=True)


QUANTS = ("bf16", "q8_0", "affine4_gs32")


def model_file(mid: str, quant: str = "bf16", head: str | None = None) -> str:
    """<id>[-<quant>][-head_<head>].gguf: the file name of one conversion."""
    return mid + ("" if quant == "bf16" else f"-{quant}") + (f"-head_{head}" if head else "") + ".gguf"


def ensure_model(mid: str, models_dir: Path, keep_hf: bool, quant: str = "bf16", head: str | None = None) -> Path:
    """models/<id>.gguf (or <id>-<quant>.gguf; head: converted with --quant-head),
    generated and converted when missing."""
    gguf = models_dir / model_file(mid, quant, head)
    if gguf.exists():
        return gguf
    hf = models_dir / mid
    models_dir.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if not (hf / "config.json").exists():
        run(["nice", py, "tools/make_checkpoint.py", "--checkpoint", mid, "--out", hf, "--quiet"])
    tmp = gguf.with_suffix(".gguf.part")
    run(["nice", py, "tools/convert_to_gguf.py", "--checkpoint", mid, "--input", hf, "--out", tmp, "--quiet",
         "--quant", quant, *(["--quant-head", head] if head else [])])
    tmp.rename(gguf)
    if not keep_hf:
        shutil.rmtree(hf)
    return gguf


PLAN_ROWS = {"tg128": ("decode_tok_s", 0.15), "pp512": ("prefill_tok_s", 0.25)}  # the planner's |pred/meas - 1| targets


def plan_of(gguf: Path, results: Path) -> dict | None:
    """`kipp plan --json` for gguf, measured just before its benchmark (None after a note when it fails)."""
    try:
        out = subprocess.run([str(ROOT / "build/kipp"), "plan", "--model", str(gguf), "--json", "--results",
                              str(results)], capture_output=True, text=True, timeout=300, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        print(f"bench_models.py: no plan for {gguf.name}: {e}", file=sys.stderr)
        return None


def attach_prediction(results: Path, gguf: Path, quant: str, plan: dict) -> None:
    """Add the plan's prediction to the tg128 and pp512 rows of gguf in the newest model results file:
    predicted_tok_s, pred_over_measured, pred_target and pred_target_met, and plan (its inputs)."""
    files = sorted(results.glob("*-cpu-*.json"), key=lambda f: f.stat().st_mtime)
    fmt = next((f for f in plan["formats"] if f["format"] == quant), None)
    if not files or fmt is None:
        return
    doc = json.loads(files[-1].read_text())
    changed = False
    for r in doc.get("results", []):
        if r.get("model") != gguf.stem or r.get("format") != quant or r.get("name") not in PLAN_ROWS:
            continue
        key, target = PLAN_ROWS[r["name"]]
        pred, meas = fmt[key], r.get("median") or 0
        ratio = pred / meas if meas > 0 else None
        met = ratio is not None and abs(ratio - 1) <= target
        r.update({"predicted_tok_s": pred, "pred_over_measured": ratio, "pred_target": target,
                  "pred_target_met": met,
                  "plan": {k: plan["machine"][k] for k in ("ram_read_gbps", "peak_gflops", "disk_read_gbps")}
                  | {"share": fmt["decode_share" if key == "decode_tok_s" else "prefill_share"],
                     "share_source": fmt["decode_share_source" if key == "decode_tok_s" else "prefill_share_source"]}})
        changed = True
        print(f"  plan   {r['name']:<6} predicted {pred:9.2f} tok/s, measured {meas:9.2f}: pred/meas "
              f"{ratio if ratio is not None else float('nan'):.3f} (target |pred/meas - 1| <= {target:.0%}: "
              f"{'met' if met else 'not met'})", flush=True)
    if changed:
        files[-1].write_text(json.dumps(doc, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cpu", help="engine backend: cpu (default) or ref")
    ap.add_argument("--model", action="append", default=[],
                    help="registry id (repeatable or comma-separated); default: %s" % ", ".join(DEFAULT_MODELS))
    ap.add_argument("--bench", default=",".join(BENCH_NAMES), help="comma list of " + ", ".join(BENCH_NAMES))
    ap.add_argument("--quant", default="bf16", help="comma list of weight schemes: bf16, q8_0, affine4_gs32")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per benchmark (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up runs per benchmark (default 1)")
    ap.add_argument("--threads", type=int, default=0, help="backend workers (0 = one per physical core)")
    ap.add_argument("--models-dir", type=Path, default=ROOT / "models")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--profiles", type=Path, default=ROOT / "profiles")
    ap.add_argument("--reuse-profile", action="store_true", help="keep an existing profiles/<host>-<level>-<cpu id>.json")
    ap.add_argument("--keep-hf", action="store_true", help="keep the Hugging Face directory after conversion")
    args = ap.parse_args()

    try:
        models = [m for arg in args.model for m in parse_names(arg, sorted(BENCH_MODELS), "--model",
                                                        "synthetic benchmark shape")] \
            or list(DEFAULT_MODELS)
        parse_names(args.bench, BENCH_NAMES, "--bench", "benchmark")
        quants = parse_names(args.quant, list(QUANTS), "--quant", "quantization scheme")
    except ValueError as e:
        ap.error(str(e))
    models.sort(key=lambda m: DEFAULT_MODELS.index(m) if m in DEFAULT_MODELS else -1)  # 4B last
    bench_bin, prof_bin = ROOT / "build/kipp-bench", ROOT / "build/bin/kipp_profile"
    for b in (bench_bin, prof_bin):
        if not b.exists():
            print(f"bench_models.py: {b} is missing; run `make all` first", file=sys.stderr)
            return 2

    if not (args.reuse_profile and (args.profiles / f"{profile_key()}.json").exists()):
        run([prof_bin, "--out", args.profiles])
    failed = []
    for mid, quant in [(m, q) for m in models for q in quants]:
        gguf = ensure_model(mid, args.models_dir, args.keep_hf or quant != quants[-1], quant)
        need = 2.1 * gguf.stat().st_size  # packed copy + the mapping's pages
        avail = mem_available_bytes()
        if avail and need > avail:
            print(f"bench_models.py: skipping {mid}: it needs about {need / 1e9:.1f} GB but MemAvailable is "
                  f"{avail / 1e9:.1f} GB", file=sys.stderr)
            failed.append(f"{mid} {quant}")
            continue
        print(f"== {mid} {quant} (load average {load_avg()})", flush=True)
        cmd = [bench_bin, "--model", gguf, "--backend", args.backend, "--bench", args.bench,
               "--reps", str(args.reps), "--warmup", str(args.warmup), "--threads", str(args.threads),
               "--profiles", args.profiles, "--out", args.results]
        plan = plan_of(gguf, args.results)
        try:
            run(cmd)
            if plan:
                attach_prediction(args.results, gguf, quant, plan)
        except subprocess.CalledProcessError as e:
            print(f"bench_models.py: kipp-bench failed on {mid} {quant} (exit {e.returncode})", file=sys.stderr)
            failed.append(f"{mid} {quant}")
    print(f"load average at the end: {load_avg()}")
    if failed:
        print(f"bench_models.py: no results for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
