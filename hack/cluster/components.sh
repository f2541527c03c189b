# The command line of every process of the local cluster, in one place (sourced after lib.sh):
# up.sh starts them all in order, restart.sh one of them, each exactly the same way.
pki=$state/pki

# start_component NAME: start NAME in its own session (logs/NAME.log, pids/NAME.pid) unless it
# already runs. State is kept: etcd's data, containerd's images (up.sh wipes what it wants first).
start_component() {
  case $1 in
    etcd)
      start etcd etcd --name mw --data-dir "$state/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
        --initial-cluster mw=http://127.0.0.1:12380 ;;
    kube-apiserver)
      start kube-apiserver kube-apiserver --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 0.0.0.0 --secure-port "$api_port" --advertise-address "$gateway" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --allow-privileged=true \
        --service-cluster-ip-range "$service_cidr" \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types InternalIP --enable-admission-plugins NodeRestriction ;;
    kube-controller-manager)
      # Its garbage collector deletes a deleted job's pods through the same client, 20 requests/s
      # by default: 8,000 pods took over 6 minutes, longer than the benchmark they ended. Raised
      # as the scheduler's below (kwokctl does the same).
      start_always kube-controller-manager kube-controller-manager --kubeconfig "$state/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
        --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
        --use-service-account-credentials --leader-elect=false --bind-address 127.0.0.1 \
        --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
        --kube-api-qps 5000 --kube-api-burst 10000 ;;
    kube-scheduler)
      # A scheduler at its default client limits (50 requests/s, burst 100) binds at most ~50
      # pods/s: a 1,024-worker group then takes 20 s to place whatever the operator does.
      # kwokctl raises them the same way for its scale clusters.
      start_always kube-scheduler kube-scheduler --kubeconfig "$state/scheduler.kubeconfig" \
        --authentication-kubeconfig "$state/scheduler.kubeconfig" \
        --authorization-kubeconfig "$state/scheduler.kubeconfig" \
        --leader-elect=false --bind-address 127.0.0.1 \
        --kube-api-qps 5000 --kube-api-burst 10000 ;;
    coredns)
      start coredns coredns -conf "$state/Corefile" ;;
    containerd)
      mkdir -p "$run/containerd" "$containerd_root"
      start containerd containerd --config "$state/containerd.toml" ;;
    kube-proxy)
      start kube-proxy kube-proxy --config "$state/kube-proxy.yaml" ;;
    kubelet)
      mkdir -p "$kubelet_root"
      start kubelet kubelet --config "$state/kubelet.yaml" --kubeconfig "$state/kubelet.kubeconfig" \
        --root-dir "$kubelet_root" --hostname-override "$node" --node-ip "$gateway" \
        --node-labels "multiworker.dev/local-cluster=true" ;;
    *) die "unknown component $1 (one of: ${components[*]})" ;;
  esac
}

# await_component NAME: wait until NAME serves (what up.sh waits for before going on).
await_component() {
  case $1 in
    etcd) wait_until 30 etcd curl -fsS "http://127.0.0.1:$etcd_port/health" ;;
    kube-apiserver) wait_until 90 "kube-apiserver /readyz" kc get --raw /readyz ;;
    containerd) wait_until 30 containerd ctr --address "$sock" version ;;
    kubelet)
      wait_until 90 "node $node to register" kc get node "$node"
      wait_until 90 "node $node Ready" kc wait --for=condition=Ready "node/$node" --timeout=1s ;;
    *) wait_until 10 "$1 to stay up" is_running "$1" ;;
  esac
}

# Every component, in the order up.sh starts them.
components=(etcd kube-apiserver kube-controller-manager kube-scheduler coredns containerd kube-proxy kubelet)
