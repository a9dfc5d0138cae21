#!/usr/bin/env bash
# Brings the CustomResourceDefinitions the rendered manifests use (cert-manager's Certificate
# and Issuer, Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule) from those
# projects' Go modules, and prints a directory of links to them, for tests/it/deploy_apply.rs,
# which creates them in its API server before it applies the renders:
#
#   tools/kube-testenv/crds.sh [DIR]        # default target/kube-testenv/crds
#   CKS_KUBE_CRD_DIR=$(tools/kube-testenv/crds.sh) cargo test --test it deploy_apply
#
# The modules come from the Go module proxy into Go's own module cache (checked against the
# checksum database as every module is); DIR holds only links into that cache, so nothing of
# upstream is copied here. The versions: cert-manager v1.20.3, the release docs/operations.md
# installs (its CRDs under deploy/crds/, one file per CRD, as controller-gen writes them), and
# prometheus-operator v0.90.1 (example/prometheus-operator-crd/, the CRDs its bundle.yaml is
# made of).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-${CKS_KUBE_CRD_DIR:-$root/target/kube-testenv/crds}}"
command -v go >/dev/null || { echo "go is required (tools/kube-testenv)" >&2; exit 1; }

# The module's directory in Go's module cache: `go mod download -json` prints it as "Dir". Run
# outside any module (/), so that no go.mod around decides what is downloaded.
module_dir() { # module@version
    local json dir
    if ! json="$(cd / && go mod download -json "$1" 2>&1)"; then
        echo "go mod download $1 failed:" >&2
        echo "$json" >&2
        return 1
    fi
    dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
    [ -d "$dir" ] || { echo "go mod download $1 named no directory: $json" >&2; return 1; }
    echo "$dir"
}

cert_manager="$(module_dir github.com/cert-manager/cert-manager@v1.20.3)"
prometheus_operator="$(module_dir github.com/prometheus-operator/prometheus-operator@v0.90.1)"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
find "$out" -maxdepth 1 -name '*.yaml' -type l -delete
link() { # directory in the module, file
    [ -f "$1/$2" ] || { echo "no $2 in $1" >&2; return 1; }
    ln -sf "$1/$2" "$out/$2"
}
for crd in certificates issuers clusterissuers certificaterequests; do
    link "$cert_manager/deploy/crds" "cert-manager.io_$crd.yaml"
done
for crd in servicemonitors podmonitors prometheusrules; do
    link "$prometheus_operator/example/prometheus-operator-crd" "monitoring.coreos.com_$crd.yaml"
done
echo "$out"
