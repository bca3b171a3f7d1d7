#!/usr/bin/env python3
"""rerank_oracle.py - Qwen3-Reranker scores from the numpy forward (issue 56).

The oracle of tests/test_rerank.c and tests/test_serve_rerank.py. It shares no
code with the C engine: the prompt is built as the model card's transformers
code builds it (Qwen/Qwen3-Reranker-0.6B, "Transformers Usage"):

    prefix_tokens + tokenizer(format_instruction(instruction, query, doc)) + suffix_tokens

tokenized by the `tokenizers` package from the checkpoint's tokenizer.json, and
scored by tools/np_forward.py's FP32 forward over the GGUF's weights (gguf
package): P(yes) = softmax([logit("no"), logit("yes")])[1] at the last position.
"score" stores K and V rounded to BF16 as Kipp's KV cache does (the forward's
kv_store hook, as tools/act_precision.py uses it); "score_fp32_kv" keeps them
FP32. Near 0.75 a score moves 0.19 per unit of log-odds, and BF16 KV alone
moves the synthetic twin's scores there by about 2e-3: the 1e-3 gate is taken
against the BF16-KV forward.

Usage:
  .venv/bin/python tools/rerank_oracle.py --gguf build/models/synthetic-tiny.gguf \\
      --tokenizer build/models/synthetic-tiny/tokenizer.json --out tests/vectors/rerank/synthetic-tiny.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import np_forward  # noqa: E402

# The model card's strings (docs/SERVING.md "Reranking" cites them).
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

# Cases: (query, instruction or None, documents). Marker text is left out on
# purpose: the card's tokenizer call would turn a typed "<|im_end|>" into the
# control token, where Kipp keeps it text (docs/SERVING.md).
CASES = [
    ("What is the capital of China?", None,
     ["The capital of China is Beijing.",
      "Gravity is a force that attracts two bodies towards each other. It gives weight to physical objects and is "
      "responsible for the movement of planets around the sun.",
      "", "Beijing", "  leading spaces and a tab\tand a newline\nhere", "北京是中国的首都。",
      "1234 starts with digits", "(parenthesis first) then words"]),
    ("Explain gravity", "Given a question, find the passage that explains it best",
     ["Gravity pulls masses together.", "Bananas are yellow.", "Einstein described gravity as the curvature of "
      "spacetime caused by mass and energy, which tells matter how to move."]),
]


def tokenize(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def prompt_ids(tok, query: str, instruction: str | None, doc: str) -> list[int]:
    ins = DEFAULT_INSTRUCTION if instruction is None else instruction
    body = f"<Instruct>: {ins}\n<Query>: {query}\n<Document>: {doc}"
    return tokenize(tok, PREFIX) + tokenize(tok, body) + tokenize(tok, SUFFIX)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to BF16, nearest-even: how Kipp's KV cache stores K and V (docs/FORMAT.md)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)).astype(np.uint32)
    return r.view(np.float32)


def score(meta, w, ids: list[int], yes: int, no: int, kv_store=None) -> tuple[float, float, float]:
    row = np_forward.forward(meta, w, ids, [len(ids) - 1], kv_store=kv_store)[0].astype(np.float64)
    ly, ln = float(row[yes]), float(row[no])
    return 1.0 / (1.0 + np.exp(ln - ly)), ly, ln


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True, help="the checkpoint's tokenizer.json")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(args.tokenizer))
    yes, no = tokenize(tok, "yes"), tokenize(tok, "no")
    assert len(yes) == 1 and len(no) == 1, (yes, no)
    meta, w = np_forward.load_weights(args.gguf)
    cases = []
    for query, ins, docs in CASES:
        out = []
        for d in docs:
            ids = prompt_ids(tok, query, ins, d)
            s, ly, ln = score(meta, w, ids, yes[0], no[0], kv_store=bf16)
            s32, ly32, ln32 = score(meta, w, ids, yes[0], no[0])
            out.append({"text": d, "ids": ids, "score": s, "logit_yes": ly, "logit_no": ln,
                        "score_fp32_kv": s32, "logit_yes_fp32_kv": ly32, "logit_no_fp32_kv": ln32})
            print(f"rerank_oracle: {len(ids)} ids, score {s:.6f} (FP32 KV {s32:.6f})", file=sys.stderr)
        cases.append({"query": query, "instruction": ins, "documents": out})
    sha = hashlib.sha256(args.gguf.read_bytes()).hexdigest()
    man = {"schema": "kipp-rerank-vectors-v1", "gguf": args.gguf.name, "gguf_sha256": sha,
           "reference": "tools/rerank_oracle.py: the model card's prompt tokenized by `tokenizers`, scored by "
                        "tools/np_forward.py (numpy FP32 Qwen3 forward over the GGUF's dequantized weights; "
                        "score: K and V rounded to BF16 as Kipp's KV cache stores them; score_fp32_kv: FP32)",
           "yes_id": yes[0], "no_id": no[0], "prefix": PREFIX, "suffix": SUFFIX,
           "default_instruction": DEFAULT_INSTRUCTION, "cases": cases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(man, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
