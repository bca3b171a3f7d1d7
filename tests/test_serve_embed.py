"""test_serve_embed.py - kipp-serve's POST /v1/embeddings (issue 56).

Oracle: tools/np_forward.py's hidden() over token ids from the `tokenizers`
package (as tests/test_embed.py): every returned vector's cosine with the
oracle's L2-normalized last row (truncated to `dimensions` and renormalized)
is >= 0.99999 on the ref backend (BF16 KV the only difference) and on the cpu
backend with KIPP_BF16_ACT=f32. Token-array inputs are embedded exactly as
given. The official `openai` SDK's client.embeddings.create (its default asks
for base64 and decodes it) and raw requests both go through. Role rules
(docs/SERVING.md "Roles"): a generation endpoint on an embedding model is a
400 naming the role, /v1/embeddings on a generation model a 400 unless
kipp-serve runs with --embeddings, and on a reranker a 400. Bad input gets a
400 naming the field. A request's inputs are run as one group while nothing
generates, so they equal isolated requests bitwise (per-session evaluation).
"""
from __future__ import annotations

import base64
import os
import struct
import threading

import numpy as np
import pytest

from conftest import REPO_ROOT, models_dir
from serve_harness import Server

import np_forward

EMB = "synthetic-tiny-embedding"
EOT = 151643
TEXTS = ["What is the capital of China?", "The capital of China is Beijing. " * 5, "ok"]


def gguf(name: str):
    p = models_dir() / f"{name}.gguf"
    assert p.is_file(), f"{p} is missing: run `make models-test`"
    return p


@pytest.fixture(scope="module")
def oracle():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(REPO_ROOT / "data" / "qwen3" / "qwen3-tokenizer" / "tokenizer.json"))
    meta, w = np_forward.load_weights(gguf(EMB))

    def ids_of(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids + [EOT]

    def embed(ids: list[int], dims: int | None = None) -> np.ndarray:
        h = np_forward.hidden(meta, w, ids, [len(ids) - 1])[0].astype(np.float64)
        h = h[:dims] if dims else h
        return h / np.linalg.norm(h)
    embed.ids_of = ids_of
    return embed


@pytest.fixture(scope="module", params=["ref", "cpu-f32"])
def server(request):
    backend = "ref" if request.param == "ref" else "cpu"
    old = os.environ.get("KIPP_BF16_ACT")
    if request.param == "cpu-f32":
        os.environ["KIPP_BF16_ACT"] = "f32"
    try:
        with Server(gguf(EMB), "--ctx", "512", backend=backend) as s:
            yield s
    finally:
        if old is None:
            os.environ.pop("KIPP_BF16_ACT", None)
        else:
            os.environ["KIPP_BF16_ACT"] = old


def close(got, want, what):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, what
    assert abs(np.linalg.norm(got) - 1) < 1e-6, what
    cos = float(got @ want)
    assert cos >= 0.99999, f"{what}: cosine {cos:.8f}"


def test_openai_sdk_embeddings_create(server, oracle):
    import openai
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="x")
    r = client.embeddings.create(model=EMB, input=TEXTS)  # the SDK asks for base64 and decodes it
    assert r.model == EMB and [d.index for d in r.data] == [0, 1, 2]
    n = 0
    for d, t in zip(r.data, TEXTS):
        ids = oracle.ids_of(t)
        close(d.embedding, oracle(ids), t)
        n += len(ids)
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n
    r = client.embeddings.create(model=EMB, input="ok", dimensions=32, encoding_format="float")
    close(r.data[0].embedding, oracle(oracle.ids_of("ok"), 32), "dimensions 32")


def test_raw_shapes_token_arrays_and_base64(server, oracle):
    ids = oracle.ids_of(TEXTS[0])
    st, a = server.post("/v1/embeddings", {"input": TEXTS[0], "model": EMB})
    assert st == 200 and a["object"] == "list" and a["data"][0]["object"] == "embedding", a
    assert len(a["data"]) == 1 and len(a["data"][0]["embedding"]) == 256
    st, b = server.post("/v1/embeddings", {"input": ids})  # one token array: used as given
    assert st == 200 and b["data"][0]["embedding"] == a["data"][0]["embedding"]
    st, c = server.post("/v1/embeddings", {"input": [ids, ids[:-1]], "encoding_format": "base64", "dimensions": 16})
    assert st == 200 and c["usage"]["prompt_tokens"] == 2 * len(ids) - 1
    vecs = [np.array(struct.unpack(f"<{16}f", base64.b64decode(d["embedding"]))) for d in c["data"]]
    close(vecs[0], oracle(ids, 16), "base64 row 0")
    close(vecs[1], oracle(ids[:-1], 16), "base64 row 1 (no EOT: as given)")


def test_batch_equals_alone(server):
    st, batch = server.post("/v1/embeddings", {"input": TEXTS})
    assert st == 200
    for i, t in enumerate(TEXTS):
        st, one = server.post("/v1/embeddings", {"input": t})
        assert st == 200 and one["data"][0]["embedding"] == batch["data"][i]["embedding"], t


