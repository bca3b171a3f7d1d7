"""machine.py - what a result document records of the CPU it ran on.

Every machine here has the hostname `vm`, and the Zen 4 and Zen 5 machines both
report the model name "AMD EPYC" and the same best ISA level, so neither the
host nor the model name tells their results apart. The CPU id
"<vendor>-f<cpu family>m<model>" of /proc/cpuinfo does ("amd-f25m17" Zen 4,
"amd-f26m2" Zen 5, "intel-f6m85" Skylake-SP); it follows bench/bench_harness.c's
kipp_cpu_id() (`build/bin/kipp_profile --cpu-id`), which tests/test_bench_tools.py
checks it against, and tags result file names: <date>-<host>-<cpu id>-<kind>-<sha>.json.
"""
from __future__ import annotations

import re
import socket

# The flags that pick kernels (the rest of /proc/cpuinfo's list is noise here).
KERNEL_FLAG_PREFIXES = ("avx", "fma", "f16c", "amx")


def _first_processor(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The key: value lines of /proc/cpuinfo's first processor block ({} when unreadable)."""
    out: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    break
                key, sep, value = line.partition(":")
                if sep:
                    out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


def cpu_id(info: dict[str, str] | None = None) -> str:
    """"<vendor>-f<family>m<model>" (decimal, as /proc/cpuinfo prints them), or
    "cpu-unknown" where those lines are missing (non-x86)."""
    info = _first_processor() if info is None else info
    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(info.get("vendor_id", ""), "cpu")
    family, model = info.get("cpu family"), info.get("model")
    if not family or not model:
        return "cpu-unknown"
    return re.sub(r"[^A-Za-z0-9-]", "_", f"{vendor}-f{family}m{model}")


def cpu_facts() -> dict:
    """{"model": model name, "cpu_id": cpu_id(), "flags": sorted kernel-picking ISA flags}."""
    info = _first_processor()
    flags = sorted(f for f in info.get("flags", "").split() if f.startswith(KERNEL_FLAG_PREFIXES))
    return {"model": info.get("model name", "unknown"), "cpu_id": cpu_id(info), "flags": flags}


def host_tag() -> str:
    """"<host>-<cpu id>", the machine part of a result file name."""
    return f"{socket.gethostname().replace('/', '_').replace(' ', '_')}-{cpu_id()}"
