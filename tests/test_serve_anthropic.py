"""test_serve_anthropic.py - the Anthropic Messages API (/v1/messages and
/v1/messages/count_tokens) through kipp-serve, with the official `anthropic`
SDK, streamed and not.

Oracles, none of them the Anthropic renderer under test:
  - the OpenAI chat endpoint, asked the same conversation in OpenAI's form
    (written here by hand, as llama-server and vLLM convert it) at temperature
    0: the same thinking, text, tool call and prompt token count;
  - /tokenize of the same messages: input_tokens;
  - greedy text without stop sequences, cut by Python at the first stop
    sequence: the stop_sequence reply;
  - jsonschema: forced tool inputs validate against input_schema;
  - a strict SSE parser written here: the exact event sequence, and that the
    streamed deltas rebuild the non-streamed reply.
The synthetic model's weights are random, so texts are gibberish but
deterministic at temperature 0.
"""
from __future__ import annotations

import json
import re

import pytest

from serve_harness import Server, with_long_note

anthropic = pytest.importorskip("anthropic")
pytest.importorskip("openai")  # conftest.oai, the oracle
jsonschema = pytest.importorskip("jsonschema")

N_CTX = 1024
MODEL = "synthetic-tiny"
KEY = "sekret-key"
CH = "/v1/chat/completions"

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "days": {"type": "integer"}},
                  "required": ["city", "days"], "additionalProperties": False}
TIME_SCHEMA = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
               "additionalProperties": False}
A_TOOLS = [{"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER_SCHEMA},
           {"name": "get_time", "input_schema": TIME_SCHEMA}]
O_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                              "parameters": WEATHER_SCHEMA}},
           {"type": "function", "function": {"name": "get_time", "parameters": TIME_SCHEMA}}]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
USER = [{"role": "user", "content": "Weather in Paris, and the time?"}]
OFF = {"type": "disabled"}
NO_THINK = {"enable_thinking": False}
THINK_ID = 151667  # Qwen3's <think> (data/qwen3 tokenizer)


@pytest.fixture(scope="module")
def client(srv):
    return anthropic.Anthropic(base_url=srv.base, api_key="none", max_retries=0, timeout=120)

# ---- a strict parser of Anthropic's event stream ----

