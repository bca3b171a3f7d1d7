"""test_serve_errors.py - kipp-serve's client errors: one
table row per validation rule, each answered in the OpenAI error shape with
the right status, a type and the offending field; never 500 for client input.
Also the limits (body size, header size), unknown model/path/method, base
checkpoints refusing chat, and the context limit and clamp.
"""
from __future__ import annotations

import json
import socket
import time

import pytest

from serve_harness import Server

N_CTX = 128
SERVE_ARGS = ("--max-body", "65536", "--max-header", "8192", "--idle-timeout", "2")  # conftest.srv
C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

# (endpoint, body (dict or raw bytes), status, param named in the error, words in the message)
CASES = [
    (C, b"{not json", 400, None, "not valid JSON"),
    (C, b"\xff\xfe{}", 400, None, "invalid UTF-8"),
    (C, b'{"prompt": "a\xc3("}', 400, None, "UTF-8"),
    (C, b"[1, 2]", 400, None, "request body is an array, expected a JSON object"),
    (C, b'{"prompt": "a", "prompt": "b"}', 400, None, "duplicate"),
    (C, {"max_tokens": 3}, 400, "prompt", "prompt is required"),
    (CH, {"max_tokens": 3}, 400, "messages", "messages is required"),
    (C, {"prompt": "a", "bogus": 1}, 400, "bogus", "not supported"),
    (C, {"prompt": "a", "suffix": "x"}, 400, "suffix", "not supported"),
    (CH, {"messages": MSG, "tools": []}, 400, "tools", "1..128 function tools"),
    (CH, {"messages": MSG, "echo": True}, 400, "echo", "not supported"),
    (C, {"prompt": "a", "temperature": -0.5}, 400, "temperature", "a finite number >= 0"),
    (C, {"prompt": "a", "temperature": "hot"}, 400, "temperature", "is a string, expected a finite number"),
    (C, {"prompt": "a", "top_p": 1.5}, 400, "top_p", "[0, 1]"),
    (C, {"prompt": "a", "top_k": -1}, 400, "top_k", "integer"),
    (C, {"prompt": "a", "top_k": 2.5}, 400, "top_k", "expected an integer"),
    (C, {"prompt": "a", "min_p": 1.5}, 400, "min_p", "[0, 1]"),
    (C, {"prompt": "a", "frequency_penalty": 3}, 400, "frequency_penalty", "[-2, 2]"),
    (C, {"prompt": "a", "presence_penalty": -3}, 400, "presence_penalty", "[-2, 2]"),
    (C, {"prompt": "a", "repetition_penalty": 0}, 400, "repetition_penalty", "[0.01, 100]"),
    (C, {"prompt": "a", "n": 9}, 400, "n", "[1, 8]"),
    (C, {"prompt": "a", "n": 0}, 400, "n", "[1, 8]"),
    (C, {"prompt": "a", "max_tokens": 0}, 400, "max_tokens", "integer"),
    (C, {"prompt": "a", "logprobs": 6}, 400, "logprobs", "[0, 5]"),
    (CH, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", "[0, 20]"),
    (CH, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs", "needs logprobs"),
    (CH, {"messages": MSG, "logprobs": 3}, 400, "logprobs", "boolean"),
    (C, {"prompt": "a", "logit_bias": {"x": 1}}, 400, "logit_bias", "not a token id"),
    (C, {"prompt": "a", "logit_bias": {"5": 101}}, 400, "logit_bias", "[-100, 100]"),
    (C, {"prompt": "a", "logit_bias": {"999999999": 1}}, 400, "logit_bias", "out of range"),
    (C, {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    (C, {"prompt": "a", "stop": [""]}, 400, "stop", "1..256"),
    (C, {"prompt": "a", "stop": 5}, 400, "stop", "expected a string"),
    (C, {"prompt": "a", "stream": "yes"}, 400, "stream", "boolean"),
    (C, {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream set to true"),
    (C, {"prompt": "a", "stream": True, "stream_options": {"x": 1}}, 400, "stream_options", "not supported"),
    (C, {"prompt": "a", "seed": "x"}, 400, "seed", "integer"),
    (C, {"prompt": "a", "seed": -1}, 400, "seed", "omit seed for a random one"),
    (CH, {"messages": MSG, "max_tokens": 2, "max_completion_tokens": 3}, 400, "max_completion_tokens",
     "max_tokens 2 and max_completion_tokens 3 disagree"),
    (CH, {"messages": MSG, "max_completion_tokens": 3, "max_tokens": 2}, 400, "max_completion_tokens",
     "max_tokens 2 and max_completion_tokens 3 disagree"),
    (C, {"prompt": []}, 400, "prompt", "non-empty"),
    (C, {"prompt": [[1, 2]]}, 400, "prompt", "batched prompts"),
    (C, {"prompt": ["a", "b"]}, 400, "prompt", "batched prompts"),
    (C, {"prompt": [1, -2]}, 400, "prompt", "token id"),
    (C, {"prompt": [1, 999999]}, 400, "prompt", "not a token id"),
    (C, {"prompt": ""}, 400, "prompt", "0 tokens"),
    (CH, {"messages": []}, 400, "messages", "1..256"),
    (CH, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages", "tool_call_id"),
    (CH, {"messages": [{"role": "user"}]}, 400, "messages", "content is missing"),
    (CH, {"messages": [{"role": "user", "content": None}]}, 400, "messages", "content is null"),
    (CH, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "messages", "text part"),
    (CH, {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, 400, "messages", "not supported"),
    (CH, {"messages": MSG, "chat_template_kwargs": {"foo": 1}}, 400, "chat_template_kwargs", "enable_thinking"),
    (CH, {"messages": MSG, "chat_template_kwargs": {"enable_thinking": 1}}, 400, "chat_template_kwargs", "boolean"),
    (C, {"prompt": "a", "model": "gpt-4"}, 404, "model", "not served"),
    (C, {"prompt": "a" * 2000}, 400, "prompt", "n_ctx"),
]


def _check_error(st, body, status, param):
    assert st == status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["type"] and e["message"]
    if param:
        assert e["param"] == param, e
    return e


@pytest.mark.parametrize("path,body,status,param,words", CASES, ids=[f"{i}-{c[3] or 'body'}" for i, c in enumerate(CASES)])
def test_validation_rule(srv, path, body, status, param, words):
    st, r = srv.post(path, body)
    e = _check_error(st, r, status, param)
    assert words.lower() in e["message"].lower(), e["message"]


def test_chat_content_parts_joined_with_newline(srv):
    """Text parts render as their "\n"-joined string, as kipp_chat_message parts and `kipp render` do (vLLM too)."""
    parts = [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]
    a = srv.post(CH, {"messages": [{"role": "user", "content": parts}], "max_tokens": 3, "temperature": 0})[1]
    b = srv.post(CH, {"messages": [{"role": "user", "content": "hel\nlo"}], "max_tokens": 3, "temperature": 0})[1]
    c = srv.post(CH, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0})[1]
    assert a["usage"] == b["usage"] and a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"]["prompt_tokens"] != c["usage"]["prompt_tokens"] or a["choices"] != c["choices"]


def test_nul_in_a_string_is_a_clear_error(srv):
    """A JSON "\u0000" is refused up front, by position, never silently cut."""
    st, r = srv.post(CH, {"messages": [{"role": "user", "content": "hi\u0000 and a tail"}], "max_tokens": 1})
    e = _check_error(st, r, 400, None)
    assert "NUL character" in e["message"] and "in the string that ends at line 1, column" in e["message"], e["message"]


def test_context_limit_message_and_clamp(srv):
    st, r = srv.post(C, {"prompt": "a " * 300})
    e = _check_error(st, r, 400, "prompt")
    assert "n_prompt_tokens" in e["message"] and f"{N_CTX} (n_ctx)" in e["message"] and e["code"] == "context_length_exceeded"
    prompt = list(range(100, 100 + N_CTX - 10))
    st, r = srv.post(C, {"prompt": prompt, "max_tokens": 50})  # sent: refused, saying by how much
    e = _check_error(st, r, 400, "max_tokens")
    assert "40 more than the context" in e["message"] and e["code"] == "context_length_exceeded"
    st, r = srv.post(C, {"prompt": prompt, "temperature": 0, "logit_bias": {"151645": -100, "151643": -100}})
    assert st == 200, r  # not sent: the default 16 is cut to the room left
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 10


def test_body_too_large(srv):
    st, r = srv.post(C, {"prompt": "x" * 70000})
    _check_error(st, r, 413, None)
    assert "65536-byte limit" in r["error"]["message"]


def test_header_too_large(srv):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    resp = b""
    while True:
        d = s.recv(4096)
        if not d:
            break
        resp += d
    s.close()
    status = int(resp.split(b" ")[1])
    assert status in (413, 431), resp[:200]


def test_idle_connection_closed(srv):
    """--idle-timeout 2: a connection that sends nothing is closed by the server."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    t0 = time.time()
    assert s.recv(100) == b"" and 1.5 < time.time() - t0 < 8
    s.close()


def test_unknown_path_and_method(srv):
    st, r = srv.request("GET", "/v1/nothing")
    assert st == 404 and json.loads(r)["error"]["type"]
    st, r = srv.request("GET", C)
    assert st == 405 and "POST" in json.loads(r)["error"]["message"]


def test_model_names_accepted(srv):
    for name in ("synthetic-tiny", None):
        body = {"prompt": "a", "max_tokens": 1, **({"model": name} if name else {})}
        assert srv.post(C, body)[0] == 200


def test_base_checkpoint_refuses_chat(synthetic_gguf):
    with Server(synthetic_gguf("synthetic-tiny-untied"), "--ctx", "64") as base:
        st, r = base.post(CH, {"messages": MSG})
        e = _check_error(st, r, 400, "messages")
        assert "base checkpoint" in e["message"]
        assert base.post(C, {"prompt": "a", "max_tokens": 1})[0] == 200


def test_no_500_in_metrics(srv):
    assert 'status="5xx"} 0' in srv.metrics()
