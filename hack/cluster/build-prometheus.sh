#!/usr/bin/env bash
# Builds (once per version and Go) promtool and the Prometheus server from the
# github.com/prometheus/prometheus Go module, static binaries that only the alert tests use
# (`promtool test rules` on the chart's rules; a real server scraping the operator), and prints
# nothing but progress. Results in $MW_CACHE/bin: promtool and prometheus (symlinks).
# Built with the `remove_all_sd` tag: no cloud service discovery (the tests scrape a static
# target), which skips most of the module's dependencies; the web UI's assets are not embedded
# either (the HTTP API is all the tests read).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
bin=$cache/bin
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# The Go that builds it is part of the key: a new toolchain rebuilds (and so gets its fixes).
key=$PROMETHEUS_VERSION-$(go env GOVERSION)

built() { [ -x "$bin/promtool-$key" ] && [ -x "$bin/prometheus-$key" ]; }
# One build at a time (CI builds ahead in the background; the tests' fixtures then wait here).
if ! built; then exec 8>"$bin/.prometheus.lock"; flock 8; fi
if ! built; then
  echo "building promtool and prometheus (github.com/prometheus/prometheus $PROMETHEUS_VERSION;" \
    "a few minutes on 2 cores)"
  t0=$SECONDS
  out=$(mktemp -d)
  mod=github.com/prometheus/prometheus
  pkg=github.com/prometheus/common/version
  ldflags="-s -w -X $pkg.Version=${PROMETHEUS_VERSION#v} -X $pkg.Branch=module"
  GOBIN=$out go install -trimpath -tags remove_all_sd -ldflags "$ldflags" \
    "$mod/cmd/promtool@$PROMETHEUS_VERSION" "$mod/cmd/prometheus@$PROMETHEUS_VERSION"
  mv "$out/promtool" "$bin/promtool-$key"
  mv "$out/prometheus" "$bin/prometheus-$key"
  rmdir "$out"
  echo "built in $((SECONDS - t0))s"
fi
ln -sf "promtool-$key" "$bin/promtool"
ln -sf "prometheus-$key" "$bin/prometheus"
