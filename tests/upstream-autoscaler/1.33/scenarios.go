package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/autoscaler/cluster-autoscaler/clusterstate/api"
	"k8s.io/autoscaler/cluster-autoscaler/utils/taints"
)

func ctxb() context.Context { return context.Background() }

var listAll = metav1.ListOptions{}

var scenarios = map[string]Scenario{
	"scale-up-down": {Cluster: oneCluster(1, 1, 5), Run: scaleUpDown},
	// CloudStack's order: the job is validated after the provider's --scale-watch (1.5 s), so
	// IncreaseSize is accepted and the capacity failure arrives through the job.
	"capacity-failure": {Cluster: oneCluster(1, 1, 5), Run: capacityFailure,
		SimFlags: []string{"--pickup-delay-ms", "2500"}},
	"stopped-worker": {Cluster: oneCluster(2, 1, 5), Run: stoppedWorker,
		// Keep the empty worker: only the unready rule may remove it here.
		AutoscalerArg: []string{"--scale-down-unneeded-time=10m"}},
	"provider-restart": {Cluster: oneCluster(1, 1, 5), Run: providerRestart,
		SimFlags: []string{"--job-duration-ms", "8000"}},
	"removal-fails-once": {Cluster: oneCluster(2, 1, 5), Run: removalFailsOnce},
	// The provider is killed while a removal it answered OK for is owed, and started again
	// with its store (--state-file): faults.go.
	"restart-during-owed-removal": {Cluster: oneCluster(2, 1, 5), Run: restartDuringOwedRemoval, StateFile: true},
	// CloudStack fails a scale-up part way and strands the cluster (Alert rule 5): faults.go. A
	// short --max-node-provision-time: upstream gives up on the VM in Error within the scenario.
	"partial-scale-up": {Cluster: oneCluster(1, 1, 5), Run: partialScaleUp,
		AutoscalerArg: []string{"--max-node-provision-time=45s"}},
	// A worker running a pod goes down: its pod is evicted once it stops tolerating the
	// unreachable taint, comes back through its ReplicaSet, and upstream adds a worker for
	// it, then removes the down one.
	"stopped-worker-with-pods": {Cluster: oneCluster(2, 1, 5), Run: stoppedWorkerWithPods},
	// The group's only worker is stopped before upstream's first loop: its node is registered
	// and NotReady (what a real cluster shows once its workers are down), upstream never saw a
	// Ready node of the group to copy. --scale-down-unneeded-time=10m: only the unready rule
	// removes the stopped worker.
	"scale-from-zero": {Cluster: oneCluster(1, 1, 5), Run: scaleFromZero,
		AutoscalerArg: []string{"--scale-down-unneeded-time=10m"}},
	// A worker with a pod of a Deployment, its PodDisruptionBudget allowing one disruption, is
	// drained by upstream through the eviction API and removed (drain.go).
	"drain-with-pdb": {Cluster: oneCluster(2, 1, 5), Run: drainWithPDB},
	// The same, the budget allowing none: upstream keeps both workers (drain.go).
	"pdb-blocks-drain": {Cluster: oneCluster(2, 1, 5), Run: pdbBlocksDrain},
	// A worker VM that is down and whose node never registered (a kubelet that never joined,
	// or a Node object deleted by hand). Upstream's expectedToRegister (clusterstate.go) skips
	// an instance with ErrorInfo, so the provider reports a down VM Running without one: the
	// instance is unregistered, upstream scales up for the pending pod once it is long
	// unregistered, then deletes it.
	"stopped-never-registered": {Cluster: "clusters:\n  - name: demo\n    control: 1\n    workers: [Stopped]\n    min_size: 1\n    max_size: 5\n    autoscaling: true\n",
		Run: stoppedNeverRegistered, AutoscalerArg: []string{"--scale-down-unneeded-time=10m", "--max-node-provision-time=45s"}},
	// CloudStack answers 7 s late during a removal: slower than upstream's 10 s gRPC deadline
	// for the provider's DeleteNodes (faults.go). A removal window whose CloudStack answer is
	// lost past the callers' deadline answers them OK and owes the removals.
	"slow-removal-answers": {Cluster: oneCluster(2, 1, 5), Run: slowRemovalAnswers},
	// Two provider replicas with --leader-elect behind a proxy standing for the Service
	// selecting the leader's label; the leader is killed while a scale-up's job runs, the
	// other while a removal it promised is owed (leader.go).
	"leader-failover": {Cluster: oneCluster(1, 1, 5), Run: leaderFailover, Providers: startLeaderReplicas,
		SimFlags: []string{"--job-duration-ms", "8000"}},
	// CloudStack unreachable for three times the staleness bound while a scale-up's job runs
	// and a removal is owed, two replicas behind the Service (outage.go). Only the unready
	// rule removes a worker: the NotReady one.
	"cloudstack-outage": {Cluster: oneCluster(2, 1, 5), Run: cloudStackOutage, Providers: cutCloudStackReplicas,
		ProvFlags: []string{"--staleness-bound", outageStaleness.String()}, AutoscalerArg: []string{"--scale-down-unneeded-time=10m"}},
	// The Kubernetes API server down for a minute while a scale-up's job runs, two replicas
	// (outage.go). --max-node-provision-time as upstream's default's tenth would be shorter
	// than the outage and client-go's recovery from it together (its informers list again
	// after a back-off of up to a minute, not shortened here): 5m.
	"apiserver-outage": {Cluster: oneCluster(1, 1, 5), Run: apiServerOutage, Providers: startLeaderReplicas,
		SimFlags: []string{"--job-duration-ms", "8000"}, AutoscalerArg: []string{"--max-node-provision-time=5m"}},
}

