#!/usr/bin/env bash
# install_deps.sh - Debian and PyPI packages Kipp needs to build, test and bench.
#
# usage: tools/install_deps.sh [--reference] [--help]
#
# Debian packages: only the missing ones are installed (one dpkg-query call
# finds them). When another process holds the apt/dpkg locks (unattended
# upgrades, a concurrent install), the script waits for them, up to
# KIPP_APT_LOCK_TIMEOUT seconds (default 600), and says what it waits for; apt
# itself gets the remaining time as DPkg::Lock::Timeout.
#
# Python packages go into the project's virtual environment .venv/ (never the
# global Python, which a concurrent pip may be changing). The Makefile,
# tests/run_tests.sh, tools/demo.sh and .ci/run all use .venv/bin/python.
# .venv/kipp-deps.stamp records what was installed; when it matches and no
# Debian package is missing, the script does nothing and takes about a second.
# torch/transformers are only needed to regenerate golden vectors (make vectors)
# and tokenizer cases; --reference installs them too.
#
# Test hooks (tests/test_install.py): KIPP_APT_EXTRA adds package names to the
# Debian list; KIPP_DEPS_DRY_RUN=1 prints the apt-get commands instead of
# running them (the lock wait still happens); KIPP_APT_LOCKS overrides the lock
# files waited for.
set -euo pipefail
cd "$(dirname "$0")/.."

REFERENCE=0
for a in "$@"; do
    case "$a" in
        --reference) REFERENCE=1 ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install_deps: unknown argument '$a' (expected --reference or --help)" >&2; exit 2 ;;
    esac
done

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
APT_PKGS="build-essential clang libclang-rt-14-dev libhwloc-dev hwloc libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev libpapi-dev papi-tools libsimde-dev libmicrohttpd-dev libzmq3-dev cmake python3 python3-pip python3-venv curl ${KIPP_APT_EXTRA:-}"
PIP_PKGS="numpy safetensors tokenizers gguf huggingface_hub tqdm matplotlib pytest jinja2 openai anthropic prometheus_client jsonschema pyzmq msgpack msgspec xxhash vllm-router"
[ "$REFERENCE" = 1 ] && PIP_PKGS="$PIP_PKGS torch transformers"
VENV=.venv
LOCK_TIMEOUT=${KIPP_APT_LOCK_TIMEOUT:-600}
LOCKS=${KIPP_APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}

# ---- Debian packages ----
# One dpkg-query for all of them; "install ok installed" is the only good status.
missing=""
status=$(dpkg-query -W -f='${Package} ${Status}\n' $APT_PKGS 2>/dev/null || true)
for p in $APT_PKGS; do
    printf '%s\n' "$status" | grep -qx "$p install ok installed" || missing="$missing $p"
done

# Wait until no process holds one of the apt/dpkg locks (fcntl locks, as apt and
# dpkg take them), at most LOCK_TIMEOUT seconds in all. Prints the remaining
# seconds on stdout.
wait_for_apt_locks() {
    local start now held
    start=$(date +%s)
    while :; do
        held=$(python3 - $LOCKS <<'PY' 2>/dev/null || true
import fcntl, os, sys
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        continue  # absent or not ours to open: apt will say so itself
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    except OSError:
        print(path)
        break
    finally:
        os.close(fd)
PY
)
        now=$(date +%s)
        [ -z "$held" ] && { echo $((LOCK_TIMEOUT - (now - start))); return 0; }
        if [ $((now - start)) -ge "$LOCK_TIMEOUT" ]; then
            echo "install_deps: $held is still held by another process after ${LOCK_TIMEOUT}s; expected it" \
                 "to be released (raise KIPP_APT_LOCK_TIMEOUT, or wait for the other apt/dpkg run to finish)" >&2
            return 1
        fi
        [ -z "${waited:-}" ] && echo "install_deps: waiting for $held (another apt/dpkg process holds it;" \
                                     "up to ${LOCK_TIMEOUT}s)" >&2
        waited=1
        sleep 1
    done
}

run_apt() {
    if [ -n "${KIPP_DEPS_DRY_RUN:-}" ]; then echo "install_deps: would run: $*"; else "$@"; fi
}

if [ -n "$missing" ]; then
    echo "install_deps: apt-get install$missing"
    left=$(wait_for_apt_locks) || exit 1
    run_apt $SUDO apt-get -o DPkg::Lock::Timeout="$left" update -qq
    left=$(wait_for_apt_locks) || exit 1
    run_apt env DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout="$left" install -y -qq $missing
fi

# ---- Python packages, in .venv ----
PY=${KIPP_BASE_PYTHON:-python3}
want="python=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') pip=$PIP_PKGS"
if [ -x "$VENV/bin/python" ] && [ -f "$VENV/kipp-deps.stamp" ] && [ "$(cat "$VENV/kipp-deps.stamp")" = "$want" ]; then
    exit 0  # nothing missing: the fast path
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "install_deps: creating the virtual environment $VENV"
    "$PY" -m venv "$VENV"
fi
echo "install_deps: pip install into $VENV: $PIP_PKGS"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check $PIP_PKGS
"$VENV/bin/python" -c "import numpy, safetensors, gguf, tqdm, pytest" \
    || { echo "install_deps: Python packages failed to import in $VENV" >&2; exit 1; }
printf '%s\n' "$want" > "$VENV/kipp-deps.stamp"
