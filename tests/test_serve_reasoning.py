"""test_serve_reasoning.py - reasoning controls and client compatibility of
kipp-serve's OpenAI endpoints (issue 51, items 3 and 5), through the official
`openai` SDK where a client would use it.

The synthetic model has random weights: it opens "<think>" only when a
logit_bias makes it, so the reasoning cases pin that token (Qwen3's id
151667) and check the exact token sequence the server must produce:
  - reasoning_effort "none"/"minimal" render the thinking-off prompt (the
    template's empty "<think>\\n\\n</think>\\n\\n": 4 more tokens), the other
    efforts the default one; a bad effort is a 400;
  - /no_think in a user turn is passed to the model as written (the Qwen3
    template does not interpret it: the model does), thinking stays on;
  - thinking_token_budget (vLLM) / thinking_budget_tokens (llama-server) N:
    exactly N reasoning tokens, then the forced "\\n", "</think>", "\\n\\n"
    (ids 198, 151668, 271), then content; streamed deltas equal the whole;
  - a reply cut off (length) inside reasoning: all reasoning, content null;
  - a second turn made of resp.choices[0].message.model_dump() works, and
    store / metadata / service_tier / modalities / user / prediction are
    accepted and logged once each;
  - min_tokens, include_stop_str_in_output, guided_json, guided_choice,
    best_of 1, echo with stream, /tokenize with tools;
  - prompt + max_tokens beyond the context is a 400 saying by how much; 128
    long tools overflowing the context are named as the cause;
  - every new field's bad value is a 400 in OpenAI's error shape.
"""
from __future__ import annotations

import json

import pytest

from serve_harness import Server, parse_sse

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

N_CTX = 512
C, CH = "/v1/completions", "/v1/chat/completions"
THINK, END_THINK, IM_END = 151667, 151668, 151645
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def ok(srv, path, body):
    st, r = srv.post(path, body)
    assert st == 200, r
    return r