// Not in -list (run by name, not by CI): scenarios that show a fault of the provider not
// fixed yet. Each moves to scenarios once it passes. None today.
var pending = map[string]Scenario{}

// Not in -list (run by name): benchmarks.
var benchmarks = map[string]Scenario{
	"bench-10":   benchScenario(10),
	"bench-1000": benchScenario(1000),
}

// oneCluster is the cks-sim scenario: cluster "demo", one control node, running workers,
// CKS autoscaling on with min and max (the provider takes CKS's minsize/maxsize).
func oneCluster(workers, min, max int) string {
	states := make([]string, workers)
	for i := range states {
		states[i] = "Running"
	}
	return fmt.Sprintf("clusters:\n  - name: demo\n    control: 1\n    workers: [%s]\n    min_size: %d\n    max_size: %d\n    autoscaling: true\n",
		strings.Join(states, ", "), min, max)
}

// group is the one node group of the status ConfigMap.
func (e *Env) group() (api.NodeGroupStatus, bool) {
	st, err := e.Up.Status()
	if err != nil || len(st.NodeGroups) != 1 {
		return api.NodeGroupStatus{}, false
	}
	return st.NodeGroups[0], true
}

// settled: upstream sees as many registered nodes as the target (no upcoming node), all
// Ready, nothing unregistered or being deleted.
func (e *Env) settled(target int) bool {
	g, ok := e.group()
	if !ok {
		return false
	}
	h := g.Health
	return h.CloudProviderTarget == target && h.NodeCounts.Registered.Total == target &&
		h.NodeCounts.Registered.Ready == target && h.NodeCounts.Unregistered == 0 &&
		h.NodeCounts.Registered.BeingDeleted == 0
}

func (e *Env) simWorkers() (running, total int) {
	c, err := e.Sim.Cluster()
	if err != nil {
		return -1, -1
	}
	for _, s := range c.Workers {
		total++
		if s == "Running" {
			running++
		}
	}
	return
}

// neverClean are the lines no scenario may show: a panic; fixNodeGroupSize acting or failing
// (the provider's target always equals its instances that are not Deleting); a failed
// template; a deletion the provider refused (scale-down, failed creations, unregistered
// nodes); a taint the autoscaler could not take off.
var neverClean = []Phrase{phPanic, phFixFailed, phDecreasing, phSizeFixed, phNodeInfosFailed,
	phDeleteEmptyFailed, phDeleteNodeFailed, phCreateErrorsFailed, phRemoveFailed, phReleaseFailed}

