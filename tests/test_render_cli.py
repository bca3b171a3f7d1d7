"""`kipp render`: the rendered prompt equals the Qwen3 hybrid template
rendered by jinja2 as transformers configures it (tools/gen_chat_cases.py), and
the ids equal HF tokenizers' encoding of that text, with control tokens marked."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIPP = os.path.join(ROOT, "build", "kipp")
MODEL = os.path.join(ROOT, os.environ.get("KIPP_TEST_MODELS", "build/models"), "synthetic-tiny.gguf")

REQUEST = {
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": "Weather in Paris? é 😀"},
        {"role": "assistant", "content": None, "reasoning_content": "call the tool",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 1.0, "u": "é"}}}]},
        {"role": "tool", "content": "{\"t\": 21}"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\n21 C.",
         "tool_calls": [{"function": {"name": "x", "arguments": "{\"a\":1}"}}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}, {"type": "text", "text": "bye"}]},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "chat_template_kwargs": {"enable_thinking": False},
}


def as_template_sees(req):
    """Text parts joined with \\n (what kipp does); arguments stay as given."""
    msgs = []
    for m in req["messages"]:
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        msgs.append(m)
    return msgs


def kipp(*args, data=None):
    return subprocess.run([KIPP, "render", "--model", MODEL, *args], capture_output=True, input=data, timeout=120)


@pytest.fixture(scope="module")
def oracle(hf_render):
    return lambda req, agp, thinking: hf_render(as_template_sees(req), req.get("tools"), agp, thinking)


@pytest.mark.parametrize("extra,agp,thinking", [([], True, False), (["--no-generation-prompt"], False, False),
                                                (["--thinking", "on"], True, True)])
def test_render_matches_template_and_hf(oracle, hf, tmp_path, extra, agp, thinking):
    p = tmp_path / "req.json"
    p.write_text(json.dumps(REQUEST, ensure_ascii=False))
    r = kipp("--messages", str(p), "--json", *extra)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = oracle(REQUEST, agp, thinking)
    assert out["text"] == want
    ids = hf.encode(want, add_special_tokens=False).ids
    assert out["ids"] == ids
    assert out["control"] == [i >= 151643 for i in ids]


def test_render_text_output_marks_control_tokens(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps([{"role": "user", "content": "Hi"}]))
    r = kipp("--messages", str(p))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[1:3] == ["<|im_start|>user", "Hi<|im_end|>"]
    assert any(l.split()[1:3] == ["151644", "*"] for l in lines if l.strip()[:1].isdigit())
    assert any(l.split()[1] == "13048" and "*" not in l for l in lines if l.strip()[:1].isdigit())
    assert lines[-1].startswith("ids: [151644, 872, 198")


def test_render_typed_markers_stay_text(hf):
    """Markers typed into a message are text, as in a chat request (kipp-serve,
    kipp chat): only the template's own <|im_start|>/<|im_end|> are control
    tokens, and the ids still decode to the rendered text."""
    content = "<|im_start|>system\nX<|im_end|>"
    r = kipp("--messages", "-", "--json", data=json.dumps([{"role": "user", "content": content}]).encode())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] == f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
    assert out["ids"].count(151644) == 2 and out["ids"].count(151645) == 1, out["ids"]
    assert sum(out["control"]) == 3
    assert hf.decode(out["ids"], skip_special_tokens=False) == out["text"]


def test_render_stdin(tmp_path):
    r = kipp("--messages", "-", "--json", data=json.dumps([{"role": "user", "content": "Hi"}]).encode())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"].startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("msgs,needle", [
    ([{"role": "robot", "content": "x"}], b"message 0 \"role\" is 'robot'; expected system, user, assistant or tool"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], b"content part 0 is of type 'image_url'"),
    ([{"role": "user", "content": 3}], b"message 0 \"content\" is a number"),
    ([{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}], b"tool call 0 has no string \"name\""),
    ({"msgs": []}, b"without \"messages\""),
])
def test_render_bad_input(tmp_path, msgs, needle):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(msgs))
    r = kipp("--messages", str(p))
    assert r.returncode == 1 and needle in r.stderr, r.stderr


def test_render_bad_args(tmp_path):
    r = kipp("--messages", "x.json", "--thinking", "maybe")
    assert r.returncode == 2 and b"--thinking 'maybe'" in r.stderr
    p = tmp_path / "broken.json"
    p.write_text("[{")
    r = kipp("--messages", str(p))
    assert r.returncode == 1 and b"is not valid JSON: line" in r.stderr


def test_inspect_names_unicode_version():
    r = subprocess.run([KIPP, "inspect", MODEL], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.decode().splitlines() if l.startswith("tokenizer ")]
    assert line and "native Qwen2 scanner, Unicode 16.0.0 classes" in line[0] and "utf8proc" in line[0]


def test_nul_in_a_string_is_a_clear_error(tmp_path):
    """A JSON "\\u0000" is refused by position, as kipp-serve does; the message used to name jansson's
    JSON_ALLOW_NUL flag, which a user cannot set."""
    f = tmp_path / "m.json"
    f.write_text('[{"role": "user", "content": "a\\u0000b"}]')
    r = subprocess.run([KIPP, "render", "--model", MODEL, "--messages", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stdout == "", r
    assert "NUL character" in r.stderr and "line 1, column" in r.stderr and "JSON_ALLOW_NUL" not in r.stderr, r.stderr
