"""test_cli.py - `kipp generate`, `kipp chat` and `kipp logits` driven as processes.

Oracles: the transformers golden vectors in tests/vectors (written by
tools/gen_vectors.py from the same synthetic checkpoints: their sha256s are
checked first), and for chat KV reuse the same conversation re-evaluated from
scratch every turn (--no-cache-reuse). All runs use the scalar "ref" backend, except the cpu cache-invariance test.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT, models_dir

KIPP = REPO_ROOT / "build" / "kipp"
VECTORS = REPO_ROOT / "tests" / "vectors"
MANIFEST = json.loads((VECTORS / "MANIFEST.json").read_text())
NMSE_HF = MANIFEST["tolerances"]["prefill_nmse"]
# Greedy tokens are compared only while HF's top-1/top-2 margin stays well above
# the logit error an NMSE of ~1e-5 implies (~0.01 at logit std 4).
SAFE_MARGIN = 0.1
TIMINGS = re.compile(r"prompt (\d+) tokens, generated (\d+) \(([a-z ]+)\), prefill [\d.]+ tok/s, "
                     r"decode [\d.]+ tok/s, TTFT [\d.]+ ms, KV (\d+) bytes/token, backend ref, seed (\d+)")


def gguf(cid: str) -> Path:
    p = models_dir() / f"{cid}.gguf"
    assert p.is_file(), f"{p} is missing: run `make models-test`"
    return p


def kipp(*args: str, stdin: str | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    assert KIPP.is_file(), f"{KIPP} is missing: run `make all`"
    return subprocess.run([str(KIPP), *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prompt(cid: str, name: str) -> dict:
    return MANIFEST["checkpoints"][cid]["prompts"][name]


def safe_greedy(p: dict) -> list[int]:
    """The HF greedy ids up to the first step whose top-2 margin is fragile."""
    n = next((i for i, m in enumerate(p["greedy_margins"]) if m < SAFE_MARGIN), len(p["greedy"]))
    return p["greedy"][:n]


def nmse(a: np.ndarray, ref: np.ndarray) -> float:
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    return float(((a - ref) ** 2).sum() / (ref ** 2).sum())


@pytest.mark.parametrize("cid", sorted(MANIFEST["checkpoints"]))
def test_vectors_match_checkpoints(cid):
    """The vectors were generated from exactly the weights build/models holds."""
    entry = MANIFEST["checkpoints"][cid]
    recorded = json.loads((REPO_ROOT / "tests" / "checkpoints.sha256.json").read_text())["checkpoints"][cid]["files"]
    for name, digest in entry["safetensors_sha256"].items():
        assert recorded[name]["sha256"] == digest, f"{cid}/{name}: vectors made from other weights; run `make vectors`"
        assert sha256(models_dir() / cid / name) == digest, f"build/models/{cid}/{name} differs from the vectors' source"
    # The GGUF is derived from these weights; its own bytes (metadata layout) may change with the
    # converter without changing any logit, and the C gate compares the logits themselves.
    assert gguf(cid).is_file()
    assert (VECTORS / entry["bin"]).stat().st_size == sum(r["count"] * 4 for p in entry["prompts"].values()
                                                         for r in p["logits"]) + \
        sum(h["count"] * 4 for p in entry["prompts"].values() for h in p["hidden"].values())


@pytest.mark.parametrize("cid,name", [("synthetic-tiny", "short"), ("synthetic-tiny-untied", "long")])
def test_logits_file_matches_transformers(cid, name, tmp_path):
    p = prompt(cid, name)
    out = tmp_path / "l.f32"
    r = kipp("logits", "--model", str(gguf(cid)), "--prompt", p["text"], "--out", str(out), "--backend", "ref")
    assert r.returncode == 0, r.stderr
    got = np.fromfile(out, dtype="<f4")
    row = p["logits"][0]
    want = np.fromfile(VECTORS / MANIFEST["checkpoints"][cid]["bin"], dtype="<f4", count=row["count"],
                       offset=row["offset"])
    assert got.shape == want.shape == (151936,)
    assert nmse(got, want) <= NMSE_HF
    assert int(np.argmax(got)) == row["argmax"] == int(np.argmax(want))
    assert f"{len(p['ids'])} prompt tokens" in r.stderr


def generated_ids(stderr: str) -> list[int]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("ids:"))
    return [int(x) for x in line.split()[1:]]


@pytest.mark.parametrize("cid,name", [("synthetic-tiny", "short"), ("synthetic-tiny-untied", "short"),
                                      ("synthetic-tiny-untied", "long")])
def test_generate_greedy_equals_transformers(cid, name):
    p = prompt(cid, name)
    want = safe_greedy(p)
    assert len(want) >= 3, f"{cid}/{name}: only {len(want)} greedy steps have a safe margin"
    r = kipp("generate", "--model", str(gguf(cid)), "--prompt", p["text"], "--max-tokens", str(len(want)),
             "--backend", "ref", "--show-ids")
    assert r.returncode == 0, r.stderr
    assert generated_ids(r.stderr) == want
    m = TIMINGS.search(r.stderr)
    assert m, f"no timings line in {r.stderr!r}"
    n_layer = {"synthetic-tiny": 2, "synthetic-tiny-untied": 3}[cid]
    assert (int(m[1]), int(m[2]), m[3], int(m[4])) == (len(p["ids"]), len(want), "max tokens", n_layer * 4096)
    assert r.stdout.endswith("\n")


def test_generate_chat_renders_and_matches_transformers():
    """--chat renders one user turn natively; HF rendered the same turn for the vectors."""
    p = prompt("synthetic-tiny", "chat")
    want = safe_greedy(p)
    assert len(want) >= 1
    r = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--prompt", MANIFEST["checkpoints"]["synthetic-tiny"]
             ["chat_user"], "--chat", "--max-tokens", str(len(want)), "--backend", "ref", "--show-ids")
    assert r.returncode == 0, r.stderr
    assert generated_ids(r.stderr) == want
    assert TIMINGS.search(r.stderr)[1] == str(len(p["ids"]))


@pytest.mark.parametrize("cid,stop,is_stop", [("synthetic-tiny", 151645, True), ("synthetic-tiny", 151643, True),
                                              ("synthetic-tiny-untied", 151643, True),
                                              ("synthetic-tiny-untied", 151645, False)])
def test_generate_stops_at_registry_stop_tokens(cid, stop, is_stop):
    """--logit-bias forces the first token; it ends generation only if the registry lists it as a stop."""
    r = kipp("generate", "--model", str(gguf(cid)), "--prompt", "Hello", "--max-tokens", "3", "--backend", "ref",
             "--logit-bias", f"{stop}=100", "--show-ids")
    assert r.returncode == 0, r.stderr
    if is_stop:
        assert "generated 0 (stop token)" in r.stderr and generated_ids(r.stderr) == [] and r.stdout == "\n"
    else:  # <|im_end|> is ordinary text for a base model: emitted three times
        assert generated_ids(r.stderr) == [stop] * 3 and r.stdout == "<|im_end|>" * 3 + "\n"


def chat(*extra: str, stdin: str) -> subprocess.CompletedProcess:
    return kipp("chat", "--model", str(gguf("synthetic-tiny")), "--backend", "ref", "--max-tokens", "4", *extra,
                stdin=stdin)


CONVERSATION = "Hello there\nWhat comes next?\n\nAnd then?\n/reset\nHello there\n/exit\nnever read\n"


def test_chat_reuses_kv_and_matches_full_recompute():
    r = chat(stdin=CONVERSATION)
    assert r.returncode == 0, r.stderr
    reuse = [(int(a), int(b)) for a, b in re.findall(r"reused (\d+) of (\d+) prompt tokens", r.stderr)]
    assert len(reuse) == 4, r.stderr  # four turns; the empty line is ignored, /exit stops before "never read"
    assert reuse[0][0] == 0 and reuse[3][0] == 0, "the first turn and the turn after /reset start empty"
    assert reuse[1][0] > reuse[0][1] // 2 and reuse[2][0] > reuse[1][0], f"no KV reuse across turns: {reuse}"
    assert "conversation reset" in r.stderr
    oracle = chat("--no-cache-reuse", stdin=CONVERSATION)
    assert oracle.returncode == 0, oracle.stderr
    assert re.findall(r"reused (\d+) of", oracle.stderr) == ["0"] * 4
    assert r.stdout == oracle.stdout, "replies with KV reuse differ from re-evaluating the conversation"
    # the turn after /reset repeats the first turn exactly
    first = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--prompt", "Hello there", "--chat",
                 "--max-tokens", "4", "--backend", "ref")
    assert first.returncode == 0, first.stderr
    assert r.stdout.startswith(first.stdout) and r.stdout.endswith(first.stdout)


@pytest.mark.parametrize("name", ["synthetic-tiny", "synthetic-tiny-q8_0", "synthetic-tiny-affine4_gs32"])
def test_chat_cache_reuse_is_invariant_on_cpu(name):
    """Row invariance, as a new user would meet it: the fast backend's greedy
    replies with KV reuse equal re-evaluating the conversation every turn
    (decode and prefill round a row alike)."""
    args = ["chat", "--model", str(gguf(name)), "--backend", "cpu", "--max-tokens", "16"]
    talk = "Tell me about cats\nAnd dogs?\n"
    r = kipp(*args, stdin=talk)
    oracle = kipp(*args, "--no-cache-reuse", stdin=talk)
    assert r.returncode == 0 and oracle.returncode == 0, r.stderr + oracle.stderr
    assert re.findall(r"reused (\d+) of", r.stderr)[1] != "0", "the second turn reused no KV"
    assert r.stdout == oracle.stdout, "cpu replies with KV reuse differ from re-evaluating the conversation"


def test_chat_pool_across_reset_matches_full_recompute():
    """/reset publishes the conversation's full 32-token blocks to the model's KV
    pool; the next conversation adopts its longest cached prefix."""
    long_turn = "Tell me about the pool that keeps every full block of this long message. " * 5
    convo = f"{long_turn}\nAnd then?\n/reset\n{long_turn}\n/exit\n"
    r = chat(stdin=convo)
    assert r.returncode == 0, r.stderr
    reuse = [(int(a), int(b)) for a, b in re.findall(r"reused (\d+) of (\d+) prompt tokens", r.stderr)]
    assert len(reuse) == 3, r.stderr
    assert reuse[0][0] == 0 and reuse[2][1] == reuse[0][1], reuse
    assert reuse[2][0] == (reuse[2][1] - 1) // 32 * 32 and reuse[2][0] >= 64, f"no pool reuse after /reset: {reuse}"
    oracle = chat("--no-cache-reuse", stdin=convo)
    assert oracle.returncode == 0, oracle.stderr
    assert r.stdout == oracle.stdout, "replies on an adopted prefix differ from re-evaluating the conversation"


def test_chat_typed_marker_stays_text():
    """A user typing "<|im_start|>" gets text tokens, not the control token:
    kipp chat tokenizes as generate --chat and the server do (kipp_chat_tokenize)."""
    def first_turn(line: str) -> int:
        r = chat(stdin=line + "\n")
        assert r.returncode == 0, r.stderr
        return int(re.findall(r"reused \d+ of (\d+) prompt tokens", r.stderr)[0])
    typed = first_turn("<|im_start|>system")
    g = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--backend", "ref", "--chat",
             "--prompt", "<|im_start|>system", "--max-tokens", "1")
    assert g.returncode == 0, g.stderr
    assert typed == int(TIMINGS.search(g.stderr).group(1)), g.stderr
    assert typed > first_turn("system") + 1, "the typed marker became one control token"


def test_chat_eof_exits_cleanly():
    r = chat(stdin="Hello there\n")
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"reused \d+ of", r.stderr)) == 1


def test_chat_refuses_base_model():
    r = kipp("chat", "--model", str(gguf("synthetic-tiny-untied")), "--backend", "ref", stdin="hi\n")
    assert r.returncode == 2 and "base checkpoint" in r.stderr


@pytest.mark.parametrize("args,needle", [
    ([], "--model"),
    (["--model", "M"], "--prompt"),
    (["--model", "M", "--prompt", "x", "--top-p", "1.5"], "--top-p '1.5'"),
    (["--model", "M", "--prompt", "x", "--temperature", "-1"], "--temperature '-1'"),
    (["--model", "M", "--prompt", "x", "--top-k", "-3"], "--top-k '-3'"),
    (["--model", "M", "--prompt", "x", "--max-tokens", "0"], "--max-tokens '0'"),
    (["--model", "M", "--prompt", "x", "--seed", "abc"], "--seed 'abc'"),
    (["--model", "M", "--prompt", "x", "--frobnicate", "1"], "--frobnicate"),
    (["--model", "M", "--prompt", "x", "--max-tokens"], "--max-tokens"),
    (["--model", "M", "--prompt", "x", "--logit-bias", "5"], "TOKEN_ID=BIAS"),
    (["--model", "M", "--prompt", "x", "--logit-bias", "5=inf"], "finite"),
])
def test_generate_argument_errors(args, needle):
    r = kipp("generate", *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr


def test_unknown_backend_is_an_argument_error():
    r = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--prompt", "x", "--backend", "vulkan")
    assert r.returncode == 2 and "vulkan" in r.stderr


def test_logit_bias_token_out_of_range():
    r = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--prompt", "x", "--backend", "ref",
             "--logit-bias", "151936=1")
    assert r.returncode == 2 and "--logit-bias '151936=1'" in r.stderr and "below 151936" in r.stderr


def test_chat_on_base_model_generate_is_rejected():
    r = kipp("generate", "--model", str(gguf("synthetic-tiny-untied")), "--prompt", "x", "--chat", "--backend", "ref")
    assert r.returncode == 2 and "--chat" in r.stderr


def test_logits_needs_out():
    r = kipp("logits", "--model", str(gguf("synthetic-tiny")), "--prompt", "x")
    assert r.returncode == 2 and "--out" in r.stderr


def test_prompt_longer_than_context_is_rejected_before_compute():
    text = " a" * 5000  # ~5000 tokens > the tiny model's 4096-token context
    r = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--prompt", text, "--backend", "ref", timeout=60)
    assert r.returncode == 1
    m = re.search(r"(\d+) tokens do not fit: the session holds 0 of 4096", r.stderr)
    assert m and int(m[1]) > 4096, r.stderr
    assert "prefill" not in r.stderr  # no timings: nothing was computed


# ---- trial-report fixes: help, per-command options, --ctx, ranges, messages, seed, chat lines ----

TINY = ["--model", str(REPO_ROOT / "build" / "models" / "synthetic-tiny.gguf"), "--backend", "ref"]
# What each command uses (the decision, written out independently of the parser's table).
OWN = {
    "generate": {"--model", "--prompt", "--backend", "--threads", "--chat", "--no-think", "--max-tokens", "--ctx",
                 "--show-ids", "--temperature", "--top-p", "--top-k", "--min-p", "--seed", "--repeat-penalty",
                 "--frequency-penalty", "--presence-penalty", "--logit-bias", "--help", "--spec", "--spec-k", "--spec-fixed", "--lora",
                 "--stream", "--no-prefetch", "--rope-scaling", "--draft-model", "--draft-self", "--draft-max", "--draft-min",
                 "--no-spec", "--kv-type"},
    "chat": {"--model", "--backend", "--threads", "--no-think", "--max-tokens", "--ctx", "--no-cache-reuse", "--system",
             "--kv-cache-dir", "--kv-cache-disk-mib",
             "--temperature", "--top-p", "--top-k", "--min-p", "--seed", "--repeat-penalty", "--frequency-penalty",
             "--presence-penalty", "--logit-bias", "--help", "--lora", "--stream", "--no-prefetch", "--rope-scaling",
             "--draft-model", "--draft-self", "--draft-max", "--draft-min", "--no-spec", "--kv-type"},
    "logits": {"--model", "--prompt", "--out", "--backend", "--threads", "--chat", "--no-think", "--help", "--lora",
               "--stream", "--no-prefetch", "--rope-scaling", "--kv-type"},
}
ALL_OPTS = set().union(*OWN.values())


@pytest.mark.parametrize("cmd", sorted(OWN))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_goes_to_stdout_and_lists_only_own_options(cmd, flag):
    r = kipp(cmd, flag)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith(f"usage: kipp {cmd} ")
    listed = set(re.findall(r"^  (--[a-z-]+)", r.stdout, re.M))
    assert listed == OWN[cmd]


@pytest.mark.parametrize("cmd,flag", [(c, f) for c in sorted(OWN) for f in sorted(ALL_OPTS - OWN[c])])
def test_option_of_another_command_is_rejected(cmd, flag):
    args = [*TINY, "--prompt", "x", "--out", "o.f32"] if cmd == "logits" else [*TINY, "--prompt", "x"]
    args = [a for a in args if cmd != "chat" or a not in ("--prompt", "x")]
    value = [] if flag in ("--chat", "--show-ids", "--no-cache-reuse", "--no-think", "--no-spec") else ["1"]
    r = kipp(cmd, *args, flag, *value, stdin="")
    assert r.returncode == 2, r.stderr
    assert f"option {flag} does not apply to `kipp {cmd}`" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("cmd", ["generate", "logits"])
def test_no_think_needs_chat(cmd):
    r = kipp(cmd, *TINY, "--prompt", "x", "--out", "o.f32", "--no-think") if cmd == "logits" else \
        kipp(cmd, *TINY, "--prompt", "x", "--no-think")
    assert r.returncode == 2 and "--no-think" in r.stderr and "--chat" in r.stderr


@pytest.mark.parametrize("cmd", ["generate", "chat"])
def test_ctx_above_context_length_is_an_error(cmd):
    args = [*TINY, "--ctx", "999999"] + (["--prompt", "hi"] if cmd == "generate" else [])
    r = kipp(cmd, *args, stdin="hi\n")
    assert r.returncode == 2, r.stderr
    assert "--ctx '999999'" in r.stderr and "4096" in r.stderr
    assert r.stdout == ""


def test_generate_ctx_bounds_the_session():
    """--ctx 6 with a 2-token prompt: 4 tokens evaluated after the prompt, 5 sampled, then a note."""
    base = ["--prompt", "hello hello", "--show-ids"]
    r = kipp("generate", *TINY, *base, "--ctx", "6", "--max-tokens", "20")
    assert r.returncode == 0, r.stderr
    m = TIMINGS.search(r.stderr)
    assert (int(m[1]), int(m[2]), m[3]) == (2, 5, "context full")
    assert "context of 6 tokens is full" in r.stderr
    # oracle: the same greedy run limited by --max-tokens instead
    full = kipp("generate", *TINY, *base, "--max-tokens", "5")
    assert full.returncode == 0 and generated_ids(r.stderr) == generated_ids(full.stderr)
    assert r.stdout == full.stdout
    assert "context full" not in full.stderr and "is full" not in full.stderr


def test_generate_prompt_longer_than_ctx_is_rejected():
    r = kipp("generate", *TINY, "--prompt", "one two three four five six", "--ctx", "3")
    assert r.returncode == 1
    assert re.search(r"(\d+) tokens do not fit: the session holds 0 of 3", r.stderr), r.stderr
    assert "prefill" not in r.stderr


@pytest.mark.parametrize("cmd", sorted(OWN))
@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("n", ["1025", "2000", "-1"])
def test_threads_limit_is_1024_at_parse_time(cmd, backend, n):
    # a missing model file shows the check happens before anything is opened
    r = kipp(cmd, "--model", "/nonexistent.gguf", "--prompt", "x", "--out", "o", "--backend", backend,
             "--threads", n) if cmd == "logits" else \
        kipp(cmd, "--model", "/nonexistent.gguf", *(["--prompt", "x"] if cmd == "generate" else []),
             "--backend", backend, "--threads", n, stdin="")
    assert r.returncode == 2, r.stderr
    assert f"--threads '{n}'" in r.stderr and "0..1024" in r.stderr


def test_ref_backend_rejects_threads_other_than_one():
    r = kipp("generate", *TINY, "--prompt", "hi", "--threads", "4")
    assert r.returncode == 2 and "--threads '4'" in r.stderr and "single-threaded" in r.stderr
    ok = kipp("generate", *TINY, "--prompt", "hi", "--threads", "1", "--max-tokens", "1")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("value", ["1e-38", "0", "0.0099", "100.5", "1e39", "nan", "inf"])
def test_repeat_penalty_out_of_range_is_rejected_up_front(value):
    r = kipp("generate", *TINY, "--prompt", "hello hello", "--repeat-penalty", value)
    assert r.returncode == 2
    assert f"--repeat-penalty '{value}'" in r.stderr and "[0.01, 100]" in r.stderr
    assert r.stdout == ""  # nothing generated before the error


@pytest.mark.parametrize("value", ["0.01", "100"])
def test_repeat_penalty_range_ends_run(value):
    r = kipp("generate", *TINY, "--prompt", "hello hello", "--repeat-penalty", value, "--max-tokens", "4",
             "--temperature", "1", "--show-ids")
    assert r.returncode == 0, r.stderr
    assert TIMINGS.search(r.stderr)[2] == "4" or "stop token" in r.stderr


@pytest.mark.parametrize("flag,value,needle", [
    ("--temperature", "1e39", "--temperature '1e39'"),
    ("--top-p", "1.5", "--top-p '1.5' is invalid, expected a number in [0, 1] (0 = greedy)"),
    ("--min-p", "1.5", "--min-p '1.5' is invalid, expected a number in [0, 1]"),
    ("--frequency-penalty", "3", "--frequency-penalty '3'"),
    ("--presence-penalty", "-2.5", "--presence-penalty '-2.5'"),
    ("--max-tokens", "99999999999", "1073741824"),
    ("--top-k", "99999999999", "1073741824"),
    ("--seed", "-1", "--seed '-1'"),
    ("--ctx", "-1", "--ctx '-1'"),  # 0 is valid: the planner's context
    ("--logit-bias", "5=1e39", "--logit-bias '5=1e39'"),
    ("--logit-bias", "5=100.5", "[-100, 100]"),
])
def test_messages_name_the_flag_and_value_as_written(flag, value, needle):
    r = kipp("generate", *TINY, "--prompt", "x", flag, value)
    assert r.returncode == 2
    assert needle in r.stderr, r.stderr
    assert "top_p" not in r.stderr and "repetition_penalty" not in r.stderr and " inf" not in r.stderr


def test_nonfinite_logits_hint_at_corrupt_weights(tmp_path):
    from gguf import GGUFReader
    src = gguf("synthetic-tiny")
    norm = next(t for t in GGUFReader(str(src)).tensors if t.name == "output_norm.weight")
    bad = tmp_path / "nan.gguf"
    data = bytearray(src.read_bytes())
    data[norm.data_offset:norm.data_offset + norm.n_bytes] = b"\xc0\x7f" * (norm.n_bytes // 2)  # bf16 NaN
    bad.write_bytes(bytes(data))
    for args in (["generate", "--prompt", "hi"], ["logits", "--prompt", "hi", "--out", str(tmp_path / "o.f32")]):
        r = kipp(args[0], "--model", str(bad), "--backend", "ref", *args[1:])
        assert r.returncode == 1
        assert "is nan" in r.stderr and "weights may be corrupt" in r.stderr, r.stderr


def test_unseeded_sampling_uses_seed_zero_and_prints_it():
    base = ["generate", *TINY, "--prompt", "hello", "--temperature", "1.5", "--max-tokens", "6", "--show-ids"]
    unseeded, zero, seven = kipp(*base), kipp(*base, "--seed", "0"), kipp(*base, "--seed", "7")
    for r in (unseeded, zero, seven):
        assert r.returncode == 0, r.stderr
    assert TIMINGS.search(unseeded.stderr)[5] == "0" and TIMINGS.search(seven.stderr)[5] == "7"
    assert generated_ids(unseeded.stderr) == generated_ids(zero.stderr)
    assert "default 0" in kipp("generate", "--help").stdout


def test_chat_trims_lines_and_skips_blank_ones():
    messy = chat(stdin="   \n\t\n  Hello there  \t\n /exit  \nnever read\n")
    clean = chat(stdin="Hello there\n")
    assert messy.returncode == 0 and clean.returncode == 0, messy.stderr
    assert len(re.findall(r"reused \d+ of", messy.stderr)) == 1  # the blank lines and /exit are no turns
    assert messy.stdout == clean.stdout


def test_chat_reset_with_whitespace():
    r = chat(stdin="Hello there\n  /reset \t\nHello there\n")
    assert r.returncode == 0, r.stderr
    assert "conversation reset" in r.stderr
    assert re.findall(r"reused (\d+) of", r.stderr) == ["0", "0"]


def test_chat_rejects_unknown_commands_and_exits_1():
    r = chat(stdin="/help\nHello there\n")
    assert r.returncode == 1
    assert "unknown command '/help'" in r.stderr and "/reset" in r.stderr and "/exit" in r.stderr
    assert len(re.findall(r"reused \d+ of", r.stderr)) == 1  # the chat goes on after the rejected line


def test_chat_double_slash_sends_a_literal_slash():
    r = chat(stdin="//x\n")
    assert r.returncode == 0, r.stderr
    one = kipp("generate", *TINY, "--prompt", "/x", "--chat", "--max-tokens", "4")
    assert one.returncode == 0 and r.stdout == one.stdout


def test_chat_exits_1_when_a_turn_fails():
    r = chat("--ctx", "8", stdin="this message is far too long for an eight token context\n")
    assert r.returncode == 1
    assert "do not fit" in r.stderr and "turn dropped" in r.stderr


# ---- --spec: prompt-lookup speculative decoding ----
SPEC_LINE = re.compile(r"spec k (\d+): acceptance ([\d.]+)% \(drafted (\d+), accepted (\d+), emitted (\d+) in (\d+) forwards\)")
COPY_PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"


def spec_ids(r: subprocess.CompletedProcess) -> list[int]:
    line = next(l for l in r.stderr.splitlines() if l.startswith("ids:"))
    return [int(x) for x in line.split()[1:]]


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("extra", [[], ["--spec-k", "1"], ["--spec-k", "16", "--spec-fixed"], ["--ctx", "60"]])
def test_generate_spec_equals_plain_greedy(backend, extra):
    """The emitted ids are exactly plain greedy's (ctx 60: drafts cut at the context limit)."""
    base = ["generate", "--model", str(gguf("synthetic-tiny")), "--backend", backend, "--prompt", COPY_PROMPT,
            "--max-tokens", "70", "--show-ids"]
    ctx = extra if extra[:1] == ["--ctx"] else []  # the plain run gets the same capacity
    plain = kipp(*base, *ctx)
    spec = kipp(*base, "--spec", *extra)
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    assert spec_ids(spec) == spec_ids(plain)
    assert spec.stdout == plain.stdout
    m = SPEC_LINE.search(spec.stderr)
    assert m, spec.stderr
    k, rate, drafted, accepted, emitted, forwards = (float(x) for x in m.groups())
    assert accepted <= drafted and emitted == len(spec_ids(plain)) - 1 and forwards <= emitted
    assert rate == pytest.approx(100.0 * accepted / drafted if drafted else 0.0, abs=0.05)


