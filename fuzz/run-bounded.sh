#!/usr/bin/env bash
# Builds every fuzz target once and runs each for a bounded time (default 60 s), stopping at the
# first crash. Needs cargo-fuzz (installed from crates.io when missing), a nightly toolchain and a
# C++ compiler (libFuzzer, the crate's `libfuzzer` feature); set FUZZ_TOOLCHAIN to another rustup
# toolchain name to use it instead of nightly. The same targets' bodies run on stable in every
# `cargo test` (tests/replay.rs), on seeded inputs.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
toolchain="+${FUZZ_TOOLCHAIN:-nightly}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# Line tables in crash backtraces (the workspace's release profile has no debug info).
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo "$toolchain" fuzz build --features libfuzzer
for target in $(cargo "$toolchain" fuzz list); do
    mkdir -p "corpus/$target"
    extra=()
    if [[ -f "$target.dict" ]]; then
        extra+=("-dict=$target.dict")
    fi
    echo "== $target: ${seconds}s"
    cargo "$toolchain" fuzz run --features libfuzzer "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len=4096 "${extra[@]}"
done
echo "every fuzz target ran ${seconds}s without a crash"
