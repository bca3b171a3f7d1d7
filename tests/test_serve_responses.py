"""test_serve_responses.py - OpenAI's Responses API (POST /v1/responses) through
kipp-serve with the official `openai` SDK: client.responses.create, streamed and
not, and the client.responses.stream helper.

Oracles, none of them the Responses renderer:
  - text, reasoning, tool calls and token counts: /v1/chat/completions on the
    same conversation with the same sampling (the chat path is tested against
    HF's template and tokenizer in test_serve_api.py / test_serve_tools.py);
  - structured output and call arguments: `jsonschema` against the schema;
  - streams: the deltas concatenated against the non-streamed response.
The synthetic model's weights are random: logit_bias (a kipp extension the
Responses endpoint passes on) forces "<think>" for reasoning, and tool_choice
"required" makes it write real calls.
"""
from __future__ import annotations

import json
import re

import pytest

from serve_harness import with_long_note

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

N_CTX = 1024
MODEL = "synthetic-tiny"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "days": {"type": "integer"}},
                  "required": ["city", "days"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city", "parameters": WEATHER_PARAMS}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                 "parameters": WEATHER_PARAMS}}
NO_THINK = {"enable_thinking": False}


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def message_text(resp):
    """The text of the response's message items, by walking the output (the SDK's
    output_text must equal it)."""
    return "".join(c.text for o in resp.output if o.type == "message" for c in o.content if c.type == "output_text")


def reasoning_text(resp):
    return "".join(c.text for o in resp.output if o.type == "reasoning" for c in (o.content or []))


# ---- text ----

@pytest.mark.parametrize("effort", ["none", "medium"])
def test_text_matches_chat(client, effort):
    """Greedy: the same text and token counts as the chat endpoint for the same conversation."""
    r = client.responses.create(model=MODEL, instructions="Be brief.", input="Hi there", max_output_tokens=24,
                                temperature=0, reasoning={"effort": effort})
    kw = {"extra_body": {"chat_template_kwargs": NO_THINK}} if effort == "none" else {}
    c = chat(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
             max_completion_tokens=24, temperature=0, **kw)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.output_text == message_text(r) == c.choices[0].message.content
    assert reasoning_text(r) == ((c.choices[0].message.model_extra or {}).get("reasoning_content") or "")
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.usage.output_tokens == c.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if c.choices[0].finish_reason == "length" else "completed")
    msg = [o for o in r.output if o.type == "message"]
    assert len(msg) == 1 and msg[0].id.startswith("msg_") and msg[0].role == "assistant"
    assert r.instructions == "Be brief." and r.reasoning.effort == effort and r.max_output_tokens == 24


def test_max_output_tokens_incomplete(client):
    """A cut reply: status incomplete, the reason, and exactly the tokens allowed."""
    r = client.responses.create(model=MODEL, input="Tell me a story", max_output_tokens=3, temperature=0,
                                reasoning={"effort": "none"})
    c = chat(client, [{"role": "user", "content": "Tell me a story"}], max_completion_tokens=3, temperature=0,
             extra_body={"chat_template_kwargs": NO_THINK})
    assert c.choices[0].finish_reason == "length"  # the oracle: this request is cut
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[-1].status == "incomplete"
    assert r.output_text == c.choices[0].message.content


def test_items_input_equals_string_input(client):
    """input as a string and as one message item with input_text parts give the same reply."""
    a = client.responses.create(model=MODEL, input="Hello", max_output_tokens=8, temperature=0)
    b = client.responses.create(model=MODEL, max_output_tokens=8, temperature=0,
                                input=[{"type": "message", "role": "user",
                                        "content": [{"type": "input_text", "text": "Hello"}]}])
    assert a.output_text == b.output_text and a.usage.input_tokens == b.usage.input_tokens
    assert a.id != b.id


# ---- reasoning ----

