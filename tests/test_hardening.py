"""test_hardening.py - regression tests for what a new user hit, one group per defect.

1. no command writes over its own input (by device and inode), outputs appear whole
   (temporary file + rename), and `make models-test` trusts content, not time stamps;
2. text crosses every API by (pointer, length): NUL inside a chat line is text;
3. list-valued options match exact names and reject unknown ones with the known list;
4. --help exits 0 everywhere, `kipp --version`, "missing required option";
5. file-derived text is escaped before it reaches the terminal;
6. chat: Ctrl-C stops a reply, a second one at the empty prompt exits, Ctrl-D ends
   the prompt line, a dropped turn writes nothing to stdout;
7. a model truncated while mapped ends the process with a message, not SIGBUS;
9. docs and `make help` agree with what the commands do.
Item 8 (install) is tests/test_install.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, models_dir

KIPP = REPO_ROOT / "build" / "kipp"
BENCH = REPO_ROOT / "build" / "kipp-bench"
BENCH_TOK = REPO_ROOT / "build" / "bin" / "bench_tokenizer"
STOP_BIAS = ["--logit-bias", "151645=-100", "--logit-bias", "151643=-100"]  # never stop by itself


def run(*args, stdin: bytes | None = None, timeout: int = 120, cwd: Path = REPO_ROOT, env=None):
    return subprocess.run([str(a) for a in args], input=stdin, capture_output=True, timeout=timeout, cwd=cwd,
                          env=env)


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory) -> Path:
    """A private copy of the tiny model: a regression here must not damage build/models."""
    d = tmp_path_factory.mktemp("model")
    dst = d / "m.gguf"
    shutil.copyfile(models_dir() / "synthetic-tiny.gguf", dst)
    return dst


# ---------------------------------------------------------------- 1. data loss

@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink", "hardlink"])
def test_logits_refuses_to_overwrite_its_model(model_copy, tmp_path, spelling):
    before = sha(model_copy)
    out = {"same": model_copy, "dotted": model_copy.parent / "." / model_copy.name}.get(spelling)
    if spelling == "symlink":
        out = tmp_path / "link.gguf"
        out.symlink_to(model_copy)
    elif spelling == "hardlink":
        out = tmp_path / "hard.gguf"
        os.link(model_copy, out)
    r = run(KIPP, "logits", "--model", model_copy, "--prompt", "hi", "--out", out, "--backend", "ref")
    assert r.returncode == 2, r.stderr
    assert b"same file as the input" in r.stderr, r.stderr
    assert sha(model_copy) == before


def test_logits_output_appears_whole_or_not_at_all(model_copy, tmp_path):
    out = tmp_path / "logits.f32"
    out.write_bytes(b"OLD")
    r = run(KIPP, "logits", "--model", model_copy, "--prompt", "hi", "--out", out, "--backend", "ref")
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size == 151936 * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits.f32"], "a temporary file was left behind"
    r = run(KIPP, "logits", "--model", model_copy, "--prompt", "hi", "--out", tmp_path / "no-dir" / "x.f32",
            "--backend", "ref")
    assert r.returncode == 1 and b"no-dir" in r.stderr, r.stderr
    assert not (tmp_path / "no-dir").exists()


def test_bench_tokenizer_refuses_to_overwrite_its_model(model_copy):
    before = sha(model_copy)
    r = run(BENCH_TOK, "--model", model_copy, "--repeat", "ab ", "--bytes", "300", "--reps", "1", "--warmup", "0",
            "--ids-out", model_copy)
    assert r.returncode == 1 and b"same file as the input" in r.stderr, r.stderr
    assert sha(model_copy) == before


def test_converter_refuses_to_overwrite_an_input(tmp_path):
    src = tmp_path / "ckpt"
    shutil.copytree(models_dir() / "synthetic-tiny", src)
    target = src / "model.safetensors"
    before = sha(target)
    r = run(sys.executable, "tools/convert_to_gguf.py", "--checkpoint", "synthetic-tiny", "--input", src,
            "--out", target, "--quiet")
    assert r.returncode == 1 and b"same file as the input" in r.stderr, r.stderr
    assert sha(target) == before


def test_make_checkpoint_refuses_the_vendored_tokenizer_dir(qwen3_data):
    r = run(sys.executable, "tools/make_checkpoint.py", "--checkpoint", "synthetic-tiny", "--out",
            qwen3_data / "qwen3-tokenizer", "--quiet")
    assert r.returncode == 1 and b"an input" in r.stderr, r.stderr


def test_python_atomic_output_keeps_the_old_file_on_failure(tmp_path):
    import safe_io
    out = tmp_path / "o.bin"
    out.write_bytes(b"OLD")
    with pytest.raises(RuntimeError):
        with safe_io.atomic_output(out) as f:
            f.write(b"NEW-HALF")
            raise RuntimeError("interrupted")
    assert out.read_bytes() == b"OLD" and [p.name for p in tmp_path.iterdir()] == ["o.bin"]
    with safe_io.atomic_output(out) as f:
        f.write(b"NEW")
    assert out.read_bytes() == b"NEW" and [p.name for p in tmp_path.iterdir()] == ["o.bin"]


def test_models_test_rebuilds_an_overwritten_model(tmp_path):
    """An overwritten (newer) model file is rebuilt: make trusts the recorded sha256, not the mtime."""
    args = ["make", "--no-print-directory", f"BUILD={tmp_path}", "TEST_MODELS=synthetic-tiny", "models-test"]
    r = run(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    gguf = tmp_path / "models" / "synthetic-tiny.gguf"
    good = sha(gguf)
    assert good == sha(models_dir() / "synthetic-tiny.gguf")
    gguf.write_bytes(b"logits, not a model")
    r = run(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    assert b"does not match its recorded sha256" in r.stdout, r.stdout
    assert sha(gguf) == good


# ---------------------------------------------------------------- 2. truncation at NUL

def chat_prompt_tokens(line: bytes) -> int:
    r = run(KIPP, "chat", "--model", models_dir() / "synthetic-tiny.gguf", "--backend", "ref", "--max-tokens", "1",
            stdin=line)
    assert r.returncode == 0, r.stderr
    m = re.search(rb"reused 0 of (\d+) prompt tokens", r.stderr)
    assert m, r.stderr
    return int(m.group(1))


def test_chat_line_with_nul_is_not_cut(tmp_path):
    """`three\\0four five` reaches the tokenizer whole: its extra tokens are exactly what
    `kipp tokenize --file` (which reads by length) gives for the part after `three`."""
    text = b"three\0four five"
    f = tmp_path / "t.txt"
    f.write_bytes(text)
    r = run(KIPP, "tokenize", "--model", models_dir() / "synthetic-tiny.gguf", "--file", f)
    n_full = len(eval(r.stdout))
    f.write_bytes(b"three")
    r = run(KIPP, "tokenize", "--model", models_dir() / "synthetic-tiny.gguf", "--file", f)
    n_three = len(eval(r.stdout))
    assert n_full > n_three
    assert chat_prompt_tokens(text + b"\n") - chat_prompt_tokens(b"three\n") == n_full - n_three


# ---------------------------------------------------------------- 3. unknown names

@pytest.mark.parametrize("names", ["nope", "pp", "pp512,tg12", "tg128,", ""])
def test_kipp_bench_rejects_unknown_benchmark_names(tmp_path, names):
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", names, "--out", tmp_path,
            "--profiles", tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert b"expected a comma-separated list of pp512, tg128, tg4k" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == [], "nothing may be written"


def test_kipp_bench_repeated_bench_flags_add_up(tmp_path):
    """--bench tg128 --bench pp512 runs both (the second flag used to replace the first silently)."""
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg128", "--bench", "pp512",
            "--reps", "1", "--warmup", "0", "--out", tmp_path, "--profiles", tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (f,) = tmp_path.glob("*.json")
    names = sorted(x["name"] for x in json.loads(f.read_text())["results"])
    assert names == ["pp512", "tg128"], names


def test_kipp_bench_decode_share_is_against_probes_beside_the_row(tmp_path):
    """A decode row's roofline is the faster of two read probes (kipp_profile --read-bw) run just
    before and after it: this VM's memory speed drifts 2x within minutes, so a profile taken earlier
    made shares of 90% and 152% for the same code. Without a profile the probes still give a share."""
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg128", "--reps", "1",
            "--warmup", "0", "--out", tmp_path, "--profiles", tmp_path / "none", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (f,) = tmp_path.glob("*.json")
    (res,) = json.loads(f.read_text())["results"]
    assert res["roofline_ref"] == "read_gbps_adjacent", res
    assert res["read_gbps_before"] > 0 and res["read_gbps_after"] > 0, res
    assert res["roofline"] == max(res["read_gbps_before"], res["read_gbps_after"])
    assert res["roofline_share"] == pytest.approx(res["gbps_effective"] / res["roofline"], rel=1e-5)
    assert res["profile_read_share"] is None  # no profile to compare with
    assert b"read_gbps_adjacent" in r.stdout


def test_kipp_bench_decode_share_is_the_median_of_per_rep_shares(tmp_path):
    """With several reps a probe runs before each rep and after the last; each rep's share is its
    own GB/s (bytes_per_token * tokens_per_rep / rep_seconds[i]) over the faster of the two probes
    that bracket it, and the row's share is the median of those (memory speed here drifts within
    seconds, so one pair of probes around the whole row misjudged it)."""
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg128", "--reps", "3",
            "--warmup", "0", "--out", tmp_path, "--profiles", tmp_path / "none", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (f,) = tmp_path.glob("*.json")
    (res,) = json.loads(f.read_text())["results"]
    probes, shares, secs = res["read_gbps_probes"], res["rep_read_shares"], res["rep_seconds"]
    assert len(probes) == 4 and len(shares) == 3 and len(secs) == 3, res
    assert all(p > 0 for p in probes) and all(s > 0 for s in secs), res
    for i in range(3):
        gbps = res["bytes_per_token"] * res["tokens_per_rep"] / secs[i] / 1e9
        assert shares[i] == pytest.approx(gbps / max(probes[i], probes[i + 1]), rel=1e-5), (i, res)
    assert res["roofline_share"] == sorted(shares)[1], res
    assert res["roofline"] == sorted(max(probes[i], probes[i + 1]) for i in range(3))[1], res
    assert res["read_gbps_before"] == probes[0] and res["read_gbps_after"] == probes[3], res
    assert sorted(secs)[1] == pytest.approx(res["tokens_per_rep"] / res["median"], rel=1e-5), res
    assert b"median of 3 reps" in r.stdout, r.stdout


def test_kipp_bench_batch_rows_bookkeeping(tmp_path):
    """The batched-decode rows: --bench batch4 runs that row alone; it counts
    B tokens per kipp_eval_batch step over 32 steps, one weight read per step plus each
    sequence's own KV and embedding row, and its share equals its tok/s over the
    one-read-per-step limit B * read GB/s / bytes per step. Bookkeeping only: no rate is judged."""
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "batch4", "--reps", "1",
            "--warmup", "0", "--out", tmp_path, "--profiles", tmp_path / "none", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (f,) = tmp_path.glob("*.json")
    doc = json.loads(f.read_text())
    (res,) = doc["results"]
    assert res["name"] == "batch4" and res["batch"] == 4 and res["steps_per_rep"] == 32, res
    assert doc["config"]["batch_steps"] == 32
    assert res["tokens_per_rep"] == 4 * 32 and res["unit"] == "tok/s", res
    assert res["bytes_per_token"] * 4 == pytest.approx(res["bytes_per_step"], rel=1e-5), res  # 6 digits in the file
    per_seq = (res["bytes_per_step"] - res["weight_bytes_per_step"]) / 4
    assert 0 < per_seq < res["weight_bytes_per_step"] / 10, res  # KV of ~33 positions + one embedding row
    assert res["context_mean"] == 16 + 33 / 2, res
    assert res["roofline_ref"] == "read_gbps_adjacent", res
    assert res["limit_tok_s"] == pytest.approx(4 * res["roofline"] * 1e9 / res["bytes_per_step"], rel=1e-5), res
    assert res["roofline_share"] == pytest.approx(res["median"] / res["limit_tok_s"], rel=1e-5), res
    assert res["target_share"] == 0.70, res
    assert b"one-read-per-step limit 4 x" in r.stdout, r.stdout
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "batch3", timeout=60)
    assert r.returncode == 2 and b"batch1, batch2, batch4, batch8, batch16, batch32" in r.stderr, r.stderr


def test_kipp_bench_says_when_the_read_probe_cannot_run(tmp_path):
    """A kipp-bench without bin/kipp_profile beside it falls back to the profile's roofline and says so;
    one probe failing leaves the other as the roofline and records the failed one as null. The binary
    sits in a folder with a quote and a space (no shell is involved)."""
    lone = tmp_path / "lo'ne dir"
    lone.mkdir()
    shutil.copy2(BENCH, lone / "kipp-bench")
    out = tmp_path / "out"
    r = run(lone / "kipp-bench", "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg128", "--reps", "1",
            "--warmup", "0", "--out", out, "--profiles", tmp_path / "none", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert b"read probe before the row" in r.stderr and b"read probe after the row" in r.stderr, r.stderr
    assert b"cannot execute it" in r.stderr, r.stderr
    assert b"no profile and every read probe failed" in r.stdout, r.stdout
    (f,) = out.glob("*.json")
    (res,) = json.loads(f.read_text())["results"]
    assert res["roofline_ref"] == "read_gbps_all" and res["roofline_share"] is None, res
    assert res["read_gbps_probes"] == [None, None] and res["rep_read_shares"] == [None], res
    # a probe that answers once, then fails: the row keeps the first probe
    (lone / "bin").mkdir()
    flag = tmp_path / "answered"
    (lone / "bin" / "kipp_profile").write_text(
        f"#!/bin/sh\nif [ -e '{flag}' ]; then echo 'probe broke' >&2; exit 3; fi\ntouch '{flag}'\n"
        f"exec '{REPO_ROOT / 'build' / 'bin' / 'kipp_profile'}' \"$@\"\n")
    (lone / "bin" / "kipp_profile").chmod(0o755)
    shutil.rmtree(out)
    r = run(lone / "kipp-bench", "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg128", "--reps", "1",
            "--warmup", "0", "--out", out, "--profiles", tmp_path / "none", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert b"read probe after the row" in r.stderr and b"exit 3: probe broke" in r.stderr, r.stderr
    assert b"read probe before" not in r.stderr, r.stderr
    (f,) = out.glob("*.json")
    (res,) = json.loads(f.read_text())["results"]
    assert res["read_gbps_before"] > 0 and res["read_gbps_after"] is None, res
    assert res["roofline_ref"] == "read_gbps_adjacent" and res["roofline"] == res["read_gbps_before"], res


def test_kipp_profile_checks_every_argument():
    """--buffer-mib takes digits only within [64, 65536] (a huge count used to wrap to a cache-sized
    buffer and print a fake figure with exit 0); --key/--cpu-id no longer print past a bad argument."""
    prof = REPO_ROOT / "build" / "bin" / "kipp_profile"
    for v in ("abc", "64x", "-1", "+64", "", "17592186044417"):
        r = run(prof, "--read-bw", "--buffer-mib", v)
        assert r.returncode == 2 and b"expected a whole number of MiB in [64, 65536]" in r.stderr, (v, r.stderr)
    r = run(prof, "--read-bw", "--buffer-mib", "10")
    assert r.returncode == 2 and b"too small" in r.stderr
    for args in (["--cpu-id", "--bogus"], ["--key", "--read-bw"], ["--read-bw", "--out", "/tmp/never"]):
        r = run(prof, *args)
        assert r.returncode == 2 and r.stdout == b"", (args, r.stdout, r.stderr)
    assert not Path("/tmp/never").exists()


def test_kipp_bench_checks_out_before_running(tmp_path):
    """--out naming a file used to fail only after every benchmark ran, as 'errno 20'."""
    f = tmp_path / "results"
    f.write_bytes(b"not a directory")
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg128", "--reps", "1",
            "--warmup", "0", "--out", f, "--profiles", tmp_path, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert b"--out" in r.stderr and b"Not a directory" in r.stderr, r.stderr
    assert b"opened with backend" not in r.stdout, "nothing may run"
    assert f.read_bytes() == b"not a directory"


def test_kipp_bench_without_a_profile_says_so_once(tmp_path):
    """The missing-profile line used to nest the loader's message and say `make profile` twice."""
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg4k", "--out", tmp_path,
            "--profiles", tmp_path / "none", timeout=300)
    line = [x for x in r.stderr.decode().splitlines() if "profile" in x][0]
    assert line.count("make profile") == 1 and "roofline shares" in line, line


