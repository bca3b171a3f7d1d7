#!/usr/bin/env python3
"""serve_fuzz_seed.py - seed corpus for `make fuzz-http`: valid and near-valid
request bodies for both endpoints (byte 0: bit 0 chat, bit 1 thinking, bit 2
starts in reasoning), one file each."""
import argparse
import json
from pathlib import Path

MSG = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
       {"role": "assistant", "content": "<think>x</think>y", "reasoning_content": "r"}]
SEEDS = [
    (0, {"prompt": "Hello", "max_tokens": 4, "stop": ["lo", "</think>"], "n": 2, "logprobs": 3, "echo": True}),
    (0, {"prompt": [1, 2, 3], "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.1, "seed": 7,
         "logit_bias": {"5": -100}, "stream": True, "stream_options": {"include_usage": True}}),
    (0, {"prompt": "a", "frequency_penalty": 1, "presence_penalty": -1, "repetition_penalty": 1.1, "model": "m"}),
    (3, {"messages": MSG, "logprobs": True, "top_logprobs": 5, "chat_template_kwargs": {"enable_thinking": False},
         "stop": "<think>\n</think>"}),
    (7, {"messages": MSG, "max_completion_tokens": 9, "stream": True}),
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
