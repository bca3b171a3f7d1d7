#!/usr/bin/env python3
"""np_yarn_vectors.py - oracle vectors of the YaRN gate (tests/test_yarn.c).

The numpy FP32 Qwen3 forward of tools/np_forward.py, whose YaRN RoPE
(yarn_parameters, rope_tables_yarn) is transcribed from Hugging Face
transformers' _compute_yarn_parameters and Qwen3RotaryEmbedding, over a GGUF
with qwen3.rope.scaling.* keys (build/models/synthetic-tiny-yarn.gguf: factor
4 over a 64-token original context, so the 256-token limit is 4x the original
and every row past position 64 is beyond it). Prompts are seeded random token
ids; for each, the final prompt position's logits and DECODE_ROWS greedy
steps (full causal recomputes).

Output: tests/vectors/yarn/<stem>.bin (float32 rows) and MANIFEST.json.

Usage:
  .venv/bin/python tools/np_yarn_vectors.py --models build/models --out tests/vectors/yarn \
      --gguf synthetic-tiny-yarn.gguf
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

import np_forward as npf

REPO = Path(__file__).resolve().parent.parent
DECODE_ROWS = 3
# name -> prompt length: one inside the original context (YaRN still rotates it), one past it.
PROMPTS = {"p40": 40, "p200": 200}
SEED = 53
N_BPE = 151643  # ordinary BPE ids: no special tokens in the prompts
TOLERANCES = {"ref_nmse": 5e-5, "cpu_nmse": 5e-5}
TOLERANCE_NOTES = {
    "ref_nmse": "issue 53's bound; the ref backend differs from the oracle by BF16 KV rounding only",
    "cpu_nmse": "issue 53's bound; the cpu backend runs with KIPP_BF16_ACT=f32 in the test (FP32 activations), "
                "so BF16 KV rounding and summation order remain (measured 1.2e-6..1.3e-5); with the default "
                "KIPP_BF16_ACT=mixed of an avx512_bf16 AMD CPU (O, Gate|Up, Down inputs rounded to BF16) it measured "
                "1.3e-5..5.4e-5, the 200-token prefill just over 5e-5: activation rounding, not YaRN",
}


def prompt_ids(n: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, N_BPE, n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=REPO / "build" / "models")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "vectors" / "yarn")
    ap.add_argument("--gguf", action="append", required=True, help="GGUF with YaRN keys, under --models")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    man = {"schema": "kipp-yarn-vectors-v1",
           "reference": "tools/np_forward.py with yarn_parameters / rope_tables_yarn: numpy FP32 transcription of "
                        "HF Qwen3 and transformers' _compute_yarn_parameters (truncate True, get_mscale attention "
                        "factor on cos and sin), eager attention, no KV cache",
           "commands": [".venv/bin/python tools/np_yarn_vectors.py --models build/models --out tests/vectors/yarn "
                        + " ".join(f"--gguf {g}" for g in args.gguf)],
           "tools": {"python": platform.python_version(), "numpy": np.__version__},
           "tolerances": TOLERANCES, "tolerance_notes": TOLERANCE_NOTES, "decode_rows": DECODE_ROWS, "files": {}}
    for name in args.gguf:
        path = args.models / name
        meta, w = npf.load_weights(path)
        yarn = npf.yarn_of(meta)
        if yarn is None:
            print(f"np_yarn_vectors: {name} has no qwen3.rope.scaling.* keys", file=sys.stderr)
            return 1
        entry = {"checkpoint": meta["kipp.checkpoint.id"], "yarn": yarn, "gguf_sha256": npf.sha256(path),
                 "prompts": {}}
        rows_out, off = [], 0
        for i, (pname, n) in enumerate(PROMPTS.items()):
            ids = prompt_ids(n, SEED + i)
            seq, logits, greedy = list(ids), [], []
            for _ in range(DECODE_ROWS + 1):
                row = npf.forward(meta, w, seq, [len(seq) - 1])[0]
                logits.append({"n_tokens": len(seq), "argmax": int(np.argmax(row)), "offset": off,
                               "count": int(row.size)})
                rows_out.append(row)
                off += row.size * 4
                greedy.append(int(np.argmax(row)))
                seq.append(greedy[-1])
            entry["prompts"][pname] = {"ids": ids, "greedy": greedy[:DECODE_ROWS], "logits": logits}
            print(f"np_yarn_vectors: {name} {pname}: {n} ids, argmax {greedy}", file=sys.stderr)
        stem = Path(name).stem
        (args.out / f"{stem}.bin").write_bytes(b"".join(r.astype("<f4").tobytes() for r in rows_out))
        entry["bin"] = f"{stem}.bin"
        man["files"][stem] = entry
    (args.out / "MANIFEST.json").write_text(json.dumps(man, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
