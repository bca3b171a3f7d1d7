"""test_serve_tools.py - tool calls through kipp-serve with the official `openai`
client.

Oracles, none of them the server's own parser:
  - the prompt: the Qwen3 chat template rendered by jinja2 as transformers
    does (tools/gen_chat_cases.py) and encoded by HF tokenizers: its token count
    is usage.prompt_tokens, and greedy /v1/completions on that exact text
    continues it with the same reply as the chat request;
  - the reply: the raw generated text, rebuilt from the logprobs' token bytes,
    split into calls and content by `expected_split` below (Python's json);
  - constrained calls: the arguments validate against the tool's parameters
    with the `jsonschema` package.
The synthetic model's text is random: logit_bias steers it onto a small
alphabet of tool-call pieces (malformed blocks), and tool_choice "required" or
a named function makes it write real calls (constrained decoding).
"""
from __future__ import annotations

import json
import re

import pytest

from serve_harness import check_stream, parse_sse, with_long_note

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

CH = "/v1/chat/completions"
N_CTX = 1024

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "days": {"type": "integer"}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                                       "required": ["tz"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "Weather in Paris, and the time?"}]
NO_THINK = {"enable_thinking": False}


def expected_split(raw: str, names) -> tuple[str, list]:
    """The documented parse, written independently: each "<tool_call>" up to the
    first "</tool_call>" after it is a call when its inner text is a JSON object
    of exactly a known "name" and an object "arguments"; any other block stays
    text (a later "<tool_call>" inside it may open one); whitespace-only text
    next to a call is dropped. Returns (content, [(name, arguments dict)])."""
    pieces, calls, piece, scan = [], [], 0, 0
    while True:
        s = raw.find("<tool_call>", scan)
        e = raw.find("</tool_call>", s + 11) if s >= 0 else -1
        if s < 0 or e < 0:
            break
        try:
            obj = json.loads(raw[s + 11:e], object_pairs_hook=_no_dup_keys)
        except ValueError:
            obj = None
        if not (isinstance(obj, dict) and set(obj) == {"name", "arguments"} and obj["name"] in names
                and isinstance(obj["arguments"], dict)):
            scan = s + 1
            continue
        pieces.append((raw[piece:s], True))
        calls.append((obj["name"], obj["arguments"]))
        piece = scan = e + 12
    pieces.append((raw[piece:], False))
    content = ""
    for k, (text, before_call) in enumerate(pieces):
        after_call = k > 0
        if text.strip(" \t\r\n") == "" and (before_call or after_call):
            continue
        content += text
    return content, calls


def _no_dup_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


def raw_text(choice) -> str:
    """The reply as generated: its tokens' bytes (logprobs) joined."""
    return b"".join(bytes(t.bytes) for t in choice.logprobs.content).decode("utf-8")


@pytest.fixture(scope="module")
def oracle(hf_render):
    """(messages, tools, thinking) -> the prompt text HF's template renders."""
    return lambda msgs, tools, thinking: hf_render(msgs, tools, True, thinking)


@pytest.fixture(scope="module")
def alphabet(tid):
    """logit_bias that keeps the model on tool-call pieces: random, mostly malformed blocks."""
    pieces = ["<tool_call>", "</tool_call>", "{\"", "name", "\":", " \"", "get", "_time", "\",", "arguments", " {}",
              "}", "\n", " ", "x"]
    return {str(tid(p)): 100 for p in pieces}


def stream_collect(chunks):
    """Content, finish and the tool calls a stream carries, checking the delta
    shape: id, type and name once, in the call's first delta; then arguments."""
    content, finish, calls = "", None, {}
    for c in chunks:
        for ch in c["choices"]:
            d = ch.get("delta", {})
            content += d.get("content") or ""
            finish = ch["finish_reason"] or finish
            for tc in d.get("tool_calls") or []:
                k = tc["index"]
                if k not in calls:
                    assert k == len(calls), f"call index {k} out of order"
                    assert tc["type"] == "function" and tc["id"].startswith("call_") and tc["function"]["name"]
                    calls[k] = {"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}, tc
                calls[k]["arguments"] += tc["function"].get("arguments", "")
    return content, finish, [calls[k] for k in sorted(calls)]


def post_stream(srv, body):
    st, raw = srv.request("POST", CH, dict(body, stream=True))
    assert st == 200, raw
    chunks = parse_sse(raw)
    check_stream(chunks, 1, True, False)
    return stream_collect(chunks)


def assert_reply_matches_raw(choice, names):
    """message.content / tool_calls / finish_reason against the raw text's own split."""
    raw = raw_text(choice)
    content, calls = expected_split(raw, names)
    msg = choice.message
    got = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]
    assert got == calls, raw
    assert msg.content == (None if calls and not content else content), raw
    if calls and choice.finish_reason != "length":
        assert choice.finish_reason == "tool_calls"
    elif not calls:
        assert choice.finish_reason in ("stop", "length")
    for c in msg.tool_calls or []:
        assert c.type == "function" and c.id.startswith("call_")
    return raw, calls


