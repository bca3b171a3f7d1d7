"""test_serve_rerank.py - kipp-serve's /v1/rerank and /v1/score (issue 56) with `requests`.

Scores are checked against the numpy oracle (tools/rerank_oracle.py ->
tests/vectors/rerank/<model>.json: the model card's prompt tokenized by
`tokenizers`, scored by tools/np_forward.py) within 1e-3, on the cpu backend
with FP32 activations (KIPP_BF16_ACT=f32; the default BF16-dot mode is
bounded in tests/test_rerank.c). 32 documents under one query prefill the
query once: the usage extension and /metrics counters show it.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

requests = pytest.importorskip("requests")

from serve_harness import Server  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RERANK_MODEL = "synthetic-tiny-reranker"
N_CTX = 512
VEC = json.loads((REPO / "tests" / "vectors" / "rerank" / f"{RERANK_MODEL}.json").read_text())


@pytest.fixture(scope="module")
def rsrv(synthetic_gguf):
    """kipp-serve on the reranker twin, FP32 activations (the 1e-3 gate's arithmetic)."""
    old = os.environ.get("KIPP_BF16_ACT")
    os.environ["KIPP_BF16_ACT"] = "f32"
    try:
        s = Server(synthetic_gguf(RERANK_MODEL), "--ctx", str(N_CTX))
        s.__enter__()
    finally:
        if old is None:
            os.environ.pop("KIPP_BF16_ACT")
        else:
            os.environ["KIPP_BF16_ACT"] = old
    yield s
    s.__exit__(None, None, None)


def test_vectors_match_the_served_file(synthetic_gguf):
    """The oracle's scores belong to this exact file: a regenerated twin needs `make vectors-rerank`."""
    import hashlib
    sha = hashlib.sha256(synthetic_gguf(RERANK_MODEL).read_bytes()).hexdigest()
    assert sha == VEC["gguf_sha256"], "the reranker twin changed: run `make vectors-rerank`"


def post(s, path, body):
    r = requests.post(s.base + path, json=body, timeout=300)
    return r.status_code, r.json()


def case(i):
    c = VEC["cases"][i]
    return c["query"], c["instruction"], [d["text"] for d in c["documents"]], [d["score"] for d in c["documents"]]


def test_rerank_scores_equal_oracle(rsrv):
    q, _, docs, want = case(0)
    st, r = post(rsrv, "/v1/rerank", {"model": RERANK_MODEL, "query": q, "documents": docs})
    assert st == 200, r
    assert r["object"] == "list" and r["model"] == RERANK_MODEL and r["id"].startswith("rerank-")
    res = r["results"]
    assert sorted(x["index"] for x in res) == list(range(len(docs)))
    for x in res:
        assert abs(x["relevance_score"] - want[x["index"]]) <= 1e-3, (x, want[x["index"]])
        assert x["document"] == {"text": docs[x["index"]]}
    scores = [x["relevance_score"] for x in res]
    assert scores == sorted(scores, reverse=True)
    n_ids = sum(len(d["ids"]) for d in VEC["cases"][0]["documents"])
    assert r["usage"]["prompt_tokens"] == n_ids == r["usage"]["total_tokens"]


def test_rerank_top_n_objects_no_documents(rsrv):
    q, _, docs, want = case(0)
    st, r = post(rsrv, "/rerank", {"query": q, "documents": [{"text": d} for d in docs], "top_n": 3,
                                   "return_documents": False})
    assert st == 200, r
    best = sorted(range(len(docs)), key=lambda i: (-want[i], i))[:3]
    assert [x["index"] for x in r["results"]] == best or \
        all(abs(want[x["index"]] - want[b]) <= 2e-3 for x, b in zip(r["results"], best))
    assert len(r["results"]) == 3 and all("document" not in x for x in r["results"])


def test_rerank_instruction(rsrv):
    q, ins, docs, want = case(1)
    st, r = post(rsrv, "/v1/rerank", {"query": q, "documents": docs, "instruction": ins})
    assert st == 200, r
    for x in r["results"]:
        assert abs(x["relevance_score"] - want[x["index"]]) <= 1e-3
    # the default instruction gives other scores: the field is used
    st, r2 = post(rsrv, "/v1/rerank", {"query": q, "documents": docs})
    assert max(abs(a["relevance_score"] - b["relevance_score"]) for a, b in
               zip(sorted(r["results"], key=lambda x: x["index"]), sorted(r2["results"], key=lambda x: x["index"]))) > 1e-4


def test_score_shapes(rsrv):
    q, _, docs, want = case(0)
    st, r = post(rsrv, "/v1/score", {"model": RERANK_MODEL, "text_1": q, "text_2": docs})
    assert st == 200, r
    assert r["object"] == "list" and r["id"].startswith("score-")
    assert [d["index"] for d in r["data"]] == list(range(len(docs)))
    for d in r["data"]:
        assert d["object"] == "score" and abs(d["score"] - want[d["index"]]) <= 1e-3
    st, one = post(rsrv, "/score", {"text_1": q, "text_2": docs[1]})  # 1:1
    assert st == 200 and len(one["data"]) == 1 and abs(one["data"][0]["score"] - want[1]) <= 1e-3
    q1, _, docs1, _ = case(1)
    st, nn = post(rsrv, "/v1/score", {"text_1": [q, q1], "text_2": [docs[0], docs1[0]]})  # N:N pairs
    assert st == 200, nn
    assert abs(nn["data"][0]["score"] - want[0]) <= 1e-3
    st, alone = post(rsrv, "/v1/score", {"text_1": q1, "text_2": docs1[0]})
    assert abs(nn["data"][1]["score"] - alone["data"][0]["score"]) <= 1e-6


def test_32_documents_prefill_the_query_once(rsrv):
    q = "Which of these passages mentions the colour of the sky at noon on a clear day?"
    docs = [f"Passage {i}: " + " ".join(["word"] * (5 + i)) for i in range(32)]
    before = {k: rsrv.gauge(f"kipp_rerank_{k}_total") for k in ("prefix_tokens_evaluated", "prefix_tokens_reused", "documents")}
    st, r = post(rsrv, "/v1/rerank", {"query": q, "documents": docs})
    assert st == 200, r
    u = r["usage"]
    p = u["prefix_tokens"]
    assert p > 60  # system prompt, instruction, query, "<Document>:"
    # the query's prefix is evaluated once: all of it but what the KV pool already held (the system prompt's block)
    assert u["prefix_tokens_evaluated"] == p - u["prefix_tokens_cached"] and u["prefix_tokens_cached"] % 32 == 0
    assert u["tokens_evaluated"] == u["prompt_tokens"] - 32 * p + u["prefix_tokens_evaluated"]
    after = {k: rsrv.gauge(f"kipp_rerank_{k}_total") for k in before}
    assert after["documents"] - before["documents"] == 32
    assert after["prefix_tokens_evaluated"] - before["prefix_tokens_evaluated"] == u["prefix_tokens_evaluated"]
    assert after["prefix_tokens_reused"] - before["prefix_tokens_reused"] == 32 * p
    # the same query again: its full prefix blocks come from the KV pool (the pool's hit counter moves)
    hits = rsrv.gauge("kipp_kv_pool_hits_total")
    st, r2 = post(rsrv, "/v1/rerank", {"query": q, "documents": docs[:2]})
    assert st == 200 and r2["usage"]["prefix_tokens_cached"] == p // 32 * 32
    assert rsrv.gauge("kipp_kv_pool_hits_total") >= hits + p // 32


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/rerank", {"query": "q", "documents": []}, "documents", "empty list"),
    ("/v1/rerank", {"query": "", "documents": ["a"]}, "query", "empty"),
    ("/v1/rerank", {"documents": ["a"]}, "query", "missing"),
    ("/v1/rerank", {"query": "q"}, "documents", "missing"),
    ("/v1/rerank", {"query": "q", "documents": "a"}, "documents", "must be a list"),
    ("/v1/rerank", {"query": 3, "documents": ["a"]}, "query", "must be a string"),
    ("/v1/rerank", {"query": "q", "documents": ["a", 7]}, "documents[1]", "string or an object"),
    ("/v1/rerank", {"query": "q", "documents": [{"txt": "a"}]}, "documents[0]", "not supported"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n", "top_n is 0;"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "2"}, "top_n", ">= 1"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "return_documents": 1}, "return_documents", "boolean"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "instruction": ""}, "instruction", "empty"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "temperature": 0}, "temperature", "not supported"),
    ("/v1/rerank", {"query": "q", "documents": ["a " * 600]}, "documents", "more than the 512 allowed"),
    ("/v1/rerank", {"query": "q " * 600, "documents": ["a"]}, "query", "the query and instruction alone"),
    ("/v1/score", {"text_1": "q " * 600, "text_2": ["a"]}, "text_1", "the query and instruction alone"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]}, "text_2", "as many"),
    ("/v1/score", {"text_1": [], "text_2": ["c"]}, "text_1", "empty list"),
    ("/v1/score", {"text_1": "a"}, "text_2", "missing"),
    ("/v1/score", {"text_1": "a", "text_2": [1]}, "text_2[0]", "must be a string"),
])
def test_bad_input_400(rsrv, path, body, param, words):
    st, r = post(rsrv, path, body)
    assert st == 400, r
    assert r["error"]["param"] == param and words in r["error"]["message"], r