def test_kipp_bench_refuses_two_models_with_one_id(tmp_path):
    """Results are keyed by (bench, model id = file name without .gguf): the same model twice used to
    write two results under one key."""
    m = models_dir() / "synthetic-tiny.gguf"
    r = run(BENCH, "--model", m, "--model", m, "--bench", "tg128", "--reps", "1", "--warmup", "0", "--out", tmp_path,
            "--profiles", tmp_path, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert b"model id 'synthetic-tiny'" in r.stderr, r.stderr
    assert list(tmp_path.glob("*.json")) == []


def test_kipp_bench_refuses_a_benchmark_the_context_cannot_hold(tmp_path):
    """synthetic-tiny has a 4096-token context; tg4k needs 4096 + 32. Asked for explicitly, it used to
    be skipped silently (exit 0, no result, no message)."""
    r = run(BENCH, "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg4k", "--reps", "1",
            "--warmup", "0", "--out", tmp_path, "--profiles", tmp_path, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert b"tg4k needs a context of 4128 positions" in r.stderr and b"4096" in r.stderr, r.stderr
    assert list(tmp_path.glob("*.json")) == []


@pytest.mark.parametrize("args", [["--bench", "nope"], ["--bench", "pp512,tg"], ["--model", "synthetic-tin"]])
def test_bench_models_rejects_unknown_names(args):
    r = run(sys.executable, "tools/bench_models.py", *args, timeout=60)
    assert r.returncode == 2 and b"unknown " in r.stderr and b"expected a comma-separated list" in r.stderr, \
        r.stderr


# ---------------------------------------------------------------- 4. help and version

@pytest.mark.parametrize("cmd", [[KIPP, "--help"], [KIPP, "registry", "--help"], [KIPP, "inspect", "--help"],
                                 [KIPP, "tokenize", "--help"], [KIPP, "generate", "--help"], [KIPP, "chat", "-h"],
                                 [KIPP, "logits", "--help"], [BENCH, "--help"], [BENCH_TOK, "--help"],
                                 [REPO_ROOT / "build" / "bin" / "kipp_profile", "--help"],
                                 ["bash", REPO_ROOT / "tools" / "install_deps.sh", "--help"]])
def test_help_exits_0(cmd):
    r = run(*cmd)
    assert r.returncode == 0 and b"usage:" in r.stdout, (r.stdout, r.stderr)


def test_version_names_sha_flags_and_isa_levels():
    r = run(KIPP, "--version")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    sha_now = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=REPO_ROOT).stdout.strip()
    assert re.search(r"^kipp \d+\.\d+\.\d+$", out, re.M), out
    assert re.search(rf"^git {sha_now}(-dirty)?$", out, re.M) or "git unknown" in out, out
    assert re.search(r"^build flags: \S+ -std=c11 .*-O", out, re.M), out
    assert re.search(r"^ISA levels compiled in: ref avx2 avx512", out, re.M), out
    assert re.search(r"^ISA level selected on this CPU: (ref|avx2|avx512)", out, re.M), out


@pytest.mark.parametrize("args,flag", [(["generate", "--model", "m.gguf"], "--prompt"),
                                       (["logits", "--prompt", "hi"], "--model"),
                                       (["logits", "--model", "m.gguf", "--prompt", "hi"], "--out"),
                                       (["tokenize", "--text", "x"], "--model"),
                                       (["detokenize", "--model", "m.gguf"], "--ids")])
def test_missing_required_option_is_named(args, flag):
    r = run(KIPP, *args)
    assert r.returncode == 2
    assert f"missing required option {flag}".encode() in r.stderr, r.stderr
    assert b"(missing)" not in r.stderr


def test_registry_shows_revision_and_status():
    r = run(KIPP, "registry")
    assert r.returncode == 0
    lines = r.stdout.decode().splitlines()
    assert "revision" in lines[0] and "status" in lines[0]
    tiny = next(ln for ln in lines if ln.startswith("synthetic-tiny "))
    assert "kipp-synth-v1-seed" in tiny and " synthetic " in tiny
    assert any(re.search(r" [0-9a-f]{40} pinned-unverified ", ln) for ln in lines)


# ---------------------------------------------------------------- 5. terminal injection

def test_escape_sequences_in_a_tensor_name_never_reach_the_terminal(tmp_path):
    data = (models_dir() / "synthetic-tiny.gguf").read_bytes()
    evil = b"\x1b]0;pwn\x07\x1b[2J\x9bXXXX"  # OSC title, clear screen, raw C1 CSI byte
    assert len(evil) == len(b"token_embd.weight")
    bad = tmp_path / "evil.gguf"
    bad.write_bytes(data.replace(b"token_embd.weight", evil, 1))
    for args in (["inspect", bad], ["generate", "--model", bad, "--prompt", "hi"],
                 ["tokenize", "--model", bad, "--text", "hi"]):
        r = run(KIPP, *args)
        assert r.returncode != 0
        for stream in (r.stdout, r.stderr):
            assert b"\x1b" not in stream and b"\x07" not in stream and b"\x9b" not in stream, stream
        assert b"\\x1b]0;pwn\\x07" in r.stderr, r.stderr


# ---------------------------------------------------------------- 6. chat UX

class Chat:
    """`kipp chat` on pipes, with stdout and stderr collected by threads."""

    def __init__(self, *extra: str):
        self.p = subprocess.Popen([str(KIPP), "chat", "--model", str(models_dir() / "synthetic-tiny.gguf"),
                                   "--backend", "ref", *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, cwd=REPO_ROOT)
        self.out, self.err = bytearray(), bytearray()
        for src, dst in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        for chunk in iter(lambda: src.read1(4096), b""):
            dst.extend(chunk)

    def send(self, text: bytes):
        self.p.stdin.write(text)
        self.p.stdin.flush()

    def wait_for(self, buf: bytearray, pred, timeout: float = 60.0):
        end = time.monotonic() + timeout
        while not pred(bytes(buf)):
            assert self.p.poll() is None or pred(bytes(buf)), f"chat ended early: {bytes(self.err)!r}"
            assert time.monotonic() < end, f"timed out; stderr: {bytes(self.err)!r}"
            time.sleep(0.02)


def test_ctrl_c_stops_the_reply_and_keeps_the_conversation():
    c = Chat("--max-tokens", "1000000", "--ctx", "4096", *STOP_BIAS)
    c.send(b"hello\n")
    c.wait_for(c.out, lambda b: len(b) > 20)            # the reply is streaming
    c.p.send_signal(signal.SIGINT)
    c.wait_for(c.err, lambda b: b"(interrupted)" in b)   # the timings line says so
    c.wait_for(c.err, lambda b: b.endswith(b"> "))       # back at the prompt
    assert c.p.poll() is None
    n_before = len(c.out)
    c.send(b"and again\n")
    c.wait_for(c.out, lambda b: len(b) > n_before + 20)  # the second reply is streaming
    c.p.send_signal(signal.SIGINT)                        # stops the second reply ...
    c.wait_for(c.err, lambda b: b.count(b"(interrupted)") >= 2)
    c.wait_for(c.err, lambda b: b.endswith(b"> "))
    m = re.findall(rb"reused (\d+) of (\d+) prompt tokens", bytes(c.err))
    # the conversation was kept: the first prompt is reused from the cache, and the second
    # prompt holds the first turn (with the partial reply) plus the new line
    assert len(m) == 2 and int(m[1][0]) >= int(m[0][1]) and int(m[1][1]) > int(m[0][1]) + 5, m
    c.p.send_signal(signal.SIGINT)                        # ... and a second Ctrl-C at the empty prompt exits
    assert c.p.wait(timeout=30) == 0, bytes(c.err)


def test_ctrl_c_twice_at_the_empty_prompt_exits():
    c = Chat()
    c.wait_for(c.err, lambda b: b.endswith(b"> "))
    c.p.send_signal(signal.SIGINT)
    c.wait_for(c.err, lambda b: b"Ctrl-C again" in b and b.endswith(b"> "))
    assert c.p.poll() is None, "one Ctrl-C at the prompt must not exit"
    c.p.send_signal(signal.SIGINT)
    assert c.p.wait(timeout=30) == 0, bytes(c.err)
    assert c.out == b""


def test_ctrl_d_ends_the_prompt_line():
    r = run(KIPP, "chat", "--model", models_dir() / "synthetic-tiny.gguf", "--backend", "ref", stdin=b"")
    assert r.returncode == 0
    assert r.stderr.endswith(b"> \n"), r.stderr


def test_dropped_turn_writes_nothing_to_stdout():
    r = run(KIPP, "chat", "--model", models_dir() / "synthetic-tiny.gguf", "--backend", "ref", "--ctx", "5",
            stdin=b"a message that does not fit\n")
    assert r.returncode == 1
    assert r.stdout == b"", r.stdout
    assert b"turn dropped" in r.stderr


# ---------------------------------------------------------------- 7. model truncated while mapped

@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_model_truncated_while_generating_is_reported(tmp_path, backend):
    m = tmp_path / "m.gguf"
    shutil.copyfile(models_dir() / "synthetic-tiny.gguf", m)
    p = subprocess.Popen([str(KIPP), "generate", "--model", str(m), "--backend", backend, "--prompt", "hi",
                          "--max-tokens", "4000", *STOP_BIAS], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(8)  # generation is running (weights are being read)
    assert first, p.stderr.read()
    os.truncate(m, 4096)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, (p.returncode, err)
    assert str(m).encode() in err and b"4096 bytes now" in err, err


# ---------------------------------------------------------------- 9. docs

def test_readme_model_path_is_what_the_demo_and_models_test_write():
    readme = (REPO_ROOT / "README.md").read_text()
    demo = (REPO_ROOT / "tools" / "demo.sh").read_text()
    paths = set(re.findall(r"build/[\w/.-]*synthetic-tiny\.gguf", readme))
    assert paths == {"build/models/synthetic-tiny.gguf"}, paths
    assert re.search(r"^OUT=build/models\b", demo, re.M), "the demo must write where the README points"


def test_make_help_lists_every_target():
    r = run("make", "--no-print-directory", "help")
    phony = re.search(r"^\.PHONY:(.*)$", (REPO_ROOT / "Makefile").read_text(), re.M).group(1).split()
    for t in phony:
        if t in ("all", "help", "clean"):
            continue
        assert re.search(rf"^make {re.escape(t)}\b", r.stdout.decode(), re.M), f"make help omits {t}"
