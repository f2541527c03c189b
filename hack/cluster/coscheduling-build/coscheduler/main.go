// Command coscheduler is kube-scheduler with the Coscheduling plugin of scheduler-plugins
// registered (and nothing else of theirs): the local cluster's second scheduler, which places
// the pods of a PodGroup all at once or not at all.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	// Registers CoschedulingArgs so the scheduler configuration file can set them.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(coscheduling.Name, coscheduling.New))
	os.Exit(cli.Run(command))
}
