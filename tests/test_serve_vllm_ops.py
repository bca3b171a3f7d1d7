"""test_serve_vllm_ops.py - kipp-serve's vLLM-compatible operations
(issue 51 items 5 and 6): vLLM's request counters and latency histograms on
/metrics, parsed with prometheus_client and checked against the usage the
replies reported; response ids that are random (distinct across processes)
and that the access log writes exactly as the client received them; and the
per-request "priority" field ordering admission and preemption.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from serve_harness import Server, parse_sse

prom = pytest.importorskip("prometheus_client.parser")

NO_EOS = {"151643": -100, "151645": -100}  # <|endoftext|>, <|im_end|>: the reply runs to its budget
# vLLM's bucket bounds (vllm/v1/metrics/loggers.py), written as prometheus_client writes them
TTFT_LE = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0",
           "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"]
ITL_LE = ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1.0", "2.5", "5.0",
          "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"]
REQ_LE = ["0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0",
          "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf"]
REQ_HISTS = ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
             "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds")


def families(s: Server) -> dict:
    return {f.name: f for f in prom.text_string_to_metric_families(s.metrics())}


def hist(fams: dict, name: str) -> dict:
    """A histogram's samples: {"le": [(le, cumulative count)], "count", "sum", "labels"} (one label set)."""
    f = fams[name]
    assert f.type == "histogram", f.type
    out = {"le": [], "labels": set()}
    for x in f.samples:
        lab = {k: v for k, v in x.labels.items() if k != "le"}
        out["labels"].add(tuple(sorted(lab.items())))
        if x.name == name + "_bucket":
            out["le"].append((x.labels["le"], x.value))
        elif x.name == name + "_count":
            out["count"] = x.value
        elif x.name == name + "_sum":
            out["sum"] = x.value
    return out


def test_vllm_counters_and_histograms_match_usage(model):
    """After a mix of requests (completions and chat, streamed and not, n=2, a
    stop and a length finish), vLLM's token counters equal the summed usage, the
    success counter counts each choice under its finish_reason, and every
    histogram has vLLM's bounds, one observation per choice (TTFT, e2e, phases)
    or per later step (inter-token latency), and cumulative buckets."""
    bodies = [("/v1/completions", {"prompt": "hello there", "max_tokens": 7, "temperature": 0, "logit_bias": NO_EOS}),
              ("/v1/completions", {"prompt": "a b c", "max_tokens": 5, "n": 2, "temperature": 0.8, "seed": 1,
                                   "logit_bias": NO_EOS}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                        "temperature": 0, "logit_bias": NO_EOS}),
              ("/v1/completions", {"prompt": "stream me", "max_tokens": 4, "temperature": 0, "stream": True,
                                   "stream_options": {"include_usage": True}, "logit_bias": NO_EOS})]
    with Server(model, "--ctx", "256") as s:
        fams = families(s)
        assert hist(fams, "vllm:time_to_first_token_seconds")["count"] == 0
        prompt = gen = choices = 0
        reasons = {"stop": 0, "length": 0, "abort": 0}
        for k, (path, b) in enumerate(bodies):
            st, r = s.post(path, b)
            assert st == 200, r
            if b.get("stream"):
                chunks = parse_sse(r)
                usage = chunks[-1]["usage"]
                fins = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            else:
                usage = r["usage"]
                fins = [c["finish_reason"] for c in r["choices"]]
            if k == 0:  # the same greedy request, stopped by the last characters of this reply: a "stop" finish
                bodies.append((path, {**b, "stop": [r["choices"][0]["text"][-2:]]}))
            prompt += usage["prompt_tokens"]
            gen += usage["completion_tokens"]
            choices += len(fins)
            for f in fins:
                reasons[f] += 1
        assert reasons["length"] >= 4 and reasons["stop"] >= 1, reasons  # both labels are exercised
        assert s.wait_idle()
        fams = families(s)
        name = "synthetic-tiny"
        base = {"model_name": name, "engine": "0"}
        # prometheus_client strips a counter family's _total suffix; the samples keep it
        pt = [x for x in fams["vllm:prompt_tokens"].samples if x.name == "vllm:prompt_tokens_total"]
        gt = [x for x in fams["vllm:generation_tokens"].samples if x.name == "vllm:generation_tokens_total"]
        assert [(x.labels, x.value) for x in pt] == [(base, prompt)]
        assert [(x.labels, x.value) for x in gt] == [(base, gen)]
        succ = {x.labels["finished_reason"]: x.value for x in fams["vllm:request_success"].samples
                if x.name == "vllm:request_success_total" and {k: x.labels[k] for k in base} == base}
        assert succ == reasons, (succ, reasons)
        for hname, les in [("vllm:time_to_first_token_seconds", TTFT_LE), ("vllm:inter_token_latency_seconds", ITL_LE)] + \
                          [(h, REQ_LE) for h in REQ_HISTS]:
            h = hist(fams, hname)
            assert [le for le, _ in h["le"]] == les, hname
            counts = [c for _, c in h["le"]]
            assert counts == sorted(counts) and counts[-1] == h["count"], (hname, counts)
            assert h["labels"] == {tuple(sorted(base.items()))}, h["labels"]
            assert h["sum"] >= 0
            if hname != "vllm:inter_token_latency_seconds":
                assert h["count"] == choices, (hname, h["count"], choices)
        # at most one inter-token gap per token after a choice's first (a speculative greedy step may emit several)
        itl = hist(fams, "vllm:inter_token_latency_seconds")
        assert 0 < itl["count"] <= gen - choices
        e2e, ttft = hist(fams, "vllm:e2e_request_latency_seconds"), hist(fams, "vllm:time_to_first_token_seconds")
        assert e2e["sum"] >= ttft["sum"] > 0
        # the older names keep their values
        kpt = [x.value for x in fams["kipp_prompt_tokens"].samples if x.name == "kipp_prompt_tokens_total"]
        assert kpt == [prompt]
        # a client that goes away mid-stream: its choice counts as finished_reason "abort", and is timed
        sock = _stream_open(s.port, {"prompt": "gone", "max_tokens": 200, "stream": True, "logit_bias": NO_EOS})
        sock.recv(100)
        sock.close()
        end = time.time() + 30
        while hist(families(s), "vllm:e2e_request_latency_seconds")["count"] < choices + 1 and time.time() < end:
            time.sleep(0.02)
        fams = families(s)
        succ = {x.labels["finished_reason"]: x.value for x in fams["vllm:request_success"].samples
                if x.name == "vllm:request_success_total"}
        assert succ == {**reasons, "abort": 1}, succ
        assert hist(fams, "vllm:e2e_request_latency_seconds")["count"] == choices + 1


