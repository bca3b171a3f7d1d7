#!/usr/bin/env python3
"""serve_fuzz_seed.py - seed corpus for `make fuzz-http`: valid and near-valid
request bodies for every endpoint (byte 0: bit 0 chat, bit 1 thinking, bit 2
starts in reasoning, bit 3 Anthropic's /v1/messages, bit 4 its count_tokens,
bit 5 /v1/responses; tests/fuzz_http.c), one file each."""
import argparse
import json
from pathlib import Path

MSG = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
       {"role": "assistant", "content": "<think>x</think>y", "reasoning_content": "r"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "a": {"type": "string", "maxLength": 4}, "b": {"enum": [1, "x", None]}}, "required": ["a"]}}}
SEEDS = [
    (0, {"prompt": "Hello", "max_tokens": 4, "stop": ["lo", "</think>"], "n": 2, "logprobs": 3, "echo": True}),
    (0, {"prompt": [1, 2, 3], "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.1, "seed": 7,
         "logit_bias": {"5": -100}, "stream": True, "stream_options": {"include_usage": True}}),
    (0, {"prompt": "a", "frequency_penalty": 1, "presence_penalty": -1, "repetition_penalty": 1.1, "model": "m"}),
    (3, {"messages": MSG, "logprobs": True, "top_logprobs": 5, "chat_template_kwargs": {"enable_thinking": False},
         "stop": "<think>\n</think>"}),
    (7, {"messages": MSG, "max_completion_tokens": 9, "stream": True}),
    (3, {"messages": MSG, "tools": [TOOL], "tool_choice": "required", "reasoning_effort": "low",
         "thinking_token_budget": 4, "min_tokens": 2, "include_stop_str_in_output": True, "priority": -1,
         "store": False, "metadata": {"a": "b"}}),
    (1, {"messages": [{"role": "user", "content": "x"}], "guided_json": {"type": "object", "properties": {"a": {
         "type": "array", "items": {"$ref": "#/$defs/n"}}}, "$defs": {"n": {"type": ["integer", "null"]}}}}),
    (1, {"messages": [{"role": "user", "content": "x"}], "guided_choice": ["yes", "no"], "service_tier": "auto"}),
    (8, {"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "s"}], "messages": [
         {"role": "user", "content": "hi"},
         {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                           {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}],
         "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}],
         "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 4},
         "stop_sequences": ["</tool_call>"], "stream": True}),
    (24, {"model": "m", "messages": [{"role": "user", "content": "count me"}], "thinking": {"type": "disabled"}}),
    (32, {"model": "m", "instructions": "be brief", "input": [
         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
         {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
         "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}],
         "reasoning": {"effort": "none"}, "text": {"format": {"type": "json_schema", "name": "x", "schema": {
             "type": "object", "properties": {"k": {"type": "string", "maxLength": 8}}, "required": ["k"]}}},
         "max_output_tokens": 16, "stream": True}),
    (32, {"input": "hello", "previous_response_id": "resp_x", "store": False}),
]

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    for i, (flags, body) in enumerate(SEEDS):
        (out / f"seed{i}").write_bytes(bytes([flags]) + json.dumps(body).encode())
    (out / "seed_bad").write_bytes(b"\x00{\"prompt\": \"\xc3(\"}")

if __name__ == "__main__":
    main()
