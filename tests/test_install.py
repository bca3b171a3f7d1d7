"""test_install.py - tools/install_deps.sh.

Another process holding the apt/dpkg lock must not make the install fail: with
nothing missing the script does not need apt at all and returns at once; with a
package missing it waits for the lock (up to KIPP_APT_LOCK_TIMEOUT) and then
runs apt-get. The missing-package path is exercised with KIPP_APT_EXTRA (a
package name that does not exist) and KIPP_DEPS_DRY_RUN=1, so `make test` never
runs a real apt-get: the lock wait is real, the apt commands are only printed.
As root the real /var/lib/dpkg/lock-frontend is held (an fcntl lock, as apt and
dpkg take it) for a few seconds; otherwise a private lock file stands in.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "install_deps.sh"
REAL_LOCK = Path("/var/lib/dpkg/lock-frontend")

HOLDER = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def lock_path(tmp_path: Path) -> tuple[Path, dict]:
    """The lock to hold and the environment that makes the script wait on it."""
    if os.geteuid() == 0 and REAL_LOCK.exists() and os.access(REAL_LOCK, os.W_OK):
        return REAL_LOCK, {}
    p = tmp_path / "lock-frontend"
    p.touch()
    return p, {"KIPP_APT_LOCKS": str(p)}


def hold(lock: Path, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def install(env_extra: dict, timeout: int = 120) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, **env_extra)
    env.pop("PYTHON", None)
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
                       env=env, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - t0


@pytest.fixture(scope="module", autouse=True)
def venv_ready():
    if not (REPO_ROOT / ".venv" / "kipp-deps.stamp").is_file():
        pytest.fail(".venv is not set up: run tools/install_deps.sh (make deps) first")


def test_nothing_missing_is_fast_even_with_the_lock_held(tmp_path):
    lock, env = lock_path(tmp_path)
    h = hold(lock, 20)
    try:
        r, dt = install(env)
    finally:
        h.kill()
        h.wait()
    assert r.returncode == 0, r.stderr
    assert dt < 5, f"the nothing-missing path took {dt:.1f} s"
    assert "waiting for" not in r.stderr and "apt-get" not in r.stdout


def test_missing_package_waits_for_the_lock_then_installs(tmp_path):
    lock, env = lock_path(tmp_path)
    h = hold(lock, 4)
    try:
        r, dt = install(dict(env, KIPP_APT_EXTRA="kipp-test-no-such-package", KIPP_DEPS_DRY_RUN="1"))
    finally:
        h.wait()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"waiting for {lock}" in r.stderr, r.stderr
    assert dt >= 2.5, f"returned after {dt:.1f} s although the lock was held for 4 s"
    assert "would run:" in r.stdout and "apt-get -o DPkg::Lock::Timeout=" in r.stdout, r.stdout
    assert "install -y -qq kipp-test-no-such-package" in r.stdout, r.stdout


def test_lock_held_past_the_timeout_fails_with_a_message(tmp_path):
    lock, env = lock_path(tmp_path)
    h = hold(lock, 8)
    try:
        r, dt = install(dict(env, KIPP_APT_EXTRA="kipp-test-no-such-package", KIPP_DEPS_DRY_RUN="1",
                             KIPP_APT_LOCK_TIMEOUT="2"))
    finally:
        h.kill()
        h.wait()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{lock} is still held by another process after 2s" in r.stderr, r.stderr
    assert "would run:" not in r.stdout


def test_python_tools_run_in_the_project_venv():
    """The Makefile, tests/run_tests.sh, tools/demo.sh use .venv/bin/python, and this test runs in it."""
    assert Path(sys.prefix).resolve() == (REPO_ROOT / ".venv").resolve(), sys.prefix
    mk = (REPO_ROOT / "Makefile").read_text()
    assert "VENV_PY  := .venv/bin/python" in mk and "PYTHON   ?= $(VENV_PY)" in mk
    assert ".venv/bin/python" in (REPO_ROOT / "tests" / "run_tests.sh").read_text()
    assert ".venv/bin/python" in (REPO_ROOT / "tools" / "demo.sh").read_text()
