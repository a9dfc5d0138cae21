package main

// Scale-down of nodes that are not empty: upstream's own drain (core/scaledown/actuation
// drain.go: an eviction per pod through the eviction API, then the wait for the pods to be
// gone) against the API server's eviction subresource, which enforces PodDisruptionBudgets
// (pkg/registry/core/pod/storage/eviction.go), the budgets' status kept by the disruption
// controller and the evicted pods replaced by the Deployment's ReplicaSet, both upstream's
// own (controllers.go).

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/autoscaler/cluster-autoscaler/utils/taints"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// PodHistory records, from a watch of the pods, the DisruptionTarget condition each pod
// showed before it went (the API server's eviction adds EvictionByEvictionAPI, the taint
// eviction controller DeletionByTaintManager, pod garbage collection DeletionByPodGC).
type PodHistory struct {
	mu         sync.Mutex
	disruption map[string]string // pod name -> the condition's reason
	stop       chan struct{}
}

// WatchPods starts a watch of the pods of podNamespace.
func WatchPods(client kubernetes.Interface) *PodHistory {
	h := &PodHistory{disruption: map[string]string{}, stop: make(chan struct{})}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(podNamespace))
	record := func(obj interface{}) {
		p, ok := obj.(*apiv1.Pod)
		if !ok {
			return
		}
		if c := podCondition(p, apiv1.DisruptionTarget); c != nil && c.Status == apiv1.ConditionTrue {
			h.mu.Lock()
			h.disruption[p.Name] = c.Reason
			h.mu.Unlock()
		}
	}
	f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj interface{}) { record(obj) },
	})
	f.Start(h.stop)
	f.WaitForCacheSync(h.stop)
	return h
}

// Disrupted maps each pod that showed a DisruptionTarget condition to its reason.
func (h *PodHistory) Disrupted() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]string{}
	for k, v := range h.disruption {
		out[k] = v
	}
	return out
}

// Stop ends the watch.
func (h *PodHistory) Stop() {
	if h != nil {
		close(h.stop)
	}
}

