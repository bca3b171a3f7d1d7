"""test_cuda_build.py - the CUDA build as CI sees it.

CI machines have no GPU. `make test` compiles the CUDA build (build/cuda) where
nvcc exists; these tests check that without a device every CUDA binary fails
cleanly (an exit status and a sentence saying there is no CUDA device, never a
crash), and that the CPU build answers `--backend cuda` by saying it has no
CUDA backend and how to get one. On a machine with a GPU the no-device checks
are skipped (tools/cuda_check.sh is the device check).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, models_dir

CPU_BIN = REPO_ROOT / "build"
CUDA_BIN = REPO_ROOT / "build" / "cuda"


def tiny() -> Path:
    p = Path(models_dir()) / "synthetic-tiny.gguf"
    if not p.exists():
        pytest.skip(f"{p} missing: run make models-test")
    return p


def run(*args, timeout: int = 120):
    r = subprocess.run([str(a) for a in args], capture_output=True, timeout=timeout, cwd=REPO_ROOT)
    return r.returncode, (r.stdout + r.stderr).decode(errors="replace")


def has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def need_cuda_build(what: Path) -> None:
    """Where nvcc exists `make test` builds build/cuda, so a missing binary is a
    build defect (fail); only a machine without nvcc skips."""
    if what.exists():
        return
    if shutil.which("nvcc"):
        pytest.fail(f"{what} missing although nvcc exists: `make test` must build the CUDA build (make cuda)")
    pytest.skip(f"{what} not built: no nvcc on this machine")


def commands(bindir: Path, model: Path):
    return {
        "kipp generate": [bindir / "kipp", "generate", "--model", model, "--prompt", "hi", "--max-tokens", "2",
                          "--backend", "cuda"],
        "kipp-bench": [bindir / "kipp-bench", "--model", model, "--backend", "cuda", "--bench", "tg128",
                       "--reps", "1", "--out", "/nonexistent-kipp-results"],
        "kipp-serve": [bindir / "kipp-serve", "--model", model, "--backend", "cuda", "--port", "0"],
    }


@pytest.mark.parametrize("name", ["kipp generate", "kipp-bench", "kipp-serve"])
def test_cpu_build_says_it_has_no_cuda(name):
    cmd = commands(CPU_BIN, tiny())[name]
    if not Path(cmd[0]).exists():
        pytest.skip(f"{cmd[0]} not built")
    rc, out = run(*cmd)
    assert rc > 0, f"{name} --backend cuda on the CPU build exited {rc}: {out}"
    assert "this build has no CUDA backend" in out and "make cuda" in out, out


@pytest.mark.parametrize("name", ["kipp generate", "kipp-bench", "kipp-serve", "kipp-cuda-gate"])
def test_cuda_build_fails_cleanly_without_a_device(name):
    need_cuda_build(CUDA_BIN / "kipp")
    if has_gpu():
        pytest.skip("a GPU is present: tools/cuda_check.sh checks the CUDA build there")
    model = tiny()
    cmd = commands(CUDA_BIN, model).get(name) or [CUDA_BIN / "kipp-cuda-gate", "--model", model]
    rc, out = run(*cmd)
    assert rc > 0, f"{name} exited {rc} (a signal when negative): {out}"
    assert "no CUDA device available" in out, out
    assert "Segmentation" not in out and "Aborted" not in out, out


def test_cuda_build_runs_the_cpu_backend_without_a_device():
    """The CUDA build is the CPU build plus a backend: --backend cpu needs no GPU or driver."""
    need_cuda_build(CUDA_BIN / "kipp")
    rc, out = run(CUDA_BIN / "kipp", "generate", "--model", tiny(), "--prompt", "Hello", "--max-tokens", "2",
                  "--backend", "cpu")
    assert rc == 0 and "backend cpu" in out, out


@pytest.mark.parametrize("model,extra", [
    ("synthetic-tiny", ["--long", "600"]),            # tied head; a prefill of two backend rounds
    ("synthetic-tiny-untied-q8_0", []),                # untied head, quantized projections (converted into tmp_path)
])
def test_cuda_backend_host_logic_matches_ref_bitwise(model, extra, tmp_path):
    """build/cuda/kipp-cuda-gate-mock: the CUDA backend's host code (interleaved
    rounds, KV arena and block tables, pooled slab, logits rows, decode graphs
    captured and replayed) over host-memory stand-ins that run the ref kernels,
    so every logit must equal the ref backend's exactly (NMSE 0)."""
    gate = CUDA_BIN / "kipp-cuda-gate-mock"
    need_cuda_build(gate)
    path = Path(models_dir()) / f"{model}.gguf"
    if not path.exists():
        path = tmp_path / f"{model}.gguf"
        base = model.removesuffix("-q8_0")
        src = Path(models_dir()) / base
        if not src.is_dir():
            pytest.skip(f"{src} missing: run make models-test")
        py = REPO_ROOT / ".venv" / "bin" / "python"
        subprocess.run([str(py), "tools/convert_to_gguf.py", "--checkpoint", base, "--input", str(src),
                        "--out", str(path), "--quant", "q8_0", "--quiet"], check=True, cwd=REPO_ROOT, timeout=300)
    rc, out = run(gate, "--model", path, "--prompt", "20", "--decode", "4", "--batch", "3", "--nmse", "0", *extra,
                  timeout=600)
    assert rc == 0 and "GATE PASS" in out, out
