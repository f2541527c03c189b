#!/usr/bin/env bash
# Restarts ONE component of the local cluster, the way up.sh starts it (components.sh), leaving
# every other one alone — for chaos tests that kill the API server or etcd on purpose.
#   restart.sh [--kill] COMPONENT   stop it if it runs (SIGTERM, SIGKILL after 10 s; --kill:
#                                   SIGKILL at once), start it again, wait until it serves
# COMPONENT: etcd kube-apiserver kube-controller-manager kube-scheduler coredns containerd
# kube-proxy kubelet. State is kept (etcd's data, images, pods). A component that is not
# running (killed by a test) is just started.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$here/components.sh"

signal=TERM
if [ "${1:-}" = --kill ]; then signal=KILL; shift; fi
name=${1:?usage: restart.sh [--kill] COMPONENT}
[[ " ${components[*]} " == *" $name "* ]] || die "unknown component $name (one of: ${components[*]})"
[ -f "$kubeconfig" ] || die "no local cluster here ($kubeconfig missing): run up.sh"

if is_running "$name"; then
  pid=$(cat "$state/pids/$name.pid")
  log "stopping $name ($pid, SIG$signal)"
  kill -CONT "$pid" 2>/dev/null || true   # a stopped (SIGSTOP) process cannot act on SIGTERM
  kill "-$signal" -- "-$pid" 2>/dev/null || kill "-$signal" "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  wait_until 10 "$name ($pid) to exit" sh -c "! kill -0 $pid"
fi
rm -f "$state/pids/$name.pid"
t0=$SECONDS
log "starting $name"
start_component "$name"
await_component "$name"
log "$name serves again after $((SECONDS - t0))s"
