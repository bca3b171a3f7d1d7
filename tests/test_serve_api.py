"""test_serve_api.py - kipp-serve end to end: the official `openai`
client and curl against both endpoints, n = 1, 3, 8, streamed and not; the
strict SSE shape; streamed == non-streamed byte for byte; stop strings split
across tokens; deterministic seeds; logprobs schema; echo logprobs against
`kipp logits`; thinking split. The server runs the tiny synthetic model on a
free loopback port.
"""
from __future__ import annotations

import json
import math
import struct
import subprocess

import pytest

from serve_harness import REPO, Server, check_stream, parse_sse

openai = pytest.importorskip("openai")

KIPP = REPO / "build" / "kipp"
N_CTX = 256


def test_health_models(srv, client):
    assert srv.request("GET", "/health") == (200, b'{"status":"ok"}')
    models = client.models.list()
    assert [m.id for m in models.data] == ["synthetic-tiny"]


@pytest.mark.parametrize("n", [1, 3, 8])
def test_completions_openai_stream_equals_nonstream(client, n):
    kw = dict(model="synthetic-tiny", prompt="The quick brown fox", max_tokens=12, temperature=0.9, seed=7, n=n)
    full = client.completions.create(**kw)
    assert len(full.choices) == n and sorted(c.index for c in full.choices) == list(range(n))
    assert full.usage.prompt_tokens > 0 and full.usage.completion_tokens <= 12 * n
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    assert full.model_extra["timings"]["predicted_n"] == full.usage.completion_tokens
    texts = {c.index: c.text for c in full.choices}
    got = {i: "" for i in range(n)}
    fins = {}
    for ch in client.completions.create(stream=True, **kw):
        for c in ch.choices:
            got[c.index] += c.text
            if c.finish_reason:
                fins[c.index] = c.finish_reason
    assert got == texts
    assert fins == {c.index: c.finish_reason for c in full.choices}


@pytest.mark.parametrize("n", [1, 3, 8])
def test_chat_openai_stream_equals_nonstream(client, n):
    kw = dict(model="synthetic-tiny", messages=[{"role": "user", "content": "Say something"}], max_tokens=10,
              temperature=0.8, top_p=0.95, seed=3, n=n, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    full = client.chat.completions.create(**kw)
    assert len(full.choices) == n
    texts = {c.index: c.message.content for c in full.choices}
    got = {i: "" for i in range(n)}
    for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        for c in ch.choices:
            got[c.index] += c.delta.content or ""
        if not ch.choices:
            assert ch.usage.completion_tokens == full.usage.completion_tokens
    assert got == texts


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_sse_strict_shape(srv, chat, usage):
    body = {"max_tokens": 9, "temperature": 1.0, "seed": 11, "n": 3, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "Hello there"}]
    else:
        body["prompt"] = "Hello there"
    st, raw = srv.request("POST", "/v1/chat/completions" if chat else "/v1/completions", body)
    assert st == 200
    streamed = check_stream(parse_sse(raw), 3, chat, usage)
    body.pop("stream"), body.pop("stream_options", None)
    st, full = srv.post("/v1/chat/completions" if chat else "/v1/completions", body)
    for c in full["choices"]:
        text = c["message"]["content"] if chat else c["text"]
        assert streamed[c["index"]][0] == text
        assert streamed[c["index"]][1] == (c["message"].get("reasoning_content") or "" if chat else "")
        assert streamed[c["index"]][2] == c["finish_reason"]


def test_curl_both_endpoints(srv):
    out = subprocess.run(["curl", "-sS", "-N", srv.base + "/v1/completions", "-H", "Content-Type: application/json",
                          "-d", json.dumps({"prompt": "Hi", "max_tokens": 5, "stream": True})],
                         capture_output=True, timeout=60, check=True).stdout
    check_stream(parse_sse(out), 1, False, False)
    out = subprocess.run(["curl", "-sS", srv.base + "/v1/chat/completions", "-d",
                          json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})],
                         capture_output=True, timeout=60, check=True).stdout
    r = json.loads(out)
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
    assert set(r["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"}


def _greedy(srv, **kw):
    body = {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, **kw}
    st, r = srv.post("/v1/completions", body)
    assert st == 200, r
    return r


def test_stop_string_split_across_tokens(srv):
    base = _greedy(srv, logprobs=0)
    toks = base["choices"][0]["logprobs"]["tokens"]
    text = base["choices"][0]["text"]
    assert "".join(toks) == text
    # a stop string made of the tail of token 2 and the head of token 3
    k = next(i for i in range(2, len(toks) - 1) if len(toks[i]) >= 2 and len(toks[i + 1]) >= 2)
    stop = toks[k][-2:] + toks[k + 1][:2]
    want = text[:text.index(stop)]
    r = _greedy(srv, stop=[stop, "never-appears"])
    assert r["choices"][0]["text"] == want and r["choices"][0]["finish_reason"] == "stop"
    st, raw = srv.request("POST", "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 16,
                                                      "temperature": 0, "stop": stop, "stream": True})
    streamed = check_stream(parse_sse(raw), 1, False, False)
    assert streamed[0][0] == want and streamed[0][2] == "stop"


