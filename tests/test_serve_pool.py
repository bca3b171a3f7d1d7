"""test_serve_pool.py - kipp-serve on a pooled model (issue 10, seed 000
"Cross-session prefix sharing"): every choice adopts the longest published
prefix of its prompt, usage reports it as prompt_tokens_details.cached_tokens,
/metrics exposes the pool, and under pool pressure requests wait in the FIFO
and still reproduce their isolated outputs. The oracle for outputs is the
same request on an unpooled server (--kv-pool-mib 0).
"""
from __future__ import annotations

import re

import pytest

from serve_harness import Server, concurrent_equals_alone

prom = pytest.importorskip("prometheus_client.parser")

LONG = "The pool keeps every full block of this prompt for the next request. " * 8


def _metric(text: str, name: str, **labels) -> float:
    for fam in prom.text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return float("nan")


def test_prefix_reuse_matches_unpooled(synthetic_gguf):
    body = {"prompt": LONG, "max_tokens": 8, "temperature": 0}
    chat = {"messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}], "max_tokens": 6,
            "temperature": 0}
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--kv-pool-mib", "0") as plain:
        want = plain.post("/v1/completions", body)[1]
        want_chat = plain.post("/v1/chat/completions", chat)[1]
        assert want["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert "kipp_kv_pool_blocks" not in plain.metrics()
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512") as s:
        n = want["usage"]["prompt_tokens"]
        assert n > 64, n
        cold = s.post("/v1/completions", body)[1]
        warm = s.post("/v1/completions", body)[1]
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        # whole 32-token blocks, leaving the last prompt token to evaluate
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 32 * 32
        assert cold["choices"][0]["text"] == warm["choices"][0]["text"] == want["choices"][0]["text"]
        # chat: the system prompt's blocks carry over to a different user turn
        first = s.post("/v1/chat/completions", chat)[1]
        other = s.post("/v1/chat/completions", {**chat, "messages": [chat["messages"][0], {"role": "user", "content": "yo"}]})[1]
        assert first["choices"][0]["message"] == want_chat["choices"][0]["message"]
        assert other["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64
        assert s.wait_idle()
        text = s.metrics()
        assert _metric(text, "kipp_kv_pool_blocks", state="total") == 4096 // 32  # one full context by default
        assert _metric(text, "kipp_kv_pool_blocks", state="published") >= (n - 1) // 32
        assert _metric(text, "kipp_kv_pool_blocks", state="referenced") == 0
        assert _metric(text, "kipp_kv_pool_hits_total") >= (n - 1) // 32 + 2
        assert _metric(text, "kipp_prompt_tokens_cached_total") == (n - 1) // 32 * 32 + other["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert re.search(r"^kipp_kv_pool_evictions_total 0$", text, re.M)


def test_pool_pressure_waits_in_fifo(synthetic_gguf):
    """--kv-pool-mib 1 on the tiny model (8 KiB per position) is a pool of 4 blocks:
    a request that alone needs more is a 400; requests that fit one at a time wait
    in the queue (admission reserves their worst case) and reproduce their
    isolated outputs; the pool evicts published blocks to make room."""
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--kv-pool-mib", "1") as s:
        st, r = s.post("/v1/completions", {"prompt": "x", "max_tokens": 100, "n": 2})
        assert st == 400 and r["error"]["code"] == "kv_budget_exceeded" and "--kv-pool-mib" in r["error"]["message"]
        concurrent_equals_alone(s, 90)
        text = s.metrics()
        assert _metric(text, "kipp_kv_pool_blocks", state="total") == 4
        assert _metric(text, "kipp_kv_pool_evictions_total") > 0


def test_pool_refusal_names_the_budget_the_client_set(synthetic_gguf):
    """A chat with no max_tokens reserves the rest of the context; when that alone
    exceeds the pool, the 400 says so (it used to name a max_tokens the client never
    sent) and gives the largest max_tokens that fits, which then succeeds."""
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--kv-pool-mib", "1") as s:
        msgs = [{"role": "user", "content": "hello there"}]
        st, r = s.post("/v1/chat/completions", {"messages": msgs})
        assert st == 400 and r["error"]["code"] == "kv_budget_exceeded", r
        msg = r["error"]["message"]
        m = re.search(r"n 1 x \((\d+) prompt \+ (\d+) generated \(no max_tokens was sent, so the rest of the context\)\)", msg)
        assert m, msg
        n_prompt, gen = int(m.group(1)), int(m.group(2))
        assert n_prompt + gen == 512
        fit = re.search(r"send max_tokens <= (\d+)", msg)
        assert fit and int(fit.group(1)) == 4 * 32 - n_prompt, msg
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": int(fit.group(1))})
        assert st == 200 and r["usage"]["prompt_tokens"] == n_prompt, r
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 1000})
        assert st == 400 and r["error"]["param"] == "max_completion_tokens", r
        assert f"{512 - n_prompt} generated (max_completion_tokens 1000, cut to the rest of the context)" in r["error"]["message"], r
        # too many choices for the pool whatever max_tokens: n is the field to change
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "n": 5})
        assert st == 400 and r["error"]["param"] == "n" and "lower n to at most 4 with this prompt" in r["error"]["message"], r
        # completions without max_tokens: the default 16, named as such
        st, r = s.post("/v1/completions", {"prompt": [5] * 120})
        assert st == 400 and "16 generated (no max_tokens was sent: the completions default 16)" in r["error"]["message"], r
        assert "send max_tokens <= 8," in r["error"]["message"], r
        # a prompt that cannot fit with even one generated token: the prompt is the field
        st, r = s.post("/v1/completions", {"prompt": [5] * 200, "max_tokens": 1})
        assert st == 400 and r["error"]["param"] == "prompt" and "shorten the prompt" in r["error"]["message"], r
    # said at startup too: this pool is smaller than one context
    assert "the KV pool holds 128 positions, fewer than one context (n_ctx 512)" in s.stderr, s.stderr


@pytest.mark.parametrize("args,ok", [(["--kv-mib", "100"], False), (["--kv-pool-mib", "8", "--kv-mib", "100"], False),
                                     (["--kv-pool-mib", "0", "--kv-mib", "100"], True)])
def test_kv_mib_needs_the_pool_off(synthetic_gguf, args, ok):
    """--kv-mib budgets only the unpooled server; with the pool on (the default) it used to be ignored silently."""
    import subprocess
    from serve_harness import SERVE
    if ok:
        with Server(synthetic_gguf("synthetic-tiny"), *args):
            return
    r = subprocess.run([str(SERVE), "--model", str(synthetic_gguf("synthetic-tiny")), "--port", "0", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--kv-mib" in r.stderr and "--kv-pool-mib 0" in r.stderr, r.stderr