// CheckClean checks what every scenario ends with: none of the lines of neverClean, no
// ToBeDeleted taint the autoscaler took back (it does so only when a deletion failed) nor one
// it left, no phantom upcoming node, its health Healthy, and the errors it counted within
// allowed.
func (e *Env) CheckClean(target int, allowedErrors float64) {
	e.Never(neverClean...)
	if l := e.Log.Lines(phReleasingTaint, taints.ToBeDeletedTaint); len(l) > 0 {
		e.Fail("autoscaler log: %d× a ToBeDeleted taint released (a deletion failed), first: %s", len(l), l[0])
	}
	for _, n := range e.Bridge.WorkerNodes() {
		for _, t := range n.Spec.Taints {
			if t.Key == "ToBeDeletedByClusterAutoscaler" || t.Key == "DeletionCandidateOfClusterAutoscaler" {
				e.Fail("node %s still has taint %s", n.Name, t.Key)
			}
		}
	}
	g, ok := e.group()
	if !ok {
		e.Fail("no node group in the status ConfigMap")
		return
	}
	if allowedErrors == 0 {
		// A failed RPC is an error upstream counts.
		e.Never(phGrpcError)
	}
	h := g.Health
	upcoming := h.CloudProviderTarget - h.NodeCounts.Registered.Total
	e.Check(upcoming == 0, "upstream counts %d upcoming node(s) (target %d, registered %d)", upcoming, h.CloudProviderTarget, h.NodeCounts.Registered.Total)
	e.Check(h.CloudProviderTarget == target, "upstream's target %d, want %d", h.CloudProviderTarget, target)
	e.Check(h.Status == api.ClusterAutoscalerHealthy, "node group health %s", h.Status)
	m := Gather()
	if v := m.Value("cluster_autoscaler_errors_total"); v > allowedErrors {
		e.Fail("cluster_autoscaler_errors_total %g (allowed %g): %v", v, allowedErrors, m.Series("cluster_autoscaler_errors_total"))
	}
	e.Check(m.Value("cluster_autoscaler_unschedulable_pods_count", "type", "unschedulable") == 0, "unschedulable_pods_count %g", m.Value("cluster_autoscaler_unschedulable_pods_count", "type", "unschedulable"))
}

