#!/usr/bin/env bash
# Builds Prometheus's own promtool, which tests/it/alert_rules.rs runs on the example alerts
# (docs/prometheus-rules.yaml): `promtool check rules` parses every expression as Prometheus
# does, and `promtool test rules` evaluates them over series that tests/prometheus/alerts.test.yaml
# writes out, `for:` durations included. Prints the binary's path:
#
#   tools/promtool/build.sh [FILE]        # default target/promtool/promtool
#   CKS_PROMTOOL=$(tools/promtool/build.sh) cargo test --test it alert_rules
#
# One Go module, pinned in go.mod and go.sum (github.com/prometheus/prometheus v0.316.0,
# cmd/promtool, named by go.mod's `tool` directive); modules come from the Go module proxy into
# Go's own module cache, the build into Go's own build cache: nothing of upstream is copied
# here. Log: target/promtool/build.log.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
logs="$root/target/promtool"
out="${1:-${CKS_PROMTOOL:-$logs/promtool}}"
command -v go >/dev/null || { echo "go is required (tools/promtool)" >&2; exit 1; }
mkdir -p "$logs" "$(dirname "$out")"
if ! (cd "$here" && go build -mod=readonly -ldflags="-s -w" -o "$out" github.com/prometheus/prometheus/cmd/promtool) >"$logs/build.log" 2>&1; then
    echo "building promtool failed (see $logs/build.log):" >&2
    tail -20 "$logs/build.log" >&2
    exit 1
fi
echo "$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
