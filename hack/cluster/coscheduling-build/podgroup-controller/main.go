// Command podgroup-controller runs only the PodGroup controller of scheduler-plugins: it keeps
// each PodGroup's status (phase, running/succeeded/failed counts) up to date. Upstream's
// controller binary also runs the ElasticQuota controller, which fails without that CRD.
package main

import (
	"flag"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	schedv1alpha1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"
	"sigs.k8s.io/scheduler-plugins/pkg/controllers"
)

func main() {
	workers := flag.Int("workers", 2, "PodGroups reconciled in parallel")
	klog.InitFlags(nil)
	flag.Parse() // also --kubeconfig, registered by controller-runtime
	ctrl.SetLogger(klog.NewKlogr())
	log := ctrl.Log.WithName("podgroup-controller")

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		log.Error(err, "building the scheme")
		os.Exit(1)
	}
	if err := schedv1alpha1.AddToScheme(scheme); err != nil {
		log.Error(err, "building the scheme")
		os.Exit(1)
	}
	// No metrics or probe listeners: one process per machine, and their default ports are
	// the ones operators like ours use.
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		log.Error(err, "creating the manager")
		os.Exit(1)
	}
	reconciler := &controllers.PodGroupReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Workers: *workers,
	}
	if err := reconciler.SetupWithManager(mgr); err != nil {
		log.Error(err, "setting up the PodGroup controller")
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "running")
		os.Exit(1)
	}
}
