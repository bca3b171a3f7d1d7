#!/usr/bin/env bash
# install_deps.sh - Debian and PyPI packages Kipp needs to build, test and bench.
# torch/transformers are only needed to regenerate golden vectors (make vectors)
# and tokenizer cases; pass --reference to install them too.
set -euo pipefail
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
APT_PKGS="build-essential clang libclang-rt-14-dev libhwloc-dev hwloc libjansson-dev libpcre2-dev libutf8proc-dev libpapi-dev papi-tools libsimde-dev libmicrohttpd-dev python3 python3-pip curl"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    echo "install_deps: apt-get install$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
PY=${PYTHON:-python3}
PIP_PKGS="numpy safetensors tokenizers gguf huggingface_hub tqdm matplotlib pytest jinja2 openai prometheus_client"
[ "${1:-}" = "--reference" ] && PIP_PKGS="$PIP_PKGS torch transformers"
$PY -m pip install -q --disable-pip-version-check $PIP_PKGS 2>&1 | grep -v "Running pip as the 'root' user" || true
$PY -c "import numpy, safetensors, gguf, tqdm, pytest" || { echo "install_deps: Python packages failed to import" >&2; exit 1; }