// scaleUpDown: pending pods → scale-up → nodes appear in cks-sim → pods placed; then the pods
// go → empty nodes → scale-down through the actuator's per-node DeleteNodes.
func scaleUpDown(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	// Three pods of 1.5 CPU on 2-CPU workers: one fits the worker there is, two need two more.
	if err := e.Bridge.AddPods("web", 3, "1500m", "512Mi"); err != nil {
		return err
	}
	if err := e.Until("every pod placed", 90*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 3 && p == 0 }); err != nil {
		return err
	}
	running, _ := e.simWorkers()
	e.Check(running == 3, "cks-sim runs %d workers after the scale-up, want 3", running)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_up_nodes_total") == 2, "scaled_up_nodes_total %g, want 2", m.Value("cluster_autoscaler_scaled_up_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_failed_scale_ups_total") == 0, "failed_scale_ups_total %v", m.Series("cluster_autoscaler_failed_scale_ups_total"))
	if err := e.Until("upstream settled at 3", 30*time.Second, func() bool { return e.settled(3) }); err != nil {
		return err
	}
	e.CheckClean(3, 0)

	// The pods go: two workers are empty and unneeded.
	if err := e.Bridge.Scale("web", 0); err != nil {
		return err
	}
	if err := e.Until("the scale-down to one worker", 120*time.Second, func() bool {
		_, total := e.simWorkers()
		return total == 1 && len(e.Bridge.WorkerNodes()) == 1
	}); err != nil {
		return err
	}
	if err := e.Until("upstream settled at 1", 30*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	e.Steps(3)
	m = Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 2, "scaled_down_nodes_total %v, want 2", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	deletes := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`)
	e.Check(deletes == 2, "the provider received %g DeleteNodes, want 2 (one per node)", deletes)
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	removals := 0
	for _, r := range reqs {
		if r["nodeids"] != "" {
			removals++
		}
	}
	e.Check(removals >= 1, "cks-sim received no scaleKubernetesCluster with nodeids")
	e.Check(e.Log.Count(phRemovingEmpty) == 2, "autoscaler log: %d× %q, want 2", e.Log.Count(phRemovingEmpty), phRemovingEmpty.Text)
	e.note = fmt.Sprintf(" [%d loops, %d removal job(s) for 2 DeleteNodes]", e.loops, removals)
	e.CheckClean(1, 0)
	return nil
}

// capacityFailure: CloudStack refuses a scale-up for capacity → the provider reports the
// request's instances as failed creations (OutOfResources) → upstream counts a failed
// scale-up, backs the group off and deletes them; once capacity is back, it scales up.
func capacityFailure(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	if _, err := e.Sim.Admin("simConfigure", "jobfailure", "capacity"); err != nil {
		return err
	}
	if err := e.Bridge.AddPods("web", 2, "1500m", "512Mi"); err != nil {
		return err
	}
	sawBackoff := ""
	if err := e.Until("a failed scale-up and backoff", 60*time.Second, func() bool {
		if g, ok := e.group(); ok && g.ScaleUp.Status == "Backoff" && sawBackoff == "" {
			sawBackoff = g.ScaleUp.BackoffInfo.ErrorCode + ": " + g.ScaleUp.BackoffInfo.ErrorMessage
		}
		return Gather().Value("cluster_autoscaler_failed_scale_ups_total") > 0 && sawBackoff != ""
	}); err != nil {
		return err
	}
	m := Gather()
	e.Check(sawBackoff != "", "upstream's status never showed the group in Backoff")
	// The provider's error code for a capacity failure (class OutOfResources).
	e.Check(strings.HasPrefix(sawBackoff, "out-of-resources:"), "backoff error %q, want the provider's out-of-resources", sawBackoff)
	e.Check(m.Value("cluster_autoscaler_failed_scale_ups_total", "reason", "out-of-resources") >= 1, "failed_scale_ups_total %v, want reason out-of-resources", m.Series("cluster_autoscaler_failed_scale_ups_total"))
	// The failed instances are deleted (fake create-error nodes), the target back at 1.
	if err := e.Until("the failed instances gone (target 1, nothing upcoming)", 60*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	_, total := e.simWorkers()
	e.Check(total == 1, "cks-sim has %d workers after a capacity failure, want 1", total)
	// Upstream backed the group off and deleted the failed creations itself
	// (deleteCreatedNodesWithErrors), the provider accepting it (CheckClean).
	e.Check(e.Log.Count(phDisabling) >= 1, "autoscaler log: no %q", phDisabling.Text)
	e.Check(e.Log.Count(phCreateErrors) >= 1, "autoscaler log: no %q (the failed creations deleted)", phCreateErrors.Text)
	b, p := e.Bridge.PodCounts()
	e.Check(b == 1 && p == 1, "pods bound %d pending %d during the backoff, want 1 and 1", b, p)
	failed := m.Series("cluster_autoscaler_failed_scale_ups_total")
	// Capacity is back: after the backoff the autoscaler scales up again.
	if _, err := e.Sim.Admin("simConfigure", "jobfailure", "none"); err != nil {
		return err
	}
	if err := e.Until("the scale-up after the backoff, every pod placed", 120*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 2 && p == 0 }); err != nil {
		return err
	}
	if err := e.Until("upstream settled at 2", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	e.note = fmt.Sprintf(" [backoff %q, failed_scale_ups_total %v]", sawBackoff, failed)
	e.CheckClean(2, 0)
	return nil
}

// nodeWithoutPods is a worker Node no pod is bound to.
func (e *Env) nodeWithoutPods() (name, vmID string) {
	used := map[string]bool{}
	pods, _ := e.Bridge.Kube.CoreV1().Pods(podNamespace).List(ctxb(), listAll)
	for _, p := range pods.Items {
		used[p.Spec.NodeName] = true
	}
	for _, n := range e.Bridge.WorkerNodes() {
		if !used[n.Name] {
			return n.Name, strings.TrimPrefix(n.Spec.ProviderID, "external-cloudstack://")
		}
	}
	return "", ""
}

func (e *Env) nodeExists(name string) bool {
	for _, n := range e.Bridge.WorkerNodes() {
		if n.Name == name {
			return true
		}
	}
	return false
}

// stoppedWorker: a worker's VM stops → cluster in Alert, its node NotReady → a scale-up is
// still permitted (a worker is down) → and the unready node is removed after
// --scale-down-unready-time, through DeleteNodes of a down worker.
func stoppedWorker(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	if err := e.Bridge.AddPods("web", 1, "1500m", "512Mi"); err != nil {
		return err
	}
	// The scheduler binds it on its own time: the empty worker is known once it has.
	if err := e.Until("the pod placed", 30*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 1 && p == 0 }); err != nil {
		return err
	}
	name, vm := e.nodeWithoutPods()
	if name == "" {
		return fmt.Errorf("no empty worker to stop")
	}
	if _, err := e.Sim.Admin("simSetVmState", "id", vm, "state", "Stopped"); err != nil {
		return err
	}
	if err := e.Until("the cluster in Alert and the node NotReady in upstream", 30*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		g, ok := e.group()
		return c.State == "Alert" && ok && g.Health.NodeCounts.Registered.Unready.Total == 1
	}); err != nil {
		return err
	}
	e.CheckUnreachable(name)
	// A pod that fits nowhere: the Ready worker is full, the other is down.
	if err := e.Bridge.AddPods("more", 1, "1500m", "512Mi"); err != nil {
		return err
	}
	if err := e.Until("the scale-up in Alert, every pod placed", 90*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 2 && p == 0 }); err != nil {
		return err
	}
	if err := e.Until("the stopped worker removed", 120*time.Second, func() bool {
		_, total := e.simWorkers()
		return !e.nodeExists(name) && total == 2
	}); err != nil {
		return err
	}
	if err := e.Until("the cluster Running and upstream settled at 2", 60*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		return c.State == "Running" && e.settled(2)
	}); err != nil {
		return err
	}
	e.Steps(3)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total", "reason", "unready") == 1, "scaled_down_nodes_total %v, want 1 unready", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_failed_scale_ups_total") == 0, "failed_scale_ups_total %v", m.Series("cluster_autoscaler_failed_scale_ups_total"))
	e.CheckClean(2, 0)
	return nil
}

// scaleFromZero: the group's only worker is stopped before upstream's first loop, so the group
// has no Ready node (its node is registered and NotReady, as in a real cluster whose workers
// went down) and upstream never had one to copy: it asks the provider for its template
// (NodeGroupTemplateNodeInfo, built from the worker offering) and scales up from it, in Alert
// (a worker is down). Then the unready worker is removed after --scale-down-unready-time.
func scaleFromZero(e *Env) error {
	workers := e.Bridge.WorkerNodes()
	if len(workers) != 1 {
		return fmt.Errorf("%d worker nodes before the first loop, want 1", len(workers))
	}
	name := workers[0].Name
	vm := strings.TrimPrefix(workers[0].Spec.ProviderID, "external-cloudstack://")
	if _, err := e.Sim.Admin("simSetVmState", "id", vm, "state", "Stopped"); err != nil {
		return err
	}
	if err := e.Until("the group in upstream's status with its one node NotReady", 30*time.Second, func() bool {
		g, ok := e.group()
		return ok && g.Health.CloudProviderTarget == 1 && g.Health.NodeCounts.Registered.Unready.Total == 1 &&
			g.Health.NodeCounts.Registered.Ready == 0
	}); err != nil {
		return err
	}
	e.CheckUnreachable(name)
	if err := e.Bridge.AddPods("web", 1, "1000m", "512Mi"); err != nil {
		return err
	}
	if err := e.Until("the scale-up from the template, the pod placed", 90*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 1 && p == 0 }); err != nil {
		return err
	}
	templates := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupTemplateNodeInfo"`)
	e.Check(templates > 0, "upstream never asked the provider for its template")
	if err := e.Until("the stopped worker removed, upstream settled at 1", 120*time.Second, func() bool {
		_, total := e.simWorkers()
		c, _ := e.Sim.Cluster()
		return total == 1 && !e.nodeExists(name) && c.State == "Running" && e.settled(1)
	}); err != nil {
		return err
	}
	e.Steps(3)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_up_nodes_total") == 1, "scaled_up_nodes_total %g, want 1", m.Value("cluster_autoscaler_scaled_up_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total", "reason", "unready") == 1, "scaled_down_nodes_total %v, want 1 unready", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_failed_scale_ups_total") == 0, "failed_scale_ups_total %v", m.Series("cluster_autoscaler_failed_scale_ups_total"))
	e.note = fmt.Sprintf(" [%g TemplateNodeInfo calls]", templates)
	e.CheckClean(1, 0)
	return nil
}

