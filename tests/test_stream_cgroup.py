"""test_stream_cgroup.py - models larger than RAM, for real.

The test makes its own memory cgroup (tools/memcg.py: cgroup v2 `memory.max`
where this process's v2 cgroup offers the memory controller, else cgroup v1
`memory.limit_in_bytes` under the v1 memory hierarchy), with a limit below the
tiny model's weights, and runs `kipp` inside it with default flags. Oracles,
none of them Kipp's streaming code:
  - the kernel: the resident run (`--stream off`) in the same cgroup is killed
    by the OOM killer (the packed copy is anonymous memory: the limit really is
    below what the model needs), and the cgroup's own counters show it hit the
    limit during the streamed run (v1 memory.max_usage_in_bytes; v2 memory.events max or memory.peak);
  - the unconstrained resident run: the streamed run's final logits (`kipp
    logits`) are bitwise equal to it, and its greedy tokens (`kipp generate
    --show-ids`) are the same, with and without prefetch.
The file's page cache is dropped (posix_fadvise DONTNEED) before each
constrained run, so its pages are charged to the test's cgroup, not found
already resident elsewhere. Skipped, with the reason printed, only where the
kernel refuses a memory cgroup (no controller, no permission).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, models_dir
from memcg import Cgroup, drop_cache

KIPP = REPO_ROOT / "build" / "kipp"
LIMIT = 60 << 20  # bytes: below the tiny model's 91 MB of weights, above the process's own ~25 MB
PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def cgroup():
    cg = Cgroup(LIMIT)
    if cg.dir is None:
        print(f"test_stream_cgroup: skipped: {cg.reason}")
        pytest.skip(f"the kernel refused a memory cgroup: {cg.reason}")
    yield cg
    cg.remove()


def tiny() -> Path:
    return models_dir() / "synthetic-tiny.gguf"


def logits(tmp_path: Path, name: str, run, *extra: str) -> tuple[subprocess.CompletedProcess, bytes]:
    out = tmp_path / f"{name}.f32"
    r = run([str(KIPP), "logits", "--model", str(tiny()), "--prompt", PROMPT, "--out", str(out), *extra])
    return r, out.read_bytes() if r.returncode == 0 else b""


def ids(run, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    r = run([str(KIPP), "generate", "--model", str(tiny()), "--prompt", PROMPT, "--max-tokens", "12", "--show-ids",
             *extra])
    got = [l for l in r.stderr.splitlines() if l.startswith("ids:")]
    return r, got[-1] if got else ""


def plain(args):
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_streamed_run_under_a_limit_below_the_weights(cgroup, tmp_path):
    assert tiny().stat().st_size > LIMIT * 1.4, "the model must be well above the limit for this test to mean anything"
    ref_r, ref = logits(tmp_path, "ref", plain, "--stream", "off")
    assert ref_r.returncode == 0, ref_r.stderr
    gref_r, gref = ids(plain, "--stream", "off")
    assert gref_r.returncode == 0 and gref, gref_r.stderr

    # default flags: the engine sees the cgroup's limit and streams on its own
    drop_cache(tiny())
    cgroup.reset_peak()
    r, got = logits(tmp_path, "auto", cgroup.run)
    assert r.returncode == 0, f"streamed run under a {LIMIT} B limit failed (rc {r.returncode}): {r.stderr}"
    assert "streamed from the file" in r.stderr, r.stderr
    assert got == ref, "streamed logits under the limit differ from the unconstrained resident run"
    assert cgroup.reached_limit(LIMIT), "the run never reached the cgroup's limit: it did not test streaming under pressure"

    for extra in ([], ["--no-prefetch"]):
        drop_cache(tiny())
        r, g = ids(cgroup.run, *extra)
        assert r.returncode == 0, f"generate {extra} under the limit failed (rc {r.returncode}): {r.stderr}"
        assert g == gref, f"greedy tokens {extra} under the limit differ: {g} vs {gref}"


def test_resident_run_does_not_fit_the_limit(cgroup, tmp_path):
    """The negative control: without streaming the packed copy cannot live under the limit."""
    drop_cache(tiny())
    r, _ = logits(tmp_path, "off", cgroup.run, "--stream", "off")
    assert r.returncode != 0, "the resident run fit under the limit: the limit does not test streaming"


def test_stream_flag_values():
    """--stream takes auto, on or off; anything else is refused by name, exit status 2."""
    r = plain([str(KIPP), "logits", "--model", str(tiny()), "--prompt", "x", "--out", "/dev/null", "--stream",
               "sometimes"])
    assert r.returncode == 2 and "--stream" in r.stderr and "sometimes" in r.stderr, r.stderr
    r = plain([str(KIPP), "generate", "--model", str(tiny()), "--prompt", "x", "--max-tokens", "2", "--stream", "on",
               "--no-prefetch"])
    assert r.returncode == 0, r.stderr