def test_seed_determinism(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.5, "n": 2}
    a = srv.post("/v1/completions", {**body, "seed": 123})[1]
    b = srv.post("/v1/completions", {**body, "seed": 123})[1]
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]


def test_logprobs_schema_chat(srv):
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                              "logprobs": True, "top_logprobs": 3, "temperature": 0,
                                              "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200
    c = r["choices"][0]
    entries = c["logprobs"]["content"]
    assert len(entries) == r["usage"]["completion_tokens"] - (c["finish_reason"] == "stop")
    raw = b"".join(bytes(e["bytes"]) for e in entries)
    assert raw.decode("utf-8", "replace") == c["message"]["content"]
    for e in entries:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6  # greedy: the token is the best
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(e["top_logprobs"], e["top_logprobs"][1:]))


def test_logprobs_schema_completions(srv):
    r = _greedy(srv, logprobs=5)
    lp = r["choices"][0]["logprobs"]
    n = len(lp["tokens"])
    assert n == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert all(len(t) <= 5 for t in lp["top_logprobs"])
    assert lp["text_offset"] == sorted(lp["text_offset"])


def _kipp_logits(model, prompt, tmp_path):
    out = tmp_path / "l.f32"
    subprocess.run([str(KIPP), "logits", "--model", str(model), "--backend", "ref", "--prompt", prompt, "--out", str(out)], check=True,
                   capture_output=True, timeout=60)
    data = out.read_bytes()
    return struct.unpack(f"<{len(data) // 4}f", data)


def _log_softmax_at(row, i):
    m = max(row)
    return row[i] - m - math.log(sum(math.exp(x - m) for x in row))


def test_echo_logprobs_match_kipp_logits(synthetic_gguf, tmp_path):
    """Prompt logprobs (multi-row logits through the scheduler's chunked prefill)
    equal a direct evaluation of each prefix by `kipp logits`, both on the ref
    backend, whose eval_n rows are bitwise per-position evaluation."""
    words = ["Hello", " world", " foo", " bar"]
    model = synthetic_gguf("synthetic-tiny")
    with Server(model, "--ctx", "64", backend="ref") as ref:
        st, r = ref.post("/v1/completions", {"prompt": "".join(words), "max_tokens": 1, "echo": True, "logprobs": 1,
                                             "temperature": 0})
    assert st == 200, r
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["text"].startswith("".join(words))
    assert lp["tokens"][:4] == words and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for k in range(1, 4):
        row = _kipp_logits(model, "".join(words[:k]), tmp_path)
        tid = json.loads(subprocess.run([str(KIPP), "tokenize", "--model", str(model), "--text", words[k]],
                                        capture_output=True, text=True, check=True).stdout)
        assert len(tid) == 1, (words[k], tid)
        want = _log_softmax_at(row, tid[0])
        assert abs(lp["token_logprobs"][k] - want) <= 1e-5 * max(1.0, abs(want)), (k, lp["token_logprobs"][k], want)


def test_thinking_split(srv):
    """enable_thinking on: generated text is split at </think>; forced by logit_bias on the marker ids."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
    # Force "<think>" (151667) first: the text then opens a reasoning block that never closes.
    st, r = srv.post("/v1/chat/completions", {**body, "logit_bias": {"151667": 100}, "max_tokens": 1})
    m = r["choices"][0]["message"]
    assert m["content"] == "" and m.get("reasoning_content") in (None, "")
    st, raw = srv.request("POST", "/v1/chat/completions", {**body, "stream": True, "max_tokens": 1,
                                                           "logit_bias": {"151667": 100}})
    streamed = check_stream(parse_sse(raw), 1, True, False)
    assert streamed[0][0] == "" and streamed[0][1] == ""


def test_chat_markers_in_content_stay_text(srv):
    """A typed <|im_start|> in user content is tokenized as text: more prompt tokens than the marker."""
    def n_prompt(content):
        st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": content}], "max_tokens": 1})
        assert st == 200, r
        return r["usage"]["prompt_tokens"]
    assert n_prompt("a<|im_start|>b") > n_prompt("ab") + 1


@pytest.mark.parametrize("stream", [False, True])
def test_utf8_held_back_and_invalid_replaced(srv, stream):
    """Byte token 160 is 0xE4, a 3-byte lead: each is held back until the next one
    proves it invalid, then sent as U+FFFD (the last at the final flush); the
    stream never carries a partial character (parse_sse decodes strictly)."""
    def run(bias, n, **kw):
        body = {"prompt": "x", "max_tokens": n, "temperature": 0, "logit_bias": bias, "stream": stream, **kw}
        st, raw = srv.request("POST", "/v1/completions", body)
        assert st == 200
        if stream:
            return check_stream(parse_sse(raw), 1, False, False)[0][0]  # parse_sse decodes strictly
        return json.loads(raw)["choices"][0]["text"]
    assert run({"160": 100}, 3) == "\ufffd" * 3