// stoppedNeverRegistered: the group's only worker VM is Stopped and its node never registered.
// What should happen: upstream counts the instance unregistered, deletes it once it is long
// unregistered (--max-node-provision-time), and scales up from the provider's template for the
// pending pod.
func stoppedNeverRegistered(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool {
		g, ok := e.group()
		return ok && g.Health.CloudProviderTarget == 1
	}); err != nil {
		return err
	}
	if err := e.Bridge.AddPods("web", 1, "1000m", "512Mi"); err != nil {
		return err
	}
	// Past --max-node-provision-time (45s here) for the unregistered instance.
	if err := e.Until("the pod placed, the stopped worker gone, upstream settled at 1", 240*time.Second, func() bool {
		b, p := e.Bridge.PodCounts()
		_, total := e.simWorkers()
		c, _ := e.Sim.Cluster()
		return b == 1 && p == 0 && total == 1 && c.State == "Running" && e.settled(1)
	}); err != nil {
		e.Never(phNoReadiness)
		return err
	}
	e.Steps(3)
	// The stopped worker went as upstream removes a long unregistered instance
	// (removeOldUnregisteredNodes), the provider accepting it (CheckClean).
	e.Check(e.Log.Count(phMarkUnregistered) >= 1, "autoscaler log: no %q", phMarkUnregistered.Text)
	e.Check(e.Log.Count(phRemoveUnregistered) >= 1, "autoscaler log: no %q", phRemoveUnregistered.Text)
	e.CheckClean(1, 0)
	return nil
}

