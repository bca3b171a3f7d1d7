"""test_serve_step.py - kipp-serve's stall-free steps (--step-ms) and the
per-step metrics (sched.c, step_cost.c, metrics.c), on the tiny model:
  - --step-ms's usage errors name the value and the accepted range;
  - with a 1 ms target (every step that decodes holds prefill to the oldest
    prompt's 16-token minimum) concurrent requests still reproduce their
    isolated outputs, and the capped-steps counter moves;
  - /metrics carries kipp_step_seconds per phase, the whole step, vLLM's
    iteration_tokens_total and the fitted costs, with values that add up:
    every phase counted once per step, the phases summing to the step, the
    tokens per step summing to what the requests evaluated.
  - every step while prompts prefill carries the decoding choices' tokens
    (kipp_step_kind_total: no prefill-only step while a choice decodes), a
    prompt beside more decoding choices is cut to the time target over
    several steps, and a burst (as many prompts as decoding choices) goes in
    one step beside the decodes (kipp_step_prefill_burst_total), with the
    burst's outputs equal to its isolated ones.
No timing is asserted: only counts, sums and signs.
"""
from __future__ import annotations

import http.client
import json
import subprocess
import threading

import pytest

from serve_harness import SERVE, Server

prom = pytest.importorskip("prometheus_client.parser")

PHASES = ("plan", "engine", "sample", "lock", "publish")


