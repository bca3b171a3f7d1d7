"""test_serve_pool.py - kipp-serve on a pooled model (seed 000
"Cross-session prefix sharing"): every choice adopts the longest published
prefix of its prompt, usage reports it as prompt_tokens_details.cached_tokens,
/metrics exposes the pool, and under pool pressure the youngest choice is
preempted and recomputed, and every request still reproduces its isolated
output. The oracle for outputs is the
same request on an unpooled server (--kv-pool-mib 0).
"""
from __future__ import annotations

import re
import threading
import time

import pytest

from serve_harness import Server, concurrent_equals_alone

prom = pytest.importorskip("prometheus_client.parser")

NO_EOS = {"151643": -100, "151645": -100}  # <|endoftext|>, <|im_end|>: the reply runs to its budget
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
        # the default pool: --max-batch (16) contexts of --ctx 512, below half the available memory here
        assert _metric(text, "kipp_kv_pool_blocks", state="total") == 16 * 512 // 32
        assert _metric(text, "kipp_kv_pool_blocks", state="published") >= (n - 1) // 32
        assert _metric(text, "kipp_kv_pool_blocks", state="referenced") == 0
        assert _metric(text, "kipp_kv_pool_hits_total") >= (n - 1) // 32 + 2
        assert _metric(text, "kipp_prompt_tokens_cached_total") == (n - 1) // 32 * 32 + other["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert re.search(r"^kipp_kv_pool_evictions_total 0$", text, re.M)
    assert "KV pool 256 blocks, 0.06 GiB: --max-batch full contexts;" in s.banner, s.banner


def _post_all(s: Server, bodies: list) -> list:
    out = [None] * len(bodies)

    def go(k):
        out[k] = s.post("/v1/completions", bodies[k])

    ts = [threading.Thread(target=go, args=(k,)) for k in range(len(bodies))]
    [t.start() for t in ts]
    [t.join(timeout=300) for t in ts]
    return out


def test_preemption_reproduces_isolated_outputs(synthetic_gguf):
    """--kv-pool-mib 1 on the tiny model (8 KiB per position) is a pool of 4 blocks,
    128 positions. Requests of up to ~100 positions each are admitted together (KV is
    reserved as sequences grow, not for their worst case), the pool runs out, the
    youngest choice is preempted and recomputed later. Every output
    equals the same request on an unpooled server: seeded sampling, n=2 choices,
    greedy with speculative drafts, and echo with prompt logprobs."""
    bodies = [{"prompt": "word " * (3 * k + 1), "max_tokens": 90, "temperature": 0.7, "seed": k} for k in range(3)]
    bodies += [{"prompt": "x", "max_tokens": 100, "n": 2, "temperature": 0.9, "seed": 7},
               {"prompt": "one two three one two three one two three", "max_tokens": 90, "temperature": 0},
               {"prompt": "echo this prompt back with its logprobs", "max_tokens": 60, "echo": True, "logprobs": 2,
                "temperature": 0.5, "seed": 3}]
    tiny = synthetic_gguf("synthetic-tiny")
    with Server(tiny, "--ctx", "512", "--kv-pool-mib", "0") as plain:
        want = [plain.post("/v1/completions", b) for b in bodies]
    assert all(st == 200 for st, _ in want), want
    with Server(tiny, "--ctx", "512", "--kv-pool-mib", "1") as s:
        got = _post_all(s, bodies)
        for b, (_, w), (st, g) in zip(bodies, want, got):
            assert st == 200, g
            for wc, gc in zip(w["choices"], g["choices"]):
                assert (gc["text"], gc["finish_reason"]) == (wc["text"], wc["finish_reason"]), b
                assert gc["logprobs"] == wc["logprobs"], b
            assert g["usage"]["completion_tokens"] == w["usage"]["completion_tokens"]
        assert s.wait_idle()
        text = s.metrics()
        assert _metric(text, "kipp_kv_pool_blocks", state="total") == 4
        assert _metric(text, "kipp_preemptions_total") > 0, "the workload was meant to run out of pool blocks"
        assert _metric(text, "vllm:num_preemptions_total", model_name="synthetic-tiny") == _metric(text, "kipp_preemptions_total")
        assert _metric(text, "kipp_recomputed_tokens_total") > 0
        assert _metric(text, "kipp_preempted_choices") == 0
        assert _metric(text, "kipp_kv_pool_blocks", state="referenced") == 0


