"""Bad input to the kernel-check driver (kernels/cpu/check/kcheck.c): every
unknown name or out-of-range value is refused with exit status 2 and a message
naming the value and what was expected; --help exits 0."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KCHECK = ROOT / "build/bin/kcheck"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(KCHECK), *args], capture_output=True, text=True)


def test_unknown_names_are_refused_with_the_known_ones() -> None:
    p = run("--op", "nope")
    assert p.returncode == 2 and "--op 'nope' is unknown" in p.stderr and "matvec" in p.stderr
    p = run("--fmt", "fp8")
    assert p.returncode == 2 and "--fmt 'fp8' is unknown" in p.stderr and "bf16" in p.stderr
    p = run("--isa", "sse4")
    assert p.returncode == 2 and "--isa 'sse4' is unknown" in p.stderr and "avx512_bf16" in p.stderr


def test_out_of_range_values_and_stray_arguments() -> None:
    p = run("--bench", "--reps", "0")
    assert p.returncode == 2 and "--reps '0' is invalid" in p.stderr
    p = run("--threads", "x")
    assert p.returncode == 2 and "--threads 'x' is invalid" in p.stderr
    p = run("--frobnicate")
    assert p.returncode == 2 and "unknown or incomplete argument '--frobnicate'" in p.stderr


def test_help_and_one_op() -> None:
    assert run("--help").returncode == 0
    p = run("--op", "add")
    assert p.returncode == 0 and p.stdout.rstrip().endswith("0") and "RESULT" in p.stdout


def test_a_subset_bench_never_replaces_a_result_file(tmp_path: Path) -> None:
    """A one-op --bench run at the commit of a full `make bench` table had
    replaced that table with its own rows; now it refuses before timing."""
    p = run("--bench", "--op", "add", "--reps", "1", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    files = list(tmp_path.glob("*-kernels-*.json"))
    assert len(files) == 1
    before = files[0].read_bytes()
    p = run("--bench", "--op", "add", "--reps", "1", "--out", str(tmp_path))
    assert p.returncode == 2 and str(files[0]) in p.stderr and "--out" in p.stderr
    assert files[0].read_bytes() == before and "RESULT" not in p.stdout
