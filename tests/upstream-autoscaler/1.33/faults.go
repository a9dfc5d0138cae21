package main

// Scenarios of faults around the provider's promises (issue 28): the provider dies while a
// removal it answered OK for is owed, CloudStack fails a scale-up part way, CloudStack answers
// slower than the autoscaler's deadline during a removal. Each checks what a user of the
// cluster would notice: nodes, taints, upstream's status and metrics, what reached CloudStack.

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"k8s.io/autoscaler/cluster-autoscaler/utils/taints"
)

// noSuchVM is the id the provider's question "may this key stop VMs?" names
// (src/provider/refresh.rs learn_stop_permission): it stops nothing.
const noSuchVM = "00000000-0000-4000-8000-000000000000"

// removalRequests counts the scaleKubernetesCluster requests with nodeids cks-sim received.
func (e *Env) removalRequests() int {
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	n := 0
	for _, r := range reqs {
		if r["nodeids"] != "" {
			n++
		}
	}
	return n
}

// vmStops lists the VMs cks-sim was asked to stop (stopVirtualMachine), the provider's
// permission question left out.
func (e *Env) vmStops() []string {
	reqs, _ := e.Sim.Requests("stopVirtualMachine")
	var ids []string
	for _, r := range reqs {
		if r["id"] != noSuchVM {
			ids = append(ids, r["id"])
		}
	}
	return ids
}

// failedScaleJobs counts cks-sim's scale jobs that ended failed (jobstatus 2), from its own
// record of every job (simJobs): listAsyncJobs lists running jobs only, as CloudStack 4.21 does.
func (e *Env) failedScaleJobs() int {
	out, err := e.Sim.Call("simJobs")
	if err != nil {
		return -1
	}
	raw, _ := json.Marshal(out["simjobsresponse"])
	var r struct {
		Jobs []struct {
			Cmd    string `json:"cmd"`
			Status int    `json:"jobstatus"`
		} `json:"asyncjobs"`
	}
	_ = json.Unmarshal(raw, &r)
	n := 0
	for _, j := range r.Jobs {
		if strings.Contains(j.Cmd, "ScaleKubernetesCluster") && j.Status == 2 {
			n++
		}
	}
	return n
}

// taintedToBeDeleted is the worker node upstream tainted ToBeDeleted (actuator.go
// StartDeletion taints a node before it calls DeleteNodes), and its VM.
func (e *Env) taintedToBeDeleted() (name, vmID string) {
	for _, n := range e.Bridge.WorkerNodes() {
		for _, t := range n.Spec.Taints {
			if t.Key == taints.ToBeDeletedTaint {
				return n.Name, strings.TrimPrefix(n.Spec.ProviderID, "external-cloudstack://")
			}
		}
	}
	return "", ""
}