def test_itl_counts_every_step_without_speculation(model):
    """With --no-spec every step emits one token, so the inter-token histogram
    has exactly completion_tokens - 1 observations per choice."""
    with Server(model, "--ctx", "256", "--no-spec") as s:
        total = 0
        for k in range(3):
            st, r = s.post("/v1/completions", {"prompt": f"p{k}", "max_tokens": 6 + k, "temperature": 0,
                                               "logit_bias": NO_EOS})
            assert st == 200, r
            total += r["usage"]["completion_tokens"] - 1
        assert s.wait_idle()
        assert hist(families(s), "vllm:inter_token_latency_seconds")["count"] == total


ID_RE = {"chat": re.compile(r"^chatcmpl-[0-9A-Za-z]{24}$"), "completions": re.compile(r"^cmpl-[0-9A-Za-z]{24}$")}


def _ids_and_log(model) -> tuple[list, list]:
    """Chat and completions, streamed and not, on a fresh server with --access-log:
    [(endpoint, id the client received)] and the access log's request lines."""
    got = []
    with Server(model, "--ctx", "256", "--access-log") as s:
        for chat in (0, 1):
            path = "/v1/chat/completions" if chat else "/v1/completions"
            body = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
            body.update(max_tokens=3, temperature=0)
            st, r = s.post(path, body)
            assert st == 200, r
            got.append(("chat" if chat else "completions", r["id"]))
            st, raw = s.post(path, {**body, "stream": True})
            assert st == 200
            ids = {c["id"] for c in parse_sse(raw)}
            assert len(ids) == 1, ids  # every chunk of a stream carries the same id
            got.append(("chat" if chat else "completions", ids.pop()))
    logs = [json.loads(l) for l in s.stderr.splitlines() if l.startswith("{")]
    return got, [e for e in logs if e.get("event") == "request" and e["method"] == "POST"]


def test_ids_random_and_logged_as_sent(model):
    a, log_a = _ids_and_log(model)
    b, _ = _ids_and_log(model)
    for kind, i in a + b:
        assert ID_RE[kind].match(i), (kind, i)
    # a restarted process starts no sequence over: every id of both processes differs
    assert len({i for _, i in a + b}) == len(a) + len(b), (a, b)
    # the access log writes exactly the id each client received, on the path it used
    assert [("chat" if "/chat/" in e["path"] else "completions", e["id"]) for e in log_a] == a, (log_a, a)


def test_priority_field_is_validated(model):
    with Server(model, "--ctx", "256") as s:
        for bad, what in [(1.5, "an integer"), ("1", "an integer"), (2 ** 31, "out of range"), (True, "an integer")]:
            for path, body in [("/v1/completions", {"prompt": "x"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})]:
                st, r = s.post(path, {**body, "max_tokens": 1, "priority": bad})
                assert st == 400 and r["error"]["param"] == "priority" and what in r["error"]["message"], (bad, r)
        for ok in (-5, 0, 7):
            st, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                                    "priority": ok})
            assert st == 200, r


