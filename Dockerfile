# syntax=docker/dockerfile:1
#
# cks-autoscaler-provider: a static binary on a distroless base.
#
#   docker build -t registry.example.com/platform/cks-autoscaler-provider:0.1.0 .
#
# Build stage: Alpine, whose native Rust target is x86_64/aarch64-unknown-linux-musl. Rust links
# musl statically by default, so the binary needs no libc at run time and the image builds for
# either architecture with `docker buildx build --platform linux/amd64,linux/arm64` (each
# platform compiles natively, no cross toolchain).
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

FROM rust:1.95-alpine@sha256:606fd313a0f49743ee2a7bd49a0914bab7deedb12791f3a846a34a4711db7ed2 AS build
# musl-dev and gcc: C parts of the TLS stack (aws-lc-sys, ring). linux-headers: aws-lc includes
# <linux/random.h>. cmake and make: aws-lc-sys falls back to its CMake build when the plain cc
# build is not possible.
RUN apk add --no-cache musl-dev gcc linux-headers cmake make
WORKDIR /src
COPY . .
# Registry and target directories are BuildKit caches: rebuilds after a source change only
# compile what changed. The binary is copied out of the cache before the layer ends.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git/db,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo build --release --locked --bin cks-autoscaler-provider \
 && install -D -m 0755 target/release/cks-autoscaler-provider /out/cks-autoscaler-provider
# The run stage has no libc: refuse a dynamically linked binary here rather than at pod start.
RUN if readelf -d /out/cks-autoscaler-provider | grep -q NEEDED; then \
        echo "cks-autoscaler-provider is dynamically linked; the static base cannot run it" >&2; \
        exit 1; \
    fi \
 && /out/cks-autoscaler-provider --help > /dev/null

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