// restartDuringOwedRemoval: upstream removes an empty worker and the provider answers its
// DeleteNodes OK; CloudStack's removal job is slow and its drain fails once (faildrains), and
// the provider is killed (SIGKILL) while that job runs. The restarted provider reads its
// store (--state-file): the removal is owed, so it carries it through as removalFailsOnce's
// provider does (stops the VM, removes it as a down VM). Upstream sees an ordinary scale-down:
// the node goes, its taint stays until then, no size to fix, nothing upcoming.
func restartDuringOwedRemoval(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	// The removal job: 8 s of its own, then 3 s per node, the drain (its first third) failing.
	if _, err := e.Sim.Admin("simConfigure", "jobdurationms", "8000", "removalpernodems", "3000", "faildrains", "1"); err != nil {
		return err
	}
	if _, err := e.Sim.Admin("simResetRequests"); err != nil {
		return err
	}
	// Both workers are empty: upstream removes one (min 1) after --scale-down-unneeded-time.
	// Its DeleteNodes answered OK is when upstream counts the scale-down
	// (delete_in_batch.go RegisterAndRecordSuccessfulScaleDownEvent: RegisterScaleDown).
	var node, vm string
	if err := e.Until("DeleteNodes answered OK, the removal job running in cks-sim", 120*time.Second, func() bool {
		if node == "" {
			node, vm = e.taintedToBeDeleted()
		}
		c, _ := e.Sim.Cluster()
		return node != "" && Gather().Value("cluster_autoscaler_scaled_down_nodes_total") == 1 &&
			c.State == "Scaling" && e.removalRequests() == 1
	}); err != nil {
		return err
	}
	okDeletes := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`, `code="Ok"`)
	e.Check(okDeletes == 1, "the provider answered %g DeleteNodes OK before it was killed, want 1", okDeletes)
	// The promise is in the store before it was made (src/provider/store.rs).
	state, err := os.ReadFile(e.StateFile)
	e.Check(err == nil && strings.Contains(string(state), vm), "the provider's store does not hold the owed removal of %s before the kill: %v %s", vm, err, state)
	e.Prov.Stop(syscall.SIGKILL)
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")
	// Upstream's loops fail while the provider is down; CloudStack's job fails meanwhile or
	// soon after the restart.
	e.Steps(3)
	stillRunning := false
	if c, err := e.Sim.Cluster(); err == nil {
		stillRunning = c.State == "Scaling"
	}
	if err := e.Prov.Restart(); err != nil {
		return err
	}
	if err := e.Until("the worker removed in cks-sim and in Kubernetes", 120*time.Second, func() bool {
		_, total := e.simWorkers()
		return total == 1 && !e.nodeExists(node) && len(e.Bridge.WorkerNodes()) == 1
	}); err != nil {
		return err
	}
	if err := e.Until("the cluster Running and upstream settled at 1", 60*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		return c.State == "Running" && e.settled(1)
	}); err != nil {
		return err
	}
	// Errors until then: the loops aborted while the provider was down and while the
	// autoscaler's gRPC connection came back. None after.
	errorsDown := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore
	e.Steps(3)
	// The injected failure did happen (the kill caught a removal CloudStack had not done), and
	// the restarted provider carried it through: one stop of that VM, one more removal.
	failedJobs := e.failedScaleJobs()
	e.Check(failedJobs == 1, "cks-sim shows %d failed scale jobs, want 1 (the removal whose drain failed)", failedJobs)
	stops := e.vmStops()
	e.Check(len(stops) == 1 && stops[0] == vm, "cks-sim was asked to stop %v, want only %s (the VM whose drain failed)", stops, vm)
	removals := e.removalRequests()
	e.Check(removals == 2, "cks-sim received %d scaleKubernetesCluster with nodeids, want 2 (the failed one, then the down VM's)", removals)
	adopted := e.Prov.Metric("cks_provider_scale_jobs_started_total", `kind="adopted"`)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 1, "scaled_down_nodes_total %v, want 1", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	// Upstream does not retry what it was told is done: the restarted provider got no DeleteNodes.
	deletes := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`)
	e.Check(deletes == 0, "the restarted provider received %g DeleteNodes, want 0", deletes)
	e.Check(e.Log.Count(phRemovingEmpty) == 1, "autoscaler log: %d× %q, want 1 (the one scale-down)", e.Log.Count(phRemovingEmpty), phRemovingEmpty.Text)
	e.Check(e.Log.Count(phRefreshFailed) > 0, "autoscaler log: no %q while the provider was down", phRefreshFailed.Text)
	e.note = fmt.Sprintf(" [job still running at the restart %v, %g job(s) adopted, %d failed job, stops %d, %d removal requests, %g autoscaler errors while the provider was down]",
		stillRunning, adopted, failedJobs, len(stops), removals, errorsDown)
	// No ToBeDeleted taint released nor left, nothing upcoming, target 1 (CheckClean).
	e.CheckClean(1, errorsBefore+errorsDown)
	return nil
}

