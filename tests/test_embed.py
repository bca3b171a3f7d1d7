"""test_embed.py - `kipp embed` against the numpy oracle (issue 56).

Oracle: tools/np_forward.py's hidden() (a float32 transcription of transformers'
Qwen3 forward, no Kipp code, weights read by the `gguf` package) over token ids
from the `tokenizers` package on data/qwen3/qwen3-tokenizer/tokenizer.json, built
the model card's way here: "Instruct: {task}\\nQuery:{query}" for a query with an
instruction, then <|endoftext|> (151643) appended; the last row L2-normalized,
and for `--dimensions D` its first D values normalized again.

Bounds, cosine against the oracle on synthetic-tiny-embedding (BF16 weights):
  - ref backend and cpu with KIPP_BF16_ACT=f32: >= 0.99999 (issue 56). What is
    left is the BF16 KV cache (measured 1 - cos <= 6.6e-6);
  - cpu in its default BF16-dot modes (mixed/bf16, where the CPU has a fast BF16
    dot): >= 0.99995. Rounding projection inputs to BF16 costs 1 - cos up to
    2.3e-5 measured here, the same error the logits gate bounds by NMSE 5e-5
    (tests/test_cpu_backend.c); 1 - cos ~ NMSE / 2 for unit vectors.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, models_dir

import np_forward

KIPP = REPO_ROOT / "build" / "kipp"
EMB = "synthetic-tiny-embedding"
TASK = "Given a web search query, retrieve relevant passages that answer the query"
TEXTS = ["What is the capital of China?", "The capital of China is Beijing. " * 6, "x", "naïve café — 東京"]
EOT = 151643


def gguf(name: str):
    p = models_dir() / f"{name}.gguf"
    assert p.is_file(), f"{p} is missing: run `make models-test`"
    return p


@pytest.fixture(scope="module")
def oracle():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(REPO_ROOT / "data" / "qwen3" / "qwen3-tokenizer" / "tokenizer.json"))
    meta, w = np_forward.load_weights(gguf(EMB))

    def embed(text: str, instruct: str | None, dims: int | None = None) -> tuple[np.ndarray, int]:
        s = f"Instruct: {instruct}\nQuery:{text}" if instruct else text
        ids = tok.encode(s, add_special_tokens=False).ids + [EOT]
        h = np_forward.hidden(meta, w, ids, [len(ids) - 1])[0].astype(np.float64)
        h = h[:dims] if dims else h
        return h / np.linalg.norm(h), len(ids)
    return embed


def run_embed(*args: str, stdin: str | None = None, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([str(KIPP), "embed", *args], input=stdin, capture_output=True, text=True, env=env,
                          timeout=300)


def act_mode_default() -> str:
    """The cpu backend's KIPP_BF16_ACT mode here, from `kipp inspect --kernels`."""
    out = subprocess.run([str(KIPP), "inspect", str(gguf(EMB)), "--kernels"], capture_output=True, text=True).stdout
    for mode in ("mixed", "bf16", "f32"):
        if f"KIPP_BF16_ACT={mode}" in out:
            return mode
    return "f32"


CASES = [("ref", {}, 0.99999), ("cpu", {"KIPP_BF16_ACT": "f32"}, 0.99999), ("cpu", {}, None)]


@pytest.mark.parametrize("backend,env,bound", CASES, ids=["ref", "cpu-f32", "cpu-default"])
@pytest.mark.parametrize("instruct", [None, TASK], ids=["document", "query"])
@pytest.mark.parametrize("dims", [None, 64])
def test_embed_matches_numpy_oracle(oracle, backend, env, bound, instruct, dims):
    if bound is None:
        bound = 0.99999 if act_mode_default() == "f32" else 0.99995
    args = ["--model", str(gguf(EMB)), "--backend", backend, *(["--instruct", instruct] if instruct else []),
            *(["--dimensions", str(dims)] if dims else []), *TEXTS]
    r = run_embed(*args, env_extra=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["object"] == "list" and out["model"] == EMB and len(out["data"]) == len(TEXTS)
    total = 0
    for i, t in enumerate(TEXTS):
        want, n_tok = oracle(t, instruct, dims)
        got = np.array(out["data"][i]["embedding"], dtype=np.float64)
        assert out["data"][i]["index"] == i and got.shape == want.shape
        assert abs(np.linalg.norm(got) - 1) < 1e-6
        cos = float(got @ want)
        assert cos >= bound, f"{t!r}: cosine {cos:.8f} < {bound}"
        total += n_tok
    assert out["usage"] == {"prompt_tokens": total, "total_tokens": total}  # EOT counted, instruct format


def test_stdin_lines_json_lines_and_array_agree():
    base = ["--model", str(gguf(EMB)), "--dimensions", "8"]
    args = run_embed(*base, "a b", "multi\nline")
    lines = run_embed(*base, stdin='a b\n"multi\\nline"\n')
    arr = run_embed(*base, stdin='["a b", "multi\\nline"]')
    for r in (args, lines, arr):
        assert r.returncode == 0, r.stderr
    assert json.loads(args.stdout) == json.loads(lines.stdout) == json.loads(arr.stdout)


def test_options_go_before_the_texts():
    """Found by a new-user trial: `kipp embed --model M a --dimensions 2` embedded "--dimensions"
    and "2" as texts; now refused. `--` ends the options, and is not itself a text."""
    base = ["--model", str(gguf(EMB)), "--dimensions", "8"]
    r = run_embed("--model", str(gguf(EMB)), "a", "--dimensions", "2")
    assert r.returncode == 2 and "option --dimensions after the first text" in r.stderr, r.stderr
    dashed, arr = run_embed(*base, "--", "--x"), run_embed(*base, stdin='["--x"]')
    assert dashed.returncode == 0 and arr.returncode == 0, (dashed.stderr, arr.stderr)
    assert json.loads(dashed.stdout) == json.loads(arr.stdout) and len(json.loads(arr.stdout)["data"]) == 1


@pytest.mark.parametrize("args,stdin,needle", [
    (["--dimensions", "0", "x"], None, "--dimensions '0' is not an integer in 1.."),
    (["--dimensions", "257", "x"], None, "--dimensions 257 is more than synthetic-tiny-embedding's d_model 256"),
    ([], "a\n\nb\n", "line 2 of stdin is empty"),
    ([], '["a", 3]', "array item 1 is not a string"),
    ([], '["a", ""]', "array item 1 is an empty string"),
    ([], "", "no input"),
    ([""], None, "is empty"),
    (["--bogus"], None, "unknown option --bogus"),
    (["--instruct", "", "x"], None, "--instruct is empty"),
])
def test_bad_input_is_named(args, stdin, needle):
    r = run_embed("--model", str(gguf(EMB)), *args, stdin=stdin)
    assert r.returncode == 2 and needle in r.stderr, (r.returncode, r.stderr)


@pytest.mark.parametrize("model,role", [("synthetic-tiny", "generation model (kipp.variant instruct)"),
                                        ("synthetic-tiny-reranker", "reranker model (kipp.variant reranker)")])
def test_wrong_role_is_refused(model, role):
    r = run_embed("--model", str(gguf(model)), "x")
    assert r.returncode == 1 and role in r.stderr and "kipp embed needs an embedding model" in r.stderr, r.stderr


def test_too_long_input_is_refused():
    r = run_embed("--model", str(gguf(EMB)), "word " * 5000)  # > 4096 tokens of context
    assert r.returncode == 2 and "more than the context length 4096" in r.stderr, r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