// appPods lists the pods labelled app=app that are not being deleted, by node.
func (e *Env) appPods(app string) (byNode map[string][]apiv1.Pod, ready int) {
	pods, err := e.Bridge.Kube.CoreV1().Pods(podNamespace).List(ctxb(), metav1.ListOptions{LabelSelector: labels.Set{"app": app}.String()})
	byNode = map[string][]apiv1.Pod{}
	if err != nil {
		return byNode, -1
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || terminal(&p) {
			continue
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		if c := podCondition(&p, apiv1.PodReady); c != nil && c.Status == apiv1.ConditionTrue {
			ready++
		}
	}
	return byNode, ready
}

// pdbStatus is the budget name as the disruption controller last wrote it, and whether it
// has seen the budget's current spec.
func (e *Env) pdbStatus(name string) (policyv1.PodDisruptionBudgetStatus, bool) {
	pdb, err := e.Bridge.Kube.PolicyV1().PodDisruptionBudgets(podNamespace).Get(ctxb(), name, metav1.GetOptions{})
	if err != nil {
		return policyv1.PodDisruptionBudgetStatus{}, false
	}
	return pdb.Status, pdb.Status.ObservedGeneration == pdb.Generation
}

// spreadWorkload creates Deployment "web" of two pods of 600m (a 2-CPU worker is 30% used by
// one, below upstream's --scale-down-utilization-threshold of 0.5, and holds both) and its
// budget with minAvailable, and waits until each worker runs one pod, Ready, and the
// disruption controller has counted them; all between two of upstream's iterations (a budget
// upstream sees before the disruption controller has counted its pods allows no disruption,
// and the nodes it protects are then left alone for --unremovable-node-recheck-timeout). It
// returns the workers' names.
func (e *Env) spreadWorkload(minAvailable int) ([]string, error) {
	if err := e.Bridge.AddPDB("web", "web", minAvailable); err != nil {
		return nil, err
	}
	if err := e.Bridge.AddPods("web", 2, "600m", "256Mi"); err != nil {
		return nil, err
	}
	var spread []string
	if err := e.Between("the Deployment's two pods Ready, one per worker, and counted by the disruption controller", 60*time.Second, func() bool {
		byNode, ready := e.appPods("web")
		st, observed := e.pdbStatus("web")
		spread = spread[:0]
		for node, pods := range byNode {
			if node != "" && len(pods) == 1 {
				spread = append(spread, node)
			}
		}
		return ready == 2 && len(spread) == 2 && observed && st.CurrentHealthy == 2 && st.ExpectedPods == 2
	}); err != nil {
		// kube-scheduler's default scoring (NodeResourcesFit LeastAllocated,
		// NodeResourcesBalancedAllocation, the default PodTopologySpread) spreads two pods
		// over two empty workers; were they on one, the other would go as an empty node.
		return nil, err
	}
	return spread, nil
}

// drainWithPDB: two workers each run one pod of a Deployment whose PodDisruptionBudget
// allows one disruption; both workers are underused and one is enough. Upstream removes one:
// it taints it ToBeDeleted, evicts its pod through the eviction API (the budget allows it,
// the API server records the disruption), waits until the pod is gone (its kubelet, the
// bridge, ends it), then calls DeleteNodes. The Deployment's ReplicaSet replaces the pod, the
// scheduler puts it on the other worker; the budget holds throughout; CloudStack removes the
// VM and its node goes.
func drainWithPDB(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	workers, err := e.spreadWorkload(1)
	if err != nil {
		return err
	}
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")
	if _, err := e.Sim.Admin("simResetRequests"); err != nil {
		return err
	}
	tainted := map[string]string{} // node -> VM, each node upstream tainted ToBeDeleted
	leastReady := 2
	if err := e.Until("one worker drained and removed, the Deployment's pods Ready on the other", 120*time.Second, func() bool {
		for _, n := range e.Bridge.WorkerNodes() {
			if hasTaint(&n, taints.ToBeDeletedTaint, apiv1.TaintEffectNoSchedule) {
				tainted[n.Name] = strings.TrimPrefix(n.Spec.ProviderID, "external-cloudstack://")
			}
		}
		byNode, ready := e.appPods("web")
		leastReady = min(leastReady, ready)
		_, total := e.simWorkers()
		return len(tainted) > 0 && total == 1 && len(e.Bridge.WorkerNodes()) == 1 && ready == 2 && len(byNode) == 1
	}); err != nil {
		return err
	}
	if err := e.Until("the cluster Running and upstream settled at 1", 60*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		return c.State == "Running" && e.settled(1)
	}); err != nil {
		return err
	}
	e.Steps(3)
	var node, vm string
	for n, v := range tainted {
		node, vm = n, v
	}
	e.Check(len(tainted) == 1, "upstream tainted %d nodes ToBeDeleted, want 1: %v", len(tainted), tainted)
	e.Check(!e.nodeExists(node) && (node == workers[0] || node == workers[1]), "the node tainted %q is not the worker removed (workers %v)", node, workers)
	// Upstream drained it: one scale-down of a node with a pod, one eviction that succeeded.
	e.Check(e.Log.Count(phRemovingNode, node) == 1, "autoscaler log: %d× %q for %s, want 1", e.Log.Count(phRemovingNode, node), phRemovingNode.Text, node)
	e.Check(e.Log.Count(phRemovingEmpty) == 0, "autoscaler log: %d× %q, want 0 (the node had a pod)", e.Log.Count(phRemovingEmpty), phRemovingEmpty.Text)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total", "reason", "underutilized") == 1, "scaled_down_nodes_total %v, want 1 underutilized", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_evicted_pods_total", "eviction_result", "succeeded") == 1 && m.Value("cluster_autoscaler_evicted_pods_total", "eviction_result", "failed") == 0,
		"evicted_pods_total %v, want 1 succeeded", m.Series("cluster_autoscaler_evicted_pods_total"))
	// The API server received that one eviction and granted it (201), refused none (429).
	granted := e.Kube.Metric("apiserver_request_total", `subresource="eviction"`, `code="201"`)
	all := e.Kube.Metric("apiserver_request_total", `subresource="eviction"`)
	e.Check(granted == 1 && all == 1, "the API server received %g evictions, granted %g, want 1 and 1", all, granted)
	evicted := []string{}
	for pod, reason := range e.Pods.Disrupted() {
		e.Check(reason == "EvictionByEvictionAPI", "pod %s was disrupted by %s", pod, reason)
		evicted = append(evicted, pod)
	}
	e.Check(len(evicted) == 1, "pods disrupted: %v, want the one the eviction API evicted", e.Pods.Disrupted())
	// The budget (minAvailable 1) held throughout: never fewer than one Ready pod.
	e.Check(leastReady >= 1, "the Deployment had %d Ready pods during the drain, its budget wants 1", leastReady)
	// The provider was asked once, CloudStack removed that VM.
	deletes := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`, `code="Ok"`)
	e.Check(deletes == 1, "the provider answered %g DeleteNodes OK, want 1", deletes)
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	e.Check(len(reqs) == 1 && reqs[0]["nodeids"] == vm, "cks-sim received scaleKubernetesCluster %v, want one removing %s", reqs, vm)
	e.note = fmt.Sprintf(" [%s drained: pod %v evicted, %d loops]", node, evicted, e.loops)
	e.CheckClean(1, errorsBefore)
	return nil
}

// pdbBlocksDrain: as drainWithPDB, but the budget allows no disruption (minAvailable 2 of 2).
// Both workers are underused and one would be enough, yet each runs a pod upstream may not
// move: its planner finds the budget exhausted (drainability rule pdb, "not enough pod
// disruption budget to move") and keeps both nodes, checked again after
// --unremovable-node-recheck-timeout. Nothing is tainted, evicted or deleted. The API server
// refuses the eviction itself (what upstream's drain or kubectl drain would hear).
func pdbBlocksDrain(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	workers, err := e.spreadWorkload(2)
	if err != nil {
		return err
	}
	st, _ := e.pdbStatus("web")
	e.Check(st.DisruptionsAllowed == 0, "the budget allows %d disruptions, want 0", st.DisruptionsAllowed)
	tainted := map[string]bool{}
	// Each worker found unremovable for the budget twice: at its first check and again after
	// the recheck timeout (30 s here), longer than --scale-down-unneeded-time (10 s), after
	// which an unneeded node is removed.
	blocked := func(node string) int { return e.Log.Count(phNotEnoughPdb, phCannotBeRemoved.Text, "Node "+node+" ") }
	if err := e.Until("both workers found unremovable for the budget, twice each", 120*time.Second, func() bool {
		for _, n := range e.Bridge.WorkerNodes() {
			if hasTaint(&n, taints.ToBeDeletedTaint, apiv1.TaintEffectNoSchedule) {
				tainted[n.Name] = true
			}
		}
		return blocked(workers[0]) >= 2 && blocked(workers[1]) >= 2
	}); err != nil {
		return err
	}
	e.Check(len(tainted) == 0, "upstream tainted %v ToBeDeleted", tainted)
	// The API server refuses an eviction of either pod: 429, the budget named.
	byNode, _ := e.appPods("web")
	for _, node := range workers {
		for _, p := range byNode[node] {
			err := e.Bridge.Kube.CoreV1().Pods(podNamespace).EvictV1(context.Background(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: podNamespace}})
			e.Check(apierrors.IsTooManyRequests(err) && strings.Contains(fmt.Sprint(err), "disruption budget"),
				"eviction of %s: %v, want 429 for the disruption budget", p.Name, err)
		}
	}
	e.Steps(3)
	// Upstream attempted no eviction (only ours reached the API server, refused), no scale-down.
	evictions := e.Kube.Metric("apiserver_request_total", `subresource="eviction"`)
	refused := e.Kube.Metric("apiserver_request_total", `subresource="eviction"`, `code="429"`)
	e.Check(evictions == 2 && refused == 2, "the API server received %g evictions, refused %g, want only the harness's 2, refused", evictions, refused)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_evicted_pods_total") == 0, "evicted_pods_total %v", m.Series("cluster_autoscaler_evicted_pods_total"))
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 0, "scaled_down_nodes_total %v", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.Never(phRemovingNode, phRemovingEmpty)
	deletes := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`)
	e.Check(deletes == 0, "the provider received %g DeleteNodes", deletes)
	_, total := e.simWorkers()
	e.Check(total == 2 && len(e.Bridge.WorkerNodes()) == 2, "cks-sim has %d workers, Kubernetes %d nodes, want 2 and 2", total, len(e.Bridge.WorkerNodes()))
	byNode, ready := e.appPods("web")
	e.Check(ready == 2 && len(byNode[workers[0]]) == 1 && len(byNode[workers[1]]) == 1, "the Deployment's pods moved or went: %d Ready, by node %v", ready, byNode)
	e.Check(len(e.Pods.Disrupted()) == 0, "pods disrupted: %v", e.Pods.Disrupted())
	e.note = fmt.Sprintf(" [%d× and %d× unremovable for the budget, %d loops]", blocked(workers[0]), blocked(workers[1]), e.loops)
	e.CheckClean(2, 0)
	return nil
}
