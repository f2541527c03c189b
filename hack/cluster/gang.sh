#!/usr/bin/env bash
# Adds gang scheduling to the running local cluster (`up.sh --gang`, or MW_GANG=1): the PodGroup
# CRD (scheduling.x-k8s.io/v1alpha1), the coscheduling scheduler as a second scheduler whose
# profile `scheduler-plugins-scheduler` places a PodGroup's pods all at once or not at all, and
# the PodGroup controller that keeps PodGroup status current. Idempotent; down.sh stops both.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
scheduler_name=scheduler-plugins-scheduler
coscheduler_port=10261   # kube-scheduler has 10259

kc get --raw /readyz >/dev/null 2>&1 || die "the cluster is not up: run up.sh first"
"$here/build-coscheduling.sh"
"$here/pki.sh"            # the controller's client certificate (existing ones are kept)

log "gang scheduling: PodGroup CRD, RBAC"
kc apply --server-side --force-conflicts -f "$bin/scheduling.x-k8s.io_podgroups.yaml" >/dev/null
wait_until 60 "the PodGroup CRD" established podgroups.scheduling.x-k8s.io
kc apply -f "$here/gang-rbac.yaml" >/dev/null

cat > "$state/coscheduler.yaml.tmp" <<EOT
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
clientConnection: {kubeconfig: $state/scheduler.kubeconfig}
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
mv "$state/coscheduler.yaml.tmp" "$state/coscheduler.yaml"

coscheduler_cmd=(coscheduler --config "$state/coscheduler.yaml"
  --authentication-kubeconfig "$state/scheduler.kubeconfig"
  --authorization-kubeconfig "$state/scheduler.kubeconfig"
  --bind-address 127.0.0.1 --secure-port "$coscheduler_port"
  # Coscheduling requeues a group it rejected as a whole (at Permit) only on a new pod or a
  # PodGroup change, not when other pods free their resources: such a group waits for
  # kube-scheduler's periodic retry of unschedulable pods (5 min by default; 20 s here).
  --pod-max-in-unschedulable-pods-duration 20s)
controller_cmd=(podgroup-controller --kubeconfig "$state/podgroup-controller.kubeconfig")

# restart_if_changed NAME COMMAND...: a process started from an older build or with other
# arguments is stopped, so the `start` below runs the current one.
restart_if_changed() {
  local name=$1 f=$state/pids/$1.pid pid; shift
  is_running "$name" || return 0
  pid=$(cat "$f")
  [ "$(readlink -f "/proc/$pid/exe")" = "$(readlink -f "$bin/$1")" ] &&
    [ "$(tr '\0' ' ' < "/proc/$pid/cmdline")" = "$* " ] && return 0
  log "restarting $name ($pid): its binary or arguments changed"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$f"
}
restart_if_changed coscheduler "${coscheduler_cmd[@]}"
restart_if_changed podgroup-controller "${controller_cmd[@]}"

log "coscheduler (schedulerName $scheduler_name), podgroup-controller"
start coscheduler "${coscheduler_cmd[@]}"
start podgroup-controller "${controller_cmd[@]}"
wait_until 60 "coscheduler /healthz" curl -fsSk "https://127.0.0.1:$coscheduler_port/healthz"
for c in coscheduler podgroup-controller; do
  is_running "$c" || die "$c exited: see $state/logs/$c.log"
done
log "gang scheduling ready: pods with schedulerName $scheduler_name and the label" \
  "scheduling.x-k8s.io/pod-group=<PodGroup> are placed whole"