// partialScaleUp: CloudStack fails a scale-up part way (cks-sim's jobfailure=partial, as
// tests/it/scenario_stranded.rs): of the two new VMs one runs and its node registers, the
// other ends in Error; the cluster is in Alert, its size unchanged, and CloudStack refuses
// every later scale request while its VMs and nodes differ (Alert rule 5). What a user
// notices: upstream's loop goes on (never "Failed to fix node group sizes"), the node that
// registered is used and never deleted as a failed creation, upstream gives up on the VM in
// Error (fixNodeGroupSize's DecreaseTargetSize, answered OK) and settles at the nodes there
// are, the provider's gauge names the stranded cluster, and every refusal names CloudStack's
// rule, never the group's minimum size.
func partialScaleUp(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	before, err := e.Sim.Cluster()
	if err != nil {
		return err
	}
	if _, err := e.Sim.Admin("simConfigure", "jobfailure", "partial"); err != nil {
		return err
	}
	// Three pods of 1.5 CPU on 2-CPU workers: one fits the worker there is, two need two more.
	if err := e.Bridge.AddPods("web", 3, "1500m", "512Mi"); err != nil {
		return err
	}
	var running, broken string // the new VMs: the one that runs, the one in Error
	if err := e.Until("the scale-up failed part way (cluster in Alert, one new VM Running, one in Error)", 60*time.Second, func() bool {
		c, err := e.Sim.Cluster()
		if err != nil || c.State != "Alert" {
			return false
		}
		running, broken = "", ""
		for id, st := range c.Workers {
			if _, old := before.Workers[id]; old {
				continue
			}
			switch st {
			case "Running":
				running = id
			case "Error":
				broken = id
			}
		}
		return running != "" && broken != ""
	}); err != nil {
		return err
	}
	c, _ := e.Sim.Cluster()
	brokenName := c.Names[broken]
	e.Check(len(c.Workers) == 3 && c.Size == 1, "cks-sim: %d workers, size %d after the partial failure, want 3 and 1", len(c.Workers), c.Size)
	// Upstream places a pod on the node that registered, gives up on the VM in Error after
	// --max-node-provision-time (static_autoscaler.go fixNodeGroupSize: DecreaseTargetSize)
	// and settles at the two nodes there are.
	if err := e.Until("a second pod placed, the VM in Error written off, upstream settled at 2", 180*time.Second, func() bool {
		b, _ := e.Bridge.PodCounts()
		return b == 2 && e.Log.Count(phDecreasing) > 0 && e.settled(2)
	}); err != nil {
		return err
	}
	writtenOff := e.loops
	// After the write-off the pending pod still asks for a node: once the backoff ends upstream
	// tries a scale-up, which CloudStack's rule refuses (executor.go executeScaleUp), and the
	// loop goes on.
	refreshes := e.Log.Count(phInstancesRefreshed)
	if err := e.Until("a scale-up tried and refused after the write-off", 150*time.Second, func() bool {
		return e.Log.Count(phIncreaseFailed) > 0
	}); err != nil {
		return err
	}
	// Until its instance list is listed again, upstream deletes the failed creations it listed
	// when the scale-up failed, both new VMs, every loop, and is refused (the rule). Once it
	// lists them again, the VM whose node registered is Running and the one in Error is
	// Deleting: no failed creation is left to delete.
	if err := e.Until("upstream's instance list refreshed after the write-off", 150*time.Second, func() bool {
		return e.Log.Count(phInstancesRefreshed) > refreshes
	}); err != nil {
		return err
	}
	e.Steps(2)
	createErrors := e.Log.Count(phCreateErrors)
	e.Steps(5)
	e.Check(e.Log.Count(phCreateErrors) == createErrors, "upstream still deletes failed creations after it listed the instances again: %d× %q in 5 loops", e.Log.Count(phCreateErrors)-createErrors, phCreateErrors.Text)

	// The loop was never aborted by an answer of the provider: no size fix failed
	// (static_autoscaler.go RunOnce: "Failed to fix node group sizes" ends the loop), Refresh
	// and the templates never failed, the cluster was never unhealthy.
	e.Never(phPanic, phFixFailed, phRefreshFailed, phNodeInfosFailed, phClusterUnhealthy, phReleaseFailed)
	e.Check(e.loops > writtenOff+5, "upstream ran %d loops, %d after the write-off", e.loops, e.loops-writtenOff)
	// DecreaseTargetSize answered OK, never refused.
	decreases := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDecreaseTargetSize"`)
	decreasesOK := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDecreaseTargetSize"`, `code="Ok"`)
	e.Check(decreases >= 1 && decreases == decreasesOK, "DecreaseTargetSize: %g calls, %g answered OK", decreases, decreasesOK)
	// The gauge names the stranded cluster, by the VM-count rule.
	blocked := e.Prov.Metric("cks_provider_cluster_blocked", `rule="alert_rule_5_vm_count_mismatch"`)
	e.Check(blocked == 1, "cks_provider_cluster_blocked{rule=\"alert_rule_5_vm_count_mismatch\"} %g, want 1", blocked)
	other := e.Prov.Metric("cks_provider_cluster_blocked") - blocked
	e.Check(other == 0, "cks_provider_cluster_blocked by another rule: %g", other)
	// Every refusal upstream heard (each RPC error is logged "Error on gRPC call", and the
	// deletion of failed creations and the scale-up name it again) names CloudStack's rule and
	// never the group's minimum size.
	var refusals []string
	for _, ph := range []Phrase{phGrpcError, phCreateErrorsFailed, phIncreaseFailed} {
		refusals = append(refusals, e.Log.Lines(ph)...)
	}
	for _, l := range refusals {
		e.Check(!strings.Contains(l, "minimum size"), "a refusal names the minimum size: %s", l)
		e.Check(strings.Contains(l, "CKS Alert rule 5"), "a refusal does not name CloudStack's rule (CKS Alert rule 5): %s", l)
	}
	// The deletions of failed creations that were refused named the VM in Error.
	for _, l := range e.Log.Lines(phCreateErrorsFailed) {
		e.Check(brokenName != "" && strings.Contains(l, brokenName), "a refused deletion of failed creations does not name the VM in Error %q: %s", brokenName, l)
	}
	provLog, _ := os.ReadFile(e.Prov.Log)
	stranded := 0
	for _, l := range strings.Split(string(provLog), "\n") {
		if strings.Contains(l, "minimum size") {
			e.Fail("provider log names the minimum size: %s", l)
		}
		if strings.Contains(l, "CloudStack has stranded the cluster") {
			stranded++
			e.Check(strings.Contains(l, "ERROR") && strings.Contains(l, "alert_rule_5_vm_count_mismatch"), "provider log: %s", l)
		}
	}
	e.Check(stranded == 1, "provider log: %d× \"CloudStack has stranded the cluster\", want 1", stranded)
	// Nothing more reached CloudStack, nothing was stopped: the new VM with a Ready node runs.
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	e.Check(len(reqs) == 1, "cks-sim received %d scaleKubernetesCluster, want 1 (the scale-up)", len(reqs))
	e.Check(len(e.vmStops()) == 0, "cks-sim was asked to stop %v", e.vmStops())
	c, _ = e.Sim.Cluster()
	e.Check(c.Workers[running] == "Running", "the new VM whose node registered is %q", c.Workers[running])
	// Upstream settled at the two Ready nodes: nothing upcoming, nothing unregistered; the
	// third pod waits for an operator.
	e.Check(e.settled(2), "upstream not settled at 2: %s", e.Describe())
	b, p := e.Bridge.PodCounts()
	e.Check(b == 2 && p == 1, "pods bound %d pending %d, want 2 and 1", b, p)
	for _, n := range e.Bridge.WorkerNodes() {
		for _, t := range n.Spec.Taints {
			if t.Key == taints.ToBeDeletedTaint {
				e.Fail("node %s has taint %s", n.Name, t.Key)
			}
		}
	}
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_up_nodes_total") == 2, "scaled_up_nodes_total %g, want 2 (the one scale-up)", m.Value("cluster_autoscaler_scaled_up_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 0, "scaled_down_nodes_total %v, want 0", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.note = fmt.Sprintf(" [%d refusals heard, %g DecreaseTargetSize, failed_scale_ups_total %v, %d loops]",
		len(refusals), decreases, m.Series("cluster_autoscaler_failed_scale_ups_total"), e.loops)
	return nil
}