@pytest.mark.parametrize("args, needle", [
    (["--spec", "--spec-k", "0"], "--spec-k '0' is invalid, expected an integer in 1..16"),
    (["--spec", "--spec-k", "17"], "--spec-k '17' is invalid, expected an integer in 1..16"),
    (["--spec-k", "4"], "expected them with --spec"),
    (["--spec-fixed"], "expected them with --spec"),
    (["--spec", "--temperature", "0.7"], "--spec needs deterministic sampling"),
])
def test_generate_spec_argument_errors(args, needle):
    r = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--prompt", "x", *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


@pytest.mark.parametrize("cmd", ["generate", "logits"])
def test_bad_kv_type_names_value_and_choices(cmd, tmp_path):
    extra = ["--out", str(tmp_path / "o.f32")] if cmd == "logits" else []
    r = kipp(cmd, *TINY, "--prompt", "x", *extra, "--kv-type", "q4_0")
    assert r.returncode == 2
    assert "--kv-type 'q4_0' is not a KV cache type; expected bf16 or q8_0" in r.stderr, r.stderr


def test_kv_type_q8_0_halves_kv_bytes_per_token():
    """34/64 of bf16's bytes (int8 + an fp16 scale per 32 values), named on the timings line."""
    got = {}
    for t in ("bf16", "q8_0"):
        r = kipp("generate", *TINY, "--prompt", "hello", "--max-tokens", "2", "--kv-type", t)
        assert r.returncode == 0, r.stderr
        m = re.search(r", KV (\d+) bytes/token, backend ref, seed 0, KV type (\w+)", r.stderr)
        assert m and m[2] == t, r.stderr
        got[t] = int(m[1])
    assert got["bf16"] == 2 * 2 * 8 * 128 * 2 and got["q8_0"] * 64 == got["bf16"] * 34, got