# ---- the prompt ----

HISTORY = USER + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET", "n": 1.5}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
]


def template_view(msgs):
    """What the template sees: arguments objects as they are (its tojson writes them)."""
    return [dict(m) for m in msgs]


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_history_and_tools_render_as_the_template(srv, client, oracle, hf, choice):
    """Two calls (arguments as a string and as an object) and their results: the
    prompt is the template's, token for token in count, and the greedy reply is
    the one /v1/completions gives for the template's text. tool_choice "none"
    renders without tools."""
    text = oracle(template_view(HISTORY), TOOLS if choice == "auto" else None, False)
    n_ids = len(hf.encode(text, add_special_tokens=False).ids)
    kw = dict(model="synthetic-tiny", max_tokens=24, temperature=0, logprobs=True)
    r = client.chat.completions.create(messages=HISTORY, tools=TOOLS, tool_choice=choice,
                                       extra_body={"chat_template_kwargs": NO_THINK}, **kw)
    assert r.usage.prompt_tokens == n_ids
    ref = client.completions.create(prompt=text, max_tokens=24, temperature=0, model="synthetic-tiny")
    assert raw_text(r.choices[0]) == ref.choices[0].text
    if choice == "auto":
        assert_reply_matches_raw(r.choices[0], SCHEMAS)
    else:  # never parsed
        assert r.choices[0].message.content == ref.choices[0].text and not r.choices[0].message.tool_calls


# ---- parsing the reply (tool_choice auto) ----

@pytest.mark.parametrize("seed", range(6))
def test_malformed_blocks_stay_content(srv, client, alphabet, seed):
    """Biased onto tool-call pieces, the reply is random blocks, almost all
    malformed: the message is the raw text's split, status 200, and the stream
    carries the same content and calls."""
    body = dict(model="synthetic-tiny", messages=USER, tools=TOOLS, max_tokens=60, temperature=1.5, seed=seed,
                logit_bias=alphabet, frequency_penalty=2.0, presence_penalty=2.0, logprobs=True,
                chat_template_kwargs=NO_THINK)
    st, r = srv.post(CH, body)
    assert st == 200, r
    choice = openai.types.chat.ChatCompletion.model_validate(r).choices[0]
    raw, calls = assert_reply_matches_raw(choice, SCHEMAS)
    assert "<tool_call>" in raw
    content, finish, scalls = post_stream(srv, body)
    assert content == (choice.message.content or "") and finish == choice.finish_reason
    assert [(c["name"], c["arguments"]) for c in scalls] == \
        [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]


def test_open_block_forever_is_content(srv, client, tid):
    """Only "<tool_call>" allowed: an unterminated block, returned whole as content."""
    r = client.chat.completions.create(model="synthetic-tiny", messages=USER, tools=TOOLS, max_tokens=8,
                                       logit_bias={str(tid("<tool_call>")): 100}, logprobs=True,
                                       extra_body={"chat_template_kwargs": NO_THINK})
    c = r.choices[0]
    assert c.message.content == "<tool_call>" * 8 and c.message.tool_calls is None and c.finish_reason == "length"


# ---- constrained calls: tool_choice required / named ----

