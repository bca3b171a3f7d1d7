"""test_sample_fields.py - the engine's one table of sampling fields
(kipp_sample_fields, engine/sampler.c) reaches both surfaces: every sampling
option `kipp generate --help` lists (read from the table) is a kipp-serve field
under the name the help gives, and both refuse the same out-of-range value with
the same expectation text, while both accept the range's ends. The oracle is
the help text itself: a row added to the table appears in all three places or
this test fails.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO_ROOT, models_dir
from serve_harness import Server

KIPP = REPO_ROOT / "build" / "kipp"
ROW = re.compile(r'^  (--[a-z-]+) [A-Z]\n      (.*); default (.*) \(kipp-serve: "([a-z_]+)"\)$', re.M)


def rows() -> list[tuple[str, str, str]]:
    """(flag, expect text, API name) of every sampling option in the help."""
    out = subprocess.run([str(KIPP), "generate", "--help"], capture_output=True, text=True, check=True).stdout
    return [(m[1], m[2], m[4]) for m in ROW.finditer(out)]


def bounds(expect: str) -> tuple[float, float | None]:
    """The range an expectation text states: [lo, hi], lo..hi, or >= lo (hi None)."""
    if m := re.search(r"\[(-?[\d.]+), (-?[\d.]+)\]", expect):
        return float(m[1]), float(m[2])
    if m := re.search(r"(-?\d+)\.\.(\d+)", expect):
        return float(m[1]), float(m[2])
    m = re.search(r">= (-?[\d.]+)", expect)
    assert m, f"no range in '{expect}'"
    return float(m[1]), None


def fmt(x: float, is_int: bool) -> str:
    return str(int(x)) if is_int else repr(x)


def test_help_lists_every_row():
    names = [r[2] for r in rows()]
    assert names == ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                     "presence_penalty"], names


def test_cli_and_server_share_ranges():
    gguf = models_dir() / "synthetic-tiny.gguf"
    assert gguf.is_file(), f"{gguf} is missing: run `make models-test`"
    with Server(gguf, "--ctx", "64") as s:
        for flag, expect, name in rows():
            lo, hi = bounds(expect)
            is_int = "integer" in expect
            for good in [lo] + ([hi] if hi is not None else []):
                st, r = s.post("/v1/completions", {"prompt": "a", "max_tokens": 1, name: int(good) if is_int else good})
                assert st == 200, (name, good, r)
                cli = subprocess.run([str(KIPP), "generate", "--model", str(gguf), "--prompt", "a", "--max-tokens", "1",
                                      "--backend", "ref", flag, fmt(good, is_int)], capture_output=True, text=True)
                assert cli.returncode == 0, (flag, good, cli.stderr)
            bad = lo - 1 if hi is None else hi + 1
            st, r = s.post("/v1/completions", {"prompt": "a", "max_tokens": 1, name: int(bad) if is_int else bad})
            assert st == 400 and r["error"]["param"] == name and expect in r["error"]["message"], (name, bad, r)
            cli = subprocess.run([str(KIPP), "generate", "--model", str(gguf), "--prompt", "a", flag, fmt(bad, is_int)],
                                 capture_output=True, text=True)
            assert cli.returncode == 2 and f"{flag} '{fmt(bad, is_int)}' is invalid, expected {expect}" in cli.stderr, \
                (flag, cli.stderr)


@pytest.mark.parametrize("name,value", [("top_k", 2.5), ("temperature", "hot")])
def test_server_refuses_wrong_type(name, value):
    with Server(models_dir() / "synthetic-tiny.gguf", "--ctx", "64") as s:
        st, r = s.post("/v1/completions", {"prompt": "a", "max_tokens": 1, name: value})
        assert st == 400 and r["error"]["param"] == name and "expected" in r["error"]["message"], r