def test_reasoning_effort_on_and_off(client, tid):
    """"<think>" forced by logit_bias: thinking on, the reply is one reasoning item
    that never closes (no message); effort none, the template has closed the
    thinking, so the same tokens are the message's text."""
    bias = {"logit_bias": {str(tid("<think>")): 100}}
    on = client.responses.create(model=MODEL, input="Hi", max_output_tokens=5, temperature=0, extra_body=bias)
    c = chat(client, [{"role": "user", "content": "Hi"}], max_completion_tokens=5, temperature=0, logit_bias=bias["logit_bias"])
    assert [o.type for o in on.output] == ["reasoning"]
    rs = on.output[0]
    assert rs.id.startswith("rs_") and rs.summary == [] and rs.content[0].type == "reasoning_text"
    assert rs.content[0].text == c.choices[0].message.model_extra["reasoning_content"] == "<think>" * 4
    assert on.output_text == "" and on.status == "incomplete"
    assert on.usage.output_tokens_details.reasoning_tokens == c.usage.completion_tokens == 5
    off = client.responses.create(model=MODEL, input="Hi", max_output_tokens=5, temperature=0, extra_body=bias,
                                  reasoning={"effort": "none"})
    assert [o.type for o in off.output] == ["message"] and off.output_text == "<think>" * 5
    assert off.usage.output_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize("seed", range(3))
def test_reasoning_and_content_match_chat(client, tid, seed):
    """Both markers favoured, sampled: whatever split the text has, the reasoning
    item and the message carry chat's reasoning_content and content."""
    bias = {str(tid("<think>")): 8, str(tid("</think>")): 8}
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=16, temperature=1.0,
                                extra_body={"logit_bias": bias, "seed": seed})
    c = chat(client, [{"role": "user", "content": "Hi"}], max_completion_tokens=16, temperature=1.0, logit_bias=bias,
             seed=seed, logprobs=True)
    m = c.choices[0].message
    assert reasoning_text(r) == ((m.model_extra or {}).get("reasoning_content") or "")
    assert r.output_text == m.content
    assert r.usage.output_tokens_details.reasoning_tokens == reasoning_token_count(c.choices[0].logprobs.content)


@pytest.mark.parametrize("field", ["thinking_token_budget", "thinking_budget_tokens"])
@pytest.mark.parametrize("budget", [0, 3])
def test_thinking_budget(client, tid, field, budget):
    """<think> pinned by logit_bias: the budget closes the reasoning after
    `budget` tokens with the forced "\n</think>\n\n", then the model answers;
    the reasoning item and message equal chat's under the same budget."""
    bias = {str(tid("<think>")): 100}
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=12, temperature=0,
                                extra_body={"logit_bias": bias, field: budget})
    c = chat(client, [{"role": "user", "content": "Hi"}], max_completion_tokens=12, temperature=0, logit_bias=bias,
             extra_body={field: budget})
    m = c.choices[0].message
    assert reasoning_text(r) == ((m.model_extra or {}).get("reasoning_content") or "") == ("<think>" * budget + "\n" if budget else "")
    assert r.output_text == m.content == "<think>" * (12 - budget - 4)
    assert r.usage.output_tokens_details.reasoning_tokens == budget + 3  # <think>, the budget, "\n", </think>


def reasoning_token_count(tokens) -> int:
    """The generated tokens (chat logprobs: each token's bytes, as sampled, not
    re-tokenized) from a leading <think> up to and including the first
    </think> after it; all of them when it never comes; 0 without <think>."""
    raw, starts = b"", []
    for t in tokens:
        starts.append(len(raw))
        raw += bytes(t.bytes)
    if not raw.startswith(b"<think>"):
        return 0
    close = raw.find(b"</think>", 7)
    end = close + 8 if close >= 0 else len(raw)
    return sum(1 for s in starts if s < end)


@pytest.mark.parametrize("seed", range(6))
def test_reasoning_tokens_are_the_sampled_tokens(client, tid, seed):
    """reasoning_tokens counts the tokens the model sampled from <think> to
    </think>, markers included (each token's offset against the state
    machine's split), as chat's logprobs list them: not a re-tokenization of
    the reasoning text, which /tokenize would split its own way (the exact
    cases, with splits the tokenizer would merge, are in test_serve_text)."""
    bias = {str(tid("<think>")): 100, str(tid("</think>")): 99, str(tid("c")): 100}
    kw = dict(temperature=1.0, frequency_penalty=1.0)
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=12, extra_body=dict(kw, logit_bias=bias, seed=seed))
    c = chat(client, [{"role": "user", "content": "Hi"}], max_completion_tokens=12, logit_bias=bias, seed=seed,
             logprobs=True, **kw)
    toks = c.choices[0].logprobs.content
    assert r.usage.output_tokens_details.reasoning_tokens == reasoning_token_count(toks), [bytes(t.bytes) for t in toks]
    assert c.usage.completion_tokens_details.reasoning_tokens == reasoning_token_count(toks)  # chat's OpenAI field


