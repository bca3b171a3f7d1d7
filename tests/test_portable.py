"""test_portable.py - the portable build: `make KIPP_PORTABLE=1` without the x86 ISA files.

On a machine that is not x86-64 the Makefile builds this way by itself (uname -m);
here KIPP_PORTABLE=1 forces it, into build-portable/. The build must compile
and link without a single *_avx2.c / *_avx512*.c object (nor SIMDe, nor the
x86 probes), and its kipp, which can only run the scalar ref kernel level,
must give the same logits, bit for bit, as the x86 build running that level
(KIPP_ISA=ref) on the tiny models; both builds' ref backends agree bitwise too.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, models_dir

BUILD = "build-portable"
NATIVE_KIPP = REPO_ROOT / "build" / "kipp"
MODELS = ("synthetic-tiny.gguf", "synthetic-tiny-q8_0.gguf", "synthetic-tiny-affine4_gs32.gguf")


def clean_env(**extra: str) -> dict:
    # Not the parent make's jobserver (make test runs this under make), nor a forced level.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "KIPP_ISA")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def portable_kipp() -> Path:
    jobs = os.environ.get("KIPP_PORTABLE_JOBS", "2")
    r = subprocess.run(["nice", "make", f"-j{jobs}", f"BUILD={BUILD}", "KIPP_PORTABLE=1",
                        f"{BUILD}/libkipp.a", f"{BUILD}/kipp"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500, env=clean_env())
    assert r.returncode == 0, f"the portable build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return REPO_ROOT / BUILD / "kipp"


def test_no_x86_level_object(portable_kipp):
    objs = [p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / BUILD).rglob("*.o")]
    assert any(o.endswith("kernels/cpu/ref.o") for o in objs), "the portable build compiled no ref kernels"
    x86 = [o for o in objs if "_avx" in o or "/emu512/" in o]
    assert not x86, f"the portable build compiled x86 level files: {x86}"
    nm = subprocess.run(["nm", "--defined-only", str(REPO_ROOT / BUILD / "libkipp.a")],
                        capture_output=True, text=True, check=True).stdout
    syms = [line.split()[-1] for line in nm.splitlines() if line.count(" ") >= 2]
    assert "k_matvec_bf16_ref" in syms
    assert not [s for s in syms if "_avx2" in s or "_avx512" in s], "x86 level symbols in the portable libkipp.a"


def logits(kipp: Path, model: Path, out: Path, backend: str, **env: str) -> bytes:
    r = subprocess.run([str(kipp), "logits", "--model", str(model), "--prompt", "The quick brown fox",
                        "--backend", backend, "--out", str(out)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=clean_env(**env))
    assert r.returncode == 0, f"{kipp} logits --backend {backend} failed: {r.stderr[-2000:]}"
    return out.read_bytes()


@pytest.mark.parametrize("name", MODELS)
def test_portable_logits_are_the_ref_level(portable_kipp, tmp_path, name):
    model = models_dir() / name
    assert model.is_file(), f"{model} missing: run make models-test"
    assert NATIVE_KIPP.is_file(), f"{NATIVE_KIPP} missing: run make"
    port = logits(portable_kipp, model, tmp_path / "port.f32", "cpu")
    assert len(port) > 0 and len(port) % 4 == 0
    native_ref_level = logits(NATIVE_KIPP, model, tmp_path / "native.f32", "cpu", KIPP_ISA="ref")
    assert port == native_ref_level, "portable cpu backend differs from the x86 build's cpu backend at KIPP_ISA=ref"
    # The ref backend (the FP32 oracle, scalar in both builds) is the same bytes in both.
    port_ref = logits(portable_kipp, model, tmp_path / "port_ref.f32", "ref")
    assert port_ref == logits(NATIVE_KIPP, model, tmp_path / "native_ref.f32", "ref"), \
        "the portable build's ref backend differs from the x86 build's"
    # A level this build lacks is refused with a note and falls back to ref: the same bytes.
    assert logits(portable_kipp, model, tmp_path / "forced.f32", "cpu", KIPP_ISA="avx2") == port
