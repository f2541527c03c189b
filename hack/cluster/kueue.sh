#!/usr/bin/env bash
# Installs Kueue (sigs.k8s.io/kueue, versions.env's KUEUE_VERSION: job queueing and quotas,
# ClusterQueue/LocalQueue/Workload) into the running local cluster, offline, and returns once
# its webhooks answer:
#   kueue.sh            the local cluster (.cluster/kubeconfig; `make kueue-up`)
#   kueue.sh --kind     the kind cluster (.cluster/kind-kubeconfig, .cluster/kind.env;
#                       `make kueue-up CLUSTER=kind`)
# The manager is built from the Go module (build-kueue.sh), packed as the one-layer image
# multiworker.local/kueue:<version> (hack/images/build.sh kueue) and imported into the nodes'
# containerd (hack/images/load.sh), so nothing is pulled. The manifests are the module's
# config/default (CRDs, RBAC, manager, internal certificates, webhooks) rendered with kubectl
# kustomize through an overlay written here: our image (IfNotPresent), small requests (the node
# has 2 cores the tests need), and a controller config that manages batch/v1 Jobs and
# MultiWorkerJobs (externalFrameworks) that carry a kueue.x-k8s.io/queue-name label only.
# The overlay drops what would make the cluster depend on Kueue beyond those jobs: the webhooks
# of the Pod, Deployment and StatefulSet integrations (not enabled here, yet upstream's
# configuration sends every pod of every namespace through the manager, failurePolicy Fail)
# and the visibility APIServices (the local API server has no aggregation layer configured:
# an unavailable API group fails discovery, and with it namespace deletion).
# Idempotent (with Kueue up and unchanged it returns in seconds) and safe to run concurrently:
# one install per cluster at a time. Nothing to stop: down.sh wipes the local cluster's etcd,
# and deleting the kind cluster deletes Kueue with it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
timeout_s=${MW_KUEUE_TIMEOUT:-180}   # from the apply until the webhooks answer
kind_cluster=
case ${1:-} in
  "") ;;
  --kind)
    [ -f "$state/kind.env" ] || die "no kind cluster: make cluster-up CLUSTER=kind"
    # shellcheck disable=SC1091  # written by hack/kind/up.sh: DOCKER_HOST, KUBECONFIG
    source "$state/kind.env"
    kubeconfig=$state/kind-kubeconfig
    kind_cluster=multiworker ;;
  *) die "unknown argument $1 (usage: kueue.sh [--kind])" ;;