def test_reasoning_history_item(client):
    """A reasoning item before an assistant message is that turn's reasoning_content:
    the prompt is chat's for the same history (Qwen3's template drops it before
    the last user turn, and keeps it after)."""
    rs = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
          "content": [{"type": "reasoning_text", "text": "think hard"}], "encrypted_content": None}
    asst = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]}
    for tail in ([{"role": "user", "content": "More?"}], []):
        r = client.responses.create(model=MODEL, input=[{"role": "user", "content": "Hi"}, rs, asst, *tail],
                                    max_output_tokens=6, temperature=0)
        msgs = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!", "reasoning_content": "think hard"}, *tail]
        c = chat(client, msgs, max_completion_tokens=6, temperature=0)
        assert r.usage.input_tokens == c.usage.prompt_tokens and r.output_text == c.choices[0].message.content


# ---- structured output ----

@pytest.mark.parametrize("seed", range(3))
def test_json_schema_validates(client, compact, seed):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                               "n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["city", "n", "ok"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="JSON please", max_output_tokens=300, temperature=1.0,
                                reasoning={"effort": "none"}, extra_body={"seed": seed, "logit_bias": compact},
                                text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}})
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


# ---- function calls ----

def call_kw(compact, seed):
    return dict(model=MODEL, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_output_tokens=300,
                temperature=0.8, reasoning={"effort": "none"}, extra_body={"seed": seed, "logit_bias": compact})


def first_turn(client, compact, seed, **more):
    r = client.responses.create(input="Weather in Paris?", **call_kw(compact, seed), **more)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and r.output[-1] is calls[0], r.output
    fc = calls[0]
    assert fc.name == "get_weather" and fc.call_id.startswith("call_") and fc.id.startswith("fc_")
    jsonschema.validate(json.loads(fc.arguments), WEATHER_PARAMS)
    # the chat endpoint, same sampling: the same call
    c = chat(client, [{"role": "user", "content": "Weather in Paris?"}], tools=[CHAT_WEATHER], tool_choice="required",
             parallel_tool_calls=False, max_completion_tokens=300, temperature=0.8, seed=seed, logit_bias=compact,
             extra_body={"chat_template_kwargs": NO_THINK})
    tc = c.choices[0].message.tool_calls
    assert [(t.function.name, t.function.arguments) for t in tc] == [(fc.name, fc.arguments)]
    assert r.usage.input_tokens == c.usage.prompt_tokens
    return r, fc, c


def second_turn_oracle(client, fc, c):
    """The chat reply to the call's result, greedy."""
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": c.choices[0].message.content,
             "tool_calls": [{"id": fc.call_id, "type": "function",
                             "function": {"name": fc.name, "arguments": fc.arguments}}]},
            {"role": "tool", "tool_call_id": fc.call_id, "content": "{\"temp\": 21}"}]
    return chat(client, msgs, tools=[CHAT_WEATHER], max_completion_tokens=24, temperature=0,
                extra_body={"chat_template_kwargs": NO_THINK})


@pytest.mark.parametrize("how", ["objects", "model_dump"])
def test_function_call_round_trip_resending_items(client, compact, how):
    r, fc, c = first_turn(client, compact, 11)
    items = list(r.output) if how == "objects" else [o.model_dump() for o in r.output]  # model_dump: nulls too
    out = {"type": "function_call_output", "call_id": fc.call_id, "output": "{\"temp\": 21}"}
    r2 = client.responses.create(model=MODEL, input=[{"role": "user", "content": "Weather in Paris?"}, *items, out],
                                 tools=[WEATHER], max_output_tokens=24, temperature=0, reasoning={"effort": "none"})
    want = second_turn_oracle(client, fc, c)
    assert r2.output_text == (want.choices[0].message.content or "")
    assert r2.usage.input_tokens == want.usage.prompt_tokens


