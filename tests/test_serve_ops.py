"""test_serve_ops.py - kipp-serve's operational surface: --api-key (Bearer and
X-Api-Key, 401 in the OpenAI shape, /health and /metrics open unless
--protect-ops), CORS (--cors-origin), the JSON access log and timestamped
lines, the port in bind errors, JSON bodies for 404/405/431, HEAD /health,
--version, /tokenize and /detokenize (against the Hugging Face tokenizer),
--alias everywhere, character text_offset, the queue limit counting waiting
requests only, and vLLM's router gauges parsed with prometheus_client.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import threading
import time

import pytest

from serve_harness import REPO, SERVE, Server, open_stream

openai = pytest.importorskip("openai")
prom = pytest.importorskip("prometheus_client.parser")

KEY = "sekret-key-123"
ORIGIN = "https://app.example.com"
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z kipp-serve: ")


def oa(s: Server, key: str = "none") -> "openai.OpenAI":
    return openai.OpenAI(base_url=s.base + "/v1", api_key=key, max_retries=0, timeout=120)


def test_api_key_cors_access_log(model):
    with Server(model, "--ctx", "256", "--api-key", KEY, "--cors-origin", ORIGIN, "--access-log") as s:
        st, r = s.post("/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert st == 401 and r["error"]["code"] == "invalid_api_key" and r["error"]["type"] == "invalid_request_error", r
        with pytest.raises(openai.AuthenticationError):
            oa(s, "wrong").completions.create(model="synthetic-tiny", prompt="a", max_tokens=2)
        full = oa(s, KEY).completions.create(model="synthetic-tiny", prompt="hello there", max_tokens=5, temperature=0)
        st, r = s.post("/v1/completions", {"prompt": "a", "max_tokens": 2},
                       headers={"Content-Type": "application/json", "X-Api-Key": KEY})
        assert st == 200, r
        assert s.request("GET", "/v1/models")[0] == 401
        assert s.request("GET", "/health")[0] == 200 and s.request("GET", "/metrics")[0] == 200  # open by default
        # CORS: the preflight needs no key; every response carries the origin
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request("OPTIONS", "/v1/chat/completions", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                              "Access-Control-Request-Headers": "authorization,content-type"})
        r = c.getresponse()
        assert r.status == 204 and r.read() == b""
        assert r.getheader("Access-Control-Allow-Origin") == ORIGIN
        assert "POST" in r.getheader("Access-Control-Allow-Methods")
        assert r.getheader("Access-Control-Allow-Headers") == "authorization,content-type"
        c.request("GET", "/health", headers={"Origin": ORIGIN})
        r = c.getresponse()
        r.read()
        assert r.status == 200 and r.getheader("Access-Control-Allow-Origin") == ORIGIN
        c.close()
    lines = s.stderr.splitlines()
    logs = [json.loads(l) for l in lines if l.startswith("{")]
    assert all(TS.match(l) for l in lines if not l.startswith("{")), lines
    assert all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", e["ts"]) for e in logs)
    mine = [e for e in logs if e.get("id") == full.id]
    assert len(mine) == 1, logs
    e = mine[0]
    assert (e["method"], e["path"], e["status"]) == ("POST", "/v1/completions", 200)
    assert e["prompt_tokens"] == full.usage.prompt_tokens and e["completion_tokens"] == full.usage.completion_tokens == 5
    assert e["cached_tokens"] == 0 and 0 < e["ttft_ms"] <= e["duration_ms"]
    assert [x["status"] for x in logs if x["method"] == "POST"][:2] == [401, 401]
    assert any(x["method"] == "OPTIONS" and x["status"] == 204 for x in logs)


def test_protect_ops(model):
    with Server(model, "--ctx", "256", "--api-key", KEY, "--protect-ops") as s:
        st, body = s.request("GET", "/health")
        assert st == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        assert s.request("GET", "/metrics")[0] == 401
        assert s.request("GET", "/health", headers={"Authorization": f"Bearer {KEY}"})[0] == 200
        assert s.request("GET", "/metrics", headers={"X-Api-Key": KEY})[0] == 200


def test_errors_json_head_version_bind(model):
    with Server(model, "--ctx", "256") as s:
        for method, path, want in (("GET", "/nope", 404), ("DELETE", "/health", 405), ("GET", "/v1/completions", 405),
                                   ("PUT", "/tokenize", 405)):
            st, body = s.request(method, path)
            assert st == want and json.loads(body)["error"]["message"], (method, path, st, body)
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
        resp = b""
        while b"}}" not in resp:
            d = sock.recv(65536)
            if not d:
                break
            resp += d
        sock.close()
        head, body = resp.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 431") and b"application/json" in head, head
        assert "--max-header" in json.loads(body)["error"]["message"]
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request("HEAD", "/health")
        r = c.getresponse()
        assert r.status == 200 and r.read() == b""
        c.close()
        # a second server on the same port names that port
        r = subprocess.run([str(SERVE), "--model", str(model), "--port", str(s.port), "--threads", "1"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert f"port {s.port}" in r.stderr and "port 0" not in r.stderr, r.stderr
        assert all(TS.match(l) for l in r.stderr.splitlines()), r.stderr
    v = subprocess.run([str(SERVE), "--version"], capture_output=True, text=True, timeout=10)
    assert v.returncode == 0 and re.match(r"^kipp-serve \d+\.\d+\.\d+ \(\S+\)\n$", v.stdout), v.stdout
    h = subprocess.run([str(SERVE), "--help"], capture_output=True, text=True, timeout=10).stdout
    for flag in ("--shutdown-timeout", "--api-key", "--protect-ops", "--cors-origin", "--access-log", "--version", "--alias"):
        assert flag in h, flag


def test_tokenize_detokenize(model):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(REPO / "data" / "qwen3" / "qwen3-tokenizer" / "tokenizer.json"))
    text = "Héllo wörld, 你好! <|im_start|>"
    with Server(model, "--ctx", "256") as s:
        st, r = s.post("/tokenize", {"model": "synthetic-tiny", "prompt": text})
        assert st == 200 and r["tokens"] == hf.encode(text, add_special_tokens=False).ids, r
        assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 256
        st, d = s.post("/detokenize", {"tokens": r["tokens"]})
        assert (st, d) == (200, {"prompt": text})
        # a chat prompt: the count a chat completion reports as prompt_tokens
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
        st, t = s.post("/tokenize", {"messages": msgs})
        usage = oa(s).chat.completions.create(model="synthetic-tiny", messages=msgs, max_tokens=1).usage
        assert st == 200 and t["count"] == usage.prompt_tokens
        want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
        assert t["tokens"] == hf.encode(want, add_special_tokens=False).ids
        for body, param in (({"prompt": "a", "bogus": 1}, "bogus"), ({"prompt": "a", "messages": msgs}, "messages"),
                            ({"messages": msgs, "add_generation_prompt": False}, "add_generation_prompt")):
            st, r = s.post("/tokenize", body)
            assert st == 400 and r["error"]["param"] == param, r
        st, r = s.post("/detokenize", {"tokens": [1, 999999]})
        assert st == 400 and "tokens[1]" in r["error"]["message"], r
        st, r = s.post("/tokenize", {"model": "nope", "prompt": "a"})
        assert st == 404 and r["error"]["code"] == "model_not_found"


def test_alias_everywhere(model):
    with Server(model, "--ctx", "256", "--alias", "qwen3") as s:
        c = oa(s)
        assert c.completions.create(model="qwen3", prompt="a", max_tokens=2).model == "qwen3"
        assert c.chat.completions.create(model="synthetic-tiny", messages=[{"role": "user", "content": "a"}],
                                         max_tokens=2).model == "qwen3"
        assert [m.id for m in c.models.list().data] == ["qwen3", "synthetic-tiny"]
        assert c.models.retrieve("qwen3").id == "qwen3"
        assert c.models.retrieve("synthetic-tiny").id == "synthetic-tiny"
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("gpt-4")
        st, body = s.request("GET", "/v1/models/gpt-4")
        assert st == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        fams = {f.name: f for f in prom.text_string_to_metric_families(s.metrics())}
        assert fams["vllm:num_requests_running"].samples[0].labels["model_name"] == "qwen3"


def test_text_offset_counts_characters(model):
    with Server(model, "--ctx", "256") as s:
        for echo in (False, True):
            prompt = "naïve 你好"
            st, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1,
                                               "echo": echo})
            assert st == 200, r
            ch = r["choices"][0]
            toks, offs = ch["logprobs"]["tokens"], ch["logprobs"]["text_offset"]
            assert any(ord(x) > 127 for x in ch["text"][len(prompt) if echo else 0:]), "needs non-ASCII output to tell chars from bytes"
            # every token here is whole characters, so offsets are the running sum of token lengths
            assert "".join(toks) == ch["text"]
            assert offs == [sum(len(t) for t in toks[:i]) for i in range(len(toks))]


def test_queue_limit_counts_waiting_only(model):
    """--max-queue 1 --max-batch 8: six simultaneous n=1 requests fit the batch, so none is refused."""
    with Server(model, "--ctx", "256", "--max-queue", "1", "--max-batch", "8") as s:
        for _ in range(3):
            go = threading.Barrier(6)
            out = [None] * 6

            def one(k):
                go.wait()
                out[k] = s.post("/v1/completions", {"prompt": f"q{k}", "max_tokens": 8, "temperature": 0})[0]

            ts = [threading.Thread(target=one, args=(k,)) for k in range(6)]
            [t.start() for t in ts]
            [t.join(timeout=120) for t in ts]
            assert out == [200] * 6


def _vllm(s: Server) -> dict:
    fams = {f.name: f for f in prom.text_string_to_metric_families(s.metrics())}
    return {n: fams[n].samples for n in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                         "vllm:kv_cache_usage_perc", "vllm:cache_config_info")}


def test_vllm_router_gauges(model):
    with Server(model, "--ctx", "512", "--max-batch", "8") as s:
        g = _vllm(s)
        assert [x.value for x in g["vllm:num_requests_running"]] == [0]
        assert [x.value for x in g["vllm:num_requests_waiting"]] == [0]
        assert [x.value for x in g["vllm:kv_cache_usage_perc"]] == [0]
        info = g["vllm:cache_config_info"]
        assert len(info) == 1 and info[0].value == 1 and info[0].labels["block_size"] == "32"
        pool = {x.labels["state"]: x.value for x in prom_samples(s, "kipp_kv_pool_blocks")}
        assert info[0].labels["num_gpu_blocks"] == str(int(pool["total"]))
        # one n=8 request fills the batch, a second waits: running 1, waiting 1
        busy = open_stream(s.port, {"prompt": "x", "max_tokens": 400, "n": 8, "stream": True, "temperature": 0})
        busy.recv(100)
        end = time.time() + 30
        while s.gauge("kipp_active_choices") < 8 and time.time() < end:
            time.sleep(0.02)
        queued = open_stream(s.port, {"prompt": "y", "max_tokens": 400, "n": 8, "stream": True, "temperature": 0})
        end = time.time() + 30
        while (s.gauge("kipp_queue_depth") < 1 or s.gauge("kipp_generation_tokens_total") < 16) and time.time() < end:
            time.sleep(0.02)  # blocks are taken as positions are evaluated: wait for tokens
        g = _vllm(s)
        pool = {x.labels["state"]: x.value for x in prom_samples(s, "kipp_kv_pool_blocks")}
        assert [x.value for x in g["vllm:num_requests_running"]] == [1]
        assert [x.value for x in g["vllm:num_requests_waiting"]] == [1]
        usage = g["vllm:kv_cache_usage_perc"][0].value
        assert 0 < usage <= 1
        assert abs(usage - (pool["total"] - pool["available"]) / pool["total"]) <= 8 / pool["total"]  # a step may pass between scrapes
        busy.close(), queued.close()
        assert s.wait_idle(timeout=20)
        g = _vllm(s)
        assert [x.value for x in g["vllm:num_requests_running"]] == [0]
        assert [x.value for x in g["vllm:num_requests_waiting"]] == [0]
        assert [x.value for x in g["vllm:kv_cache_usage_perc"]] == [0]


def prom_samples(s: Server, name: str) -> list:
    return [x for f in prom.text_string_to_metric_families(s.metrics()) if f.name == name for x in f.samples]


def test_engine_notes_are_timestamped(monkeypatch, model):
    """The library's notes (base/log.h) reach kipp-serve's log as its own timestamped lines
    (an unknown KIPP_ISA level makes the cpu backend say which it runs, on any CPU), and the CLI's
    default sink writes them as "kipp: ..." lines."""
    gguf = model
    monkeypatch.setenv("KIPP_ISA", "no-such-level")
    with Server(gguf, "--ctx", "64") as s:
        assert s.request("GET", "/health")[0] == 200
    lines = [l for l in s.stderr.splitlines() if l]
    note = [l for l in lines if "cpu backend:" in l and "KIPP_ISA=no-such-level" in l]
    assert len(note) == 1 and TS.match(note[0]), lines
    assert all(TS.match(l) for l in lines if not l.startswith("{")), lines
    cli = subprocess.run([str(REPO / "build" / "kipp"), "generate", "--model", str(gguf), "--prompt", "a",
                          "--max-tokens", "1"], capture_output=True, text=True)
    assert cli.returncode == 0 and re.search(r"^kipp: cpu backend: .*KIPP_ISA=no-such-level", cli.stderr, re.M), cli.stderr
