"""test_serve_drain.py - kipp-serve's graceful drain: on SIGTERM the requests
in flight (4 streams and 1 non-streamed, through the `openai` client) all end
without a client exception, with a finish_reason, and with text that is a
prefix of (or equal to) the same greedy request's text on an undisturbed
server; new requests get 503 and /health 503 meanwhile; a short
--shutdown-timeout ends long requests with "length"; a second signal ends
them at once; the exit status is 0.
"""
from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from serve_harness import Server

openai = pytest.importorskip("openai")

ARGS = ("--ctx", "2048", "--kv-pool-mib", "64")
PROMPTS = ["The quick brown fox", "Once upon a time", "In the beginning", "Hello there, friend"]
CHAT = [{"role": "user", "content": "Tell me a story."}]


def client(s: Server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)


def reference(model, max_tokens: int) -> tuple[list, str]:
    """The greedy texts on an undisturbed server: the oracle each drained reply must be a prefix of."""
    with Server(model, *ARGS) as s:
        c = client(s)
        texts = [c.completions.create(model="synthetic-tiny", prompt=p, max_tokens=max_tokens, temperature=0).choices[0].text
                 for p in PROMPTS]
        chat = c.chat.completions.create(model="synthetic-tiny", messages=CHAT, max_tokens=max_tokens, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        return texts, chat.choices[0].message.content


def run_in_flight(s: Server, max_tokens: int, out: dict) -> list:
    """Start 4 streams and 1 non-streamed chat request; returns their threads. Each records
    (text, finish_reason) or the exception it raised."""
    c = client(s)

    def stream(k):
        try:
            text, fin = "", None
            for ch in c.completions.create(model="synthetic-tiny", prompt=PROMPTS[k], max_tokens=max_tokens, temperature=0,
                                           stream=True):
                for choice in ch.choices:
                    assert fin is None, "content after the finish chunk"
                    text += choice.text
                    fin = choice.finish_reason or fin
            out[k] = (text, fin)
        except Exception as e:  # recorded: the test fails on any client exception
            out[k] = e

    def whole():
        try:
            r = c.chat.completions.create(model="synthetic-tiny", messages=CHAT, max_tokens=max_tokens, temperature=0,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            out[4] = (r.choices[0].message.content, r.choices[0].finish_reason)
        except Exception as e:
            out[4] = e

    ts = [threading.Thread(target=stream, args=(k,)) for k in range(4)] + [threading.Thread(target=whole)]
    [t.start() for t in ts]
    return ts


def wait_running(s: Server, n: int, timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if s.gauge("kipp_active_choices") >= n and s.gauge("kipp_generation_tokens_total") >= 10:
            return
        time.sleep(0.02)
    raise AssertionError("the five requests never ran together")


def check_replies(out: dict, ref_texts: list, ref_chat: str, exact: bool) -> list:
    fins = []
    for k in range(5):
        got = out.get(k)
        assert isinstance(got, tuple), f"request {k} failed in the client: {got!r}"
        text, fin = got
        want = ref_chat if k == 4 else ref_texts[k]
        assert fin in ("length", "stop"), (k, fin)
        if exact:
            assert text == want, (k, text, want)
        else:
            assert want.startswith(text), (k, text[-40:], len(text), len(want))
        fins.append(fin)
    return fins


def test_drain_lets_running_requests_finish(synthetic_gguf):
    """Graceful path: the five finish on their own during the drain, with the undisturbed texts.
    They are long (1500 tokens, seconds of work) so the server is still draining when the
    503 checks run: with 60 tokens a fast machine finished all five and exited first."""
    model = synthetic_gguf("synthetic-tiny")
    ref_texts, ref_chat = reference(model, 1500)
    with Server(model, *ARGS, "--shutdown-timeout", "300") as s:
        out: dict = {}
        ts = run_in_flight(s, 1500, out)
        wait_running(s, 5)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        # draining: /health and new work get 503 with an OpenAI error body; the old ones continue
        st, body = s.request("GET", "/health")
        assert (st, json.loads(body)) == (503, {"status": "draining"})
        st, r = s.post("/v1/completions", {"prompt": "new", "max_tokens": 2})
        assert st == 503 and r["error"]["code"] == "shutting_down" and r["error"]["type"] == "server_error", r
        with pytest.raises(openai.APIStatusError) as ei:
            client(s).completions.create(model="synthetic-tiny", prompt="new", max_tokens=2)
        assert ei.value.status_code == 503
        assert s.gauge("kipp_active_choices") >= 1, "the five ended before the checks: nothing was draining"
        [t.join(timeout=300) for t in ts]
        assert s.proc.wait(timeout=30) == 0
        fins = check_replies(out, ref_texts, ref_chat, exact=True)
        assert fins == ["length"] * 5  # the tiny model's greedy text never reaches EOS


def test_drain_timeout_ends_requests_with_length(synthetic_gguf):
    """Timeout path: requests far too long for a 1 s drain end with "length" and a
    prefix of their undisturbed text, streams with a finish chunk and [DONE]."""
    model = synthetic_gguf("synthetic-tiny")
    ref_texts, ref_chat = reference(model, 1500)
    with Server(model, *ARGS, "--shutdown-timeout", "1") as s:
        out: dict = {}
        ts = run_in_flight(s, 1500, out)
        wait_running(s, 5)
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        [t.join(timeout=60) for t in ts]
        assert s.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 20
        fins = check_replies(out, ref_texts, ref_chat, exact=False)
        assert fins == ["length"] * 5
        assert any(len(out[k][0]) < len(ref_texts[k]) for k in range(4)), "no stream was cut: the test proves nothing"
    assert "shutdown timeout: ending" in s.stderr, s.stderr[-2000:]


def test_second_signal_ends_at_once(synthetic_gguf):
    model = synthetic_gguf("synthetic-tiny")
    ref_texts, ref_chat = reference(model, 1500)
    with Server(model, *ARGS, "--shutdown-timeout", "600") as s:
        out: dict = {}
        ts = run_in_flight(s, 1500, out)
        wait_running(s, 5)
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGINT)
        [t.join(timeout=60) for t in ts]
        assert s.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 20
        check_replies(out, ref_texts, ref_chat, exact=False)
    assert "second signal: ending" in s.stderr, s.stderr[-2000:]


def test_raw_stream_ends_with_finish_chunk_and_done(synthetic_gguf):
    """The wire itself: a stream cut by the drain still ends with a finish chunk and one [DONE]."""
    import http.client
    from serve_harness import check_stream, parse_sse
    model = synthetic_gguf("synthetic-tiny")
    with Server(model, *ARGS, "--shutdown-timeout", "0") as s:
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1500, "temperature": 0, "stream": True,
                                                         "stream_options": {"include_usage": True}}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        first = r.read1(200)
        s.proc.send_signal(signal.SIGTERM)
        raw = first + r.read()
        assert s.proc.wait(timeout=30) == 0
        chunks = parse_sse(raw)
        out = check_stream(chunks, 1, chat=False, include_usage=True)
        assert out[0][2] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] < 1500