def check_constrained(choice, allowed, max_calls, usage=None, max_tokens=None):
    """A constrained reply: only well-formed calls of allowed functions with valid
    arguments, in the grammar's frame. A random model may spend max_tokens on
    JSON whitespace: then the last block is cut, and stays content."""
    raw, calls = assert_reply_matches_raw(choice, SCHEMAS)
    for name, args in calls:
        assert name in allowed
        jsonschema.validate(args, SCHEMAS[name])
    assert raw.startswith("<tool_call>\n"), raw
    if choice.finish_reason == "length" and usage is not None:
        assert usage.completion_tokens == max_tokens and len(calls) < max_calls, raw
        cut = choice.message.content
        assert cut.startswith("<tool_call>\n") and "</tool_call>" not in cut and raw.endswith(cut), raw
        return calls
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, raw
    assert 1 <= len(calls) <= max_calls, raw
    # the grammar's frame: blocks separated by one newline, nothing else
    assert raw.endswith("\n</tool_call>"), raw
    blocks = raw.split("\n</tool_call>")
    assert len(blocks) == len(calls) + 1 and all(b.startswith(("<tool_call>\n", "\n<tool_call>\n")) for b in blocks[:-1])
    return calls


@pytest.mark.parametrize("seed", range(4))
def test_required_makes_valid_calls(srv, client, compact, seed):
    kw = dict(model="synthetic-tiny", messages=USER, tools=TOOLS, tool_choice="required", max_tokens=300,
              temperature=1.0, seed=seed, logprobs=True, logit_bias=compact,
              extra_body={"chat_template_kwargs": NO_THINK})
    r = client.chat.completions.create(parallel_tool_calls=False, **kw)
    check_constrained(r.choices[0], SCHEMAS, 1)
    r = client.chat.completions.create(**{**kw, "max_tokens": 600})  # parallel_tool_calls defaults to true
    check_constrained(r.choices[0], SCHEMAS, 8, r.usage, 600)


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_named_function(srv, client, compact, name):
    r = client.chat.completions.create(model="synthetic-tiny", messages=USER, tools=TOOLS, max_tokens=300, seed=3,
                                       logit_bias=compact,
                                       tool_choice={"type": "function", "function": {"name": name}}, logprobs=True,
                                       parallel_tool_calls=False, extra_body={"chat_template_kwargs": NO_THINK})
    assert [n for n, _ in check_constrained(r.choices[0], {name}, 1)] == [name]


def test_round_trip_streamed_and_not(srv, client, compact):
    """A two-turn tool conversation: call (required), its result, another call,
    its result, then the answer (auto). Each call's stream carries the same call
    as the whole response, ids included, and the calls go back as history."""
    kw = dict(model="synthetic-tiny", tools=TOOLS, max_tokens=300, temperature=0.8, parallel_tool_calls=False,
              logit_bias=compact)
    history = list(USER)
    for turn in range(2):
        r = client.chat.completions.create(messages=history, tool_choice="required", seed=11 + turn, logprobs=True,
                                           extra_body={"chat_template_kwargs": NO_THINK}, **kw)
        calls = check_constrained(r.choices[0], SCHEMAS, 1)
        body = dict(kw, messages=history, tool_choice="required", seed=11 + turn, chat_template_kwargs=NO_THINK)
        content, finish, scalls = post_stream(srv, body)
        msg = r.choices[0].message
        assert content == "" and finish == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in scalls] == \
            [(c.function.name, c.function.arguments) for c in msg.tool_calls]  # ids differ: another request
        assert [(c["name"], json.loads(c["arguments"])) for c in scalls] == calls
        history += [msg.model_dump(exclude_none=True)]
        history += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": turn})} for c in msg.tool_calls]
    answer = client.chat.completions.create(messages=history, logprobs=True, seed=3,
                                            extra_body={"chat_template_kwargs": NO_THINK}, **{**kw, "max_tokens": 16})
    assert_reply_matches_raw(answer.choices[0], SCHEMAS)
    streamed = post_stream(srv, dict(kw, messages=history, max_tokens=16, seed=3, chat_template_kwargs=NO_THINK))
    assert streamed[0] == (answer.choices[0].message.content or "") and streamed[1] == answer.choices[0].finish_reason


# ---- streamed arguments ----

@pytest.fixture(scope="module")
def odd_bias(compact, hf):
    """compact's first 100 entries (the server takes 300 at most), plus a push
    towards 200 tokens that carry part of a character's UTF-8 bytes or a
    backslash, so that string escapes and split characters land in the
    arguments (the grammar keeps them inside strings)."""
    odd = [i for i in range(151643) if "\ufffd" in hf.decode([i]) or "\\" in hf.decode([i])][:200]
    return dict(list(compact.items())[:100], **{str(i): 4 for i in odd})


