package main

// The cluster's own controllers and scheduler, upstream's code, run in this process against
// the scenario's API server: the ReplicaSet, Deployment, disruption (PodDisruptionBudget
// status), taint eviction and EndpointSlice controllers of kube-controller-manager, and
// kube-scheduler with its default configuration. Each is started as kubernetes/kubernetes
// v1.33.1 starts it (cmd/kube-controller-manager/app: apps.go startReplicaSetController and
// startDeploymentController, policy.go startDisruptionController, core.go
// startTaintEvictionController, discovery.go startEndpointSliceController, the shared
// informers and REST mapper of controllermanager.go
// CreateControllerContext; cmd/kube-scheduler/app/server.go Setup and Run, without the
// secure serving and leader election a single in-process scheduler has no use for).
//
// Why in process, and not the bridge imitating them nor a kube-controller-manager process:
// they come from the k8s.io/kubernetes module the autoscaler already depends on (go.mod), so
// they add 34 small packages to this module's build (pkg/controller/{replicaset,deployment,
// disruption,tainteviction}, pkg/scheduler's queue and cache, client-go's scale client),
// where cmd/kube-controller-manager would be a third large binary to build (about 300
// packages more than kube-apiserver, volume plugins included, and modules its go.sum lacks)
// and a process to start per scenario. Two controllers stay the bridge's (nodes.go, pods.go),
// because the scenarios need them faster than upstream's code can be made to run: the node
// lifecycle controller (its grace period is a flag, but it judges a node by its kubelet's
// heartbeats, the Lease renewals the bridge does not post) and pod garbage collection (its
// 40 s quarantine is a constant).

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	cacheddiscovery "k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller"
	"k8s.io/kubernetes/pkg/controller/deployment"
	"k8s.io/kubernetes/pkg/controller/disruption"
	"k8s.io/kubernetes/pkg/controller/endpointslice"
	"k8s.io/kubernetes/pkg/controller/replicaset"
	"k8s.io/kubernetes/pkg/controller/tainteviction"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/profile"
)

// Controllers are the controllers and the scheduler running; Stop ends them.
type Controllers struct {
	cancel context.CancelFunc
}

// StartControllers starts the controllers and the scheduler on k, their own log lines (each
// logs through its context's logger) to logger. It returns once their informers have synced.
func StartControllers(k *Kube, logger klog.Logger) (*Controllers, error) {
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	c := &Controllers{cancel: cancel}
	if err := c.start(ctx, k); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Controllers) start(ctx context.Context, k *Kube) error {
	// kube-controller-manager's client limits [--kube-api-qps 20, --kube-api-burst 30].
	client, err := kubernetes.NewForConfig(k.Config(20, 30))
	if err != nil {
		return err
	}
	trim := func(obj interface{}) (interface{}, error) {
		if accessor, err := meta.Accessor(obj); err == nil && accessor.GetManagedFields() != nil {
			accessor.SetManagedFields(nil)
		}
		return obj, nil
	}
	// --min-resync-period [12h]: controllermanager.go ResyncPeriod picks between it and twice it.
	shared := informers.NewSharedInformerFactoryWithOptions(client, 12*time.Hour, informers.WithTransform(trim))
	cachedClient := cacheddiscovery.NewMemCacheClient(client.Discovery())
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(cachedClient)
	go wait.Until(restMapper.Reset, 30*time.Second, ctx.Done())

	// ConcurrentRSSyncs and ConcurrentDeploymentSyncs: 5 (pkg/controller/{replicaset,
	// deployment}/config/v1alpha1/defaults.go).
	go replicaset.NewReplicaSetController(ctx, shared.Apps().V1().ReplicaSets(), shared.Core().V1().Pods(),
		client, replicaset.BurstReplicas).Run(ctx, 5)
	dc, err := deployment.NewDeploymentController(ctx, shared.Apps().V1().Deployments(), shared.Apps().V1().ReplicaSets(),
		shared.Core().V1().Pods(), client)
	if err != nil {
		return err
	}
	go dc.Run(ctx, 5)
	scaleClient, err := scale.NewForConfig(k.Config(20, 30), restMapper, dynamic.LegacyAPIPathResolverFunc,
		scale.NewDiscoveryScaleKindResolver(client.Discovery()))
	if err != nil {
		return err
	}
	go disruption.NewDisruptionController(ctx, shared.Core().V1().Pods(), shared.Policy().V1().PodDisruptionBudgets(),
		shared.Core().V1().ReplicationControllers(), shared.Apps().V1().ReplicaSets(), shared.Apps().V1().Deployments(),
		shared.Apps().V1().StatefulSets(), client, restMapper, scaleClient, client.Discovery()).Run(ctx)
	// The taint eviction controller finds a node's pods through the shared pod informer's
	// index by node name, which kube-controller-manager's node lifecycle controller adds
	// (pkg/controller/nodelifecycle/node_lifecycle_controller.go NewNodeLifecycleController:
	// controller.AddPodNodeNameIndexer); that controller is the bridge's here, so the index
	// is added as it adds it.
	if err := controller.AddPodNodeNameIndexer(shared.Core().V1().Pods().Informer()); err != nil {
		return err
	}
	te, err := tainteviction.New(ctx, client, shared.Core().V1().Pods(), shared.Core().V1().Nodes(), "taint-eviction-controller")
	if err != nil {
		return err
	}
	go te.Run(ctx)
	// The EndpointSlice controller writes the provider's Service's EndpointSlices from its
	// pods' Ready condition (leader.go's proxy routes by them): its defaults
	// (pkg/controller/endpointslice/config/v1alpha1/defaults.go: 5 syncs, 100 endpoints per
	// slice, no batch period).
	go endpointslice.NewController(ctx, shared.Core().V1().Pods(), shared.Core().V1().Services(),
		shared.Core().V1().Nodes(), shared.Discovery().V1().EndpointSlices(), 100, client, 0).Run(ctx, 5)
	shared.Start(ctx.Done())

	// kube-scheduler: its client limits [--kube-api-qps 50, --kube-api-burst 100], its own
	// informer factory (scheduler.NewInformerFactory: pods not terminated), events through
	// the events API (options.go Config: NewEventBroadcasterAdapterWithContext).
	schedClient, err := kubernetes.NewForConfig(k.Config(50, 100))
	if err != nil {
		return err
	}
	schedInformers := scheduler.NewInformerFactory(schedClient, 0)
	broadcaster := events.NewEventBroadcasterAdapterWithContext(ctx, schedClient)
	recorders := profile.RecorderFactory(func(name string) events.EventRecorder { return broadcaster.NewRecorder(name) })
	sched, err := scheduler.New(ctx, schedClient, schedInformers, nil, recorders)
	if err != nil {
		return err
	}
	broadcaster.StartRecordingToSink(ctx.Done())
	schedInformers.Start(ctx.Done())
	schedInformers.WaitForCacheSync(ctx.Done())
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		return err
	}
	go sched.Run(ctx)
	shared.WaitForCacheSync(ctx.Done())
	return nil
}

// Stop ends the controllers and the scheduler.
func (c *Controllers) Stop() {
	if c == nil {
		return
	}
	c.cancel()
}
