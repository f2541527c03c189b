// CoreDNS with only the plugins the local and kind clusters' Corefiles use (the Corefile in
// hack/cluster/configs.sh, kubeadm's in the kind node): CoreDNS's documented way to choose
// plugins at compile time, a main package that sets dnsserver.Directives. The full build
// compiles every cloud provider's SDK (route53, azure, clouddns, etcd) that no cluster here
// uses, which tripled a cold build on 2 cores.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// directives: the kept plugins in the order of CoreDNS's plugin.cfg (the order they run in).
var directives = []string{
	"reload", "bind", "ready", "health", "prometheus", "errors", "log", "loadbalance", "cache",
	"template", "hosts", "kubernetes", "loop", "forward", "whoami",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