def test_pool_refusal_names_the_budget_the_client_set(synthetic_gguf):
    """With a pool smaller than one context, a reply the client set no budget for
    ends where the pool does (finish_reason length), never a 400 for want of
    max_tokens; an explicit max_tokens that one choice cannot fit, too many choices,
    or a prompt that cannot fit is a 400 naming the field to change."""
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--kv-pool-mib", "1") as s:
        msgs = [{"role": "user", "content": "hello there"}]
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "temperature": 0, "logit_bias": NO_EOS})
        n_prompt = r["usage"]["prompt_tokens"]
        assert st == 200 and r["choices"][0]["finish_reason"] == "length", r
        assert r["usage"]["completion_tokens"] == 4 * 32 - n_prompt, r
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4 * 32 - n_prompt})
        assert st == 200 and r["usage"]["prompt_tokens"] == n_prompt, r
        # past the context itself: the context is what refuses (issue 51), saying by how much
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 1000})
        assert st == 400 and r["error"]["param"] == "max_completion_tokens", r
        assert r["error"]["code"] == "context_length_exceeded" and f"{n_prompt + 1000 - 512} more" in r["error"]["message"], r
        # within the context but past the pool: the pool is what refuses, naming the budget to send
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 400})
        assert st == 400 and r["error"]["param"] == "max_completion_tokens", r
        assert r["error"]["code"] == "kv_budget_exceeded", r
        msg = r["error"]["message"]
        assert f"({n_prompt} prompt + 400 max_completion_tokens) positions do not fit the KV pool" in msg, msg
        assert f"send max_completion_tokens <= {4 * 32 - n_prompt}," in msg, msg
        # too many choices for the pool whatever max_tokens: n is the field to change
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "n": 5})
        assert st == 400 and r["error"]["param"] == "n" and "lower n to at most 4 with this prompt" in r["error"]["message"], r
        # n=2 with no max_tokens: both choices run (one may be preempted), none is refused
        st, r = s.post("/v1/chat/completions", {"messages": msgs, "n": 2, "temperature": 0.8, "seed": 1})
        assert st == 200 and len(r["choices"]) == 2, r
        # completions without max_tokens: the default 16, cut to the pool
        st, r = s.post("/v1/completions", {"prompt": [5] * 120, "temperature": 0, "logit_bias": NO_EOS})
        assert st == 200 and r["usage"]["completion_tokens"] == 8 and r["choices"][0]["finish_reason"] == "length", r
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


def test_open_ended_chat_does_not_hold_up_short_requests(synthetic_gguf):
    """A chat with no max_tokens used to reserve the rest of the context, so with a
    one-context pool a concurrent 5-token request waited for it to finish. With KV
    taken as sequences grow, the short request is admitted at once and ends while
    the long reply is still streaming."""
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "512", "--kv-pool-mib", "4") as s:
        order = []
        long_body = {"messages": [{"role": "user", "content": "talk"}], "logit_bias": NO_EOS, "temperature": 0}

        def long_req():
            st, r = s.post("/v1/chat/completions", long_body)
            order.append(("long", st, r["choices"][0]["finish_reason"] if st == 200 else r))

        t = threading.Thread(target=long_req)
        t.start()
        while s.gauge("kipp_generation_tokens_total") < 1:  # the long reply is decoding
            time.sleep(0.01)
        st, r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 5, "temperature": 0})
        order.append(("short", st, r["usage"]["completion_tokens"]))
        t.join(timeout=300)
        assert order == [("short", 200, 5), ("long", 200, "length")], order


def test_default_pool_holds_whole_contexts(synthetic_gguf):
    """The default pool holds --max-batch contexts in whole 32-position blocks, also
    when --ctx is not a multiple of 32 (500 positions take 16 blocks)."""
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", "500", "--max-batch", "8") as s:
        assert _metric(s.metrics(), "kipp_kv_pool_blocks", state="total") == 8 * 16
    assert "KV pool 128 blocks" in s.banner and "--max-batch full contexts" in s.banner, s.banner


def test_q8_0_kv_pool_reuse_and_preemption_match_unpooled(synthetic_gguf):
    """--kv-type q8_0 (34/64 of bf16's bytes per token): the same gates within that KV type. The
    oracle is an unpooled q8_0 server; --kv-pool-mib 1 holds 7 blocks (1 MiB / (32 x 4352 bytes))
    where bf16 held 4; a warm prompt adopts its published blocks, and under a load that runs the
    pool out every request still reproduces its isolated output."""
    tiny = synthetic_gguf("synthetic-tiny")
    bodies = [{"prompt": "word " * (3 * k + 1), "max_tokens": 90, "temperature": 0.7, "seed": k} for k in range(6)]
    bodies += [{"prompt": "one two three one two three one two three", "max_tokens": 90, "temperature": 0},
               {"prompt": LONG, "max_tokens": 8, "temperature": 0}]
    with Server(tiny, "--ctx", "512", "--kv-pool-mib", "0", "--kv-type", "q8_0") as plain:
        want = [plain.post("/v1/completions", b) for b in bodies]
        assert 'kipp_kv_bytes_per_token{kv_type="q8_0"} 4352' in plain.metrics()
    assert "KV q8_0, 4352 bytes/token; no KV pool" in plain.banner, plain.banner
    assert all(st == 200 for st, _ in want), want
    with Server(tiny, "--ctx", "512", "--kv-pool-mib", "1", "--kv-type", "q8_0") as s:
        warm = s.post("/v1/completions", bodies[-1])[1]
        assert warm["choices"][0]["text"] == want[-1][1]["choices"][0]["text"]
        again = s.post("/v1/completions", bodies[-1])[1]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, again["usage"]
        assert again["choices"][0]["text"] == want[-1][1]["choices"][0]["text"]
        got = _post_all(s, bodies)
        for b, (_, w), (st, g) in zip(bodies, want, got):
            assert st == 200, g
            assert [(c["text"], c["finish_reason"]) for c in g["choices"]] == \
                [(c["text"], c["finish_reason"]) for c in w["choices"]], b
        assert s.wait_idle()
        text = s.metrics()
        assert _metric(text, "kipp_kv_pool_blocks", state="total") == 7
        assert _metric(text, "kipp_preemptions_total") > 0, "the workload was meant to run out of pool blocks"
    assert "KV q8_0, 4352 bytes/token; KV pool 7 blocks" in s.banner, s.banner
