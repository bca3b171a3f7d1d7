"""`kipp tokenize` / `kipp detokenize` on a converted synthetic checkpoint,
against Hugging Face `tokenizers` on data/qwen3/qwen3-tokenizer (the oracle)."""
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIPP = os.path.join(ROOT, "build", "kipp")
MODEL = os.path.join(ROOT, os.environ.get("KIPP_TEST_MODELS", "build/models"), "synthetic-tiny.gguf")
TEXTS = ["Hello world", "<|im_start|>user\nHi<|im_end|>", "naïve café 中文 😀 'LL", "  \t\r\n x", ""]


def kipp(*args, data=None):
    return subprocess.run([KIPP, *args], capture_output=True, input=data, timeout=120)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_matches_hf(hf, text):
    r = kipp("tokenize", "--model", MODEL, "--text", text, "--special")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == hf.encode(text, add_special_tokens=False).ids


def test_tokenize_file_and_plain_mode(hf, tmp_path):
    p = tmp_path / "in.txt"
    p.write_bytes("<think>x</think>".encode())
    r = kipp("tokenize", "--model", MODEL, "--file", str(p))
    ids = json.loads(r.stdout)
    assert r.returncode == 0 and 151667 not in ids and 151668 not in ids
    r = kipp("tokenize", "--model", MODEL, "--file", str(p), "--special")
    assert json.loads(r.stdout) == [151667, 87, 151668]


def test_detokenize_round_trip(hf):
    text = "Hello 👨‍👩‍👧 <think>ok</think>"
    ids = hf.encode(text, add_special_tokens=False).ids
    r = kipp("detokenize", "--model", MODEL, "--ids", ",".join(map(str, ids)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == text + "\n"


@pytest.mark.parametrize("args,needle", [
    (["tokenize", "--model", MODEL], "exactly one of --text"),
    (["tokenize", "--model", MODEL, "--text", "a", "--bogus"], "unknown argument --bogus"),
    (["detokenize", "--model", MODEL, "--ids", "1,x"], "(\"x\") is not a token id"),
    (["detokenize", "--model", MODEL, "--ids", "151936"], "151936 at index 0 is out of range"),
    (["detokenize", "--ids", "1"], "missing required option --model"),
])
def test_bad_arguments_exit_2(args, needle):
    r = kipp(*args)
    assert r.returncode == 2 and needle in r.stderr.decode(), r.stderr


@pytest.mark.parametrize("kind", ["directory", "fifo", "missing"])
def test_tokenize_unreadable_file_exit_1(kind, tmp_path):
    """--file that is not a readable regular file: named with the reason, exit 1, nothing on
    stdout (was: `[]` and exit 0 for a directory; a FIFO must not block)."""
    path = tmp_path / "x"
    if kind == "directory":
        path.mkdir()
        reason = os.strerror(21)  # EISDIR: "Is a directory"
    elif kind == "fifo":
        os.mkfifo(path)
        reason = "not a regular file"
    else:
        reason = os.strerror(2)  # ENOENT
    r = subprocess.run([KIPP, "tokenize", "--model", MODEL, "--file", str(path)],
                       capture_output=True, timeout=20)
    assert r.returncode == 1 and r.stdout == b"", (r.returncode, r.stdout, r.stderr)
    assert f"kipp tokenize: cannot read --file {path}: {reason}" in r.stderr.decode(), r.stderr


def test_tokenize_file_from_stdin(hf):
    r = kipp("tokenize", "--model", MODEL, "--file", "-", data="Hello world".encode())
    assert r.returncode == 0 and json.loads(r.stdout) == hf.encode("Hello world", add_special_tokens=False).ids


@pytest.mark.parametrize("cmd", ["tokenize", "detokenize"])
def test_model_fifo_refused_without_blocking(cmd, tmp_path):
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    extra = ["--text", "hi"] if cmd == "tokenize" else ["--ids", "1"]
    r = subprocess.run([KIPP, cmd, "--model", str(fifo), *extra], capture_output=True, timeout=20)
    assert r.returncode == 1 and f"'{fifo}' is a FIFO; expected a regular GGUF file" in r.stderr.decode()


HELP_OPTS = {  # the options each command takes, written out independently of the parser
    "tokenize": {"--model", "--text", "--file", "--special", "--help"},
    "detokenize": {"--model", "--ids", "--help"},
    "inspect": {"--kernels", "--help"},
}
HELP_FIRST = {
    "tokenize": "usage: kipp tokenize --model FILE (--text T | --file F) [--special]\n",
    "detokenize": "usage: kipp detokenize --model FILE --ids 1,2,3\n",
    "inspect": "usage: kipp inspect FILE.gguf [--kernels]\n",
}


@pytest.mark.parametrize("cmd", sorted(HELP_OPTS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_to_stdout_exit_0(cmd, flag):
    r = kipp(cmd, flag)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    out = r.stdout.decode()
    assert out.startswith(HELP_FIRST[cmd]), out
    assert set(re.findall(r"^  (--[a-z-]+)", out, re.M)) == HELP_OPTS[cmd]


def test_help_wins_over_other_arguments():
    r = kipp("tokenize", "--model", MODEL, "--text", "x", "--help")
    assert r.returncode == 0 and r.stdout.decode().startswith(HELP_FIRST["tokenize"])
