"""test_chat_fit.py - chat context fitting (oldest turns dropped) in both front ends:
kipp-serve chat requests (with the official `openai` client) and `kipp chat`.

The rule, written out here independently of engine/chat_fit.c (`fit` below):
keep the system message (messages[0] when it is one) and the newest turns, a
turn starting at a user message, dropping the oldest turns until the prompt
plus the answer's reserve (max_tokens but at most n_ctx // 2, or n_ctx // 4 when
absent) fits n_ctx;
when even the newest turn alone does not, keep it and let the length check
decide. This model scans linearly from the oldest cut (the engine bisects).

Oracles for the token counts: the Qwen3 chat template rendered by transformers
(or jinja2 configured as transformers, tools/gen_chat_cases.py) and encoded by
HF tokenizers, never Kipp's tokenizer.
"""
from __future__ import annotations

import json
import random
import re
import subprocess

import pytest

from serve_harness import REPO, Server

openai = pytest.importorskip("openai")

KIPP = REPO / "build" / "kipp"
CH = "/v1/chat/completions"
N_CTX = 256
IM_END = 151645
SEEDS = 48
WORDS = ("cat dog river stone light paper seven blue quick slow north garden window music yellow bridge "
         "winter salt copper ocean").split()


@pytest.fixture(scope="module")
def count(hf_render, hf):
    """messages -> prompt tokens of the template's render (generation prompt on, default thinking)."""

    def n_tokens(msgs):
        return len(hf.encode(hf_render(msgs, None, True, None), add_special_tokens=False).ids)
    n_tokens.render = lambda msgs: hf_render(msgs, None, True, None)
    n_tokens.hf = hf
    return n_tokens


def fit(msgs, n_tokens, n_ctx, max_tokens):
    """The rule: messages dropped after the system message (a turn boundary)."""
    reserve = n_ctx // 4 if max_tokens is None else min(max_tokens, n_ctx // 2)
    head = 1 if msgs and msgs[0]["role"] == "system" else 0
    starts = [i for i in range(head, len(msgs)) if i == head or msgs[i]["role"] == "user"]
    for s in starts:
        if n_tokens(msgs[:head] + msgs[s:]) + reserve <= n_ctx:
            return s - head
    return starts[-1] - head if starts else 0


def text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversation(seed):
    """A random conversation: optional system message, 1..10 turns, some with a
    tool-call block (assistant tool_calls + tool responses + a final answer),
    message sizes from a few words to ~120 tokens, ending with a user turn."""
    rng = random.Random(seed)
    msgs = [{"role": "system", "content": text(rng, 1, 60)}] if rng.random() < 0.7 else []
    n_turns = rng.randint(1, 10)
    for t in range(n_turns):
        if t == n_turns - 1:  # now and then a last turn too long for the context on its own
            msgs.append({"role": "user", "content": text(rng, 1, 50) if rng.random() < 0.85 else text(rng, 200, 320)})
            break
        msgs.append({"role": "user", "content": text(rng, 1, 50 if rng.random() < 0.8 else 120)})
        if rng.random() < 0.3:
            calls = [{"id": f"call_{t}_{k}", "type": "function",
                      "function": {"name": "lookup", "arguments": json.dumps({"q": text(rng, 1, 4)})}}
                     for k in range(rng.randint(1, 2))]
            msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": text(rng, 1, 20)} for c in calls]
        msgs.append({"role": "assistant", "content": text(rng, 1, 40)})
    return msgs


