# syntax=docker/dockerfile:1.12
#
# cks-autoscaler-provider: a static binary on a distroless base.
#
#   docker build -t registry.example.com/platform/cks-autoscaler-provider:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t … --push .
#
# The frontend (`syntax`) is pinned to 1.12: a newer BuildKit frontend cannot change how this
# file is read.
#
# Build stage: runs on the build host's own platform (`--platform=$BUILDPLATFORM`) and
# cross-compiles for the image's (`TARGETARCH`): tools/static-build/build.sh builds for the
# musl target with Zig as C compiler and linker (cargo-zigbuild), so an arm64 image builds at
# native speed on an amd64 host, with no QEMU emulation and no cross toolchain per
# architecture. Rust links musl statically, so the binary needs no libc at run time. CI runs
# the same script for x86_64, with the same pinned Zig and cargo-zigbuild.
#
# Run stage: gcr.io/distroless/static (no shell, no package manager). Unlike `scratch` it already
# carries the CA certificates CloudStack's HTTPS certificate is verified against, tzdata, and a
# `nonroot` user (65532).
#
# Both base images are pinned by digest (the multi-architecture index), so a rebuild of one
# commit gets the same bases whatever their tags point at later; the tag stays for readers. To
# move to newer bases, look the digests up and replace them:
#   docker buildx imagetools inspect rust:1.95-alpine                      (or: crane digest ...)
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot
#
# Air-gapped: mirror both base images and point the FROM lines at the mirror (same digests);
# give pip an index mirror (PIP_INDEX_URL) and cargo a registry mirror or vendored sources
# (`cargo vendor`, then a .cargo/config.toml replacing crates-io; the build then needs
# `--offline` added in tools/static-build/build.sh).

FROM --platform=$BUILDPLATFORM rust:1.95-alpine@sha256:606fd313a0f49743ee2a7bd49a0914bab7deedb12791f3a846a34a4711db7ed2 AS build
# gcc and musl-dev: the host's C compiler and linker, for build scripts (they run on the build
# host). python3 and pip: Zig comes as the `ziglang` wheel. cargo-zigbuild from crates.io (its
# PyPI wheel is glibc-only), the version tools/static-build/requirements.txt pins.
RUN apk add --no-cache musl-dev gcc python3 py3-pip
WORKDIR /src
COPY tools/static-build/requirements.txt tools/static-build/requirements.txt
RUN pip install --no-cache-dir --break-system-packages \
        "$(grep '^ziglang==' tools/static-build/requirements.txt)" \
 && cargo install --locked \
        "cargo-zigbuild@$(sed -n 's/^cargo-zigbuild==//p' tools/static-build/requirements.txt)" \
 && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl
COPY . .
ARG TARGETARCH
# Registry and target directories are BuildKit caches, the target one per architecture (two
# platforms of one build would otherwise wait on each other's lock): rebuilds after a source
# change only compile what changed. The binary is copied out of the cache before the layer ends.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git/db,sharing=locked \
    --mount=type=cache,id=cks-target-$TARGETARCH,target=/src/target,sharing=locked \
    case "$TARGETARCH" in \
        amd64) target=x86_64-unknown-linux-musl ;; \
        arm64) target=aarch64-unknown-linux-musl ;; \
        *) echo "unsupported TARGETARCH $TARGETARCH (amd64, arm64)" >&2; exit 1 ;; \
    esac \
 && tools/static-build/build.sh "$target" /out/cks-autoscaler-provider

FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
LABEL org.opencontainers.image.title="cks-autoscaler-provider" \
      org.opencontainers.image.description="Kubernetes cluster-autoscaler externalgrpc cloud provider for Apache CloudStack Kubernetes Service (CKS)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/cks-autoscaler-provider /usr/local/bin/cks-autoscaler-provider
# Numeric, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 65532:65532
# gRPC (externalgrpc + grpc.health.v1), then metrics, /healthz and /readyz.
EXPOSE 8086 9090
ENTRYPOINT ["/usr/local/bin/cks-autoscaler-provider"]
CMD ["serve"]
