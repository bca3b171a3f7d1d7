"""test_stream_flags.py - bad values of the streaming switches
are refused with a message naming the value and the accepted ones, in every
front end that takes them: `--stream` in kipp and kipp-serve, KIPP_STREAM in
kipp-bench (which reads the environment)."""
from __future__ import annotations

import os
import subprocess

import pytest

from conftest import REPO_ROOT, models_dir

BUILD = REPO_ROOT / "build"


def run(args, env=None):
    r = subprocess.run([str(a) for a in args], capture_output=True, timeout=120, cwd=REPO_ROOT,
                       env={**os.environ, **(env or {})})
    return r.returncode, (r.stdout + r.stderr).decode(errors="replace")


@pytest.mark.parametrize("front", ["generate", "serve"])
@pytest.mark.parametrize("bad", ["maybe", "", "ON"])
def test_bad_stream_flag_is_refused(front, bad):
    model = models_dir() / "synthetic-tiny.gguf"
    cmd = ([BUILD / "kipp", "generate", "--model", model, "--prompt", "hi"] if front == "generate"
           else [BUILD / "kipp-serve", "--model", model, "--port", "0"])
    rc, out = run(cmd + ["--stream", bad])
    assert rc != 0 and rc < 128, (rc, out)
    assert f"--stream '{bad}' is invalid, expected auto, on or off" in out, out


def test_bad_stream_env_is_refused_by_the_bench(tmp_path):
    rc, out = run([BUILD / "kipp-bench", "--model", models_dir() / "synthetic-tiny.gguf", "--bench", "tg128",
                   "--reps", "1", "--out", tmp_path], env={"KIPP_STREAM": "maybe"})
    assert rc != 0 and rc < 128, (rc, out)
    assert "KIPP_STREAM=maybe is not a stream mode; expected auto, on or off" in out, out
