package main

// Benchmarks (not in -list; run with -scenario bench-10 or bench-1000): upstream's own loop
// duration (cluster_autoscaler_function_duration_seconds{function="main"}) with our provider,
// and the share of it spent in calls to the cloud provider (the externalgrpc client: its RPCs
// to our provider, its caches included), timed by wrapping the CloudProvider and its
// NodeGroups. Only the benchmarks wrap; the scenarios run the cloud provider as built.

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/framework"
)

type callTimer struct {
	mu    sync.Mutex
	total time.Duration
	calls int
}

var providerCalls callTimer

func (t *callTimer) since(start time.Time) {
	d := time.Since(start)
	t.mu.Lock()
	t.total += d
	t.calls++
	t.mu.Unlock()
}

func (t *callTimer) read() (time.Duration, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total, t.calls
}

type timedCloud struct{ cloudprovider.CloudProvider }

type timedGroup struct{ cloudprovider.NodeGroup }

func wrapGroup(g cloudprovider.NodeGroup) cloudprovider.NodeGroup {
	if g == nil || reflect.ValueOf(g).IsNil() {
		return g
	}
	return &timedGroup{g} // a pointer: the core calls reflect.Value.IsNil on node groups
}

func wrapCloudProvider(cp cloudprovider.CloudProvider) cloudprovider.CloudProvider {
	return &timedCloud{cp}
}

func (c timedCloud) NodeGroups() []cloudprovider.NodeGroup {
	defer providerCalls.since(time.Now())
	gs := c.CloudProvider.NodeGroups()
	out := make([]cloudprovider.NodeGroup, len(gs))
	for i, g := range gs {
		out[i] = wrapGroup(g)
	}
	return out
}

func (c timedCloud) NodeGroupForNode(n *apiv1.Node) (cloudprovider.NodeGroup, error) {
	defer providerCalls.since(time.Now())
	g, err := c.CloudProvider.NodeGroupForNode(n)
	return wrapGroup(g), err
}

func (c timedCloud) Refresh() error {
	defer providerCalls.since(time.Now())
	return c.CloudProvider.Refresh()
}

func (c timedCloud) GPULabel() string {
	defer providerCalls.since(time.Now())
	return c.CloudProvider.GPULabel()
}

func (c timedCloud) GetAvailableGPUTypes() map[string]struct{} {
	defer providerCalls.since(time.Now())
	return c.CloudProvider.GetAvailableGPUTypes()
}

func (g timedGroup) TargetSize() (int, error) {
	defer providerCalls.since(time.Now())
	return g.NodeGroup.TargetSize()
}

func (g timedGroup) IncreaseSize(d int) error {
	defer providerCalls.since(time.Now())
	return g.NodeGroup.IncreaseSize(d)
}

func (g timedGroup) DeleteNodes(ns []*apiv1.Node) error {
	defer providerCalls.since(time.Now())
	return g.NodeGroup.DeleteNodes(ns)
}

func (g timedGroup) DecreaseTargetSize(d int) error {
	defer providerCalls.since(time.Now())
	return g.NodeGroup.DecreaseTargetSize(d)
}

func (g timedGroup) Nodes() ([]cloudprovider.Instance, error) {
	defer providerCalls.since(time.Now())
	return g.NodeGroup.Nodes()
}

func (g timedGroup) TemplateNodeInfo() (*framework.NodeInfo, error) {
	defer providerCalls.since(time.Now())
	return g.NodeGroup.TemplateNodeInfo()
}

func (g timedGroup) GetOptions(d config.NodeGroupAutoscalingOptions) (*config.NodeGroupAutoscalingOptions, error) {
	defer providerCalls.since(time.Now())
	return g.NodeGroup.GetOptions(d)
}

func benchScenario(workers int) Scenario {
	states := strings.TrimSuffix(strings.Repeat("Running, ", workers), ", ")
	return Scenario{
		Cluster: fmt.Sprintf("clusters:\n  - name: demo\n    control: 1\n    workers: [%s]\n    min_size: 1\n    max_size: %d\n    autoscaling: true\n", states, workers+10),
		Nodes:   fmt.Sprintf("1:%d:demo@%s", workers+10, ClientName),
		// The nodes are empty: scale-down is computed every loop but never acted on.
		AutoscalerArg: []string{"--scale-down-unneeded-time=1h"},
		Wrap:          true,
		Run:           func(e *Env) error { return bench(e, workers) },
	}
}

func bench(e *Env, workers int) error {
	if err := e.Until("every node registered", 120*time.Second, func() bool { return e.settled(workers) }); err != nil {
		return err
	}
	e.Steps(3) // caches warm
	const loops = 20
	m0 := Gather()
	sum0, n0 := m0.Histogram("cluster_autoscaler_function_duration_seconds", "function", "main")
	rpc0, calls0 := providerCalls.read()
	if err := e.Steps(loops); err != nil {
		return err
	}
	m1 := Gather()
	sum1, n1 := m1.Histogram("cluster_autoscaler_function_duration_seconds", "function", "main")
	rpc1, calls1 := providerCalls.read()
	n := float64(n1 - n0)
	if n == 0 {
		return fmt.Errorf("no main loop measured")
	}
	mainMs := (sum1 - sum0) / n * 1000
	rpcMs := float64((rpc1 - rpc0).Microseconds()) / 1000 / n
	e.note = fmt.Sprintf(" [%d nodes: main loop %.1f ms mean over %d loops, cloud provider calls %.1f ms (%.1f%%), %d calls per loop]",
		workers, mainMs, int(n), rpcMs, 100*rpcMs/mainMs, (calls1-calls0)/int(n))
	// Empty nodes carry upstream's soft DeletionCandidate taint here (unneeded, never removed):
	// only the log is checked.
	e.Never(phPanic, phFixFailed)
	return nil
}