esac
[ $# -le 1 ] || die "usage: kueue.sh [--kind]"
ns=kueue-system
deployment=kueue-controller-manager
# The on-demand visibility API (pending workloads) is served through the API server's
# aggregation layer, which the local cluster does not configure (no --requestheader-* and
# --proxy-client-* flags): left registered, it fails discovery and namespaces never finish
# deleting. Kueue itself does not need it; its server in the manager just goes unused.
visibility_apiservices="v1beta1.visibility.kueue.x-k8s.io v1beta2.visibility.kueue.x-k8s.io"
t_all=$SECONDS
kc get --raw /readyz >/dev/null 2>&1 || die "the cluster is not up: run make cluster-up${kind_cluster:+ CLUSTER=kind} first"

# One install per cluster at a time (pytest fixtures in several xdist workers may all call this).
mkdir -p "$state"
exec 7>"$state/${kind_cluster:+kind-}kueue.lock"
flock -n 7 || { log "kueue: waiting for another install to finish"; flock 7; }

# timed TITLE COMMAND...: run COMMAND, then log how long it took.
timings=()
timed() {
  local title=$1 t0=$SECONDS; shift
  "$@"
  timings+=("$title $((SECONDS - t0))s")
}

# The binary (a cold Go build takes minutes; build-kueue.sh waits for one already under way),
# the image, and the image in the nodes.
timed build "$repo/hack/images/build.sh" kueue
if [ -n "$kind_cluster" ]; then
  timed load "$repo/hack/images/load.sh" --kind "$kind_cluster" kueue
else
  timed load "$repo/hack/images/load.sh" kueue
fi
# shellcheck disable=SC2016  # expanded by the inner bash
image=$(bash -c 'source "$1" && ref kueue' bash "$repo/hack/images/lib.sh")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The module's config/ (a writable copy: kustomize reads it, we replace the controller config).
cp -r "$bin/kueue-config-$KUEUE_VERSION" "$work/config"
manager_config=$work/config/components/manager/controller_manager_config.yaml

# The controller config as shipped (health, metrics, webhook port, leader election, concurrency,
# client QPS), but for `integrations`, replaced as a whole, and manageJobsWithoutQueueName.
python3 - "$manager_config" <<'EOF'
import sys
path = sys.argv[1]
lines = open(path).read().splitlines()
if not any(line.startswith("integrations:") for line in lines):
    sys.exit(f"{path}: no top-level integrations: key (a new Kueue layout? update kueue.sh)")
out, skipping = [], False
for line in lines:
    if line.startswith("integrations:"):
        skipping = True
        continue
    if skipping and (line.startswith(" ") or not line.strip()):
        continue  # the shipped list (and its commented entries)
    skipping = False
    if line.startswith("manageJobsWithoutQueueName:"):
        continue
    out.append(line)
out += [
    "# multiworker (hack/cluster/kueue.sh): Kueue manages only jobs that name a LocalQueue",
    "# (label kueue.x-k8s.io/queue-name): batch/v1 Jobs, and MultiWorkerJobs, whose Workloads",
    "# the multiworker operator creates and runs itself (an external framework).",
    "manageJobsWithoutQueueName: false",
    "integrations:",
    "  frameworks:",
    '  - "batch/job"',
    "  externalFrameworks:",
    '  - "MultiWorkerJob.v1alpha1.multiworker.dev"',
]
open(path, "w").write("\n".join(out) + "\n")
EOF
grep -q '^integrations:' "$manager_config" || die "could not rewrite $manager_config"

mkdir "$work/overlay"
cat > "$work/overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../config/default
patches:
- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: $deployment, namespace: $ns}
    spec:
      template:
        spec:
          containers:
          - name: manager
            image: $image
            imagePullPolicy: IfNotPresent
            resources:
              requests: {cpu: 50m, memory: 128Mi}
              limits: {cpu: null, memory: 512Mi}
- patch: |-
    apiVersion: admissionregistration.k8s.io/v1
    kind: MutatingWebhookConfiguration
    metadata: {name: kueue-mutating-webhook-configuration}
    webhooks:
    - {name: mpod.kb.io, \$patch: delete}
    - {name: mdeployment.kb.io, \$patch: delete}
    - {name: mstatefulset.kb.io, \$patch: delete}
- patch: |-
    apiVersion: admissionregistration.k8s.io/v1
    kind: ValidatingWebhookConfiguration
    metadata: {name: kueue-validating-webhook-configuration}
    webhooks:
    - {name: vpod.kb.io, \$patch: delete}
    - {name: vdeployment.kb.io, \$patch: delete}
    - {name: vstatefulset.kb.io, \$patch: delete}
EOF
for v in $visibility_apiservices; do
  cat >> "$work/overlay/kustomization.yaml" <<EOF
- patch: |-
    apiVersion: apiregistration.k8s.io/v1
    kind: APIService
    metadata: {name: $v}
    \$patch: delete
EOF
done
kc kustomize --load-restrictor LoadRestrictionsNone "$work/overlay" > "$work/kueue.yaml" \
  || die "kubectl kustomize failed on $work/overlay"
grep -q "image: $image\$" "$work/kueue.yaml" || die "the rendered Deployment does not run $image"