def test_function_call_round_trip_previous_response_id(client, compact):
    r, fc, c = first_turn(client, compact, 12)
    out = {"type": "function_call_output", "call_id": fc.call_id, "output": "{\"temp\": 21}"}
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, input=[out], tools=[WEATHER],
                                 max_output_tokens=24, temperature=0, reasoning={"effort": "none"})
    want = second_turn_oracle(client, fc, c)
    assert r2.previous_response_id == r.id
    assert r2.output_text == (want.choices[0].message.content or "")
    assert r2.usage.input_tokens == want.usage.prompt_tokens


def test_previous_response_not_stored_or_unknown(client, compact):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    for rid in (r.id, "resp_0123456789abcdef"):
        with pytest.raises(openai.BadRequestError) as ei:
            client.responses.create(model=MODEL, input="again", previous_response_id=rid, max_output_tokens=2)
        err = ei.value.body
        assert err["param"] == "previous_response_id" and rid in err["message"], err
        assert err["code"] == "previous_response_not_found"


# ---- streaming ----

def collect(events):
    """Check the event stream's order rules; returns (final response, text deltas,
    reasoning deltas, {output_index: arguments deltas}, added items)."""
    events = list(events)
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(len(seqs))), seqs
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert sum(e.type in ("response.completed", "response.incomplete") for e in events) == 1
    rid = events[0].response.id
    text, reasoning, args, added, done = "", "", {}, {}, {}
    for e in events:
        if e.type == "response.output_item.added":
            assert e.output_index == len(added) and e.output_index not in done
            added[e.output_index] = e.item
        elif e.type == "response.output_item.done":
            assert e.output_index in added and e.output_index not in done and e.item.id == added[e.output_index].id
            done[e.output_index] = e.item
        elif e.type == "response.output_text.delta":
            assert added[e.output_index].type == "message" and e.output_index not in done
            text += e.delta
        elif e.type == "response.reasoning_text.delta":
            assert added[e.output_index].type == "reasoning" and e.output_index not in done
            reasoning += e.delta
        elif e.type == "response.function_call_arguments.delta":
            args[e.output_index] = args.get(e.output_index, "") + e.delta
        elif e.type == "response.function_call_arguments.done":
            assert e.arguments == args[e.output_index]
    final = events[-1].response
    assert final.id == rid and set(done) == set(added) == set(range(len(final.output)))
    for i, item in enumerate(final.output):
        assert done[i].model_dump() == item.model_dump()
    return final, text, reasoning, args, added


@pytest.mark.parametrize("effort", ["none", "medium"])
def test_stream_equals_whole(client, tid, effort):
    kw = dict(model=MODEL, input="Hi", max_output_tokens=12, temperature=0, reasoning={"effort": effort},
              extra_body={"logit_bias": {str(tid("<think>")): 3, str(tid("</think>")): 3}})
    whole = client.responses.create(**kw)
    final, text, reasoning, _, _ = collect(client.responses.create(stream=True, **kw))
    assert text == whole.output_text == final.output_text
    assert reasoning == reasoning_text(whole) == reasoning_text(final)
    assert [o.type for o in final.output] == [o.type for o in whole.output]
    assert final.usage.output_tokens == whole.usage.output_tokens and final.status == whole.status


def test_stream_forced_reasoning(client, tid):
    kw = dict(model=MODEL, input="Hi", max_output_tokens=5, temperature=0,
              extra_body={"logit_bias": {str(tid("<think>")): 100}})
    final, text, reasoning, _, _ = collect(client.responses.create(stream=True, **kw))
    assert reasoning == "<think>" * 4 and text == "" and final.status == "incomplete"


def test_stream_function_call(client, compact):
    kw = call_kw(compact, 11)
    whole = client.responses.create(input="Weather in Paris?", **kw)
    final, text, _, args, added = collect(client.responses.create(input="Weather in Paris?", stream=True, **kw))
    calls = [o for o in whole.output if o.type == "function_call"]
    scalls = [(i, o) for i, o in added.items() if o.type == "function_call"]
    assert len(scalls) == len(calls) == 1
    i, item = scalls[0]
    assert item.name == calls[0].name and item.arguments == "" and item.call_id.startswith("call_")
    assert args[i] == calls[0].arguments == final.output[i].arguments
    assert text == whole.output_text