// providerRestart: the provider is killed while the scale-up's CloudStack job runs and
// started again; it picks the job up, and upstream neither scales up twice nor keeps a
// phantom node.
func providerRestart(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	if err := e.Bridge.AddPods("web", 2, "1500m", "512Mi"); err != nil {
		return err
	}
	if err := e.Until("the scale-up job running in cks-sim", 30*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		return c.State == "Scaling"
	}); err != nil {
		return err
	}
	e.Prov.Stop(syscall.SIGKILL)
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")
	e.Steps(3) // upstream's calls fail while the provider is down
	errorsDown := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore
	e.Check(e.Log.Count(phRefreshFailed) > 0, "autoscaler log: no %q while the provider was down", phRefreshFailed.Text)
	if err := e.Prov.Restart(); err != nil {
		return err
	}
	if err := e.Until("every pod placed after the restart", 90*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 2 && p == 0 }); err != nil {
		return err
	}
	if err := e.Until("upstream settled at 2", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	// Errors until then: the loops aborted while the provider was down and while the
	// autoscaler's gRPC connection came back (its reconnect backoff). None after.
	errorsDown = Gather().Value("cluster_autoscaler_errors_total") - errorsBefore
	e.Steps(5)
	_, total := e.simWorkers()
	e.Check(total == 2, "cks-sim has %d workers, want 2 (no second scale-up)", total)
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	e.Check(len(reqs) == 1, "cks-sim received %d scaleKubernetesCluster, want 1", len(reqs))
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_up_nodes_total") == 1, "scaled_up_nodes_total %g, want 1", m.Value("cluster_autoscaler_scaled_up_nodes_total"))
	e.note = fmt.Sprintf(" [%g autoscaler errors while the provider was down: %v]", errorsDown, m.Series("cluster_autoscaler_errors_total"))
	e.CheckClean(2, errorsBefore+errorsDown)
	return nil
}