def sdk_stream_calls(client, **kw):
    """The openai SDK's stream of a chat request: (content, finish, per call
    index {ids, names, args}: every id, name and arguments delta it carried)."""
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"ids": [], "names": [], "args": []})
                c["ids"] += [tc.id] if tc.id else []
                c["names"] += [tc.function.name] if tc.function and tc.function.name else []
                c["args"] += [tc.function.arguments] if tc.function and tc.function.arguments else []
    return content, finish, [calls[k] for k in sorted(calls)]


STREAM_KW = dict(model="synthetic-tiny", messages=USER, tools=TOOLS, max_tokens=300, temperature=1.0,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
                 extra_body={"chat_template_kwargs": NO_THINK})


def test_arguments_stream_as_written(srv, client, odd_bias):
    """A call's arguments stream as the model writes them: its id and name once,
    then several arguments deltas that concatenate to exactly the whole
    response's arguments, byte for byte, also where a character's UTF-8 bytes
    or a string escape span tokens."""
    odd = 0
    for seed in range(4):
        r = client.chat.completions.create(seed=seed, logit_bias=odd_bias, **STREAM_KW)
        assert r.choices[0].finish_reason == "tool_calls", r
        want = r.choices[0].message.tool_calls[0].function.arguments
        content, finish, calls = sdk_stream_calls(client, seed=seed, logit_bias=odd_bias, **STREAM_KW)
        assert finish == "tool_calls" and content == "" and len(calls) == 1
        c = calls[0]
        assert len(c["ids"]) == 1 and c["ids"][0].startswith("call_") and c["names"] == ["get_weather"], c
        assert len(c["args"]) > 1 and "".join(c["args"]) == want, (c["args"], want)
        odd += "\\" in want or any(ord(ch) > 127 for ch in want)
    assert odd, "no seed wrote an escape or a non-ASCII character into the arguments"


def test_cut_call_streams_its_prefix_and_is_no_call(srv, client, compact):
    """max_tokens cuts the call after its head: the whole reply has no call
    (finish length, the block stays content); its stream sent the call's head
    once and the arguments written so far (a prefix of what the whole call
    would have), with the same content and finish (docs/SERVING.md, "Streamed calls")."""
    long_weather = {"type": "function", "function": dict(WEATHER["function"], parameters=with_long_note(SCHEMAS["get_weather"]))}
    base = dict(STREAM_KW, tools=[long_weather, TIME])  # the call needs more than max_tokens (serve_harness.LONG_NOTE)
    full = client.chat.completions.create(seed=5, logit_bias=compact, logprobs=True, **base)
    raw, args = raw_text(full.choices[0]), full.choices[0].message.tool_calls[0].function.arguments
    start, n, pos = re.search(r'"arguments"\s*:\s*\{', raw).end(), 0, 0
    while pos <= start:  # the tokens up to the arguments' first byte, then three more
        pos += len(bytes(full.choices[0].logprobs.content[n].bytes))
        n += 1
    kw = dict(base, max_tokens=n + 3)
    cut = client.chat.completions.create(seed=5, logit_bias=compact, **kw).choices[0]
    assert cut.finish_reason == "length" and not cut.message.tool_calls
    assert raw.startswith(cut.message.content) and cut.message.content.startswith("<tool_call>")
    content, finish, calls = sdk_stream_calls(client, seed=5, logit_bias=compact, **kw)
    assert finish == "length" and content == cut.message.content and len(calls) == 1
    c = calls[0]
    assert len(c["ids"]) == 1 and c["names"] == ["get_weather"]
    part = "".join(c["args"])
    assert part and args.startswith(part) and len(part) < len(args), (part, args)


