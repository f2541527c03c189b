#!/usr/bin/env bash
# A Docker engine for kind, on machines that have none.
#   docker.sh up       use the engine that answers; else install Debian's docker.io (if dockerd
#                      is missing) and start a private dockerd
#   docker.sh down     stop the private dockerd, if this script started it
#   docker.sh status   say which engine kind uses
# The private dockerd listens on its own socket ($engine_sock; scripts set DOCKER_HOST), so a
# plain `docker info` keeps failing and nothing else on the machine switches to it. It keeps
# its images in $MW_CACHE/kind/docker (the node image survives `down`), and leaves the host's
# iptables, IP forwarding and bridges alone: --iptables=false --ip-masq=false
# --ip-forward=false --bridge=none (kind's own network needs none of them).
set -euo pipefail
# shellcheck source=hack/kind/lib.sh
source "$(dirname "$0")/lib.sh"

# cap_sys_resource_bounded: root may hold CAP_SYS_RESOURCE (bit 24 of CapBnd).
cap_sys_resource_bounded() {
  local bnd; bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  (( (16#$bnd >> 24) & 1 ))
}

install_docker_io() {
  command -v dockerd >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || die "dockerd is missing; install Debian's docker.io (needs root)"
  local policy=/usr/sbin/policy-rc.d ours=0 t0=$SECONDS
  # Debian's maintainer scripts start services through invoke-rc.d, which asks policy-rc.d:
  # 101 = "not allowed", so installing docker.io starts no daemon.
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# multiworker: no daemon starts while docker.io is installed\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    ours=1
  elif ! grep -q 'exit 101' "$policy"; then
    log "warning: $policy exists and is not ours; the docker.io install may start a daemon"
  fi
  log "installing Debian's docker.io (no daemon starts by itself)"
  mkdir -p "$kind_work"
  local rc=0
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io \
      > "$kind_work/docker-install.log" 2>&1; } || rc=$?
  [ "$ours" = 1 ] && rm -f "$policy"
  [ "$rc" = 0 ] || { tail -20 "$kind_work/docker-install.log" >&2; die "apt-get install docker.io failed"; }
  command -v dockerd >/dev/null 2>&1 || die "docker.io is installed but dockerd is not on PATH"
  log "docker.io installed in $((SECONDS - t0))s ($(dockerd --version))"
}

private_running() {
  [ -f "$engine_pid" ] && kill -0 "$(cat "$engine_pid")" 2>/dev/null
}

start_private() {
  [ "$(id -u)" = 0 ] || die "no Docker engine answers, and starting one needs root"
  install_docker_io
  mkdir -p "$engine_run" "$engine_data"
  if private_running; then
    die "a private dockerd runs (pid $(cat "$engine_pid")) but does not answer on $engine_sock; see $engine_log"
  fi
  rm -f "$engine_pid" "$engine_sock" "$engine_owned"
  local args=(--host "unix://$engine_sock" --pidfile "$engine_pid" --data-root "$engine_data"
    --exec-root "$engine_run/exec" --iptables=false --ip-masq=false --ip-forward=false
    --bridge=none)
  if ! cap_sys_resource_bounded; then
    local runc; runc=$(command -v runc) || die "runc is missing (Debian package runc)"
    sed "s#@RUNC@#$runc#" "$here/runc-shim" > "$engine_run/runc-shim"
    chmod 0755 "$engine_run/runc-shim"
    args+=(--add-runtime "mw-runc=$engine_run/runc-shim" --default-runtime mw-runc)
    log "root lacks CAP_SYS_RESOURCE here: containers run through $engine_run/runc-shim"
  fi
  [ -d /lib/modules ] || touch "$engine_run/lib-modules-absent"  # kind mounts it; docker creates it
  log "starting a private dockerd (socket $engine_sock, data $engine_data, log $engine_log)"
  setsid dockerd "${args[@]}" > "$engine_log" 2>&1 < /dev/null &
  local deadline=$((SECONDS + 60))
  until DOCKER_HOST=unix://$engine_sock docker info >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 $! 2>/dev/null; then
      tail -20 "$engine_log" >&2
      die "the private dockerd did not come up (log: $engine_log)"
    fi
    sleep 0.3
  done
  touch "$engine_owned"
}

up() {
  use_engine
  if engine_answers; then
    if [ -f "$engine_owned" ]; then log "private dockerd running ($engine_sock)"
    else log "using the Docker engine that answers (${DOCKER_HOST:-default socket})"; fi
    return 0
  fi
  start_private
}

down() {
  if [ ! -f "$engine_owned" ]; then
    log "no private dockerd of ours runs; any other Docker engine is left alone"
    return 0
  fi
  local pid
  if private_running; then
    pid=$(cat "$engine_pid")
    log "stopping the private dockerd ($pid)"
    kill -TERM "$pid"
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      log "dockerd $pid did not stop in 30s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  # What a dockerd killed mid-way can leave: its containerd, mounts under its roots, docker0.
  local cpid=$engine_run/exec/containerd/containerd.pid
  if [ -f "$cpid" ] && kill -0 "$(cat "$cpid")" 2>/dev/null; then kill -TERM "$(cat "$cpid")" || true; fi
  grep -oE " ($engine_run|$engine_data)[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  if ip link show docker0 >/dev/null 2>&1; then ip link delete docker0 2>/dev/null || true; fi
  if [ -f "$engine_run/lib-modules-absent" ]; then rmdir /lib/modules 2>/dev/null || true; fi
  rm -rf "$engine_run"
  if docker info >/dev/null 2>&1; then
    log "note: another Docker engine still answers on the default socket (not ours)"
  fi
}

status() {
  use_engine
  if ! engine_answers; then echo "no Docker engine answers"; return 1; fi
  if [ -f "$engine_owned" ]; then echo "private dockerd: DOCKER_HOST=unix://$engine_sock"
  else echo "Docker engine: ${DOCKER_HOST:-default socket}"; fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: docker.sh up|down|status" ;;
esac