// removalFailsOnce: upstream removes an empty worker; CloudStack's removal job fails once on
// the node's drain (an injected kubectl/SSH failure, cks-sim's faildrains) and the cluster goes
// to Alert. The provider answered DeleteNodes with OK, so it carries the removal through: it
// stops the VM (stopVirtualMachine) and removes it as a down VM, which needs no drain. Upstream
// sees an ordinary scale-down: the node goes, no error, no size to fix.
func removalFailsOnce(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	// The next drain fails: that of the first removal (no drain has run yet).
	if _, err := e.Sim.Admin("simConfigure", "faildrains", "1"); err != nil {
		return err
	}
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")
	if _, err := e.Sim.Admin("simResetRequests"); err != nil {
		return err
	}
	workers := e.Bridge.WorkerNodes()
	if len(workers) != 2 {
		return fmt.Errorf("%d worker nodes at the start, want 2", len(workers))
	}
	// Both workers are empty: upstream removes one (min 1), after --scale-down-unneeded-time.
	sawAlert, sawCordon := false, ""
	if err := e.Until("one worker removed in cks-sim and in Kubernetes", 120*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		if c.State == "Alert" {
			sawAlert = true
		}
		// The failed drain cordons the node (kubectl drain's first step), and the node
		// lifecycle controller taints it unschedulable.
		for _, n := range e.Bridge.WorkerNodes() {
			if n.Spec.Unschedulable && hasTaint(&n, apiv1.TaintNodeUnschedulable, apiv1.TaintEffectNoSchedule) {
				sawCordon = n.Name
			}
		}
		_, total := e.simWorkers()
		return total == 1 && len(e.Bridge.WorkerNodes()) == 1
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
	// The injected failure did happen: the first removal job failed (530) and the provider
	// stopped the VM before removing it again.
	failedJobs := e.failedScaleJobs()
	e.Check(failedJobs == 1, "cks-sim shows %d failed scale jobs, want 1 (the removal whose drain failed)", failedJobs)
	stops, _ := e.Sim.Requests("stopVirtualMachine")
	e.Check(len(stops) == 1, "cks-sim received %d stopVirtualMachine, want 1 (the VM whose drain failed)", len(stops))
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	removals := 0
	for _, r := range reqs {
		if r["nodeids"] != "" {
			removals++
		}
	}
	e.Check(removals == 2, "cks-sim received %d scaleKubernetesCluster with nodeids, want 2 (the failed one, then the down VM's)", removals)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 1, "scaled_down_nodes_total %v, want 1", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	deletes := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`)
	e.Check(deletes == 1, "the provider received %g DeleteNodes, want 1 (upstream does not retry what it was told is done)", deletes)
	// Upstream started one scale-down and heard it succeed: no failed deletion, its
	// ToBeDeleted taint never released, no size to fix (CheckClean checks them too).
	e.Check(e.Log.Count(phRemovingEmpty) == 1, "autoscaler log: %d× %q, want 1 (the one scale-down)", e.Log.Count(phRemovingEmpty), phRemovingEmpty.Text)
	e.Never(phDeleteEmptyFailed, phDeleteNodeFailed, phDecreasing, phFixFailed)
	if l := e.Log.Lines(phReleasingTaint, taints.ToBeDeletedTaint); len(l) > 0 {
		e.Fail("autoscaler log: the ToBeDeleted taint released %d×: %s", len(l), l[0])
	}
	e.Check(sawCordon != "", "no node cordoned by the failed drain")
	e.note = fmt.Sprintf(" [Alert seen %v, cordoned %q, %d failed job, %d stopVirtualMachine, %d removal requests]", sawAlert, sawCordon, failedJobs, len(stops), removals)
	e.CheckClean(1, errorsBefore)
	return nil
}

func hasTaint(n *apiv1.Node, key string, effect apiv1.TaintEffect) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key && t.Effect == effect {
			return true
		}
	}
	return false
}

// CheckUnreachable checks that node shows what a real cluster shows for a node whose VM is
// down: Ready Unknown, tainted unreachable NoSchedule and NoExecute (nodes.go).
func (e *Env) CheckUnreachable(name string) {
	for _, n := range e.Bridge.WorkerNodes() {
		if n.Name != name {
			continue
		}
		r := readyCondition(&n)
		e.Check(r != nil && r.Status == apiv1.ConditionUnknown, "node %s of a stopped VM: Ready %v, want Unknown", name, r)
		e.Check(hasTaint(&n, apiv1.TaintNodeUnreachable, apiv1.TaintEffectNoSchedule) && hasTaint(&n, apiv1.TaintNodeUnreachable, apiv1.TaintEffectNoExecute),
			"node %s of a stopped VM has taints %v, want unreachable NoSchedule and NoExecute", name, n.Spec.Taints)
		return
	}
	e.Fail("no node %s", name)
}

// stoppedWorkerWithPods: two workers each run a pod of one Deployment; one worker's VM stops.
// What a real cluster does then: its node goes Unknown and is tainted unreachable; the pod
// stays bound to it until its toleration of the NoExecute taint (defaultTolerationSeconds)
// runs out, is evicted and stays Terminating (its kubelet is gone), and the ReplicaSet
// replaces it. The replacement fits nowhere: upstream scales up in Alert, then removes the
// down worker (unready, only a pod being deleted on it) through DeleteNodes of a down VM,
// which CloudStack removes without a drain; the pod garbage collector deletes the
// Terminating pod once its node is gone.
func stoppedWorkerWithPods(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	if err := e.Bridge.AddPods("web", 2, "1500m", "512Mi"); err != nil {
		return err
	}
	if err := e.Until("both pods placed", 30*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 2 && p == 0 }); err != nil {
		return err
	}
	pods, _ := e.Bridge.Kube.CoreV1().Pods(podNamespace).List(ctxb(), listAll)
	var victim, vm, node string
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			victim, node = p.Name, p.Spec.NodeName
		}
	}
	for _, n := range e.Bridge.WorkerNodes() {
		if n.Name == node {
			vm = strings.TrimPrefix(n.Spec.ProviderID, "external-cloudstack://")
		}
	}
	if _, err := e.Sim.Admin("simSetVmState", "id", vm, "state", "Stopped"); err != nil {
		return err
	}
	stopped := time.Now()
	if err := e.Until("the node NotReady in upstream", 30*time.Second, func() bool {
		g, ok := e.group()
		return ok && g.Health.NodeCounts.Registered.Unready.Total == 1
	}); err != nil {
		return err
	}
	e.CheckUnreachable(node)
	var evicted time.Duration
	if err := e.Until("the pod of the down worker evicted", 90*time.Second, func() bool {
		p, err := e.Bridge.Kube.CoreV1().Pods(podNamespace).Get(ctxb(), victim, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			evicted = time.Since(stopped)
			return true
		}
		return false
	}); err != nil {
		return err
	}
	// The node is Unknown after nodeMonitorGracePeriod, the pod tolerates the taint for
	// defaultTolerationSeconds from then.
	e.Check(evicted >= defaultTolerationSeconds*time.Second, "the pod was evicted %s after its VM stopped, before its toleration (%ds) ran out", evicted.Round(time.Second), defaultTolerationSeconds)
	// By the taint eviction controller (tainteviction/taint_eviction.go, which marks the pod
	// before it deletes it).
	e.Check(e.Pods.Disrupted()[victim] == "DeletionByTaintManager", "the pod of the down worker was disrupted by %q, want DeletionByTaintManager", e.Pods.Disrupted()[victim])
	if err := e.Until("the replacement placed on a new worker", 120*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 2 && p == 0 }); err != nil {
		return err
	}
	if err := e.Until("the down worker removed, no pod left Terminating, upstream settled at 2", 180*time.Second, func() bool {
		_, total := e.simWorkers()
		c, _ := e.Sim.Cluster()
		return total == 2 && !e.nodeExists(node) && e.Bridge.Terminating() == 0 && c.State == "Running" && e.settled(2)
	}); err != nil {
		return err
	}
	e.Steps(3)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_up_nodes_total") == 1, "scaled_up_nodes_total %g, want 1", m.Value("cluster_autoscaler_scaled_up_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total", "reason", "unready") == 1, "scaled_down_nodes_total %v, want 1 unready", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_failed_scale_ups_total") == 0, "failed_scale_ups_total %v", m.Series("cluster_autoscaler_failed_scale_ups_total"))
	e.note = fmt.Sprintf(" [pod evicted %s after its VM stopped, %d loops]", evicted.Round(time.Second), e.loops)
	e.CheckClean(2, 0)
	return nil
}