BAD = [
    ({}, "input is missing"),
    ({"input": ""}, "input is an empty string"),
    ({"input": []}, "input is an empty array"),
    ({"input": ["a", ""]}, "input[1] is an empty string"),
    ({"input": [[]]}, "input[0] is an empty token array"),
    ({"input": ["a", 3]}, "input[1] is an integer but input[0] is a string"),
    ({"input": [1, -2]}, "input[1] is -2, not a token id"),
    ({"input": [[1, 151936]]}, "input[0][1] is 151936, not a token id; expected 0..151935"),
    ({"input": 7}, "input is an integer; expected a string"),
    ({"input": {"a": 1}}, "input is an object"),
    ({"input": "x", "dimensions": 0}, "dimensions 0 is out of range; expected 1..256"),
    ({"input": "x", "dimensions": 257}, "dimensions 257 is out of range"),
    ({"input": "x", "dimensions": "8"}, "dimensions is a string"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format 'int8' is not supported"),
    ({"input": "x", "foo": 1}, "unknown field 'foo'"),
    ({"input": "x", "user": 5}, "user is an integer"),
    ({"input": ("word " * 600).strip()}, "has 601 tokens (with the <|endoftext|> appended), more than the context length 512"),
    ({"input": ["a", [1] * 513]}, "input[1] is an array but input[0] is a string"),
    ({"input": [[1], [1] * 513]}, "input[1] has 513 tokens, more than the context length 512"),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[n[:40] for _, n in BAD])
def test_bad_input_400(server, body, needle):
    st, r = server.post("/v1/embeddings", body)
    assert st == 400 and needle in r["error"]["message"], (st, r)


def test_not_json_and_unknown_model(server):
    st, r = server.post("/v1/embeddings", "{nope")
    assert st == 400 and "not valid JSON" in r["error"]["message"]
    # the type named is the body's own (it was read after the body was released)
    for body, kind in (("[1]", "an array"), ("[]", "an array")):
        st, r = server.post("/v1/embeddings", body)
        assert st == 400 and r["error"]["message"] == f"request body is {kind}, expected a JSON object", (body, r)
    st, r = server.post("/v1/embeddings", '{"input": "a", "input": "b"}')
    assert st == 400 and "duplicate" in r["error"]["message"], r
    st, r = server.post("/v1/embeddings", {"input": "x", "model": "gpt-4"})
    assert st == 404 and r["error"]["code"] == "model_not_found"


def test_generation_endpoints_refused_naming_the_role(server):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        st, r = server.post(path, body)
        assert st == 400, (path, r)
        assert "is an embedding model (kipp.variant embedding)" in r["error"]["message"], r


def test_roles_on_generation_and_reranker_models():
    with Server(gguf("synthetic-tiny"), "--ctx", "256") as s:
        st, r = s.post("/v1/embeddings", {"input": "x"})
        assert st == 400 and "is a generation model (kipp.variant instruct)" in r["error"]["message"], r
        assert "--embeddings" in r["error"]["message"]
    with Server(gguf("synthetic-tiny"), "--ctx", "256", "--embeddings") as s:
        st, r = s.post("/v1/embeddings", {"input": ["x", "y"], "dimensions": 8})
        assert st == 200 and len(r["data"]) == 2 and len(r["data"][0]["embedding"]) == 8
        st, r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert st == 200, r  # still a generation server
    with Server(gguf("synthetic-tiny-reranker"), "--ctx", "256") as s:
        st, r = s.post("/v1/embeddings", {"input": "x"})
        assert st == 400 and "is a reranker model (kipp.variant reranker)" in r["error"]["message"], r


def test_embeddings_beside_generation_do_not_starve_decode():
    """With --embeddings on a generation model, a long completion and embedding requests interleave:
    the completion finishes with its tokens, every embedding request answers 200."""
    with Server(gguf("synthetic-tiny"), "--ctx", "512", "--embeddings") as s:
        out = {}

        def gen():
            out["gen"] = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 64,
                                                    "temperature": 0, "min_tokens": 64})
        t = threading.Thread(target=gen)
        t.start()
        codes = [s.post("/v1/embeddings", {"input": TEXTS * 4})[0] for _ in range(3)]
        t.join(120)
        assert codes == [200, 200, 200]
        st, r = out["gen"]
        assert st == 200 and r["usage"]["completion_tokens"] == 64, r


def test_input_the_pool_can_never_hold_is_a_400():
    """Found by a new-user trial: on an 8 MiB pool (32 blocks, 1,024 positions) a 2,000-token
    input passed the context check and got a 503 "retry" that could never succeed."""
    with Server(gguf(EMB), "--ctx", "4096", "--kv-pool-mib", "8") as s:
        st, r = s.post("/v1/embeddings", {"input": [[5] * 2000]})
        assert st == 400 and "positions the KV pool holds (--kv-pool-mib)" in r["error"]["message"], r
        st, r = s.post("/v1/embeddings", {"input": [[5] * 1000]})
        assert st == 200 and len(r["data"][0]["embedding"]) == 256, r
