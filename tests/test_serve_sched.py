"""test_serve_sched.py - kipp-serve's scheduler through HTTP (seed 000
phases 5-6): mixed-length concurrent requests reproduce their
isolated outputs; a full queue answers 429; a client that hangs up mid-stream
frees its choices and KV blocks at once; /metrics parses with
prometheus_client's parser. Short, bounded loads on the tiny model.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from serve_harness import Server, concurrent_equals_alone, open_stream

prom = pytest.importorskip("prometheus_client.parser")

N_CTX = 256
SERVE_ARGS = ("--max-batch", "16")  # conftest.srv


def _bodies():
    # prompts of 1..~90 tokens (several 32-token prefill chunks), mixed n, lengths and sampling
    out = []
    for i in range(6):
        b = {"prompt": "word " * (i * 17 + 1), "max_tokens": 6 + 5 * i, "n": 1 + i % 3, "seed": 100 + i,
             "temperature": [0, 0.7, 1.2][i % 3], "top_k": [0, 40, 0][i % 3], "presence_penalty": 0.5 * (i % 2),
             "repetition_penalty": 1.0 + 0.1 * (i % 2)}
        out.append(("/v1/completions", b))
    out.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": "tell me " * 20}], "max_tokens": 12,
                                         "n": 2, "seed": 5, "temperature": 0.9}))
    return out


def _texts(r):
    return [c.get("text", c.get("message", {}).get("content")) for c in r["choices"]]


def test_concurrent_mixed_requests_match_isolated(srv):
    bodies = _bodies()
    isolated = []
    for path, b in bodies:
        st, r = srv.post(path, b)
        assert st == 200, r
        isolated.append(_texts(r))
    results = [None] * len(bodies)

    def go(i):
        results[i] = srv.post(*bodies[i])

    for _round in range(2):  # twice: cold and warm
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
        [t.start() for t in threads]
        [t.join(timeout=300) for t in threads]
        for i, (st, r) in enumerate(results):
            assert st == 200, r
            assert _texts(r) == isolated[i], f"request {i} differs when batched"
    assert srv.wait_idle()


def test_client_hangs_up_mid_stream(srv):
    assert srv.wait_idle()
    before = srv.gauge("kipp_cancelled_total")
    s = open_stream(srv.port, {"prompt": "x", "max_tokens": 200, "n": 4, "stream": True, "temperature": 0})
    got = b""
    deadline = time.time() + 30
    while got.count(b"data: ") < 3 and time.time() < deadline:
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200")
    assert srv.gauge("kipp_active_choices") == 4
    s.close()
    t0 = time.time()
    assert srv.wait_idle(timeout=5), "choices or KV blocks still held after the client left"
    assert time.time() - t0 < 2.0
    assert srv.gauge("kipp_cancelled_total") == before + 1
    # the server is still healthy
    assert srv.post("/v1/completions", {"prompt": "a", "max_tokens": 2})[0] == 200


def test_queue_full_answers_429(synthetic_gguf):
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--max-batch", "8", "--max-queue", "1") as s:
        # greedy: the tiny model's greedy text never reaches EOS, so the busy
        # request holds the batch for all 400 tokens whatever the machine's speed
        busy = open_stream(s.port, {"prompt": "x", "max_tokens": 400, "n": 8, "stream": True, "temperature": 0})
        busy.recv(100)  # the response has started; admission may still be pending
        deadline = time.time() + 30
        while s.gauge("kipp_active_choices") < 8 and time.time() < deadline:  # admitted: the batch is full
            time.sleep(0.02)
        queued = open_stream(s.port, {"prompt": "y", "max_tokens": 400, "n": 8, "stream": True, "temperature": 0})
        deadline = time.time() + 30
        while s.gauge("kipp_queue_depth") < 1 and time.time() < deadline:
            time.sleep(0.02)
        assert s.gauge("kipp_queue_depth") == 1, "the second request never waited in the queue"
        st, r = s.post("/v1/completions", {"prompt": "z", "max_tokens": 1})
        assert st == 429 and r["error"]["code"] == "queue_full" and "retry" in r["error"]["message"]
        busy.close(), queued.close()
        assert s.wait_idle(timeout=10)
        assert s.gauge("kipp_queue_depth") == 0


def test_metrics_parse(srv):
    srv.post("/v1/completions", {"prompt": "a", "max_tokens": 3})
    fams = {f.name: f for f in prom.text_string_to_metric_families(srv.metrics())}
    for name in ("kipp_requests", "kipp_prompt_tokens", "kipp_generation_tokens", "kipp_time_to_first_token_seconds",
                 "kipp_inter_token_latency_seconds", "kipp_queue_depth", "kipp_active_choices", "kipp_kv_blocks_in_use"):
        assert name in fams, (name, sorted(fams))
    assert fams["kipp_time_to_first_token_seconds"].type == "histogram"
    ok = [s for s in fams["kipp_requests"].samples if s.labels.get("status") == "2xx" and s.value > 0]
    assert ok, fams["kipp_requests"].samples
    gen = [s.value for s in fams["kipp_generation_tokens"].samples]
    assert gen and gen[0] >= 3


def test_keepalive_connection_reuse(srv):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    for _ in range(3):
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "a", "max_tokens": 2}))
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["choices"]
    c.close()


def test_long_generation_outlives_idle_timeout(synthetic_gguf):
    """--idle-timeout 1: a completion that runs for seconds without a byte on the
    wire is not idle; streamed and non-streamed both finish, and the connection's
    idle timer runs again afterwards."""
    no_eos = {"151643": -100, "151645": -100}
    # --no-spec: greedy copying text would otherwise finish in well under a second; 1600 steps of
    # 4 rows, since a quiet Zen 5 ran 400 of them in 1.3 s once the head took the BF16 dot
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "2048", "--idle-timeout", "1", "--no-spec") as s:
        body = {"prompt": "x", "max_tokens": 1600, "temperature": 0, "logit_bias": no_eos, "n": 4}
        t0 = time.time()
        st, r = s.post("/v1/completions", body)
        assert st == 200 and r["usage"]["completion_tokens"] == 4 * 1600, r
        assert time.time() - t0 > 1.5, "too fast to test the idle timeout: raise max_tokens"
        st, raw = s.request("POST", "/v1/completions", {**body, "stream": True})
        assert st == 200 and raw.endswith(b"data: [DONE]\n\n")
        c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        assert c.recv(10) == b""  # an idle connection is still closed
        c.close()


def test_kv_budget_admission(synthetic_gguf):
    """--kv-mib 1 on the tiny model (8 KiB per position) is 4 blocks of 32: a request
    that alone needs more is a 400; requests that fit together wait their turn and
    still reproduce their isolated outputs. --kv-mib budgets unpooled serving
    (--kv-pool-mib 0); test_serve_pool.py has the pooled twin."""
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--kv-mib", "1", "--kv-pool-mib", "0") as s:
        st, r = s.post("/v1/completions", {"prompt": "x", "max_tokens": 100, "n": 2})
        assert st == 400 and r["error"]["code"] == "kv_budget_exceeded" and "--kv-mib" in r["error"]["message"]
        concurrent_equals_alone(s, 40)