def bad(srv, path, body, param, words):
    st, r = srv.post(path, body)
    assert st == 400, (body, r)
    e = r["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["type"] == "invalid_request_error", e
    assert e["param"] == param and words in e["message"], (param, words, e)
    return e


# ---- reasoning controls ----

def test_reasoning_effort(srv):
    n = {}
    for effort in ("none", "minimal", "low", "medium", "high", None):
        body = {"messages": USER, "max_tokens": 1, "temperature": 0}
        if effort:
            body["reasoning_effort"] = effort
        n[effort] = ok(srv, CH, body)["usage"]["prompt_tokens"]
    off = ok(srv, CH, {"messages": USER, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": False}})
    assert n["none"] == n["minimal"] == off["usage"]["prompt_tokens"] == n[None] + 4, n
    assert n["low"] == n["medium"] == n["high"] == n[None], n
    # off wins over enable_thinking true
    both = ok(srv, CH, {"messages": USER, "max_tokens": 1, "reasoning_effort": "none",
                        "chat_template_kwargs": {"enable_thinking": True}})
    assert both["usage"]["prompt_tokens"] == n["none"]


def test_soft_switches_pass_through(srv):
    """/think and /no_think are the model's to read: the prompt holds them as written, thinking stays on."""
    for switch in ("/no_think", "/think"):
        msgs = [{"role": "user", "content": f"Hello {switch}"}]
        ids = ok(srv, "/tokenize", {"messages": msgs})["tokens"]
        text = ok(srv, "/detokenize", {"tokens": ids})["prompt"]
        assert text.endswith(f"Hello {switch}<|im_end|>\n<|im_start|>assistant\n"), text


def reasoning_tokens(srv, body):
    """(reply, token texts of choice 0) of a chat request with logprobs."""
    r = ok(srv, CH, {**body, "logprobs": True})
    return r, [t["token"] for t in r["choices"][0]["logprobs"]["content"]]


@pytest.mark.parametrize("field", ["thinking_token_budget", "thinking_budget_tokens"])
@pytest.mark.parametrize("budget", [0, 1, 4])
def test_thinking_budget(srv, client, field, budget):
    body = {"messages": USER, "max_tokens": 12, "temperature": 0, "logit_bias": {str(THINK): 100}, field: budget}
    r, toks = reasoning_tokens(srv, body)
    # <think>, then exactly `budget` reasoning tokens, then the forced close, then the answer
    assert toks[0] == "<think>" and toks[1:1 + budget] == ["<think>"] * budget, toks
    assert toks[1 + budget:4 + budget] == ["\n", "</think>", "\n\n"], toks
    msg = r["choices"][0]["message"]
    assert msg.get("reasoning_content", "") == ("<think>" * budget + "\n" if budget else ""), msg
    assert msg["content"] == "<think>" * (12 - budget - 4), msg
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": budget + 3}, r["usage"]  # <think> .. </think>
    stream = client.chat.completions.create(model="synthetic-tiny", messages=USER, max_tokens=12, temperature=0, stream=True,
                                            logit_bias={str(THINK): 100}, extra_body={field: budget})
    rc, cc = "", ""
    for ch in stream:
        for c in ch.choices:
            rc += getattr(c.delta, "reasoning_content", None) or ""
            cc += c.delta.content or ""
    assert (rc, cc) == (msg.get("reasoning_content", ""), msg["content"])


def test_budget_leaves_a_reply_without_reasoning_alone(srv):
    base = {"messages": USER, "max_tokens": 8, "temperature": 0}
    r = ok(srv, CH, base)
    assert ok(srv, CH, {**base, "thinking_token_budget": 2})["choices"] == r["choices"]
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}, r


def test_cut_off_inside_reasoning(srv):
    r = ok(srv, CH, {"messages": USER, "max_tokens": 5, "temperature": 0, "logit_bias": {str(THINK): 100}})
    c = r["choices"][0]
    assert c["finish_reason"] == "length"
    assert c["message"]["reasoning_content"] == "<think>" * 4 and c["message"]["content"] is None, c


# ---- what clients send ----

def test_model_dump_second_turn(srv, client):
    first = client.chat.completions.create(model="synthetic-tiny", messages=USER, max_tokens=4, temperature=0, store=False,
                                           metadata={"run": "a"}, service_tier="auto", user="u1",
                                           extra_body={"modalities": ["text"]})
    msg = first.choices[0].message.model_dump()
    assert {"refusal", "audio", "function_call", "annotations"} <= set(msg), msg
    second = client.chat.completions.create(
        model="synthetic-tiny", max_tokens=4, temperature=0,
        messages=USER + [msg, {"role": "user", "content": "And tomorrow?"}],
        prediction={"type": "content", "content": "Sunny"})
    assert second.choices[0].finish_reason in ("stop", "length")
    # again: the ignored fields are logged once per process, not per request
    client.chat.completions.create(model="synthetic-tiny", messages=USER, max_tokens=1, store=True, metadata={"run": "b"})


def test_min_tokens(srv):
    body = {"messages": USER, "max_tokens": 10, "temperature": 0, "logit_bias": {str(IM_END): 100},
            "chat_template_kwargs": {"enable_thinking": False}}
    assert ok(srv, CH, body)["usage"]["completion_tokens"] == 0
    r = ok(srv, CH, {**body, "min_tokens": 4})
    assert r["usage"]["completion_tokens"] == 4 and r["choices"][0]["finish_reason"] == "stop", r


def test_include_stop_str_in_output(srv):
    base = {"prompt": "The weather in Paris is", "max_tokens": 24, "temperature": 0}
    full = ok(srv, C, base)["choices"][0]["text"]
    stop = full[len(full) // 2:len(full) // 2 + 2]
    at = full.find(stop)
    cut = ok(srv, C, {**base, "stop": stop})["choices"][0]
    kept = ok(srv, C, {**base, "stop": stop, "include_stop_str_in_output": True})["choices"][0]
    assert cut["text"] == full[:at] and kept["text"] == full[:at + len(stop)], (full, stop, cut, kept)
    assert cut["finish_reason"] == kept["finish_reason"] == "stop"


def test_guided_json_and_choice(srv):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    for seed in range(3):
        body = {"messages": USER, "max_tokens": 40, "seed": seed, **off}
        r = ok(srv, CH, {**body, "guided_json": schema})
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
        r = ok(srv, CH, {**body, "guided_json": json.dumps(schema)})
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
        r = ok(srv, CH, {**body, "guided_choice": ["yes", "no"]})
        assert json.loads(r["choices"][0]["message"]["content"]) in ("yes", "no"), r


def test_completions_best_of_echo_stream_suffix(srv, client):
    base = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 1}
    plain = ok(srv, C, base)["choices"][0]
    assert ok(srv, C, {**base, "best_of": 1})["choices"][0]["text"] == plain["text"]
    assert ok(srv, C, {**base, "suffix": ""})["choices"][0]["text"] == plain["text"]
    whole = ok(srv, C, {**base, "echo": True})["choices"][0]
    assert whole["text"] == "Once upon a time" + plain["text"]
    st, raw = srv.request("POST", C, {**base, "echo": True, "stream": True})
    assert st == 200
    chunks = [c for c in parse_sse(raw) if c != "[DONE]"]
    text = "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"])
    lp = [t for ch in chunks if ch["choices"] and ch["choices"][0]["logprobs"]
          for t in ch["choices"][0]["logprobs"]["tokens"]]
    assert text == whole["text"] and lp == whole["logprobs"]["tokens"], (text, whole)
    offs = [o for ch in chunks if ch["choices"] and ch["choices"][0]["logprobs"]
            for o in ch["choices"][0]["logprobs"]["text_offset"]]
    assert offs == whole["logprobs"]["text_offset"]


def test_tokenize_counts_tools(srv):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    bare = ok(srv, "/tokenize", {"messages": USER})["count"]
    with_tools = ok(srv, "/tokenize", {"messages": USER, "tools": tools})["count"]
    chat = ok(srv, CH, {"messages": USER, "tools": tools, "max_tokens": 1})["usage"]["prompt_tokens"]
    assert with_tools == chat and with_tools > bare + 20, (bare, with_tools, chat)
    bad(srv, "/tokenize", {"prompt": "a", "tools": tools}, "tools", "needs \"messages\"")


