#!/usr/bin/env bash
# `make run`: the whole first-run path on one machine. Brings up a cluster (kind when a Docker
# engine answers, else the built-in local real cluster), builds and loads the images, installs
# the operator with Helm, runs the example CPU job to the end while showing its status, and
# prints where the trained model is. Re-running reuses everything that already exists.
#   MW_EXAMPLE=PATH            the job manifest to run (default below; its claim comes from
#                              examples/checkpoint-pvc.yaml)
#   MW_EXAMPLE_NAMESPACE=NS    where to run it (default: default)
#   MW_RUN_TIMEOUT=SECONDS     how long to follow it (default: 900)
set -euo pipefail
example=${MW_EXAMPLE:-examples/cpu-job.yaml}   # the one place that names the example
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export MW_CACHE=${MW_CACHE:-$HOME/.cache/multiworker}
export PATH="$MW_CACHE/bin:$PATH"
ns=${MW_EXAMPLE_NAMESPACE:-default}
say() { printf '\n==> %s\n' "$*"; }
[ -f "$example" ] || { echo "run.sh: no example manifest at $example" >&2; exit 1; }

if docker info >/dev/null 2>&1; then
  say "cluster: kind (a Docker engine is available)"
  hack/kind/up.sh
  export KUBECONFIG=$repo/.cluster/kind-kubeconfig
  load=(hack/images/load.sh --kind multiworker)
else
  say "cluster: built-in local real cluster (no Docker engine here)"
  hack/cluster/up.sh
  export KUBECONFIG=$repo/.cluster/kubeconfig
  load=(hack/images/load.sh)
fi

say "images: build offline (cached by content) and load"
hack/images/build.sh base worker operator
"${load[@]}" base worker operator

say "operator: the CRD (server-side: too big for client-side apply), then helm upgrade --install"
# Helm creates crds/ on a first install only; applying it here also upgrades an older CRD.
kubectl apply --server-side --force-conflicts -f crds/
hack/cluster/wait-crd.sh multiworkerjobs.multiworker.dev 60
helm upgrade --install multiworker-operator charts/multiworker-operator \
  --namespace multiworker-system --create-namespace --wait --timeout 5m
kubectl -n multiworker-system rollout status deployment -l app.kubernetes.io/instance=multiworker-operator

# The job's name is the manifest's metadata.name (the CRD is installed now, so kubectl can
# read the file as a MultiWorkerJob).
job=$(kubectl -n "$ns" create --dry-run=client -o name -f "$example" | sed -n 's|^multiworkerjob[.a-z]*/||p')
[ "$(echo "$job" | wc -w)" = 1 ] || { echo "run.sh: $example must hold one MultiWorkerJob" >&2; exit 1; }
say "example: $ns/$job ($example)"
kubectl -n "$ns" apply -f examples/checkpoint-pvc.yaml
# A finished example from an earlier run is replaced so the run is shown again.
kubectl -n "$ns" delete mwj "$job" --ignore-not-found --wait=true
kubectl -n "$ns" apply -f "$example"

say "following $job (Ctrl-C stops following; the job keeps running)"
fields='{.status.phase} ready={.status.ready} restarts={.status.restarts} step={.status.progress.step}'
deadline=$((SECONDS + ${MW_RUN_TIMEOUT:-900})) last="" phase=""
while :; do
  line=$(kubectl -n "$ns" get mwj "$job" -o "jsonpath=$fields" 2>/dev/null || true)
  [ "$line" != "$last" ] && { printf '%s  %s\n' "$(date +%T)" "$line"; last=$line; }
  phase=${line%% *}
  case $phase in Succeeded | Failed) break ;; esac
  [ $SECONDS -lt $deadline ] || { echo "still $phase after ${MW_RUN_TIMEOUT:-900}s"; break; }
  sleep 2
done

say "status (kubectl mwj status $job: the plugin from .venv/bin, docs/client.md)"
kubectl -n "$ns" get mwj "$job"
PATH="$repo/.venv/bin:$PATH" kubectl mwj -n "$ns" status "$job"
echo "(next: export PATH=\"$repo/.venv/bin:\$PATH\"; kubectl mwj logs $job --all, kubectl mwj list;"
echo " from Python: multiworker.client, docs/client.md)"
[ "$phase" = Succeeded ] || exit 1
# Where the chief saved the model: TRAIN_MODEL_PATH in the template, on the job's claim.
get() { kubectl -n "$ns" get "$@"; }
model=$(get mwj "$job" -o jsonpath='{.spec.template.spec.containers[*].env[?(@.name=="TRAIN_MODEL_PATH")].value}')
[ -n "$model" ] || exit 0
claim=$(get mwj "$job" -o jsonpath='{.spec.checkpoint.claimName}')
mount=$(get mwj "$job" -o jsonpath='{.spec.checkpoint.mountPath}')
volume=$(get pvc "$claim" -o jsonpath='{.spec.volumeName}')
host=$(kubectl get pv "$volume" -o jsonpath='{.spec.hostPath.path}' 2>/dev/null || true)
if [ -n "$host" ] && [ -n "${KUBECONFIG##*kind-kubeconfig}" ]; then
  where="on this machine: $host/${model#"$mount"/}"
else
  where="in the claim's volume"
fi
say "trained model: $model on claim '$claim' ($where)"