def parse_events(raw: bytes) -> list:
    """'event: <type>\\ndata: <json>\\n\\n' frames, each data's type equal to its event name."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), text[-200:]
    out = []
    for frame in text[:-2].split("\n\n"):
        lines = frame.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), frame[:200]
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name, (name, data)
        out.append(data)
    return out


def rebuild(events: list) -> dict:
    """Check the event grammar and rebuild the message it streams."""
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    assert events[-2]["type"] == "message_delta"
    msg = events[0]["message"]
    assert msg["content"] == [] and msg["stop_reason"] is None and msg["role"] == "assistant"
    assert msg["id"].startswith("msg_")
    blocks, open_ = [], None
    for ev in events[1:-2]:
        t = ev["type"]
        if t == "ping":
            continue
        if t == "content_block_start":
            assert open_ is None and ev["index"] == len(blocks), ev
            b = dict(ev["content_block"])
            assert b["type"] in ("text", "thinking", "tool_use")
            if b["type"] == "tool_use":
                assert b["input"] == {} and b["id"].startswith("toolu_") and b["name"]
                b["partial"] = ""
            else:
                assert b[b["type"]] == ""
            blocks.append(b)
            open_ = ev["index"]
        elif t == "content_block_delta":
            assert ev["index"] == open_, ev
            b, d = blocks[open_], ev["delta"]
            want = {"text": ("text_delta",), "thinking": ("thinking_delta", "signature_delta"),
                    "tool_use": ("input_json_delta",)}[b["type"]]
            assert d["type"] in want, (b["type"], d)
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                assert "signature_seen" not in b, "thinking after the signature"
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature_seen"] = True
            else:
                b["partial"] += d["partial_json"]
        elif t == "content_block_stop":
            assert ev["index"] == open_, ev
            b = blocks[open_]
            if b["type"] == "thinking":
                assert b.pop("signature_seen", False), "a thinking block closes after its signature_delta"
            if b["type"] == "tool_use":
                try:
                    b["input"] = json.loads(b["partial"])
                    del b["partial"]
                except ValueError:
                    b["cut"] = True  # a call max_tokens cut: the input as far as it was written
            open_ = None
        else:
            raise AssertionError(f"unexpected event {ev}")
    assert open_ is None, "a block was never closed"
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == "max_tokens" or not any(b.get("cut") for b in blocks), blocks
    return {"content": blocks, "stop_reason": delta["delta"]["stop_reason"],
            "stop_sequence": delta["delta"]["stop_sequence"], "usage": msg["usage"],
            "output_tokens": delta["usage"]["output_tokens"], "events": events}


def raw_stream(srv, body: dict, headers: dict | None = None) -> dict:
    st, raw = srv.request("POST", "/v1/messages", dict(body, stream=True),
                          headers={"Content-Type": "application/json", **(headers or {})})
    assert st == 200, raw[:500]
    return rebuild(parse_events(raw))


def texts(content) -> tuple[str, str, list]:
    """(thinking, text, [(name, input)]) of a content list (dicts or SDK blocks), without cut calls."""
    th, tx, calls = "", "", []
    for b in content:
        b = b if isinstance(b, dict) else b.model_dump()
        if b.get("cut"):  # streamed only: the whole reply has no call max_tokens cut
            continue
        if b["type"] == "thinking":
            th += b["thinking"]
        elif b["type"] == "text":
            tx += b["text"]
        else:
            calls.append((b["name"], b["input"]))
    return th, tx, calls


SAMPLING = ("temperature", "top_p", "top_k")  # SDK 2.x dropped them from the typed signature: sent in extra_body


def create(client, **body):
    """client.messages.create with the sampling fields moved into extra_body."""
    extra = dict(body.pop("extra_body", {}), **{k: body.pop(k) for k in SAMPLING if k in body})
    return client.messages.create(**body, extra_body=extra or None)


def sdk_stream(client, **body):
    extra = dict(body.pop("extra_body", {}), **{k: body.pop(k) for k in SAMPLING if k in body})
    return client.messages.stream(**body, extra_body=extra or None)


def openai_reply(oai, messages, **kw):
    r = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)
    return r, r.choices[0]


# ---- text ----

def test_text_reply_matches_openai_chat_and_tokenize(client, oai, srv):
    sysblocks = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in French."}]
    r = create(client, model=MODEL, max_tokens=24, temperature=0, system=sysblocks, messages=USER, thinking=OFF)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    o_msgs = [{"role": "system", "content": "You are terse.\nAnswer in French."}] + USER
    o, ch = openai_reply(oai, o_msgs, max_tokens=24, extra_body={"chat_template_kwargs": NO_THINK})
    th, tx, calls = texts(r.content)
    assert th == "" and calls == [] and tx == ch.message.content
    assert [b.type for b in r.content] == (["text"] if tx else [])
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[ch.finish_reason]
    assert r.stop_sequence is None
    st, tok = srv.post("/tokenize", {"messages": o_msgs, "chat_template_kwargs": NO_THINK})
    assert st == 200
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == tok["count"] == o.usage.prompt_tokens
    assert r.usage.output_tokens == o.usage.completion_tokens


def test_stream_equals_non_streamed(client, srv):
    body = {"model": MODEL, "max_tokens": 32, "temperature": 0, "messages": USER, "thinking": OFF}
    whole = create(client, **body)
    s = raw_stream(srv, body)
    assert texts(s["content"]) == texts(whole.content)
    assert s["stop_reason"] == whole.stop_reason and s["output_tokens"] == whole.usage.output_tokens
    assert s["events"][1]["type"] == "ping", "a ping follows message_start"
    with sdk_stream(client, **body) as st:
        pieces = "".join(st.text_stream)
        final = st.get_final_message()
    assert pieces == texts(whole.content)[1]
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason


# ---- stop sequences ----

def test_stop_sequences(client, srv):
    base = {"model": MODEL, "max_tokens": 40, "temperature": 0, "messages": USER, "thinking": OFF}
    full = texts(create(client, **base).content)[1]
    assert len(full) >= 12, full
    stop = full[len(full) // 2: len(full) // 2 + 3]
    r = create(client, **base, stop_sequences=["\x01never", stop])
    assert texts(r.content)[1] == full[:full.index(stop)]
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    s = raw_stream(srv, dict(base, stop_sequences=["\x01never", stop]))
    assert s["stop_reason"] == "stop_sequence" and s["stop_sequence"] == stop
    assert texts(s["content"])[1] == full[:full.index(stop)]
    r = create(client, **base, stop_sequences=["\x01never"])
    assert r.stop_sequence is None and r.stop_reason in ("end_turn", "max_tokens")
    assert texts(r.content)[1] == full


# ---- thinking ----

def test_thinking_on_matches_openai_reasoning(client, oai, srv):
    for thinking in (None, {"type": "enabled", "budget_tokens": 40}):
        kw = {"thinking": thinking} if thinking else {}
        r = create(client, model=MODEL, max_tokens=48, temperature=0, messages=USER, **kw)
        _, ch = openai_reply(oai, USER, max_tokens=48)
        reasoning = getattr(ch.message, "reasoning_content", None) or ""
        th, tx, _ = texts(r.content)
        if thinking and r.usage.output_tokens >= thinking["budget_tokens"]:
            assert reasoning.startswith(th)  # a budget only ever ends the reasoning sooner
        else:
            assert th == reasoning and tx == (ch.message.content or "")
        if th:
            assert r.content[0].type == "thinking" and r.content[0].signature == ""
        s = raw_stream(srv, dict(model=MODEL, max_tokens=48, temperature=0, messages=USER, **kw))
        assert texts(s["content"]) == texts(r.content)


def test_thinking_off_has_no_thinking_block(client, oai):
    r = create(client, model=MODEL, max_tokens=32, temperature=0, messages=USER, thinking=OFF)
    _, ch = openai_reply(oai, USER, max_tokens=32, extra_body={"chat_template_kwargs": NO_THINK})
    assert all(b.type != "thinking" for b in r.content)
    assert texts(r.content)[1] == ch.message.content


def test_thinking_budget_ends_reasoning(client, oai, srv):
    """budget_tokens bounds the thinking block, and the model answers after it.
    Random weights rarely open <think>, so logit_bias (a Kipp extension here, as
    on chat) pins Qwen3's <think> id: the reply opens reasoning and never closes
    it alone. The oracle is the chat endpoint with vLLM's thinking_token_budget:
    the same reasoning and the same answer; without a budget the reasoning runs
    to max_tokens and nothing is answered."""
    budget, bias = 6, {str(THINK_ID): 100}
    r = create(client, model=MODEL, max_tokens=24, temperature=0, messages=USER,
               thinking={"type": "enabled", "budget_tokens": budget}, extra_body={"logit_bias": bias})
    _, ch = openai_reply(oai, USER, max_tokens=24, logit_bias=bias, extra_body={"thinking_token_budget": budget})
    th, tx, _ = texts(r.content)
    assert r.content[0].type == "thinking" and th and th == ch.message.reasoning_content, (r.content, ch.message)
    assert tx and tx == ch.message.content and r.stop_reason == "max_tokens", (r.content, ch.message)
    st, tok = srv.post("/tokenize", {"prompt": th})
    assert st == 200 and budget - 1 <= tok["count"] <= budget + 1, (tok["count"], th)
    with sdk_stream(client, model=MODEL, max_tokens=24, temperature=0, messages=USER,
                    thinking={"type": "enabled", "budget_tokens": budget}, extra_body={"logit_bias": bias}) as stream:
        streamed = stream.get_final_message()
    assert texts(streamed.content)[:2] == (th, tx), streamed.content
    free = create(client, model=MODEL, max_tokens=24, temperature=0, messages=USER, extra_body={"logit_bias": bias})
    fth, ftx, _ = texts(free.content)
    assert not ftx and len(fth) > len(th), free.content


# ---- tools ----

def _tool_turn(client, oai, tool_choice, o_choice, parallel=True):
    """A forced call, against the OpenAI chat reply with the same tools and choice."""
    body = {"model": MODEL, "max_tokens": 128, "temperature": 0, "messages": USER, "tools": A_TOOLS,
            "tool_choice": dict(tool_choice, disable_parallel_tool_use=not parallel), "thinking": OFF}
    r = create(client, **body)
    _, ch = openai_reply(oai, USER, max_tokens=128, tools=O_TOOLS, tool_choice=o_choice, parallel_tool_calls=parallel,
                         extra_body={"chat_template_kwargs": NO_THINK})
    uses = [b for b in r.content if b.type == "tool_use"]
    assert uses
    assert [(u.name, u.input) for u in uses] == [(c.function.name, json.loads(c.function.arguments))
                                                 for c in ch.message.tool_calls]
    # a call cut by max_tokens is no call: the reply says max_tokens honestly, as OpenAI's says length
    assert r.stop_reason == {"tool_calls": "tool_use", "length": "max_tokens"}[ch.finish_reason]
    assert len({u.id for u in uses}) == len(uses)
    for u in uses:
        assert u.id.startswith("toolu_")
        jsonschema.validate(u.input, SCHEMAS[u.name])
    if not parallel:
        assert len(uses) == 1 and r.stop_reason == "tool_use"
    return body, r


@pytest.mark.parametrize("choice,o_choice,parallel", [
    ({"type": "any"}, "required", True),
    ({"type": "any"}, "required", False),
    ({"type": "tool", "name": "get_time"}, {"type": "function", "function": {"name": "get_time"}}, False),
])
def test_forced_tool_call_matches_openai(client, oai, srv, choice, o_choice, parallel):
    body, r = _tool_turn(client, oai, choice, o_choice, parallel)
    if choice["type"] == "tool":
        assert all(b.name == choice["name"] for b in r.content if b.type == "tool_use")
    s = raw_stream(srv, body)
    assert texts(s["content"]) == texts(r.content) and s["stop_reason"] == r.stop_reason
    ids = [b["id"] for b in s["content"] if b["type"] == "tool_use"]
    assert len(set(ids)) == len(ids)  # one id per call, each sent once (content_block_start)
    with sdk_stream(client, **body) as st:
        final = st.get_final_message()
    uses = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    cut = [b["name"] for b in s["content"] if b.get("cut")]  # streamed as far as written, then max_tokens
    assert uses[:len(uses) - len(cut)] == texts(r.content)[2] and [n for n, _ in uses[len(uses) - len(cut):]] == cut


FORCE_WEATHER = {"model": MODEL, "max_tokens": 128, "temperature": 0, "messages": USER, "tools": A_TOOLS,
                 "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                 "thinking": OFF}


def json_pieces(events):
    return [e["delta"]["partial_json"] for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]


def test_tool_input_streams_as_written(client, srv):
    """input_json_delta pieces come as the model writes the call: more than one
    for a call with two fields, and concatenated they are the input's JSON; the
    id goes once, in content_block_start. The SDK's stream sees the same
    pieces and builds the same input as the whole reply."""
    whole = create(client, **FORCE_WEATHER)
    use = [b for b in whole.content if b.type == "tool_use"]
    assert whole.stop_reason == "tool_use" and len(use) == 1, whole.content
    s = raw_stream(srv, FORCE_WEATHER)
    starts = [e for e in s["events"] if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    pieces = json_pieces(s["events"])
    assert len(starts) == 1 and starts[0]["content_block"]["name"] == "get_weather"
    assert len(pieces) > 1 and json.loads("".join(pieces)) == use[0].input, pieces
    with sdk_stream(client, **FORCE_WEATHER) as st:
        sdk_pieces = [e.partial_json for e in st if e.type == "input_json"]
        final = st.get_final_message()
    assert sdk_pieces == pieces
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("get_weather", use[0].input)]


def test_cut_tool_input_streams_its_prefix(client, oai, srv):
    """max_tokens cuts the call after its head: the whole reply has no tool_use
    (stop_reason max_tokens, the block stays text); the stream opened the
    tool_use block once, sent the input written so far (a prefix of the whole
    call's arguments, as the chat endpoint writes them) and closed it, and the
    SDK's stream takes that without error."""
    long_schema = with_long_note(WEATHER_SCHEMA)  # the call needs more than max_tokens (serve_harness.LONG_NOTE)
    o_tools = [{"type": "function", "function": dict(O_TOOLS[0]["function"], parameters=long_schema)}, O_TOOLS[1]]
    a_tools = [dict(A_TOOLS[0], input_schema=long_schema), A_TOOLS[1]]
    o, ch = openai_reply(oai, USER, max_tokens=256, tools=o_tools, logprobs=True, parallel_tool_calls=False,
                         tool_choice={"type": "function", "function": {"name": "get_weather"}},
                         extra_body={"chat_template_kwargs": NO_THINK})
    args = ch.message.tool_calls[0].function.arguments
    toks = [bytes(t.bytes) for t in ch.logprobs.content]
    raw = b"".join(toks).decode()
    start, n, pos = re.search(r'"arguments"\s*:\s*\{', raw).end(), 0, 0
    while pos <= start:  # the tokens up to the arguments' first byte, then three more
        pos += len(toks[n])
        n += 1
    body = dict(FORCE_WEATHER, tools=a_tools, max_tokens=n + 3)
    whole = create(client, **body)
    assert whole.stop_reason == "max_tokens" and all(b.type == "text" for b in whole.content), whole.content
    assert raw.startswith(texts(whole.content)[1])
    s = raw_stream(srv, body)
    cut = [b for b in s["content"] if b.get("cut")]
    assert s["stop_reason"] == "max_tokens" and len(cut) == 1 and cut[0]["name"] == "get_weather"
    assert cut[0]["partial"] and args.startswith(cut[0]["partial"]), (cut, args)
    assert texts(s["content"]) == texts(whole.content)
    with sdk_stream(client, **body) as st:
        final = st.get_final_message()
    assert final.stop_reason == "max_tokens" and [b.type for b in final.content].count("tool_use") == 1


def test_tool_round_trip(client, oai, srv):
    _, r = _tool_turn(client, oai, {"type": "any"}, "required", parallel=False)
    uses = [b for b in r.content if b.type == "tool_use"]
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": [{"type": "text", "text": f"{u.name}: 18C"}]}
               for u in uses]
    a_msgs = USER + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                     {"role": "user", "content": results}]
    body = {"model": MODEL, "max_tokens": 32, "temperature": 0, "messages": a_msgs, "tools": A_TOOLS, "thinking": OFF}
    r2 = create(client, **body)
    o_msgs = USER + [{"role": "assistant", "content": texts(r.content)[1] or None, "tool_calls": [
        {"id": u.id, "type": "function", "function": {"name": u.name, "arguments": json.dumps(u.input, ensure_ascii=False)}}
        for u in uses]}] + [{"role": "tool", "tool_call_id": u.id, "content": f"{u.name}: 18C"} for u in uses]
    o, ch = openai_reply(oai, o_msgs, max_tokens=32, tools=O_TOOLS, extra_body={"chat_template_kwargs": NO_THINK})
    assert r2.usage.input_tokens + (r2.usage.cache_read_input_tokens or 0) == o.usage.prompt_tokens
    th, tx, calls = texts(r2.content)
    assert tx == (ch.message.content or "")
    assert calls == [(c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls or []]
    n = client.messages.count_tokens(model=MODEL, messages=a_msgs, tools=A_TOOLS, thinking=OFF)
    assert n.input_tokens == o.usage.prompt_tokens


# ---- count_tokens ----

def test_count_tokens_equals_message_start(client, srv):
    system = "Be brief."
    n = client.messages.count_tokens(model=MODEL, system=system, messages=USER, tools=A_TOOLS)
    s = raw_stream(srv, {"model": MODEL, "max_tokens": 4, "system": system, "messages": USER, "tools": A_TOOLS})
    u = s["usage"]
    assert n.input_tokens == u["input_tokens"] + u["cache_read_input_tokens"]
    n2 = client.messages.count_tokens(model=MODEL, messages=USER)
    st, tok = srv.post("/tokenize", {"messages": USER})
    assert n2.input_tokens == tok["count"] < n.input_tokens


# ---- errors ----

def _is_anthropic_error(body, etype):
    assert isinstance(body, dict) and body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == etype and body["error"]["message"], body


@pytest.mark.parametrize("extra,needle", [
    ({"bogus": 1}, "bogus"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": "x"}, "top_k"),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"thinking": {"type": "enabled"}}, "budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 64}}, "max_tokens"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": A_TOOLS}, "nope"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ({"messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}]}, "toolu_x"),
    ({"messages": USER + [{"role": "assistant", "content": "Sure"}]}, "prefill"),
])
def test_bad_fields_are_400_in_anthropic_shape(client, srv, extra, needle):
    body = dict({"model": MODEL, "max_tokens": 16, "messages": USER}, **extra)
    st, out = srv.post("/v1/messages", body)
    assert st == 400
    _is_anthropic_error(out, "invalid_request_error")
    assert needle in out["error"]["message"], out
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(**{k: v for k, v in body.items() if k in ("model", "max_tokens", "messages")},
                               extra_body={k: v for k, v in body.items() if k not in ("model", "max_tokens", "messages")})
    assert ei.value.status_code == 400 and needle in ei.value.message