def test_max_tokens_beyond_context(srv):
    prompt = list(range(100, 100 + N_CTX - 10))
    e = bad(srv, C, {"prompt": prompt, "max_tokens": 50}, "max_tokens", "40 more than the context")
    assert e["code"] == "context_length_exceeded" and f"{N_CTX} (n_ctx)" in e["message"]
    r = ok(srv, C, {"prompt": prompt, "temperature": 0, "logit_bias": {str(IM_END): -100, "151643": -100}})
    assert r["usage"]["completion_tokens"] == 10 and r["choices"][0]["finish_reason"] == "length"
    bad(srv, CH, {"messages": USER, "max_completion_tokens": N_CTX}, "max_completion_tokens", "more than the context")


def test_overflow_names_the_tools(srv):
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "A long description. " * 8,
                                               "parameters": {"type": "object", "properties": {}}}}
             for i in range(128)]
    e = bad(srv, CH, {"messages": USER, "tools": tools}, "tools", "the tool definitions take")
    assert "system message" not in e["message"] and e["code"] == "context_length_exceeded", e


BAD_FIELDS = [
    (CH, {"reasoning_effort": "max"}, "reasoning_effort", "expected \"none\""),
    (CH, {"reasoning_effort": 1}, "reasoning_effort", "expected \"none\""),
    (CH, {"thinking_token_budget": -2}, "thinking_token_budget", "[-1,"),
    (CH, {"thinking_budget_tokens": "a"}, "thinking_budget_tokens", "expected an integer"),
    (CH, {"thinking_token_budget": 3, "thinking_budget_tokens": 4}, "thinking_budget_tokens", "disagree"),
    (CH, {"store": "yes"}, "store", "boolean"),
    (CH, {"metadata": 5}, "metadata", "object of string values"),
    (CH, {"metadata": {"a": 1}}, "metadata", "expected a string"),
    (CH, {"service_tier": "fast"}, "service_tier", "\"auto\""),
    (CH, {"modalities": ["text", "audio"]}, "modalities", "text only"),
    (CH, {"prediction": {"type": "x"}}, "prediction", "\"content\""),
    (CH, {"audio": {"voice": "alloy", "format": "mp3"}}, "audio", "text only"),
    (CH, {"web_search_options": {}}, "web_search_options", "does not search"),
    (CH, {"min_tokens": -1}, "min_tokens", "[0,"),
    (CH, {"min_tokens": 5, "max_tokens": 2}, "min_tokens", "above max_tokens 2"),
    (CH, {"include_stop_str_in_output": 1}, "include_stop_str_in_output", "boolean"),
    (CH, {"guided_json": 5}, "guided_json", "JSON Schema"),
    (CH, {"guided_json": "[1]"}, "guided_json", "not a JSON object"),
    (CH, {"guided_choice": []}, "guided_choice", "1..256 strings"),
    (CH, {"guided_choice": ["a", 2]}, "guided_choice", "guided_choice[1]"),
    (CH, {"guided_regex": "a+"}, "guided_regex", "JSON Schema only"),
    (CH, {"guided_json": {"type": "object"}, "response_format": {"type": "json_object"}}, "guided_json",
     "both constrain"),
    (CH, {"use_beam_search": True}, "use_beam_search", "vLLM extension"),
    (CH, {"messages": USER + [{"role": "assistant", "content": "x", "refusal": "no"}]}, "messages", "refusal"),
    (CH, {"messages": USER + [{"role": "assistant", "content": "x", "audio": {"id": "a"}}]}, "messages", "audio"),
    (CH, {"messages": [{"role": "user", "content": "x", "refusal": None}]}, "messages", "not supported"),
    (C, {"best_of": 2}, "best_of", "expected 1"),
    (C, {"suffix": "x"}, "suffix", "fill-in-the-middle"),
    (CH, {"bogus_field": 1}, "bogus_field", "not supported"),
]


@pytest.mark.parametrize("path,extra,param,words", BAD_FIELDS)
def test_bad_field_is_a_400(srv, path, extra, param, words):
    body = {"messages": USER} if path == CH else {"prompt": "a"}
    bad(srv, path, {**body, "max_tokens": 2, **extra}, param, words)


def test_ignored_fields_logged_once(synthetic_gguf):
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", str(N_CTX)) as s:
        for _ in range(2):
            ok(s, CH, {"messages": USER + [{"role": "assistant", "content": "x", "refusal": None, "annotations": []},
                                           {"role": "user", "content": "y"}],
                       "max_tokens": 1, "store": True, "metadata": {"a": "b"}, "service_tier": "auto", "user": "u",
                       "modalities": ["text"], "prediction": {"type": "content", "content": "z"}})
    for name in ("store", "metadata", "service_tier", "user", "modalities", "prediction", "messages[].refusal",
                 "messages[].annotations"):
        assert s.stderr.count(f"request field '{name}' is accepted and ignored") == 1, (name, s.stderr[-3000:])