@pytest.mark.parametrize("seed", range(SEEDS))
def test_server_keeps_system_and_newest_turns(srv, count, seed):
    """Conversations of many sizes against the model of the rule: the prompt the
    server evaluated has the oracle's token count for the kept messages, and
    usage.truncated_messages is the number dropped; 400 context_length_exceeded
    when even the system message and the last turn leave no token free, or
    when a max_tokens that was sent does not fit beside the kept prompt."""
    msgs = conversation(seed)
    max_tokens = [None, 1, 16, 64, 200, 100000][seed % 6]
    dropped = fit(msgs, count, N_CTX, max_tokens)
    head = 1 if msgs[0]["role"] == "system" else 0
    kept = msgs[:head] + msgs[head + dropped:]
    n_kept = count(kept)
    body = {"messages": msgs, "temperature": 0, "logit_bias": {str(IM_END): 100}}  # stop at once: cheap
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    st, r = srv.post(CH, body)
    if n_kept >= N_CTX:
        assert st == 400 and r["error"]["code"] == "context_length_exceeded", r
        assert f"{N_CTX} (n_ctx)" in r["error"]["message"] and "last turn" in r["error"]["message"]
        return
    if max_tokens is not None and n_kept + max_tokens > N_CTX:  # a sent budget the context cannot hold: refused
        assert st == 400 and r["error"]["code"] == "context_length_exceeded", r
        assert f"{n_kept + max_tokens - N_CTX} more than the context" in r["error"]["message"], r
        return
    assert st == 200, r
    assert r["usage"]["truncated_messages"] == dropped, (dropped, r["usage"])
    assert r["usage"]["prompt_tokens"] == n_kept, (n_kept, r["usage"])
    assert kept[head]["role"] == "user" or dropped == 0, "a cut is only ever at a user message"


def test_sizes_cover_every_outcome(count):
    """The seeds above reach all three outcomes: fits whole, truncated, refused."""
    seen = {}
    for seed in range(SEEDS):
        msgs = conversation(seed)
        mt = [None, 1, 16, 64, 200, 100000][seed % 6]
        d = fit(msgs, count, N_CTX, mt)
        head = 1 if msgs[0]["role"] == "system" else 0
        k = "refused" if count(msgs[:head] + msgs[head + d:]) >= N_CTX else "cut" if d else "whole"
        seen[k] = seen.get(k, 0) + 1
    assert set(seen) == {"whole", "cut", "refused"}, seen


def test_server_kept_text_is_the_newest_turns(srv, count):
    """The reply equals greedy /v1/completions on the template's text of the
    kept messages: the server kept those very messages, not just as many tokens."""
    msgs = [{"role": "system", "content": "You keep answers short."}]
    for k in range(8):
        msgs += [{"role": "user", "content": f"question {k}: " + " ".join(WORDS[k:k + 12])},
                 {"role": "assistant", "content": f"answer {k}: " + " ".join(WORDS[k + 3:k + 15])}]
    msgs.append({"role": "user", "content": "and the last one?"})
    dropped = fit(msgs, count, N_CTX, 24)
    assert dropped > 0 and dropped % 2 == 0
    kept = msgs[:1] + msgs[1 + dropped:]
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="synthetic-tiny", messages=msgs, max_tokens=24, temperature=0,
                                       logprobs=True)
    assert r.usage.model_extra["truncated_messages"] == dropped
    raw = b"".join(bytes(t.bytes) for t in r.choices[0].logprobs.content).decode("utf-8")
    ref = client.completions.create(model="synthetic-tiny", prompt=count.render(kept), max_tokens=24, temperature=0)
    assert raw == ref.choices[0].text


