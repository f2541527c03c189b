# Shared settings for the local real cluster scripts (sourced, not run).
# One cluster per machine: fixed ports and addresses, state under the repo's .cluster/.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${MW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multiworker}
bin=$cache/bin
state=$repo/.cluster                  # kubeconfig, pki, configs, logs, pids, etcd data
run=/run/multiworker                  # sockets and runtime state (short paths)
kubelet_root=/var/lib/multiworker/kubelet
containerd_root=$cache/containerd     # kept across cluster restarts: imported images survive
sock=$run/containerd/containerd.sock

node=${MW_NODE_NAME:-mw-node}
node_gpus=${MW_NODE_GPUS:-4}
bridge=mwbr0
gateway=10.88.0.1                      # bridge address: API advertise address, node IP, DNS
pod_cidr=10.88.0.0/16
service_cidr=10.96.0.0/16
api_service_ip=10.96.0.1
# kwok's fake nodes (fake-nodes.sh): pod IPs and node addresses with nothing behind them.
fake_pod_cidr=10.89.0.0/16
fake_node_cidr=10.90.0.0/16
range_metric=4201   # tags this cluster's unreachable routes (ranges.sh)
etcd_port=12379
api_port=6443

export PATH="$bin:$PATH"
kubeconfig=$state/kubeconfig

# shellcheck source=ranges.sh
source "$here/ranges.sh"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

# wait_until SECONDS DESCRIPTION COMMAND... : poll until COMMAND succeeds.
wait_until() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${limit}s waiting for $what"
    sleep 0.2
  done
}

# require_free_disk PATH...: each PATH's filesystem has MW_MIN_FREE_GIB (default 5) free.
# Below 1% free the kubelet evicts pods and deletes images, the pause image with them; every
# new pod then fails "failed to get sandbox image" — better to refuse here and say why.
require_free_disk() {
  local need=${MW_MIN_FREE_GIB:-5} path free
  for path in "$@"; do
    mkdir -p "$path"
    free=$(df -P -BG "$path" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
    [ "$free" -ge "$need" ] || die "only ${free} GiB free under $path (images, pods' volumes): \
the kubelet evicts pods and deletes images when a disk runs full; free ${need} GiB or more \
(MW_MIN_FREE_GIB sets the floor)"
  done
}

is_running() { # NAME: the process recorded in pids/NAME.pid is alive — the one started then,
  # not a later process that reuses its pid (it must be no younger than the pid file)
  local f=$state/pids/$1.pid pid age
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  age=$(ps -o etimes= -p "$pid" 2>/dev/null) || return 1
  [ $(($(date +%s) - age)) -le $(($(stat -c %Y "$f") + 5)) ]
}

# start NAME COMMAND...: run in its own session, log to logs/NAME.log, record the PID.
# Descriptors above 2 are closed first: a daemon must not inherit (and so hold forever) a lock
# or pipe of whoever brought the cluster up, e.g. `flock LOCK make cluster-up`.
start() {
  local name=$1; shift
  if is_running "$name"; then return 0; fi
  mkdir -p "$state/logs" "$state/pids"
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"
    done
    exec setsid "$@" >"$state/logs/$name.log" 2>&1 < /dev/null
  ) &
  echo $! > "$state/pids/$name.pid"
}

stop_process() { # NAME: SIGTERM to the process group recorded in pids/NAME.pid, SIGKILL after 10 s
  local f=$state/pids/$1.pid pid
  if is_running "$1"; then
    pid=$(cat "$f")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# start_always NAME COMMAND...: `start`, and start COMMAND again whenever it exits — what the
# kubelet does for a real cluster's static control-plane pods. kube-scheduler exits by design
# when its cache turns inconsistent (seen after the API server was SIGKILLed mid-binding),
# and a cluster without a scheduler would hang every later test. Stopping the recorded PID's
# process group (down.sh, restart.sh) stops the loop and the command together.
start_always() {
  local name=$1; shift
  # shellcheck disable=SC2016  # expanded by the inner sh
  start "$name" sh -c 'while :; do "$@"; echo "[cluster] $1 exited $?: starting it again in 1s"; sleep 1; done' sh "$@"
}

kc() { kubectl --kubeconfig "$kubeconfig" "$@"; }

# guard_local_ranges: every range this cluster hands out is served here or unreachable
# (ranges.sh). Service IPs are routed to the bridge: for processes on this host kube-proxy
# rewrites a ClusterIP only after the route lookup, so an `unreachable` route alone would break
# them; with this route the lookup succeeds, allocated ClusterIPs are rewritten to pods, and an
# unallocated one stays on the bridge (no neighbour answers: "No route to host").
guard_local_ranges() {
  guard_ranges local "$range_metric" "$pod_cidr=pods (bridge $bridge)" \
    "$service_cidr=services (kube-proxy, via bridge $bridge)" \
    "$fake_pod_cidr=kwok fake pods (nothing behind them)" \
    "$fake_node_cidr=kwok fake nodes (nothing behind them)"
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip route replace "$service_cidr" dev "$bridge" src "$gateway"
  fi
}
