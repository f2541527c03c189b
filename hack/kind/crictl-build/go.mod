// Builds crictl for the offline kind node image (kubeadm and `kind load` checks use it). A
// module of its own: `go install ...@version` needs the proxy's version list, which may be
// refused, while a required version is fetched directly.
module multiworker.dev/crictl-build

go 1.26.2

require sigs.k8s.io/cri-tools v1.36.0 // indirect