def _samples(text: str) -> dict:
    """{(name, frozenset(labels)): value} of a Prometheus exposition."""
    out = {}
    for fam in prom.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_step_ms_usage_errors(synthetic_gguf):
    model = str(synthetic_gguf("synthetic-tiny"))
    for bad in ("abc", "-1", "60001", "1.5", "", "auto2"):
        r = subprocess.run([str(SERVE), "--model", model, "--step-ms", bad], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, r.stderr
        assert f"--step-ms '{bad}' is invalid, expected auto, 0 (off: the token budget alone) or a target in 1..60000 ms" \
            in r.stderr, r.stderr
    r = subprocess.run([str(SERVE), "--model", model, "--step-ms"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--step-ms needs a value" in r.stderr, r.stderr
    r = subprocess.run([str(SERVE), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--step-ms 0|auto|MS" in r.stdout


def _bodies():
    # one short prompt decoding long, then longer prompts that prefill while it decodes
    return [{"prompt": "word " * (40 * k + 2), "max_tokens": 24 - 4 * k, "temperature": [0, 0.8][k % 2], "seed": 7 + k}
            for k in range(4)]


@pytest.mark.parametrize("step_ms", ["1", "0", "auto"])
def test_capped_steps_keep_outputs(synthetic_gguf, step_ms):
    # a 64-token budget spreads the prompts over several steps, so later ones prefill while earlier ones decode
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "256", "--step-ms", step_ms, "--step-tokens", "64",
                "--no-spec") as s:
        bodies = _bodies()
        alone = []
        for b in bodies:
            st, r = s.post("/v1/completions", b)
            assert st == 200, r
            alone.append(r["choices"][0]["text"])
        out = [None] * len(bodies)

        def go(i):
            out[i] = s.post("/v1/completions", bodies[i])

        for _round in range(2):
            ts = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=300)
            assert [o[0] for o in out] == [200] * len(bodies), out
            assert [o[1]["choices"][0]["text"] for o in out] == alone
        capped, burst = s.gauge("kipp_step_prefill_capped_total"), s.gauge("kipp_step_prefill_burst_total")
        # 1 ms is below any step here: every step that decodes beside a prompt of more than 16 tokens is cut,
        # unless the prompts are a burst (as many as the decoding choices), which take the token budget
        if step_ms != "auto":  # auto's cuts depend on the measured costs
            assert capped + burst >= 1 if step_ms == "1" else capped == 0, (capped, burst)
        assert s.wait_idle()


def test_step_metrics_add_up(synthetic_gguf):
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "256", "--no-spec", "--kv-pool-mib", "0") as s:
        bodies = _bodies()
        res = [None] * len(bodies)

        def go(i):
            res[i] = s.post("/v1/completions", bodies[i])

        ts = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=300)
        assert all(r[0] == 200 for r in res), res
        assert s.wait_idle()
        m = _samples(s.metrics())
    steps = m[("kipp_scheduler_steps_total", frozenset())]
    assert steps >= 4
    total = 0.0
    for ph in PHASES:
        lab = frozenset({("phase", ph)})
        assert m[("kipp_step_seconds_count", lab)] == steps, ph
        assert m[("kipp_step_seconds_bucket", frozenset({("phase", ph), ("le", "+Inf")}))] == steps, ph
        assert m[("kipp_step_seconds_sum", lab)] >= 0, ph
        total += m[("kipp_step_seconds_sum", lab)]
    assert m[("kipp_step_seconds_sum", frozenset({("phase", "engine")}))] > 0
    assert m[("kipp_step_total_seconds_count", frozenset())] == steps
    assert abs(m[("kipp_step_total_seconds_sum", frozenset())] - total) <= 1e-5 * (len(PHASES) + 1)
    lab = frozenset({("model_name", "synthetic-tiny"), ("engine", "0")})
    assert m[("vllm:iteration_tokens_total_count", lab)] == steps
    # every prompt token is evaluated once (unpooled: nothing adopted); each choice evaluates its generated
    # tokens but the last (finished by length) or all of them but none after a stop id
    prompt = sum(r[1]["usage"]["prompt_tokens"] for r in res)
    gen = sum(r[1]["usage"]["completion_tokens"] for r in res)
    tokens = m[("vllm:iteration_tokens_total_sum", lab)]
    assert prompt + gen - len(res) <= tokens <= prompt + gen, (prompt, gen, tokens)
    for term in ("base", "decode_token", "prefill_token", "attention_kpair"):
        assert m[("kipp_step_cost_seconds", frozenset({("term", term)}))] >= 0, term
    assert m[("kipp_step_target_seconds", frozenset())] >= 0


def _kinds(s: Server) -> dict:
    m = _samples(s.metrics())
    out = {k: m[("kipp_step_kind_total", frozenset({("kind", k)}))] for k in ("decode", "prefill", "mixed")}
    out["burst"] = m[("kipp_step_prefill_burst_total", frozenset())]
    return out


class _Decoding:
    """A streamed request of n choices decoding max_tokens each in a thread; .first is set at its first text."""

    def __init__(self, port: int, n: int, max_tokens: int):
        self.first, self.chunks, self.port = threading.Event(), 0, port
        self.body = {"prompt": "tell me a story", "max_tokens": max_tokens, "n": n, "temperature": 0, "stream": True,
                     "logit_bias": {"151643": -100, "151645": -100}}
        self.t = threading.Thread(target=self._run)
        self.t.start()

    def _run(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        c.request("POST", "/v1/completions", body=json.dumps(self.body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        for line in iter(r.readline, b""):
            if line.startswith(b"data: {") and any(ch.get("text") for ch in json.loads(line[6:]).get("choices", [])):
                self.chunks += 1
                self.first.set()
        c.close()
        self.first.set()


def _delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a}


def test_decode_rides_every_prefill_step(synthetic_gguf):
    # 2 choices decode; a 300-token prompt beside them is no burst (1 < 2): a 1 ms target cuts it to
    # small chunks over several steps, and every one of those steps carries both decodes
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "1024", "--step-ms", "1", "--step-tokens", "256",
                "--no-spec", "--kv-pool-mib", "0") as s:
        a = _Decoding(s.port, 2, 600)
        assert a.first.wait(120) and a.t.is_alive()
        k0 = _kinds(s)
        st, r = s.post("/v1/completions", {"prompt": "word " * 300, "max_tokens": 1, "temperature": 0})
        assert st == 200, r
        k1 = _kinds(s)
        assert a.t.is_alive(), "the decoding request outlived the prompt's prefill"
        a.t.join(timeout=300)
        d = _delta(k0, k1)
        assert d["prefill"] == 0 and d["burst"] == 0, d
        assert d["mixed"] >= 2, d  # 300 prompt tokens at most 254 a step beside 2 decodes; the target cuts more
        # the streamed request's chunks were rendered by its HTTP thread, each render that produced bytes counted
        assert s.gauge("kipp_http_renders_total") >= 1 and s.gauge("kipp_http_render_seconds_total") > 0


def test_burst_prefills_in_one_step(synthetic_gguf):
    prompt = {"prompt": "word " * 150, "max_tokens": 6, "n": 3, "temperature": 0}
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "1024", "--step-ms", "1", "--step-tokens", "2048",
                "--no-spec", "--kv-pool-mib", "0") as s:
        kinit = _kinds(s)
        st, alone = s.post("/v1/completions", prompt)
        assert st == 200, alone
        k0 = _kinds(s)
        a = _Decoding(s.port, 1, 600)
        assert a.first.wait(120)
        k1 = _kinds(s)
        st, r = s.post("/v1/completions", prompt)  # 3 prompts beside 1 decoding choice: a burst
        assert st == 200, r
        k2 = _kinds(s)
        assert a.t.is_alive(), "the decoding request outlived the burst"
        a.t.join(timeout=300)
    # alone, nothing decodes: its 3 prompts (n = 3) take one prefill-only step; so does the decoding request's
    assert _delta(kinit, k0)["prefill"] == 1 and _delta(kinit, k0)["mixed"] == 0, (kinit, k0)
    assert _delta(k0, k1)["prefill"] == 1, (k0, k1)
    d = _delta(k1, k2)
    assert d["prefill"] == 0 and d["mixed"] == 1 and d["burst"] == 1, d
    assert [c["text"] for c in r["choices"]] == [c["text"] for c in alone["choices"]]
