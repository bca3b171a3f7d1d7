#!/usr/bin/env python3
"""gen_chat_cases.py - golden chat renderings from Hugging Face apply_chat_template.

Writes tests/chat_cases/cases.jsonl, one conversation per line:

  {"name": str, "kind": "hybrid" | "instruct-2507" | "thinking-2507",
   "messages": [{"role", "content" (str|null), "reasoning_content"?: str,
                 "tool_calls"?: [{"name", "arguments" (JSON text)}]}],
   "add_generation_prompt": bool, "enable_thinking": bool,
   "tools_json": str | null,      # as the C caller passes it (any JSON layout)
   "expected": str}               # transformers' rendering, the oracle

The oracle is transformers' apply_chat_template(tokenize=False) with the
chat_template of data/qwen3/qwen3-tokenizer/tokenizer_config{,.instruct-2507,
.thinking-2507}.json. When transformers is missing it falls back to jinja2
configured as transformers configures it (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False),
raise_exception). Tool calls reach the template in OpenAI form
{"type": "function", "function": {"name", "arguments": <string>}} (half of
the cases) or flat {"name", "arguments"}; tools as Python objects parsed from
tools_json, so the template's `tojson` re-serialises them.

Usage: .venv/bin/python tools/gen_chat_cases.py [--data data/qwen3] [--out tests/chat_cases]
"""
import argparse
import json
import os
import sys

KINDS = {"hybrid": "tokenizer_config.json", "instruct-2507": "tokenizer_config.instruct-2507.json",
         "thinking-2507": "tokenizer_config.thinking-2507.json"}


def make_renderer(data):
    """render(template, messages, tools, add_generation_prompt, enable_thinking) -> str"""
    tdir = os.path.join(data, "qwen3-tokenizer")
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(tdir)

        def render(template, messages, tools, agp, thinking):
            kw = {} if thinking is None else {"enable_thinking": thinking}
            return tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                           add_generation_prompt=agp, **kw)
        print("oracle: transformers apply_chat_template", file=sys.stderr)
        return render
    except ImportError:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from jinja2 import TemplateError

        def raise_exception(msg):
            raise TemplateError(msg)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = raise_exception

        def render(template, messages, tools, agp, thinking):
            kw = {} if thinking is None else {"enable_thinking": thinking}
            return env.from_string(template).render(messages=messages, tools=tools,
                                                    add_generation_prompt=agp, **kw)
        print("oracle: jinja2 configured as transformers", file=sys.stderr)
        return render


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city — «quoted» \"text\"",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich or 東京"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search\tthe web\nwith a query\\path",
        "parameters": {"type": "object", "properties": {
            "q": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
            "threshold": {"type": "number", "default": 0.5}, "tiny": {"type": "number", "default": 1e-07},
            "big": {"type": "number", "default": 1e+16}, "exact": {"type": "boolean", "default": False},
            "nothing": {"default": None}, "ratio": {"default": 3.0}, "neg": {"default": -2.5}}}}},
    {"name": "flat_tool", "description": "A tool given without the function wrapper \u0001\u001f \u2028",
     "parameters": {}},
]


def call(name, args, wrapped=True):
    return {"name": name, "arguments": args}, wrapped


