#!/usr/bin/env bash
# Builds every fuzz target and runs each for a bounded time (default 60 s), stopping at the first
# crash. Needs cargo-fuzz (installed from crates.io when missing) and a nightly toolchain; set
# FUZZ_TOOLCHAIN to another rustup toolchain name to use it instead of nightly.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
toolchain="+${FUZZ_TOOLCHAIN:-nightly}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo "$toolchain" fuzz build
for target in $(cargo "$toolchain" fuzz list); do
    mkdir -p "corpus/$target"
    extra=()
    if [[ -f "$target.dict" ]]; then
        extra+=("-dict=$target.dict")
    fi
    echo "== $target: ${seconds}s"
    cargo "$toolchain" fuzz run "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len=4096 "${extra[@]}"
done
echo "every fuzz target ran ${seconds}s without a crash"
