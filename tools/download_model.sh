#!/usr/bin/env bash
# download_model.sh --checkpoint ID [--dest DIR] [--retries N] [--quiet]
#
# Downloads the registry entry's pinned Hugging Face revision (tools/checkpoints.py)
# and verifies every file: recorded sha256/size first, else the LFS sha256 or git
# blob id that the pinned revision's tree reports. Refuses synthetic entries and
# entries without a pinned revision. Interrupted files stay as FILE.part and are
# resumed with HTTP Range on retry or on the next run; a file that fails its check
# is deleted, never left under its final name.
#
# Environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (optional),
# PYTHON (default: the project venv .venv/bin/python made by tools/install_deps.sh,
# else python3). The work is done by tools/hub_download.py.
set -euo pipefail
root="$(dirname "$0")/.."
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$(dirname "$0")/hub_download.py" "$@"