def test_other_errors_in_anthropic_shape(client, srv):
    st, out = srv.post("/v1/messages", {"messages": USER})
    assert st == 400 and "max_tokens" in out["error"]["message"]
    _is_anthropic_error(out, "invalid_request_error")
    with pytest.raises(anthropic.NotFoundError) as ei:
        create(client, model="not-served", max_tokens=4, messages=USER)
    assert "not-served" in ei.value.message
    _is_anthropic_error(ei.value.body, "not_found_error")
    st, raw = srv.request("GET", "/v1/messages")
    assert st == 405
    _is_anthropic_error(json.loads(raw), "invalid_request_error")
    st, out = srv.post("/v1/messages/count_tokens", {"messages": USER, "max_tokens": 5})
    assert st == 400 and "max_tokens" in out["error"]["message"]
    _is_anthropic_error(out, "invalid_request_error")
    st, out = srv.post("/v1/messages", "{not json")
    assert st == 400
    _is_anthropic_error(out, "invalid_request_error")


# ---- auth and headers ----

def test_x_api_key_and_headers(synthetic_gguf):
    with Server(synthetic_gguf("synthetic-tiny"), "--ctx", str(N_CTX), "--api-key", KEY, "--max-body", "65536") as s:
        ok = anthropic.Anthropic(base_url=s.base, api_key=KEY, max_retries=0, timeout=120,
                                 default_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
        r = ok.messages.create(model=MODEL, max_tokens=4, messages=USER, thinking=OFF, service_tier="auto",
                               metadata={"user_id": "u-1"}, cache_control={"type": "ephemeral"})
        assert r.usage.output_tokens >= 1
        ok.messages.create(model=MODEL, max_tokens=1, messages=USER, service_tier="standard_only")
        bearer = anthropic.Anthropic(base_url=s.base, auth_token=KEY, max_retries=0, timeout=120)
        assert bearer.messages.count_tokens(model=MODEL, messages=USER).input_tokens > 0
        bad = anthropic.Anthropic(base_url=s.base, api_key="wrong", max_retries=0, timeout=120)
        with pytest.raises(anthropic.AuthenticationError) as ei:
            bad.messages.create(model=MODEL, max_tokens=4, messages=USER)
        _is_anthropic_error(ei.value.body, "authentication_error")
        st, out = s.post("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": USER, "pad": "x" * 70000},
                         headers={"Content-Type": "application/json", "x-api-key": KEY})
        assert st == 413
        _is_anthropic_error(out, "request_too_large")
    notes = [ln for ln in s.stderr.splitlines() if "service_tier" in ln]
    assert len(notes) == 1 and notes[0][:4].isdigit() and notes[0][23:36] == "Z kipp-serve:", notes  # once, timestamped
