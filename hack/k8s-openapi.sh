#!/usr/bin/env bash
# Prints the part of the pinned Kubernetes' own OpenAPI v3 document (core/v1) that spec.template's
# CRD schema is generated from: every schema PodTemplateSpec reaches, verbatim, with its origin.
# `make generate` writes it to operator/src/multiworker/api/podtemplatespec.openapi.json (committed,
# so rendering the CRD needs no Go); `make verify` fails when the committed copy differs.
# Source: api/openapi-spec/v3/api__v1_openapi.json in the k8s.io/kubernetes Go module at
# K8S_VERSION (hack/cluster/versions.env), from the Go module cache or the Go module proxy.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/cluster/versions.env
source "$repo/hack/cluster/versions.env"
py=${PY:-$repo/.venv/bin/python}
command -v go >/dev/null || { echo "k8s-openapi.sh: needs Go (go mod download)" >&2; exit 1; }
# Outside any module, so that only the version named here counts.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=$( (cd "$tmp" && GOFLAGS='' go mod download -json "k8s.io/kubernetes@$K8S_VERSION") \
  | "$py" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
"$py" -m multiworker.api.openapi extract "$dir/api/openapi-spec/v3/api__v1_openapi.json" "$K8S_VERSION"