def test_not_json_and_unknown_model(rsrv):
    r = requests.post(rsrv.base + "/v1/rerank", data=b"{nope", timeout=60)
    assert r.status_code == 400 and "not a JSON object" in r.json()["error"]["message"]
    st, r = post(rsrv, "/v1/rerank", {"model": "other", "query": "q", "documents": ["a"]})
    assert st == 404 and r["error"]["code"] == "model_not_found"


def test_generation_model_refuses_rerank(srv):
    """synthetic-tiny is a generation model: /v1/rerank and /v1/score answer 400 naming its role."""
    for path, body in (("/v1/rerank", {"query": "q", "documents": ["a"]}), ("/v1/score", {"text_1": "q", "text_2": "a"})):
        st, r = post(srv, path, body)
        assert st == 400 and r["error"]["param"] == "model", r
        assert "reranker" in r["error"]["message"] and "generation" in r["error"]["message"], r


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
    ("/v1/messages", {"model": RERANK_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16}),
])
def test_reranker_refuses_generation(rsrv, path, body):
    st, r = post(rsrv, path, body)
    assert st == 400, r
    msg = json.dumps(r)
    assert "a reranker model" in msg and "/v1/rerank" in msg, r


def test_many_short_documents_and_a_small_pool(synthetic_gguf):
    """Found by a new-user trial: 2,100 identical one-word documents share all but their last
    token, so one kipp_eval_batch group held 2,100 forked sessions, one copied tail block each,
    more than the 2,048-block pool: a 503. Groups now keep to half the pool's free blocks, and
    every score equals the one-document request's. On an 8 MiB pool (32 blocks) a prompt the
    pool can never hold is a 400 naming --kv-pool-mib, not a 503 to retry."""
    with Server(synthetic_gguf(RERANK_MODEL), "--ctx", "4096") as s:
        st, one = post(s, "/v1/rerank", {"query": "q", "documents": ["x"]})
        assert st == 200, one
        st, r = post(s, "/v1/rerank", {"query": "q", "documents": ["x"] * 2100})
        assert st == 200, r
        assert len(r["results"]) == 2100
        assert {x["relevance_score"] for x in r["results"]} == {one["results"][0]["relevance_score"]}, r["results"][:3]
    with Server(synthetic_gguf(RERANK_MODEL), "--ctx", "4096", "--kv-pool-mib", "8") as s:
        st, r = post(s, "/v1/rerank", {"query": "q", "documents": ["word " * 1200]})
        assert st == 400 and "--kv-pool-mib" in r["error"]["message"] and r["error"]["param"] == "documents", r
        st, r = post(s, "/v1/rerank", {"query": "q", "documents": ["word " * 100, "x"]})
        assert st == 200 and len(r["results"]) == 2, r