def test_server_untruncated_reports_zero(srv):
    st, r = srv.post(CH, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert st == 200 and r["usage"]["truncated_messages"] == 0, r


# ---- kipp chat ----

def test_cli_chat_drops_oldest_turns_like_the_rule(synthetic_gguf, count):
    """`kipp chat --ctx` over a sequence of lines of many sizes: each turn's prompt
    (the "of N prompt tokens" line) and each "dropped the K oldest messages" line
    follow the model of the rule applied to the conversation as the CLI keeps it
    (dropped messages leave it for good); a line that cannot fit even alone fails
    its turn and leaves the conversation as it was. Replies are pinned to one
    token repeated (logit_bias) so the oracle knows their text."""
    ctx, max_tokens = 160, 4
    x = count.hf.token_to_id("x")
    rng = random.Random(7)
    lines = [text(rng, 1, 45) for _ in range(14)]
    lines[9] = " ".join(["river"] * 200)  # alone beyond --ctx: the turn fails
    system = "Answer in one word."
    r = subprocess.run([str(KIPP), "chat", "--model", str(synthetic_gguf("synthetic-tiny")), "--backend", "ref",
                        "--ctx", str(ctx), "--max-tokens", str(max_tokens), "--system", system,
                        "--logit-bias", f"{x}=100"],
                       input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr  # the one oversize line
    got_prompts = [int(n) for n in re.findall(r"reused \d+ of (\d+) prompt tokens", r.stderr)]
    got_drops = [int(n) for n in re.findall(r"dropped the (\d+) oldest messages", r.stderr)]
    state = [{"role": "system", "content": system}]
    want_prompts, want_drops = [], []
    for line in lines:
        state.append({"role": "user", "content": line})
        d = fit(state, count, ctx, max_tokens)
        kept = state[:1] + state[1 + d:]
        if count(kept) >= ctx:
            state.pop()
            continue
        state = kept
        if d:
            want_drops.append(d)
        want_prompts.append(count(state))
        state.append({"role": "assistant", "content": "x" * max_tokens})
    assert want_drops, "the lines never overflowed the context: the test checks nothing"
    assert got_prompts == want_prompts, r.stderr
    assert got_drops == want_drops, r.stderr
    assert f"which do not fit the {ctx}-token context" in r.stderr


EDGE = [
    # a reply before the first user message: it belongs to the oldest turn and goes with it
    [{"role": "system", "content": "be brief"}, {"role": "assistant", "content": " ".join(WORDS * 4)}]
    + [m for k in range(3) for m in ({"role": "user", "content": " ".join(WORDS[k:] * 2)},
                                     {"role": "assistant", "content": " ".join(WORDS[:k + 5] * 2)})]
    + [{"role": "user", "content": "last"}],
    # no system message: nothing is kept at the head
    [m for k in range(6) for m in ({"role": "user", "content": " ".join(WORDS[k:] * 2)},
                                   {"role": "assistant", "content": " ".join(WORDS[:k + 5])})]
    + [{"role": "user", "content": "last"}],
    # a system message later in the conversation is part of its turn
    [{"role": "system", "content": "rules"}, {"role": "user", "content": " ".join(WORDS * 3)},
     {"role": "system", "content": "more rules " * 20}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": " ".join(WORDS * 2)}, {"role": "assistant", "content": "fine"},
     {"role": "user", "content": "last"}],
    # the system message alone
    [{"role": "system", "content": "only a system prompt"}],
]


@pytest.mark.parametrize("case", range(len(EDGE)))
@pytest.mark.parametrize("max_tokens", [None, 32, 120])
def test_server_edge_shapes(srv, count, case, max_tokens):
    msgs = EDGE[case]
    dropped = fit(msgs, count, N_CTX, max_tokens)
    head = 1 if msgs[0]["role"] == "system" else 0
    kept = msgs[:head] + msgs[head + dropped:]
    body = {"messages": msgs, "temperature": 0, "logit_bias": {str(IM_END): 100}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    st, r = srv.post(CH, body)
    assert st == 200, r
    assert r["usage"]["truncated_messages"] == dropped and r["usage"]["prompt_tokens"] == count(kept), r["usage"]


def test_server_pool_reuses_the_kept_system_prefix(synthetic_gguf, count):
    """The system message stays at the head, so the KV pool's published blocks of it
    serve the next, differently cut, request (prompt_tokens_details.cached_tokens)."""
    system = {"role": "system", "content": " ".join(WORDS * 4)}
    turns = [m for k in range(10) for m in ({"role": "user", "content": " ".join(WORDS[k:k + 10])},
                                            {"role": "assistant", "content": " ".join(WORDS[k + 2:k + 12])})]
    a = [system] + turns[:12] + [{"role": "user", "content": "first"}]
    b = [system] + turns + [{"role": "user", "content": "second"}]
    n_sys = count([system]) - 3  # the render ends with "<|im_start|>assistant\n": 3 tokens of no system text
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", str(N_CTX)) as s:
        for msgs, expect_cut in ((a, True), (b, True)):
            st, r = s.post(CH, {"messages": msgs, "max_tokens": 8, "temperature": 0})
            assert st == 200, r
            assert (r["usage"]["truncated_messages"] > 0) == expect_cut
            assert s.wait_idle()
        assert fit(b, count, N_CTX, 8) != fit(a, count, N_CTX, 8)
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_sys // 32 * 32 >= 32, r["usage"]
