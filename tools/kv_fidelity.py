#!/usr/bin/env python3
"""The q8_0 KV cache's fidelity at long context (issue 53 item 2): the final
row's logits with `kipp logits --kv-type q8_0` against the same prompt with
`--kv-type bf16` (the oracle: the default cache, same backend and weights),
per model and prompt length: logits NMSE (bound 1e-3) and whether the argmax
agrees. The default is the issue's one-off: models/synthetic-0.6b.gguf at
4,096 and 16,384 tokens (about 40 s and 6 min of prefill per run on 2 busy
cores), plus the tiny outlier checkpoint at 4,096 (tests/test_kv_q8.c gates
the tiny shapes in `make test`).

Writes results/<YYYYMMDD>-<host>-<cpu id>-kvfidelity-<sha>.json (kipp.bench.v1,
kind kvfidelity). A prompt is ordinary English words in a seeded order; its
token count is what kipp reports, at most the requested length.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import machine  # noqa: E402

WORDS = ("the of and to in is was for that on as with by it at from his an were are which this be or had not but "
         "first one their its new after who they have her she two been other when there all during into school time "
         "may years more most only over city some world would where later up such used many can state about national "
         "out known university united then made").split()


def prompt(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(" " + rng.choice(WORDS) for _ in range(n_words))


def logits(model: Path, text: str, kv: str, threads: int) -> tuple[np.ndarray, int, float]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "l.f32"
        t0 = time.time()
        r = subprocess.run([str(ROOT / "build" / "kipp"), "logits", "--model", str(model), "--prompt", text, "--out",
                            str(out), "--kv-type", kv, *(["--threads", str(threads)] if threads else [])],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"kipp logits --kv-type {kv} on {model}: {r.stderr.strip()}")
        m = re.search(r"(\d+) prompt tokens", r.stderr)
        return np.fromfile(out, dtype="<f4"), int(m[1]) if m else -1, time.time() - t0


def uptime() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", metavar="MODEL:TOKENS",
                    help="a model file and prompt length; repeatable (default: the issue's 0.6B 4096 and 16384, "
                         "tiny-outliers 4096)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args()
    cases = args.case or ["models/synthetic-0.6b.gguf:4096", "models/synthetic-0.6b.gguf:16384",
                          "build/models/synthetic-tiny-outliers.gguf:4096"]
    rows, load0, t0 = [], uptime(), time.time()
    for case in cases:
        path, _, n = case.rpartition(":")
        model, n = (ROOT / path if not Path(path).is_absolute() else Path(path)), int(n)
        text = prompt(int(n * 0.9), n)  # about one token a word; the count kipp reports is recorded
        ref, nt, s_ref = logits(model, text, "bf16", args.threads)
        got, _, s_q8 = logits(model, text, "q8_0", args.threads)
        nmse = float(np.sum((got.astype(np.float64) - ref) ** 2) / np.sum(ref.astype(np.float64) ** 2))
        row = {"name": f"kv_q8_0_fidelity_{nt}", "model": path, "prompt_tokens": nt, "logits_nmse": nmse, "bound": 1e-3, "pass": nmse <= 1e-3 and
               int(np.argmax(got)) == int(np.argmax(ref)), "argmax_bf16": int(np.argmax(ref)),
               "argmax_q8_0": int(np.argmax(got)), "wall_s_bf16": round(s_ref, 1), "wall_s_q8_0": round(s_q8, 1)}
        rows.append(row)
        print(f"{path} at {nt} tokens: NMSE {nmse:.3g} (bound 1e-3), argmax {row['argmax_q8_0']} vs "
              f"{row['argmax_bf16']}: {'pass' if row['pass'] else 'FAIL'}", flush=True)
    sha = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    now = dt.datetime.now(dt.timezone.utc)
    doc = {"schema": "kipp.bench.v1", "kind": "kvfidelity", "git_sha": sha, "date": f"{now:%Y-%m-%dT%H:%M:%SZ}",
           "host": machine.host_tag().rsplit("-", 3)[0], "cpu": machine.cpu_facts(),
           "config": {"oracle": "kipp logits --kv-type bf16, same backend (cpu) and weights", "metric":
                      "final row's logits NMSE and argmax", "threads": args.threads, "uptime_at_start": load0,
                      "uptime_at_end": uptime(), "wall_s": round(time.time() - t0, 1)},
           "results": rows}
    out = Path(args.results) / f"{now:%Y%m%d}-{machine.host_tag()}-kvfidelity-{sha}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
