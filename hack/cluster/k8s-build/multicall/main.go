// One binary for kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, chosen by
// the name it is called by (a symlink) or by its first argument. It exists to carry a control
// plane for kwok benchmarks to a machine without Go (hack/bench/device-kit.sh): the four share
// most of their code, so one binary compresses to about a third of four.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	_ "time/tzdata"

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	commands := map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	}
	if _, ok := commands[name]; !ok && name != "kubectl" && len(os.Args) > 1 {
		name, os.Args = os.Args[1], os.Args[1:]
	}
	if name == "kubectl" {
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			util.CheckErr(err)
		}
		return
	}
	command, ok := commands[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: k8s {kube-apiserver|kube-controller-manager|kube-scheduler|kubectl} ARGS")
		os.Exit(2)
	}
	os.Exit(cli.Run(command()))
}
