#!/usr/bin/env bash
# Builds (once) osprey-otelcol, the minimal OpenTelemetry Collector of
# main.go/components.go (OTLP receiver, debug exporter; collector release
# v0.165.0, pinned by go.mod/go.sum), for the OTLP delivery test
# (crates/osprey-upload/tests/collector.rs).
#
#   build.sh [DIR]     (default: $OSPREY_OTELCOL or /var/cache/osprey/otelcol-0.165.0)
#
# Idempotent: DIR/osprey-otelcol with DIR/.osprey-ready holding the hash of
# the sources it was built from; a run with the same sources does nothing.
# Concurrent runs wait on a lock. Needs Go 1.26 or later and the Go module
# proxy. A cold build takes minutes on 2 cores.
set -euo pipefail

src=$(cd "$(dirname "$0")" && pwd)
dir=${1:-${OSPREY_OTELCOL:-/var/cache/osprey/otelcol-0.165.0}}
key=$(cat "$src/main.go" "$src/components.go" "$src/go.mod" "$src/go.sum" | sha256sum | cut -d' ' -f1)
ready() { [ -x "$dir/osprey-otelcol" ] && [ "$(cat "$dir/.osprey-ready" 2>/dev/null)" = "$key" ]; }
ready && exit 0

mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
ready && exit 0

start=$(date +%s)
# Go's module and build caches (about 2 GB for the collector) live only for
# the build: the binary is the cache. -trimpath: the binary does not depend
# on where the clone is.
scratch="$dir.go"
trap 'rm -rf "$scratch"' EXIT
(cd "$src" && GOCACHE="$scratch/cache" GOMODCACHE="$scratch/mod" GOFLAGS="-mod=readonly -modcacherw" \
    go build -trimpath -o "$dir/osprey-otelcol.new" .) >"$dir/build.log" 2>&1 \
    || { echo "build-otelcol: go build failed, see $dir/build.log" >&2; exit 1; }
mv "$dir/osprey-otelcol.new" "$dir/osprey-otelcol"
echo "$key" >"$dir/.osprey-ready"
echo "build-otelcol: built $dir/osprey-otelcol in $(($(date +%s) - start)) s" >&2
