#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd for the tests that need a Kubernetes API server
# (cks_testkit::kube, tests/it/kube_store.rs) and prints the directory holding them:
#
#   tools/kube-testenv/build.sh [DIR]        # default target/kube-testenv/bin
#   CKS_KUBE_BIN_DIR=$(tools/kube-testenv/build.sh) cargo test --test it kube_store
#
# DIR may also come from CKS_KUBE_BIN_DIR (the variable the tests read). Two Go modules, one per
# binary, each pinned in its go.mod and go.sum: apiserver/ (k8s.io/kubernetes v1.33.1,
# cmd/kube-apiserver, every k8s.io staging module replaced by its v0.33.1 release) and etcd/
# (go.etcd.io/etcd/server/v3 v3.5.21, its main package, the etcd release Kubernetes 1.33 is
# tested with). Modules come from the Go module proxy into Go's own module cache, builds into
# Go's own build cache; nothing of upstream is copied here. Logs: target/kube-testenv/.
#
# Needs Go 1.24 or later (the modules name their binaries with go.mod's `tool` directive).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
logs="$root/target/kube-testenv"
out="${1:-${CKS_KUBE_BIN_DIR:-$logs/bin}}"
command -v go >/dev/null || { echo "go is required (tools/kube-testenv)" >&2; exit 1; }
mkdir -p "$logs" "$out"
out="$(cd "$out" && pwd)"

# -mod=readonly: go.mod and go.sum say exactly what is built; -ldflags=-s -w leaves the symbol
# tables out (smaller, faster to link). The other flags are tests/upstream-autoscaler/run's, so
# the packages both builds share (k8s.io/apimachinery, client-go, ...) are compiled once.
build() { # module, package, binary, extra linker flags
    local log="$logs/build-$3.log"
    if ! (cd "$here/$1" && go build -mod=readonly -ldflags="-s -w $4" -o "$out/$3" "$2") >"$log" 2>&1; then
        echo "building $3 failed (see $log):" >&2
        tail -20 "$log" >&2
        return 1
    fi
}
# The version Kubernetes' own build stamps (hack/lib/version.sh); without it /version says
# v0.0.0-master.
v=k8s.io/component-base/version
build apiserver k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver \
    "-X $v.gitVersion=v1.33.1 -X $v.gitMajor=1 -X $v.gitMinor=33 -X $v.gitTreeState=clean"
build etcd go.etcd.io/etcd/server/v3 etcd ""
echo "$out"
