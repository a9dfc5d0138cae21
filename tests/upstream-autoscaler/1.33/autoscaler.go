package main

// The cluster-autoscaler, built as cluster-autoscaler-1.33.0's main.go builds it
// (buildAutoscaler), from its own flags (config/flags), with the externalgrpc cloud provider
// (builder, `externalgrpc` build tag) and its Kubernetes client from its --kubeconfig
// (utils/kubernetes/client.go CreateKubeClient), the scenario's API server. What main.go
// does around it is not run: leader election, the HTTP server, the loop trigger (the
// harness runs each iteration itself, Env.Step).

import (
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	cloudBuilder "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/builder"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	"k8s.io/autoscaler/cluster-autoscaler/config/flags"
	"k8s.io/autoscaler/cluster-autoscaler/core"
	"k8s.io/autoscaler/cluster-autoscaler/core/podlistprocessor"
	"k8s.io/autoscaler/cluster-autoscaler/core/scaleup/orchestrator"
	"k8s.io/autoscaler/cluster-autoscaler/debuggingsnapshot"
	"k8s.io/autoscaler/cluster-autoscaler/loop"
	"k8s.io/autoscaler/cluster-autoscaler/metrics"
	ca_processors "k8s.io/autoscaler/cluster-autoscaler/processors"
	"k8s.io/autoscaler/cluster-autoscaler/processors/nodegroupset"
	"k8s.io/autoscaler/cluster-autoscaler/processors/nodeinfosprovider"
	"k8s.io/autoscaler/cluster-autoscaler/processors/scaledowncandidates"
	"k8s.io/autoscaler/cluster-autoscaler/processors/scaledowncandidates/emptycandidates"
	"k8s.io/autoscaler/cluster-autoscaler/processors/scaledowncandidates/previouscandidates"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/clustersnapshot"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/clustersnapshot/predicate"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/clustersnapshot/store"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/drainability/rules"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/framework"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/options"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/scheduling"
	kube_util "k8s.io/autoscaler/cluster-autoscaler/utils/kubernetes"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	kube_flag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
)

// Upstream is one cluster-autoscaler: its loop, its Kubernetes client and its health check.
type Upstream struct {
	Autoscaler core.Autoscaler
	Kube       kubernetes.Interface
	Reader     kubernetes.Interface // the harness's client, for what it reads (Status)
	Health     *metrics.HealthCheck
	Options    config.AutoscalingOptions
	stop       chan struct{}
}

// ParseFlags parses the autoscaler's own command line, as its main does (klog flags, the
// pflag command line with Go flags added, then config/flags).
func ParseFlags(args []string) config.AutoscalingOptions {
	klog.InitFlags(nil)
	os.Args = append([]string{"cluster-autoscaler"}, args...)
	kube_flag.InitFlags()
	return flags.AutoscalingOptions()
}

