#!/usr/bin/env bash
# Deletes the kind cluster `multiworker`.
set -euo pipefail
export PATH="${MW_CACHE:-$HOME/.cache/multiworker}/bin:$PATH"
kind delete cluster --name multiworker
