"""memcg.py - a child memory cgroup of this process's own, made for one test or benchmark run
(tests/test_stream_cgroup.py, tools/bench_stream.py).

cgroup v2 `memory.max` where this process's v2 cgroup offers the memory
controller, else cgroup v1 `memory.limit_in_bytes` under the v1 memory
hierarchy; swap around the limit is closed too (v2 memory.swap.max = 0, v1
memory.memsw.limit_in_bytes = the limit) where the files exist. When the
kernel refuses (no controller, no permission), .dir is None and .reason says
why, for the caller to print.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


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

    def run(self, args: list[str], timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        procs = self.dir / "cgroup.procs"

        def enter():
            procs.write_text(str(os.getpid()))

        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=enter,
                              env=env)

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


def drop_cache(path: Path) -> None:
    """Drop the file's clean, unmapped pages from the page cache, so a later run's reads are charged to its cgroup."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