def test_spec_options_belong_to_generate_only():
    r = kipp("chat", "--model", str(gguf("synthetic-tiny")), "--spec", stdin="")
    assert r.returncode == 2 and "does not apply to `kipp chat`" in r.stderr


# ---- --draft-model / --draft-self: draft-model speculative decoding ----
DRAFT_LINE = re.compile(r"draft model k (\d+): acceptance ([\d.]+)% \(drafted (\d+), accepted (\d+), emitted (\d+) in (\d+) forwards\)")


@pytest.mark.parametrize("extra", [["--draft-self", "q8_0"], ["--draft-model", "synthetic-tiny-affine4_gs32-head_affine4_gs32",
                                                             "--draft-max", "3"],
                                   ["--draft-self", "affine4", "--draft-min", "2"]])
def test_generate_draft_model_equals_plain_greedy(extra):
    extra = [str(gguf(a)) if a.startswith("synthetic-") else a for a in extra]
    base = ["generate", "--model", str(gguf("synthetic-tiny")), "--prompt", "one two three one two", "--max-tokens", "24",
            "--show-ids"]
    plain, spec = kipp(*base), kipp(*base, *extra)
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    assert spec_ids(spec) == spec_ids(plain) and spec.stdout == plain.stdout
    m = DRAFT_LINE.search(spec.stderr)
    assert m and int(m[3]) > 0, spec.stderr  # drafted: the equality is not that of a plain run