// Build builds the autoscaler as main.go's buildAutoscaler does, wrapping the cloud provider
// with wrap when it is not nil (benchmarks only).
func Build(opts config.AutoscalingOptions, wrap func(cloudprovider.CloudProvider) cloudprovider.CloudProvider) (*Upstream, error) {
	metrics.RegisterAll(opts.EmitPerNodeGroupMetrics)
	kube := kube_util.CreateKubeClient(opts.KubeClientOpts)

	trim := func(obj interface{}) (interface{}, error) {
		if accessor, err := meta.Accessor(obj); err == nil {
			accessor.SetManagedFields(nil)
		}
		return obj, nil
	}
	informerFactory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(trim))

	fwHandle, err := framework.NewHandle(informerFactory, opts.SchedulerConfig, opts.DynamicResourceAllocationEnabled)
	if err != nil {
		return nil, err
	}
	deleteOptions := options.NewNodeDeleteOptions(opts)
	drainabilityRules := rules.Default(deleteOptions)

	var snapshotStore clustersnapshot.ClusterSnapshotStore = store.NewDeltaSnapshotStore(opts.ClusterSnapshotParallelism)
	aopts := core.AutoscalerOptions{
		AutoscalingOptions:   opts,
		FrameworkHandle:      fwHandle,
		ClusterSnapshot:      predicate.NewPredicateSnapshot(snapshotStore, fwHandle, opts.DynamicResourceAllocationEnabled),
		KubeClient:           kube,
		InformerFactory:      informerFactory,
		DebuggingSnapshotter: debuggingsnapshot.NewDebuggingSnapshotter(false),
		DeleteOptions:        deleteOptions,
		DrainabilityRules:    drainabilityRules,
		ScaleUpOrchestrator:  orchestrator.New(),
	}
	aopts.Processors = ca_processors.DefaultProcessors(opts)
	aopts.Processors.TemplateNodeInfoProvider = nodeinfosprovider.NewDefaultTemplateNodeInfoProvider(&opts.NodeInfoCacheExpireTime, opts.ForceDaemonSets)
	aopts.Processors.PodListProcessor = podlistprocessor.NewDefaultPodListProcessor(scheduling.ScheduleAnywhere)

	sdCandidatesSorting := previouscandidates.NewPreviousCandidates()
	comparers := []scaledowncandidates.CandidatesComparer{
		emptycandidates.NewEmptySortingProcessor(emptycandidates.NewNodeInfoGetter(aopts.ClusterSnapshot), deleteOptions, drainabilityRules),
		sdCandidatesSorting,
	}
	aopts.Processors.ScaleDownCandidatesNotifier.Register(sdCandidatesSorting)
	cp := scaledowncandidates.NewCombinedScaleDownCandidatesProcessor()
	cp.Register(scaledowncandidates.NewScaleDownCandidatesSortingProcessor(comparers))
	if opts.ScaleDownDelayTypeLocal {
		sdp := scaledowncandidates.NewScaleDownCandidatesDelayProcessor()
		cp.Register(sdp)
		aopts.Processors.ScaleStateNotifier.Register(sdp)
	}
	aopts.Processors.ScaleDownNodeProcessor = cp
	aopts.Processors.NodeGroupSetProcessor = &nodegroupset.BalancingNodeGroupSetProcessor{
		Comparator: nodegroupset.CreateGenericNodeInfoComparator(opts.BalancingExtraIgnoredLabels, opts.NodeGroupSetRatios),
	}

	metrics.UpdateCPULimitsCores(opts.MinCoresTotal, opts.MaxCoresTotal)
	metrics.UpdateMemoryLimitsBytes(opts.MinMemoryTotal, opts.MaxMemoryTotal)
	metrics.InitMetrics()

	if wrap != nil {
		// What core.initializeDefaultOptions would build, wrapped.
		aopts.CloudProvider = wrap(cloudBuilder.NewCloudProvider(opts, informerFactory))
	}

	autoscaler, err := core.NewAutoscaler(aopts, informerFactory)
	if err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	informerFactory.Start(stop)
	for typ, synced := range informerFactory.WaitForCacheSync(stop) {
		if !synced {
			return nil, fmt.Errorf("unable to start and sync resource informers (%v)", typ)
		}
	}

	u := &Upstream{
		Autoscaler: autoscaler,
		Kube:       kube,
		Health:     metrics.NewHealthCheck(opts.MaxInactivityTime, opts.MaxFailingTime),
		Options:    opts,
		stop:       stop,
	}
	if err := autoscaler.Start(); err != nil {
		return nil, err
	}
	return u, nil
}

// Stop ends the autoscaler's informers.
func (u *Upstream) Stop() {
	if u != nil {
		close(u.stop)
	}
}

// RunOnce runs one iteration as main's loop does (loop.RunAutoscalerOnce: metrics, health).
func (u *Upstream) RunOnce() {
	loop.RunAutoscalerOnce(u.Autoscaler, u.Health, time.Now())
}