def conversations():
    """(name, messages, tools) triples; messages in the C-side shape."""
    U = lambda c: {"role": "user", "content": c}
    S = lambda c: {"role": "system", "content": c}
    A = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
    T = lambda c: {"role": "tool", "content": c}
    TC = lambda name, args: {"name": name, "arguments": args}
    w = '{"city": "Paris"}'
    convs = [
        ("user_only", [U("Hello!")], None),
        ("system_user", [S("You are a helpful assistant."), U("Hi")], None),
        ("empty_user", [U("")], None),
        ("unicode", [S("Réponds en français. 日本語も。"), U("Ça va ? 😀👨‍👩‍👧")], None),
        ("multi_turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")], None),
        ("multi_turn_think_in_content",
         [U("2+2?"), A("<think>\nsimple math\n</think>\n\n4"), U("and 3+3?")], None),
        ("think_content_last_assistant", [U("2+2?"), A("<think>\nadd\n</think>\n\n4")], None),
        ("reasoning_field_last", [U("q"), A("answer", reasoning_content="step 1\nstep 2")], None),
        ("reasoning_field_earlier", [U("q"), A("answer", reasoning_content="hidden"), U("next")], None),
        ("reasoning_after_last_query",
         [U("q1"), A("a1", reasoning_content="r1"), U("q2"), A("a2", reasoning_content="r2")], None),
        ("reasoning_newlines", [U("q"), A("\n\nanswer\n", reasoning_content="\n\nr\n\n")], None),
        ("empty_reasoning_not_last", [U("q"), A("a", reasoning_content=""), U("q2"), A("b")], None),
        ("think_without_open", [U("q"), A("reasoning only</think>\n\nfinal")], None),
        ("double_think", [U("q"), A("<think>a</think>b<think>c</think>\nd")], None),
        ("think_open_only", [U("q"), A("<think>never closed")], None),
        ("system_mid", [U("hi"), S("new instructions"), U("go")], None),
        ("assistant_first", [A("I speak first."), U("ok")], None),
        ("assistant_only_last", [A("<think>x</think>y")], None),
        ("null_assistant_content", [U("q"), A(None)], None),
        ("tools_no_system", [U("Weather in Paris?")], [TOOLS[0]]),
        ("tools_with_system", [S("Be brief."), U("Weather?")], TOOLS[:2]),
        ("tools_three", [U("x")], TOOLS),
        ("tools_empty_list", [U("x")], []),
        ("tool_call_with_content",
         [U("Weather in Paris?"), A("Let me check.", tool_calls=[TC("get_weather", w)])], [TOOLS[0]]),
        ("tool_call_null_content",
         [U("Weather in Paris?"), A(None, tool_calls=[TC("get_weather", w)])], [TOOLS[0]]),
        ("tool_call_empty_content",
         [U("Weather?"), A("", tool_calls=[TC("get_weather", w), TC("search", '{"q": "paris"}')])], TOOLS),
        ("tool_round_trip",
         [S("sys"), U("Weather in Paris?"), A("", tool_calls=[TC("get_weather", w)]),
          T('{"temp": 21, "sky": "clear"}'), A("It is 21°C and clear.")], [TOOLS[0]]),
        ("tool_multi_response",
         [U("Compare"), A(None, tool_calls=[TC("get_weather", w), TC("get_weather", '{"city": "Oslo"}')]),
          T("21"), T("5"), A("Paris is warmer.")], [TOOLS[0]]),
        ("multi_step_tool",
         [U("Plan a trip"), A("<think>need weather</think>", tool_calls=[TC("get_weather", w)]),
          T("sunny"), A(None, reasoning_content="now search", tool_calls=[TC("search", '{"q":"hotels"}')]),
          T("3 hotels"), A("Done.", reasoning_content="summarise")], TOOLS[:2]),
        ("multi_step_gen_prompt",
         [U("Plan"), A(None, tool_calls=[TC("search", '{"q": "x"}')]), T("result")], TOOLS[:2]),
        ("wrapped_tool_response_user",
         [U("q"), A("calling", tool_calls=[TC("search", "{}")]), U("<tool_response>\nraw\n</tool_response>"),
          A("final", reasoning_content="r")], TOOLS[:2]),
        ("tool_first_message", [T("orphan result"), U("ok")], None),
        ("tool_last_message", [U("q"), A(None, tool_calls=[TC("search", '{"q": 1}')]), T("r1")], TOOLS[:2]),
        ("tool_call_args_verbatim",
         [U("q"), A("x", tool_calls=[TC("search", '{ "q" :"spaced",\n "limit":3 }')])], TOOLS[:2]),
        ("newlines_everywhere", [S("\nsys\n"), U("\n\nq\n\n"), A("\n\na\n\n"), U("\n")], None),
        ("special_text_in_content", [U("<|im_start|>user\nfake<|im_end|>"), A("<tool_call>not a call</tool_call>")],
         None),
        ("long_conversation", [U("q%d" % (i // 2)) if i % 2 == 0 else A("a%d" % (i // 2)) for i in range(12)],
         None),
        ("system_only", [S("only a system prompt")], None),
    ]
    return convs


def to_hf(messages, wrap):
    out = []
    for m in messages:
        h = {"role": m["role"], "content": m["content"]}
        if "reasoning_content" in m:
            h["reasoning_content"] = m["reasoning_content"]
        if m.get("tool_calls"):
            h["tool_calls"] = [{"type": "function", "function": dict(c)} if wrap else dict(c)
                               for c in m["tool_calls"]]
        out.append(h)
    return out


def tools_text(tools, style):
    if tools is None:
        return None
    if style == 0:
        return json.dumps(tools)  # ASCII-escaped, default separators
    if style == 1:
        return json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(tools, indent=2, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", default=os.path.join(here, "..", "data", "qwen3"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "chat_cases"))
    args = ap.parse_args()
    render = make_renderer(args.data)
    templates = {k: json.load(open(os.path.join(args.data, "qwen3-tokenizer", f), encoding="utf-8"))["chat_template"]
                 for k, f in KINDS.items()}
    cases = []
    for ci, (name, msgs, tools) in enumerate(conversations()):
        for kind in KINDS:
            variants = [(True, True), (False, True), (True, False)] if kind == "hybrid" else [(True, True)]
            if kind != "hybrid" and ci % 2:
                continue  # the 2507 templates: every other conversation
            for agp, thinking in variants:
                tj = tools_text(tools, ci % 3)
                hf_tools = json.loads(tj) if tj is not None else None
                thinking_arg = None if (thinking and ci % 2) else thinking  # "absent" half the time
                expected = render(templates[kind], to_hf(msgs, wrap=ci % 2 == 0), hf_tools, agp, thinking_arg)
                cases.append({"name": name, "kind": kind, "messages": msgs, "add_generation_prompt": agp,
                              "enable_thinking": thinking, "tools_json": tj, "expected": expected})
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    counts = {k: sum(c["kind"] == k for c in cases) for k in KINDS}
    print(f"wrote {len(cases)} conversations to {path}: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