def test_stream_arguments_as_written(client, compact):
    """response.function_call_arguments.delta events come as the model writes
    the call: its item (id, call_id, name) is added once, before them; more
    than one delta for a call with two fields, concatenating to the item's
    arguments."""
    events = list(client.responses.create(input="Weather in Paris?", stream=True, **call_kw(compact, 11)))
    final, *_ = collect(events)
    fc = [o for o in final.output if o.type == "function_call"]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    adds = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert len(fc) == len(adds) == 1 and len(deltas) > 1, events
    assert adds[0].item.id == fc[0].id and adds[0].item.call_id == fc[0].call_id
    assert all(d.item_id == fc[0].id and d.output_index == adds[0].output_index for d in deltas)
    assert "".join(d.delta for d in deltas) == fc[0].arguments and events.index(adds[0]) < events.index(deltas[0])


def test_stream_cut_call(client, compact):
    """max_output_tokens cuts the call after its head: the Response is
    incomplete with no function_call item (the block stays text); the stream
    added the call's item, sent the arguments written so far (a prefix of the
    whole call's) and ended the item "incomplete"."""
    long_params = with_long_note(WEATHER_PARAMS)  # the call needs more than the budget (serve_harness.LONG_NOTE)
    kw = dict(call_kw(compact, 11), tools=[dict(WEATHER, parameters=long_params)])
    c = chat(client, [{"role": "user", "content": "Weather in Paris?"}], tool_choice="required",
             tools=[{"type": "function", "function": dict(CHAT_WEATHER["function"], parameters=long_params)}],
             parallel_tool_calls=False, max_completion_tokens=300, temperature=0.8, seed=11, logit_bias=compact,
             logprobs=True, extra_body={"chat_template_kwargs": NO_THINK})
    args = c.choices[0].message.tool_calls[0].function.arguments
    toks = [bytes(t.bytes) for t in c.choices[0].logprobs.content]
    raw = b"".join(toks).decode()
    start, n, pos = re.search(r'"arguments"\s*:\s*\{', raw).end(), 0, 0
    while pos <= start:  # the tokens up to the arguments' first byte, then three more
        pos += len(toks[n])
        n += 1
    kw["max_output_tokens"] = n + 3
    whole = client.responses.create(input="Weather in Paris?", **kw)
    assert whole.status == "incomplete" and [o.type for o in whole.output] == ["message"], whole.output
    assert raw.startswith(whole.output_text) and whole.output_text.startswith("<tool_call>")
    events = list(client.responses.create(input="Weather in Paris?", stream=True, **kw))
    adds = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    dones = [e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    part = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert len(adds) == len(dones) == 1 and dones[0].item.status == "incomplete" and dones[0].item.arguments == part
    assert part and args.startswith(part) and len(part) < len(args), (part, args)
    assert not [e for e in events if e.type == "response.function_call_arguments.done"]
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == whole.output_text


def test_stream_helper(client, compact):
    """client.responses.stream: its accumulated final response equals the
    non-streamed one (the helper needs response.completed: a reply that ends)."""
    kw = call_kw(compact, 13)
    whole = client.responses.create(input="Weather in Paris?", **kw)
    with client.responses.stream(input="Weather in Paris?", **kw) as s:
        args = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
        final = s.get_final_response()
    assert final.status == whole.status == "completed"
    got = [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in final.output]
    assert got == [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in whole.output]
    assert args == "".join(o.arguments for o in final.output if o.type == "function_call")


def test_raw_stream_framing(srv):
    """OpenAI's framing: 'event: <type>' then 'data: <json>' whose type matches; no [DONE]."""
    st, raw = srv.request("POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 3, "stream": True})
    assert st == 200
    blocks = raw.decode().strip("\n").split("\n\n")
    for b in blocks:
        ev, data = b.split("\n")
        assert ev.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == ev[7:]
    assert "[DONE]" not in raw.decode()


# ---- fields without behaviour, and errors ----

def test_inert_fields_accepted_and_echoed(client):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=True, metadata={"k": "v"}, user="u1",
                                truncation="auto", include=["reasoning.encrypted_content"], service_tier="auto",
                                parallel_tool_calls=True, tool_choice="auto", tools=[], top_p=0.9, temperature=0.5)
    assert r.metadata == {"k": "v"} and r.user == "u1" and r.truncation == "auto" and r.tools == []
    assert r.top_p == pytest.approx(0.9) and r.temperature == pytest.approx(0.5) and r.store is True


BAD = [
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content"),
    ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input[0]"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0]"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"reasoning": {"effort": "max"}}, "reasoning"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"background": True}, "background"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"previous_response_id": 7}, "previous_response_id"),
    ({"thinking_token_budget": -2}, "thinking_token_budget"),
    ({"thinking_budget_tokens": "a"}, "thinking_budget_tokens"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[p for _, p in BAD])