def test_chat_takes_a_draft_model_and_samples():
    r = kipp("chat", "--model", str(gguf("synthetic-tiny")), "--draft-self", "q8_0", "--temperature", "0.8",
             "--max-tokens", "8", stdin="hello\n")
    assert r.returncode == 0 and "draft model k" in r.stderr, r.stderr


@pytest.mark.parametrize("args,needle,status", [
    (["--draft-model", "/nonexistent/draft.gguf"], "'/nonexistent/draft.gguf' (drafting for --model", 1),
    (["--draft-min", "2"], "expected it with --draft-model or --draft-self", 2),
    (["--draft-self", "q4"], "--draft-self 'q4' is invalid, expected q8_0 or affine4", 2),
    (["--draft-self", "q8_0", "--draft-max", "2", "--draft-min", "3"], "--draft-min 3 is above the longest draft 2", 2),
    (["--draft-self", "q8_0", "--draft-model", "x.gguf"], "both name a draft", 2),
    (["--no-spec", "--draft-self", "q8_0"], "--no-spec turns speculative decoding off and --draft-self turns it on", 2),
    (["--draft-model", "x.gguf", "--no-spec"], "--no-spec turns speculative decoding off and --draft-model turns it on", 2),
    (["--no-spec", "--spec"], "--no-spec turns speculative decoding off and --spec turns it on", 2),
    (["--draft-model", str(gguf("synthetic-tiny-embedding"))], "the draft is an embedding model (kipp.variant embedding), "
     "expected a generation model", 2),
    (["--draft-model", str(gguf("synthetic-tiny-reranker"))], "the draft is a reranker model (kipp.variant reranker)", 2),
])
def test_generate_draft_argument_errors(args, needle, status):
    r = kipp("generate", "--model", str(gguf("synthetic-tiny")), "--prompt", "x", *args)
    assert r.returncode == status and needle in r.stderr, r.stderr


@pytest.mark.parametrize("cmd", ["generate", "chat"])
def test_no_spec_is_plain_decoding(cmd):
    """--no-spec (kipp-serve's flag) is plain decoding: the same text and ids, no speculative counters."""
    base = [cmd, "--model", str(gguf("synthetic-tiny")), "--max-tokens", "16"]
    base += ["--prompt", "one two three one two", "--show-ids"] if cmd == "generate" else []
    plain, off = kipp(*base, stdin="hello\n"), kipp(*base, "--no-spec", stdin="hello\n")
    assert plain.returncode == 0 and off.returncode == 0, plain.stderr + off.stderr
    assert off.stdout == plain.stdout and "acceptance" not in off.stderr
    if cmd == "generate":
        assert spec_ids(off) == spec_ids(plain)


def test_draft_self_without_a_twin_names_the_files():
    model = gguf("synthetic-tiny-untied")
    r = kipp("generate", "--model", str(model), "--prompt", "x", "--draft-self", "q8_0")
    assert r.returncode == 2 and "synthetic-tiny-untied-q8_0.gguf" in r.stderr and "does not quantize at load" in r.stderr
