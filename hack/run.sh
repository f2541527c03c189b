#!/usr/bin/env bash
# `make run`: the whole first-run path on one machine. Brings up a cluster (kind when a Docker
# engine answers, else the built-in local real cluster), builds and loads the images, installs
# the operator with Helm, runs the example CPU job to the end while showing its status, and
# prints where the trained model is. Re-running reuses everything that already exists.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export MW_CACHE=${MW_CACHE:-$HOME/.cache/multiworker}
export PATH="$MW_CACHE/bin:$PATH"
job=linear-cpu   # metadata.name in examples/cpu-job.yaml
ns=${MW_EXAMPLE_NAMESPACE:-default}
say() { printf '\n==> %s\n' "$*"; }

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

say "operator: helm upgrade --install"
helm upgrade --install multiworker-operator charts/multiworker-operator \
  --namespace multiworker-system --create-namespace --wait --timeout 5m
kubectl -n multiworker-system rollout status deployment -l app.kubernetes.io/instance=multiworker-operator

say "example: $ns/$job (examples/cpu-job.yaml)"
kubectl -n "$ns" apply -f examples/checkpoint-pvc.yaml
# A finished example from an earlier run is replaced so the run is shown again.
kubectl -n "$ns" delete mwj "$job" --ignore-not-found --wait=true
kubectl -n "$ns" apply -f examples/cpu-job.yaml

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

say "status"
kubectl -n "$ns" get mwj "$job"
kubectl -n "$ns" describe mwj "$job" | sed -n '/^Status:/,$p'
[ "$phase" = Succeeded ] || exit 1
if [ -z "${KUBECONFIG##*kind-kubeconfig}" ]; then
  where="on the kind node, in the claim's volume"
else
  where="on this machine: /var/lib/multiworker/example-checkpoints/model/linear.keras"
fi
say "trained model: claim 'checkpoints' (examples/checkpoint-pvc.yaml), model/linear.keras ($where)"