def _stream_open(port: int, body: dict) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def _finish_order(s: Server, first: dict, second: dict) -> list:
    """With --max-batch 8 held by a streamed n=8 request, queue `first` then
    `second` (n=8 each, so only one fits at a time), release the batch, and
    return the tags of the two in the order they finished."""
    busy = _stream_open(s.port, {"prompt": "busy", "max_tokens": 200, "n": 8, "stream": True, "temperature": 0,
                                 "logit_bias": NO_EOS})
    busy.recv(100)
    end = time.time() + 30
    while s.gauge("kipp_active_choices") < 8 and time.time() < end:
        time.sleep(0.01)
    order, lock = [], threading.Lock()

    def go(body):
        st, r = s.post("/v1/completions", body)
        assert st == 200, r
        with lock:
            order.append(body["prompt"])

    threads = []
    for body, depth in ((first, 1), (second, 2)):
        threads.append(threading.Thread(target=go, args=(body,)))
        threads[-1].start()
        end = time.time() + 30
        while s.gauge("kipp_queue_depth") < depth and time.time() < end:
            time.sleep(0.01)
        assert s.gauge("kipp_queue_depth") == depth
    busy.close()  # the busy request is cancelled: the batch frees at once
    [t.join(timeout=120) for t in threads]
    assert s.wait_idle()
    return order


def test_priority_orders_admission(model):
    """A queued priority -1 request is admitted before a priority 5 one that
    arrived earlier; equal priorities keep arrival order."""
    def body(tag, prio):
        return {"prompt": tag, "max_tokens": 24, "n": 8, "temperature": 0, "logit_bias": NO_EOS, "priority": prio}

    with Server(model, "--ctx", "512", "--max-batch", "8", "--max-queue", "8") as s:
        assert _finish_order(s, body("late", 5), body("urgent", -1)) == ["urgent", "late"]
        assert _finish_order(s, body("one", 3), body("two", 3)) == ["one", "two"]
        assert _finish_order(s, body("dflt", 0), body("neg", -2)) == ["neg", "dflt"]


def test_priority_orders_preemption(synthetic_gguf):
    """--kv-pool-mib 1 on the tiny model is a pool of 4 blocks (128 positions).
    A priority 5 request is admitted first; a priority -1 request joins it while
    it runs; when the two outgrow the pool, the less urgent one is preempted
    although it is the older, so the urgent one finishes first. Outputs still
    equal an unpooled server's."""
    tiny = synthetic_gguf("synthetic-tiny")
    low = {"prompt": "low", "max_tokens": 100, "temperature": 0.7, "seed": 1, "logit_bias": NO_EOS, "priority": 5}
    high = {"prompt": "high", "max_tokens": 100, "temperature": 0.7, "seed": 2, "logit_bias": NO_EOS, "priority": -1}
    with Server(tiny, "--ctx", "512", "--kv-pool-mib", "0") as plain:
        want = {b["prompt"]: plain.post("/v1/completions", b)[1]["choices"][0]["text"] for b in (low, high)}
    preempted_runs = 0
    with Server(tiny, "--ctx", "512", "--kv-pool-mib", "1", "--no-spec") as s:
        for _ in range(3):
            before = s.gauge("kipp_preemptions_total")
            order, texts, lock = [], {}, threading.Lock()
            sock = _stream_open(s.port, {**low, "stream": True})
            buf = b""
            while b"data: {" not in buf:  # low holds a session and is generating
                buf += sock.recv(4096)

            def read_low():
                nonlocal buf
                while not buf.endswith(b"\r\n0\r\n\r\n"):  # the stream's last chunk
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                with lock:
                    order.append("low")

            def post_high():
                st, r = s.post("/v1/completions", high)
                assert st == 200, r
                with lock:
                    order.append("high")
                texts["high"] = r["choices"][0]["text"]

            ts = [threading.Thread(target=read_low), threading.Thread(target=post_high)]
            [t.start() for t in ts]
            [t.join(timeout=120) for t in ts]
            sock.close()
            body = buf.split(b"\r\n\r\n", 1)[1]
            text = "".join(c["choices"][0]["text"] for c in parse_sse(_dechunk(body)) if c["choices"])
            assert text == want["low"] and texts["high"] == want["high"]
            assert s.wait_idle()
            if s.gauge("kipp_preemptions_total") > before:
                preempted_runs += 1
                assert order == ["high", "low"], order
    assert preempted_runs > 0, "the two requests were meant to outgrow the pool together"


def _dechunk(body: bytes) -> bytes:
    """HTTP/1.1 chunked transfer decoding of a whole body."""
    out, i = b"", 0
    while True:
        j = body.index(b"\r\n", i)
        n = int(body[i:j].split(b";")[0], 16)
        if n == 0:
            return out
        out += body[j + 2:j + 2 + n]
        i = j + 2 + n + 2
