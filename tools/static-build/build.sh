#!/bin/sh
# The provider's static binary, as the image ships it: built for a musl target with Zig as the
# C compiler and linker (cargo-zigbuild), so one build host produces amd64 and arm64 alike, no
# emulation and no per-architecture cross toolchain. The Dockerfile's build stage runs this
# script; CI runs it for x86_64 so the image's build step cannot rot unseen.
#
#   tools/static-build/build.sh TARGET OUT
#
# TARGET: x86_64-unknown-linux-musl or aarch64-unknown-linux-musl. OUT: where the binary goes.
# Needs on PATH: cargo with TARGET's standard library (rustup target add TARGET), and
# cargo-zigbuild with its ziglang (tools/static-build/requirements.txt).
set -eu
target="${1:?usage: build.sh TARGET OUT}"
out="${2:?usage: build.sh TARGET OUT}"
case "$target" in
    x86_64-unknown-linux-musl | aarch64-unknown-linux-musl) ;;
    *) echo "build.sh: unsupported target $target (x86_64- or aarch64-unknown-linux-musl)" >&2; exit 2 ;;
esac
CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo zigbuild --release --locked --target "$target" --bin cks-autoscaler-provider
install -D -m 0755 "${CARGO_TARGET_DIR:-target}/$target/release/cks-autoscaler-provider" "$out"
# The image's run stage has no libc: refuse a dynamically linked binary here, not at pod start.
if readelf -d "$out" | grep -q NEEDED; then
    echo "build.sh: $out is dynamically linked; the static base cannot run it" >&2
    exit 1
fi
machine=$(readelf -h "$out" | sed -n 's/^ *Machine: *//p')
case "$target:$machine" in
    x86_64-*:*X86-64* | aarch64-*:*AArch64*) ;;
    *) echo "build.sh: $out is built for '$machine', not $target" >&2; exit 1 ;;
esac
# Run it where the build host can (the same architecture).
if [ "$(uname -m)" = "${target%%-*}" ]; then
    "$out" --help > /dev/null
fi
echo "build.sh: $out ($machine, static)"
