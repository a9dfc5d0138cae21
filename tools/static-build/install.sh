#!/usr/bin/env bash
# Installs the static build's cross toolchain (tools/static-build/requirements.txt: Zig and
# cargo-zigbuild, from PyPI) into a virtual environment (default target/static-build/venv) and
# the musl targets' standard libraries (rustup), then prints the directory to put first on PATH:
#
#   PATH="$(tools/static-build/install.sh):$PATH" tools/static-build/build.sh x86_64-unknown-linux-musl OUT
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$repo/target/static-build/venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$repo/tools/static-build/requirements.txt"
rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl >&2
echo "$venv/bin"
