#!/usr/bin/env bash
# Runs each built image in a private, throwaway containerd (own socket, root and state under a
# temp dir; never the cluster's) and checks what the other parts rely on:
#   pause    exits 0 on SIGTERM
#   base     python3 (ssl, venv), bash, ps; tini as PID 1 forwards SIGTERM to the command
#   worker   imports tensorflow and multiworker.runtime, and tf-keras when asked (Keras 2);
#            examples/training/train.py trains alone
#   operator imports multiworker, kopf, kubernetes and runs `multiworker-operator --help`, as
#            UID 65532 on a read-only root filesystem
#   smoke.sh [NAME...]        (default: every image that has an archive, but worker-gpu)
# Needs root (containerd, runc). Also shows how long each import into containerd takes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || die "smoke.sh needs root (it runs containerd)"
need containerd containerd runc

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for n in pause base worker operator; do [ -s "$archives/$n.tar" ] && names+=("$n"); done
fi
[ ${#names[@]} -gt 0 ] || die "no image archives in $archives: run hack/images/build.sh first"

dir=$(mktemp -d /tmp/mw-smoke.XXXXXX)
sock=$dir/containerd.sock
containerd_pid=
stop_containerd() {
  if [ -n "$containerd_pid" ]; then
    for id in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    kill "$containerd_pid" 2>/dev/null || true
    wait "$containerd_pid" 2>/dev/null || true
  fi
  umount -R "$dir/root" 2>/dev/null || true
  rm -rf "$dir"
}
trap stop_containerd EXIT

cat > "$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$dir/ttrpc.sock"
EOF
containerd --config "$dir/config.toml" > "$dir/containerd.log" 2>&1 &
containerd_pid=$!
for _ in $(seq 100); do ctr --address "$sock" version >/dev/null 2>&1 && break; sleep 0.1; done
ctr --address "$sock" version >/dev/null 2>&1 || { cat "$dir/containerd.log" >&2; die "containerd did not start"; }

c() { ctr --address "$sock" -n k8s.io "$@"; }
failures=0
check() { # DESCRIPTION COMMAND...
  local what=$1; shift
  if out=$("$@" 2>&1); then
    log "  ok: $what${out:+ ($(echo "$out" | tail -1))}"
  else
    log "  FAILED: $what"; echo "$out" | tail -15 >&2; failures=$((failures + 1))
  fi
}
run() { c run --rm "$@"; }   # run [FLAGS] REF ID [ARGS...]

# term_exit STATUS REF ID [ARGS...]: start a task, send it SIGTERM once it runs; it must exit
# with STATUS.
term_exit() {
  local expect=$1 ref=$2 id=$3; shift 3
  c run --rm "$ref" "$id" "$@" & local pid=$!
  for _ in $(seq 100); do c tasks ls | grep -q "^$id .*RUNNING" && break; sleep 0.1; done
  sleep 0.5   # let the process install its handlers
  c tasks kill -s SIGTERM "$id"
  local status=0; wait "$pid" || status=$?
  echo "exit $status"
  [ "$status" = "$expect" ]
}

python_term='import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
time.sleep(60)'

for name in "${names[@]}"; do
  bash "$here/load.sh" --address "$sock" "$name"
  r=$(ref "$name")
  log "$name: checks"
  check "a second load is skipped" sh -c "bash '$here/load.sh' --address '$sock' '$name' 2>&1 | grep 'already in containerd'"
  case $name in
    pause)
      check "exits 0 on SIGTERM" term_exit 0 "$r" pause-term ;;
    base)
      check "python3 with ssl and venv" run "$r" base-py python3 -c 'import ssl, venv, sys; print(sys.version.split()[0])'
      check "bash, ps, tini" run "$r" base-tools bash -c 'ps -p 1 -o comm= && tini --version'
      check "tini forwards SIGTERM" term_exit 7 "$r" base-term /usr/bin/tini -- python3 -c "$python_term" ;;
    worker | worker-gpu)
      check "imports tensorflow and multiworker.runtime" run "$r" "$name-import" python3 -c \
        'import time; t=time.time(); import tensorflow as tf, multiworker.runtime; print(f"tensorflow {tf.__version__}, import {time.time()-t:.1f}s")'
      check "examples/training present" run "$r" "$name-examples" ls /opt/multiworker/examples/training
      check "Keras 2 (tf-keras) at TensorFlow's version behind TF_USE_LEGACY_KERAS=1" run \
        --env TF_USE_LEGACY_KERAS=1 "$r" "$name-keras2" python3 -c \
        'import tensorflow as tf, tf_keras; assert tf.keras.Model.__module__.startswith("tf_keras"); assert tf_keras.__version__.rsplit(".", 1)[0] == tf.__version__.rsplit(".", 1)[0]; print("tf-keras", tf_keras.__version__)'
      check "example trains standalone (2 epochs)" run --net-host --env MWJ_PROGRESS_PORT=0 "$r" \
        "$name-train" timeout 300 python3 /opt/multiworker/examples/training/train.py --epochs 2 ;;
    operator)
      check "imports as UID 65532 on a read-only root" run --read-only "$r" operator-import python3 -c \
        'import os, multiworker, kopf, kubernetes, pydantic; assert os.getuid() == 65532, os.getuid(); print("uid", os.getuid())'
      check "multiworker-operator --help under tini, read-only" run --read-only "$r" operator-help \
        /usr/bin/tini -- multiworker-operator --help ;;
    *) die "no checks for $name" ;;
  esac
done
[ "$failures" = 0 ] || die "$failures check(s) failed"
log "all checks passed: ${names[*]}"
