#!/usr/bin/env bash
# Adds gang scheduling to the running local cluster (`up.sh --gang`, or MW_GANG=1): the PodGroup
# CRD (scheduling.x-k8s.io/v1alpha1), the coscheduling scheduler as a second scheduler whose
# profile `scheduler-plugins-scheduler` places a PodGroup's pods all at once or not at all, and
# the PodGroup controller that keeps PodGroup status current. Idempotent; down.sh stops both.
# `gang.sh --kind` does the same for the kind cluster (hack/kind/up.sh): both processes run on
# this host against its API server with its admin kubeconfig (no image is needed offline), and
# `gang.sh --kind --stop` (hack/kind/down.sh, and up.sh before it recreates the cluster) stops them.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
scheduler_name=scheduler-plugins-scheduler
stop=0
if [ "${2:-}" = --stop ]; then stop=1; fi
case ${1:-} in
  "")
    prefix=
    coscheduler_port=10261   # kube-scheduler has 10259
    scheduler_kubeconfig=$state/scheduler.kubeconfig
    controller_kubeconfig=$state/podgroup-controller.kubeconfig ;;
  --kind)
    prefix=kind-             # process names: the local cluster's may run beside these
    coscheduler_port=10263
    kubeconfig=$state/kind-kubeconfig
    scheduler_kubeconfig=$kubeconfig
    controller_kubeconfig=$kubeconfig ;;
  *) die "unknown argument $1 (usage: gang.sh [--kind [--stop]])" ;;
esac

if [ "$stop" = 1 ]; then
  for c in "${prefix}coscheduler" "${prefix}podgroup-controller"; do stop_process "$c"; done
  exit 0
fi
kc get --raw /readyz >/dev/null 2>&1 || die "the cluster is not up: run up.sh first"
"$here/build-coscheduling.sh"
# The local controller's client certificate (existing ones are kept).
[ -n "$prefix" ] || "$here/pki.sh"

log "gang scheduling: PodGroup CRD, RBAC"
kc apply --server-side --force-conflicts -f "$bin/scheduling.x-k8s.io_podgroups.yaml" >/dev/null
KUBECONFIG=$kubeconfig "$here/wait-crd.sh" podgroups.scheduling.x-k8s.io 60 || die "no PodGroup CRD"
kc apply -f "$here/gang-rbac.yaml" >/dev/null

cat > "$state/${prefix}coscheduler.yaml.tmp" <<EOT
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
clientConnection: {kubeconfig: $scheduler_kubeconfig}
profiles:
- schedulerName: $scheduler_name
  plugins:
    multiPoint:
      enabled: [{name: Coscheduling}]
    queueSort:              # Coscheduling orders the queue so a group's pods stay together
      enabled: [{name: Coscheduling}]
      disabled: [{name: "*"}]
  pluginConfig:
  - name: Coscheduling
    args:
      permitWaitingTimeSeconds: 60    # for PodGroups without scheduleTimeoutSeconds
      podGroupRejectPercentage: 0     # one member that cannot fit rejects the whole group
EOT
mv "$state/${prefix}coscheduler.yaml.tmp" "$state/${prefix}coscheduler.yaml"

coscheduler_cmd=(coscheduler --config "$state/${prefix}coscheduler.yaml"
  --authentication-kubeconfig "$scheduler_kubeconfig"
  --authorization-kubeconfig "$scheduler_kubeconfig"
  --bind-address 127.0.0.1 --secure-port "$coscheduler_port"
  # Coscheduling requeues a group it rejected as a whole (at Permit) only on a new pod or a
  # PodGroup change, not when other pods free their resources: such a group waits for
  # kube-scheduler's periodic retry of unschedulable pods (5 min by default; 20 s here).
  --pod-max-in-unschedulable-pods-duration 20s
  # Level 3 logs each move between the scheduler's queues, with the plugins that rejected the
  # pod: what a gang test's failure needs to tell a scheduler that waits from one never asked.
  -v=3)
controller_cmd=(podgroup-controller --kubeconfig "$controller_kubeconfig")

# restart_if_changed NAME COMMAND...: a process started from an older build or with other
# arguments is stopped, so the `start` below runs the current one.
restart_if_changed() {
  local name=$1 pid; shift
  is_running "$name" || return 0
  pid=$(cat "$state/pids/$name.pid")
  [ "$(readlink -f "/proc/$pid/exe")" = "$(readlink -f "$bin/$1")" ] &&
    [ "$(tr '\0' ' ' < "/proc/$pid/cmdline")" = "$* " ] && return 0
  log "restarting $name ($pid): its binary or arguments changed"
  stop_process "$name"
}
restart_if_changed "${prefix}coscheduler" "${coscheduler_cmd[@]}"
restart_if_changed "${prefix}podgroup-controller" "${controller_cmd[@]}"

log "coscheduler (schedulerName $scheduler_name), podgroup-controller"
start "${prefix}coscheduler" "${coscheduler_cmd[@]}"
start "${prefix}podgroup-controller" "${controller_cmd[@]}"
wait_until 60 "coscheduler /healthz" curl -fsSk "https://127.0.0.1:$coscheduler_port/healthz"
for c in "${prefix}coscheduler" "${prefix}podgroup-controller"; do
  is_running "$c" || die "$c exited: see $state/logs/$c.log"
done
log "gang scheduling ready: pods with schedulerName $scheduler_name and the label" \
  "scheduling.x-k8s.io/pod-group=<PodGroup> are placed whole"