def test_bad_input_is_400_naming_the_field(srv, body, param):
    st, r = srv.post("/v1/responses", {"input": "Hi", "max_output_tokens": 2, **body})
    assert st == 400, r
    err = r["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert param.split("[")[0].split(".")[0] in err["message"], err


@pytest.mark.parametrize("raw,words", [(b"[]", "request body is an array, expected a JSON object"), (b"[1, 2]", "expected a JSON object"),
                                       (b"{", "not valid JSON")])
def test_body_that_is_not_an_object_is_400(srv, raw, words):
    """The message names the body's type, read before the body is freed (fuzz_http found
    the Responses parser reading it after: an ASan kipp-serve, KIPP_SERVE_BIN, fails here)."""
    st, r = srv.post("/v1/responses", raw)
    assert st == 400 and words in r["error"]["message"], r


def test_bad_input_through_the_sdk(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "max"})
    assert ei.value.body["param"] == "reasoning"


def test_tool_turn_without_its_call_is_400(srv):
    st, r = srv.post("/v1/responses", {"input": [{"role": "user", "content": "x"},
                                                 {"type": "function_call_output", "call_id": "c1", "output": "y"}]})
    assert st == 400 and r["error"]["param"] == "input", r


def test_store_keeps_the_last_256(srv):
    """The documented bound: after 256 newer stored responses the oldest is evicted
    (400 previous_response_not_found), and the one after it, with 255 newer, is kept."""
    def create(**kw):
        st, r = srv.post("/v1/responses", {"input": "Hi", "max_output_tokens": 1, **kw})
        assert st == 200, r
        return r["id"]
    ids = [create() for _ in range(257)]
    st, r = srv.post("/v1/responses", {"input": "x", "max_output_tokens": 1, "previous_response_id": ids[0]})
    assert st == 400 and r["error"]["code"] == "previous_response_not_found", r
    st, r = srv.post("/v1/responses", {"input": "x", "max_output_tokens": 1, "previous_response_id": ids[1]})
    assert st == 200 and r["previous_response_id"] == ids[1], r  # the 256th newest is still kept
    st, r = srv.request("GET", f"/v1/responses/{ids[0]}")  # evicted: gone for GET too
    assert st == 404 and ids[0] in json.loads(r)["error"]["message"], r
    st, r = srv.request("GET", f"/v1/responses/{ids[1]}")
    assert st == 200 and json.loads(r)["id"] == ids[1], r


def test_retrieve_and_delete(client, srv):
    """GET /v1/responses/{id} (client.responses.retrieve) returns the stored
    Response as created; DELETE forgets it; an id never stored (store false,
    unknown) or deleted is a 404 in OpenAI's error shape naming it, for both."""
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=6, temperature=0, metadata={"k": "v"})
    assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False).id
    assert client.responses.delete(r.id) is None
    for rid in (r.id, unstored, "resp_0123456789abcdef"):
        with pytest.raises(openai.NotFoundError) as ei:
            client.responses.retrieve(rid)
        err = ei.value.body
        assert err["type"] == "invalid_request_error" and rid in err["message"], err
        st, body = srv.request("DELETE", f"/v1/responses/{rid}")
        assert st == 404 and rid in json.loads(body)["error"]["message"], body
    st, body = srv.request("PUT", f"/v1/responses/{r.id}")
    assert st == 405 and "GET or DELETE" in json.loads(body)["error"]["message"], body