def test_required_with_thinking_leaves_the_thinking_free(srv, client, compact, tid):
    """Thinking on: a reply that opens with <think> is free until "</think>",
    then constrained; one that does not is constrained throughout. Calls are
    read from the content only. logit_bias makes the free part think markers
    only, and frequency_penalty ends a run of <think>, so the thinking closes
    within a few tokens."""
    bias = {**dict(list(compact.items())[:298]), str(tid("<think>")): 100, str(tid("</think>")): 100}
    opened = 0
    for seed in range(6):
        r = client.chat.completions.create(model="synthetic-tiny", messages=USER, tools=TOOLS, tool_choice="required",
                                           max_tokens=300, seed=seed, logprobs=True, logit_bias=bias,
                                           frequency_penalty=2.0, parallel_tool_calls=False)
        c = r.choices[0]
        raw = raw_text(c)
        cut = raw.index("</think>") + 8 if raw.startswith("<think>") else 0
        free, constrained = raw[:cut], raw[cut:]
        assert free.replace("<think>", "").replace("</think>", "") == "", raw
        content, calls = expected_split(constrained.lstrip("\n"), SCHEMAS)
        assert len(calls) == 1 and content == "" and c.finish_reason == "tool_calls", raw
        assert [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == calls
        assert c.message.content is None
        if cut:  # split as reasoning: <think>...</think> then the call
            opened += 1
            assert c.message.model_extra["reasoning_content"] == raw[7:cut - 8].strip("\n")
    assert opened > 0, "no seed opened a thinking block: the free part went untested"


# ---- client errors ----

def tools_with(**fn):
    return [{"type": "function", "function": {"name": "f", **fn}}]


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
ERRORS = [
    ({"tools": [{"type": "retrieval"}]}, "tools", "tools[0] is not a function tool"),
    ({"tools": tools_with(name="bad name")}, "tools", "a-z, A-Z, 0-9"),
    ({"tools": tools_with(parameters=[1])}, "tools", "JSON Schema object"),
    ({"tools": tools_with(strict="yes")}, "tools", "strict is a string, expected a boolean"),
    ({"tools": tools_with(extra=1)}, "tools", "tools[0].function.extra is not supported"),
    ({"tools": tools_with() + tools_with()}, "tools", "repeats tools[0]"),
    ({"tools": {"type": "function"}}, "tools", "expected an array"),
    ({"tools": tools_with(), "tool_choice": "any"}, "tool_choice", "'any'"),
    ({"tools": tools_with(), "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice",
     "'g', which is not in tools"),
    ({"tools": tools_with(), "tool_choice": {"type": "function"}}, "tool_choice", "expected \"none\""),
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when tools are given"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls", "only allowed when tools"),
    ({"tools": tools_with(), "parallel_tool_calls": 1}, "parallel_tool_calls", "expected a boolean"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f", "arguments": "{x"})]}]},
     "messages", "arguments is not valid JSON"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f", "arguments": 3})]}]},
     "messages", "expected a JSON string or an object"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [dict(CALL, type="code")]}]}, "messages", "expected \"function\""),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [CALL, CALL]}]}, "messages", "repeats call 0"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [dict(CALL, id="")]}]}, "messages", "non-empty string"),
    ({"messages": USER + [{"role": "tool", "tool_call_id": "c1", "content": "x"}]}, "messages", "does not follow"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "c2", "content": "x"}]},
     "messages", "'c2' matches no id"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "c1"}]},
     "messages", "content is missing"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c1"}]}, "messages", "only on tool messages"),
    ({"messages": USER + [{"role": "assistant", "function_call": {}}]}, "messages", "function_call is not supported"),
    ({"tool_choice": "required", "tools": tools_with(), "response_format": {"type": "json_object"}}, "tool_choice",
     "response_format json_object would contradict"),
    # a schema keyword the constrained decoder does not support, when it would have to enforce it
    ({"tools": tools_with(parameters={"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}),
      "tool_choice": "required"}, "tools", "pattern"),
]


@pytest.mark.parametrize("extra,param,words", ERRORS, ids=[f"{i}-{e[1]}" for i, e in enumerate(ERRORS)])
def test_tool_errors(srv, extra, param, words):
    st, r = srv.post(CH, {"messages": USER, "max_tokens": 2, **extra})
    assert st == 400, r
    assert r["error"]["param"] == param and words in r["error"]["message"], r["error"]


def test_unsupported_keyword_is_fine_when_not_enforced(srv):
    """tool_choice auto compiles no grammar: the tool's schema is only rendered."""
    tools = tools_with(parameters={"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}, strict=True)
    st, r = srv.post(CH, {"messages": USER, "max_tokens": 2, "tools": tools})
    assert st == 200, r


def test_history_tool_calls_accepted_without_tools(srv):
    """A past call to a function no longer offered is history, not an error."""
    msgs = USER + [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                   {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    st, r = srv.post(CH, {"messages": msgs, "max_tokens": 2})
    assert st == 200, r
    assert "tool_calls" not in r["choices"][0]["message"]
