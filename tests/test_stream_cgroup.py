"""test_stream_cgroup.py - models larger than RAM, for real (issue 37 item 2).

The test makes its own memory cgroup (cgroup v2 `memory.max` where this
process's v2 cgroup offers the memory controller, else cgroup v1
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

import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, models_dir

KIPP = REPO_ROOT / "build" / "kipp"
LIMIT = 60 << 20  # bytes: below the tiny model's 91 MB of weights, above the process's own ~25 MB
PROMPT = "The quick brown fox jumps over the lazy dog"


def own_cgroup_lines() -> list[tuple[str, str, str]]:
    out = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        out.append((hid, ctrls, path))
    return out


class Cgroup:
    """A child memory cgroup of this process's own, v2 or v1; .reason says why none could be made."""

    def __init__(self, limit: int):
        self.dir: Path | None = None
        self.v2 = False
        self.reason = ""
        lines = own_cgroup_lines()
        v2 = [p for h, c, p in lines if h == "0" and c == ""]
        v1 = [p for h, c, p in lines if "memory" in c.split(",")]
        tried = []
        for kind in ("v2", "v1"):
            if kind == "v2" and v2:
                for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                    base = root / v2[0].lstrip("/")
                    ctl = base / "cgroup.controllers"
                    if ctl.is_file() and "memory" in ctl.read_text().split():
                        if self._make(base, "memory.max", limit, v2=True, tried=tried):
                            return
                    elif ctl.is_file():
                        tried.append(f"v2 {base}: no memory controller in cgroup.controllers")
            if kind == "v1" and v1:
                base = Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/")
                if base.is_dir() and self._make(base, "memory.limit_in_bytes", limit, v2=False, tried=tried):
                    return
                if not base.is_dir():
                    tried.append(f"v1: {base} does not exist")
        self.reason = "; ".join(tried) or "no memory cgroup in /proc/self/cgroup"

    def _make(self, base: Path, knob: str, limit: int, v2: bool, tried: list) -> bool:
        d = base / f"kipp-stream-test-{os.getpid()}"
        try:
            d.mkdir(exist_ok=True)
            if v2 and "memory" not in (d / "cgroup.controllers").read_text().split():
                (base / "cgroup.subtree_control").write_text("+memory")
            (d / knob).write_text(str(limit))
            got = int((d / knob).read_text().split()[0])
            if abs(got - limit) > 1 << 20:
                raise OSError(f"{knob} reads {got} after writing {limit}")
            swap = d / ("memory.swap.max" if v2 else "memory.memsw.limit_in_bytes")  # no swapping around the limit
            if swap.exists():
                try:
                    swap.write_text("0" if v2 else str(limit))
                except OSError:
                    pass
        except OSError as e:
            tried.append(f"{'v2' if v2 else 'v1'} {d}: {e}")
            try:
                d.rmdir()
            except OSError:
                pass
            return False
        self.dir, self.v2 = d, v2
        return True

    def run(self, args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
        procs = self.dir / "cgroup.procs"

        def enter():
            procs.write_text(str(os.getpid()))

        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=enter)

    def reset_peak(self):
        if not self.v2:
            (self.dir / "memory.max_usage_in_bytes").write_text("0")

    def reached_limit(self, limit: int) -> bool:
        """The cgroup's usage reached its limit since reset_peak (v1 max_usage_in_bytes; v2 events max or memory.peak)."""
        if self.v2:
            for line in (self.dir / "memory.events").read_text().splitlines():
                k, v = line.split()
                if k == "max" and int(v) > 0:
                    return True
            peak = self.dir / "memory.peak"
            return peak.exists() and int(peak.read_text()) >= limit - (4 << 20)
        return int((self.dir / "memory.max_usage_in_bytes").read_text()) >= limit - (4 << 20)

    def remove(self):
        if self.dir:
            try:
                self.dir.rmdir()
            except OSError:
                pass


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


def drop_cache(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


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