log "kueue $KUEUE_VERSION: applying ($(grep -c '^kind:' "$work/kueue.yaml") objects, image $image)"
t0=$SECONDS
kc apply --server-side --force-conflicts --field-manager multiworker-kueue -f "$work/kueue.yaml" >/dev/null
# An install by an earlier kueue.sh (or by hand, from upstream's manifests) may have left them.
# shellcheck disable=SC2086  # a list of names
kc delete apiservice $visibility_apiservices --ignore-not-found >/dev/null

# await DESCRIPTION COMMAND...: poll COMMAND until it succeeds, up to the shared deadline; on
# timeout, say what it answered last and show the manager's pods, events and logs.
deadline=$((SECONDS + timeout_s))
await() {
  local what=$1; shift
  until "$@" >"$work/last" 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      log "error: Kueue not ready after ${timeout_s}s: $what; the last try said:"
      sed 's/^/    /' "$work/last" >&2
      log "pods in $ns:"; kc -n "$ns" get pods -o wide >&2 || true
      log "events in $ns:"; kc -n "$ns" get events --sort-by=.lastTimestamp 2>&1 | tail -15 >&2 || true
      log "manager logs (last 60 lines):"
      kc -n "$ns" logs "deploy/$deployment" --all-containers --tail=60 >&2 || true
      die "Kueue did not become ready (kubeconfig $kubeconfig)"
    fi
    sleep 1
  done
}
# deployment_available: the rollout is done (the current template's pods alone, all available).
deployment_available() {
  local r='{.spec.replicas}' want got
  want=$(kc -n "$ns" get deploy "$deployment" -o jsonpath="{.metadata.generation} $r $r $r $r")
  got=$(kc -n "$ns" get deploy "$deployment" -o jsonpath='{.status.observedGeneration} {.status.replicas} {.status.updatedReplicas} {.status.availableReplicas} {.status.readyReplicas}')
  echo "generation, replicas (all, updated, available, ready): want $want, have $got"
  [ "$want" = "$got" ] || { nudge_cert_volume; return 1; }
}
# nudge_cert_volume: the manager writes its webhook certificates into its own Secret at start
# and is not ready until they appear in its mounted copy, which a kubelet rewrites only when it
# syncs the pod: on an update, else every syncFrequency (1 min). Without help, apply-to-Available
# took 13-20 s or 95-129 s, and once in CI over 180 s. Once the Secret holds a certificate, an
# annotation (an update) every 10 s makes the kubelet sync the pod and remount the Secret at
# once: 9-20 s in 6 installs here. (elastic/cloud-on-k8s does the same for its certificates.)
last_nudge=0
nudge_cert_volume() {
  [ $((SECONDS - last_nudge)) -ge 10 ] || return 0
  [ -n "$(kc -n "$ns" get secret kueue-webhook-server-cert -o jsonpath='{.data.tls\.crt}' 2>/dev/null)" ] \
    || return 0
  last_nudge=$SECONDS
  kc -n "$ns" annotate pods --all --overwrite "multiworker.dev/remount-certs=$SECONDS" >/dev/null 2>&1 \
    && nudges=$((nudges + 1)) || true
}
nudges=0
# The webhooks answer (server up, CA bundle injected by the manager's internal certificates):
# a ResourceFlavor passes the mutating and validating webhooks, and a queued Job the Job ones.
cat > "$work/probe.yaml" <<'EOF'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: multiworker-kueue-probe}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: multiworker-kueue-probe
  namespace: default
  labels: {kueue.x-k8s.io/queue-name: multiworker-kueue-probe}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: probe, image: multiworker.local/base:bookworm, command: ["true"]}]
EOF
await "Deployment $ns/$deployment Available" deployment_available
timings+=("apply-to-Available $((SECONDS - t0))s (nudges $nudges)")
await "the webhooks answer (kubectl create --dry-run=server of a ResourceFlavor and a Job)" \
  kc create --dry-run=server -f "$work/probe.yaml"
timings+=("apply-to-webhooks $((SECONDS - t0))s")
log "kueue $KUEUE_VERSION ready in $((SECONDS - t_all))s (${timings[*]})"
