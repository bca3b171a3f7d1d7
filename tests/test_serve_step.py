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
No timing is asserted: only counts, sums and signs.
"""
from __future__ import annotations

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
        capped = s.gauge("kipp_step_prefill_capped_total")
        # 1 ms is below any step here: every step that decodes beside a prompt of more than 16 tokens is cut
        if step_ms != "auto":  # auto's cuts depend on the measured costs
            assert capped >= 1 if step_ms == "1" else capped == 0, capped
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