// slowRemovalAnswers: CloudStack answers every command 7 s late (cks-sim's latencyms) while
// upstream removes an empty worker: the provider's DeleteNodes needs a fresh listing and the
// removal request, longer together than upstream's 10 s gRPC deadline (grpc_timeout). The
// provider answers OK before the deadline and owes the removal (src/provider/ops.rs
// delete_nodes). Upstream sees an ordinary scale-down: the node goes, counted once, no failed
// deletion, no taint released, and CloudStack is asked to remove the VM once.
func slowRemovalAnswers(e *Env) error {
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")
	if _, err := e.Sim.Admin("simResetRequests"); err != nil {
		return err
	}
	if _, err := e.Sim.Admin("simConfigure", "latencyms", "7000"); err != nil {
		return err
	}
	// Both workers are empty: upstream removes one (min 1) after --scale-down-unneeded-time
	// (actuator.go StartDeletion: the ToBeDeleted taint, then DeleteNodes).
	tainted := map[string]string{} // node -> VM, each node upstream tainted ToBeDeleted
	if err := e.Until("a worker removed in cks-sim and in Kubernetes", 240*time.Second, func() bool {
		for _, n := range e.Bridge.WorkerNodes() {
			for _, t := range n.Spec.Taints {
				if t.Key == taints.ToBeDeletedTaint {
					tainted[n.Name] = strings.TrimPrefix(n.Spec.ProviderID, "external-cloudstack://")
				}
			}
		}
		_, total := e.simWorkers()
		return len(tainted) > 0 && total == 1 && len(e.Bridge.WorkerNodes()) == 1
	}); err != nil {
		return err
	}
	slowErrors := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore
	deleteDuration, _ := e.provHistogram("cks_provider_grpc_request_duration_seconds", `method="NodeGroupDeleteNodes"`)
	if _, err := e.Sim.Admin("simConfigure", "latencyms", "0"); err != nil {
		return err
	}
	if err := e.Until("the cluster Running and upstream settled at 1", 60*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		return c.State == "Running" && e.settled(1)
	}); err != nil {
		return err
	}
	e.Steps(3)
	// One scale-down decided (a second node tainted: the first deletion failed, upstream chose
	// again), one DeleteNodes answered OK, counted once.
	e.Check(len(tainted) == 1, "upstream tainted %d nodes ToBeDeleted, want 1: %v", len(tainted), tainted)
	deletes := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`)
	deletesOK := e.Prov.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`, `code="Ok"`)
	e.Check(deletes == 1 && deletesOK == 1, "the provider received %g DeleteNodes, answered %g OK, want 1 and 1", deletes, deletesOK)
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 1, "scaled_down_nodes_total %v, want 1", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.Check(e.Log.Count(phRemovingEmpty) == 1, "autoscaler log: %d× %q, want 1 (the one scale-down)", e.Log.Count(phRemovingEmpty), phRemovingEmpty.Text)
	// No failed deletion, the ToBeDeleted taint never released (CheckClean checks them too).
	e.Never(phDeleteEmptyFailed, phDeleteNodeFailed)
	if l := e.Log.Lines(phReleasingTaint, taints.ToBeDeletedTaint); len(l) > 0 {
		e.Fail("autoscaler log: the ToBeDeleted taint released %d×: %s", len(l), l[0])
	}
	// CloudStack was asked once to remove the VM, and nothing else.
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	var named []string
	for _, r := range reqs {
		named = append(named, r["nodeids"])
	}
	want := ""
	for _, vm := range tainted {
		want = vm
	}
	e.Check(len(reqs) == 1 && named[0] == want, "cks-sim received scaleKubernetesCluster for nodeids %q, want one for %q", named, want)
	e.Check(e.failedScaleJobs() == 0, "cks-sim shows %d failed scale jobs", e.failedScaleJobs())
	e.note = fmt.Sprintf(" [DeleteNodes answered in %.1fs, %g autoscaler errors while CloudStack was slow: %v]",
		deleteDuration, slowErrors, m.Series("cluster_autoscaler_errors_total"))
	e.CheckClean(1, errorsBefore+slowErrors)
	return nil
}

// provHistogram is the mean and count of one of the provider's histograms over the series
// whose labels contain every one of labels.
func (e *Env) provHistogram(name string, labels ...string) (mean float64, count int) {
	sum := e.Prov.Metric(name+"_sum", labels...)
	n := e.Prov.Metric(name+"_count", labels...)
	if n <= 0 {
		return 0, 0
	}
	return sum / n, int(n)
}
