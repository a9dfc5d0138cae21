package main

// The bridge's pods: the controllers, the API server's pod rules and the scheduler a real
// cluster runs, one pass per Sync. Paths are of kubernetes/kubernetes v1.33.1 (the module
// cache's copy) unless said otherwise. Not modelled: pod Ready conditions (the kubelet's, and
// the node lifecycle controller's MarkPodsNotReady; nothing the autoscaler decides reads
// them), PodDisruptionBudgets in the eviction subresource (no scenario has one), the kubelet's
// grace period on a live node (a deletion it carries out is immediate), kube-scheduler's
// scoring (first fit by node name).

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	policyv1beta1 "k8s.io/api/policy/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	k8stesting "k8s.io/client-go/testing"
	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	corehelper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
)

const podNamespace = "default"

var podsResource = apiv1.SchemeGroupVersion.WithResource("pods")

// evictionWork is a pod the taint eviction controller will delete: since when (the work's
// CreatedAt) and when.
type evictionWork struct{ since, at time.Time }

func (b *Bridge) isKubeletUp(node string) bool {
	b.upMu.Lock()
	defer b.upMu.Unlock()
	return node != "" && b.kubeletUp[node]
}

func terminal(p *apiv1.Pod) bool {
	return p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed
}

// deletePod is the API server's DELETE of a pod, through the object tracker (it runs inside
// the fake clientset's reactors too). pkg/registry/core/pod/strategy.go CheckGracefulDelete:
// the grace period is the request's, else the pod's terminationGracePeriodSeconds; an
// unscheduled or terminated pod goes at once; a bound one gets its deletionTimestamp and stays
// (Terminating) until its kubelet has stopped it and deletes it for good
// (pkg/kubelet/status/status_manager.go syncPod). A kubelet that runs does that here at once;
// a silent one never does, and the pod waits for the node's deletion (pod garbage collection)
// or its return. cond, when given, is the DisruptionTarget condition the deleting controller
// adds first.
func (b *Bridge) deletePod(name string, grace *int64, cond *apiv1.PodCondition) error {
	tr := b.Kube.Tracker()
	obj, err := tr.Get(podsResource, podNamespace, name)
	if err != nil {
		return err
	}
	pod := obj.(*apiv1.Pod).DeepCopy()
	period := int64(apiv1.DefaultTerminationGracePeriodSeconds)
	if grace != nil {
		period = *grace
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		period = *pod.Spec.TerminationGracePeriodSeconds
	}
	if pod.Spec.NodeName == "" || terminal(pod) {
		period = 0
	}
	if period <= 0 || b.isKubeletUp(pod.Spec.NodeName) {
		return tr.Delete(podsResource, podNamespace, name)
	}
	if pod.DeletionTimestamp != nil {
		return nil
	}
	if cond != nil {
		cond.LastTransitionTime = metav1.Now()
		pod.Status.Conditions = append(pod.Status.Conditions, *cond)
	}
	now := metav1.Now()
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, &period
	return tr.Update(podsResource, pod, podNamespace)
}

// evictionReactor is the pods/eviction subresource (pkg/registry/core/pod/storage/
// eviction.go): the pod is deleted with the eviction's delete options. client-go's fake
// clientset only records an eviction; the autoscaler's drain (core/scaledown/actuation/
// drain.go evictPod) then waits for pods that never go.
func (b *Bridge) evictionReactor(action k8stesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(k8stesting.CreateAction)
	if !ok || action.GetSubresource() != "eviction" {
		return false, nil, nil
	}
	var name string
	var opts *metav1.DeleteOptions
	switch ev := create.GetObject().(type) {
	case *policyv1beta1.Eviction:
		name, opts = ev.Name, ev.DeleteOptions
	case *policyv1.Eviction:
		name, opts = ev.Name, ev.DeleteOptions
	default:
		return true, nil, fmt.Errorf("eviction of type %T", ev)
	}
	var grace *int64
	if opts != nil {
		grace = opts.GracePeriodSeconds
	}
	if err := b.deletePod(name, grace, &apiv1.PodCondition{Type: apiv1.DisruptionTarget, Status: apiv1.ConditionTrue,
		Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting"}); err != nil {
		return true, nil, err
	}
	return true, &metav1.Status{Status: metav1.StatusSuccess}, nil
}

// drain is kubectl drain's evictions of every pod on node (CloudStack drains a running VM's
// node before it deletes it; kubectl's source is *unverified*, nodes.go). No DaemonSet pod
// runs here, which --ignore-daemonsets would leave.
func (b *Bridge) drain(ctx context.Context, node string) error {
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == node {
			if err := b.Kube.CoreV1().Pods(podNamespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: podNamespace}}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// minTolerationTime is pkg/controller/tainteviction/taint_eviction.go getMinTolerationTime:
// the least tolerationSeconds of the tolerations used, 0 for none given as ≤ 0, -1 (for
// ever) when none has a limit.
func minTolerationTime(tolerations []apiv1.Toleration) time.Duration {
	if len(tolerations) == 0 {
		return 0
	}
	least := int64(math.MaxInt64)
	for _, t := range tolerations {
		if t.TolerationSeconds != nil {
			if *t.TolerationSeconds <= 0 {
				return 0
			}
			least = min(least, *t.TolerationSeconds)
		}
	}
	if least == math.MaxInt64 {
		return -1
	}
	return time.Duration(least) * time.Second
}

// pods runs one pass of the pods' controllers, then the scheduler.
func (b *Bridge) pods(ctx context.Context, now time.Time) error {
	nodeList, err := b.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	nodes := map[string]*apiv1.Node{}
	for i := range nodeList.Items {
		nodes[nodeList.Items[i].Name] = &nodeList.Items[i]
	}
	podList, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	orphaned := map[string]bool{}
	for i := range podList.Items {
		p := &podList.Items[i]
		node, bound := nodes[p.Spec.NodeName]
		switch {
		case p.Spec.NodeName == "":
		case p.DeletionTimestamp != nil && b.isKubeletUp(p.Spec.NodeName):
			// Its kubelet stopped it: deleted for good (status_manager.go syncPod).
			if err := b.deletePod(p.Name, nil, nil); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		case !bound:
			// pkg/controller/podgc/gc_controller.go gcOrphaned: a pod bound to a node that
			// no longer exists, still missing after quarantineTime, is marked failed and
			// deleted at once.
			orphaned[p.Spec.NodeName] = true
			since, ok := b.orphanSince[p.Spec.NodeName]
			if !ok {
				b.orphanSince[p.Spec.NodeName] = now
			} else if now.Sub(since) >= podGCQuarantine {
				zero := int64(0)
				if err := b.deletePod(p.Name, &zero, nil); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		case p.DeletionTimestamp == nil:
			if err := b.taintEviction(p, node, now); err != nil {
				return err
			}
		}
	}
	for n := range b.orphanSince {
		if !orphaned[n] {
			delete(b.orphanSince, n)
		}
	}
	if err := b.replicaSets(ctx, now); err != nil {
		return err
	}
	return b.schedule(ctx)
}

// taintEviction is pkg/controller/tainteviction/taint_eviction.go processPodOnNode for a pod
// bound to node: no NoExecute taint, nothing to do (work cancelled); a taint it does not
// tolerate, deleted now; otherwise deleted once the least tolerationSeconds of the
// tolerations used has passed since the work was created (tolerated for ever: none).
// deletePodHandler deletes with the DisruptionTarget condition DeletionByTaintManager.
func (b *Bridge) taintEviction(p *apiv1.Pod, node *apiv1.Node, now time.Time) error {
	var noExecute []apiv1.Taint
	for _, t := range node.Spec.Taints {
		if t.Effect == apiv1.TaintEffectNoExecute {
			noExecute = append(noExecute, t)
		}
	}
	if len(noExecute) == 0 {
		delete(b.evictAt, p.UID)
		return nil
	}
	all, used := corehelper.GetMatchingTolerations(noExecute, p.Spec.Tolerations)
	w, scheduled := b.evictAt[p.UID]
	if !scheduled {
		w.since = now
	}
	switch least := minTolerationTime(used); {
	case !all:
		w.at = now
	case least < 0:
		delete(b.evictAt, p.UID)
		return nil
	default:
		w.at = w.since.Add(least)
	}
	b.evictAt[p.UID] = w
	if now.Before(w.at) {
		return nil
	}
	delete(b.evictAt, p.UID)
	err := b.deletePod(p.Name, nil, &apiv1.PodCondition{Type: apiv1.DisruptionTarget, Status: apiv1.ConditionTrue,
		Reason: "DeletionByTaintManager", Message: "Taint manager: deleting due to NoExecute taint"})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func controlledBy(p *apiv1.Pod, rs *appsv1.ReplicaSet) bool {
	ref := metav1.GetControllerOf(p)
	return ref != nil && ref.UID == rs.UID
}

// active is pkg/controller/controller_utils.go IsPodActive: not terminated, not being deleted.
func active(p *apiv1.Pod) bool { return !terminal(p) && p.DeletionTimestamp == nil }

// replicaSets is pkg/controller/replicaset/replica_set.go manageReplicas for every
// ReplicaSet: as many active pods as spec.replicas, new ones from the template (named as the
// API server's generateName does, k8s.io/apiserver/pkg/storage/names: the ReplicaSet's name,
// "-", 5 random characters), the surplus deleted in getPodsToDelete's order
// (controller_utils.go ActivePodsWithRanks: unassigned first, then Pending before Running,
// then the newest; the ranks on readiness, deletion cost and co-location are not modelled).
func (b *Bridge) replicaSets(ctx context.Context, now time.Time) error {
	rss, err := b.Kube.AppsV1().ReplicaSets(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range rss.Items {
		rs := &rss.Items[i]
		var live []*apiv1.Pod
		for j := range pods.Items {
			if p := &pods.Items[j]; controlledBy(p, rs) && active(p) {
				live = append(live, p)
			}
		}
		want := 0
		if rs.Spec.Replicas != nil {
			want = int(*rs.Spec.Replicas)
		}
		for n := len(live); n < want; n++ {
			if _, err := b.Kube.CoreV1().Pods(podNamespace).Create(ctx, newPod(rs, now), metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		if len(live) <= want {
			continue
		}
		phaseRank := map[apiv1.PodPhase]int{apiv1.PodPending: 0, apiv1.PodUnknown: 1, apiv1.PodRunning: 2}
		sort.SliceStable(live, func(i, j int) bool {
			a, c := live[i], live[j]
			if (a.Spec.NodeName == "") != (c.Spec.NodeName == "") {
				return a.Spec.NodeName == ""
			}
			if phaseRank[a.Status.Phase] != phaseRank[c.Status.Phase] {
				return phaseRank[a.Status.Phase] < phaseRank[c.Status.Phase]
			}
			return c.CreationTimestamp.Before(&a.CreationTimestamp)
		})
		for _, p := range live[:len(live)-want] {
			if err := b.deletePod(p.Name, nil, nil); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// newPod is a pod of rs as the API server stores it: generated name, uid, creation time, the
// defaults of pkg/apis/core/v1/defaults.go (terminationGracePeriodSeconds 30) and the
// tolerations the DefaultTolerationSeconds admission plugin adds to a pod that has none for
// not-ready / unreachable NoExecute (plugin/pkg/admission/defaulttolerationseconds/
// admission.go Admit).
func newPod(rs *appsv1.ReplicaSet, now time.Time) *apiv1.Pod {
	t := rs.Spec.Template.DeepCopy()
	p := &apiv1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec, Status: apiv1.PodStatus{Phase: apiv1.PodPending}}
	p.Name = rs.Name + "-" + utilrand.String(5)
	p.GenerateName = rs.Name + "-"
	p.Namespace = rs.Namespace
	p.UID = uuid.NewUUID()
	p.CreationTimestamp = metav1.NewTime(now)
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
	if p.Spec.TerminationGracePeriodSeconds == nil {
		g := int64(apiv1.DefaultTerminationGracePeriodSeconds)
		p.Spec.TerminationGracePeriodSeconds = &g
	}
	notReady, unreachable := false, false
	for _, tol := range p.Spec.Tolerations {
		noExec := tol.Effect == apiv1.TaintEffectNoExecute || tol.Effect == ""
		notReady = notReady || (noExec && (tol.Key == apiv1.TaintNodeNotReady || tol.Key == ""))
		unreachable = unreachable || (noExec && (tol.Key == apiv1.TaintNodeUnreachable || tol.Key == ""))
	}
	seconds := int64(defaultTolerationSeconds)
	if !notReady {
		p.Spec.Tolerations = append(p.Spec.Tolerations, apiv1.Toleration{Key: apiv1.TaintNodeNotReady, Operator: apiv1.TolerationOpExists, Effect: apiv1.TaintEffectNoExecute, TolerationSeconds: &seconds})
	}
	if !unreachable {
		p.Spec.Tolerations = append(p.Spec.Tolerations, apiv1.Toleration{Key: apiv1.TaintNodeUnreachable, Operator: apiv1.TolerationOpExists, Effect: apiv1.TaintEffectNoExecute, TolerationSeconds: &seconds})
	}
	return p
}

func podRequests(p *apiv1.Pod) (cpu, mem int64) {
	for _, c := range p.Spec.Containers {
		cpu += c.Resources.Requests.Cpu().MilliValue()
		mem += c.Resources.Requests.Memory().Value()
	}
	return
}

// feasible is kube-scheduler's filters that matter here: NodeUnschedulable
// (pkg/scheduler/framework/plugins/nodeunschedulable: a cordoned node, unless the pod
// tolerates the unschedulable taint) and TaintToleration (plugins/tainttoleration Filter: no
// NoSchedule or NoExecute taint the pod does not tolerate). Readiness is not a filter: the
// node lifecycle controller's taints stand for it.
func feasible(p *apiv1.Pod, n *apiv1.Node) bool {
	if n.Spec.Unschedulable {
		cordon := apiv1.Taint{Key: apiv1.TaintNodeUnschedulable, Effect: apiv1.TaintEffectNoSchedule}
		tolerated := false
		for i := range p.Spec.Tolerations {
			tolerated = tolerated || p.Spec.Tolerations[i].ToleratesTaint(&cordon)
		}
		if !tolerated {
			return false
		}
	}
	_, untolerated := schedcorev1.FindMatchingUntoleratedTaint(n.Spec.Taints, p.Spec.Tolerations, func(t *apiv1.Taint) bool {
		return t.Effect == apiv1.TaintEffectNoSchedule || t.Effect == apiv1.TaintEffectNoExecute
	})
	return !untolerated
}

func setScheduled(p *apiv1.Pod, status apiv1.ConditionStatus, reason string) bool {
	for i := range p.Status.Conditions {
		c := &p.Status.Conditions[i]
		if c.Type == apiv1.PodScheduled {
			if c.Status == status && c.Reason == reason {
				return false
			}
			c.Status, c.Reason, c.LastTransitionTime = status, reason, metav1.Now()
			return true
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, apiv1.PodCondition{Type: apiv1.PodScheduled, Status: status, Reason: reason, LastTransitionTime: metav1.Now()})
	return true
}

// schedule binds pending pods, oldest first (the scheduling queue's PrioritySort: equal
// priorities by time), each to the first feasible node by name with room (NodeResourcesFit:
// cpu, memory, pod count against allocatable, counting every pod bound there, terminating
// ones included), and marks the others unschedulable as kube-scheduler does
// (PodScheduled=False, reason Unschedulable). The kubelet then runs the pod (Running).
func (b *Bridge) schedule(ctx context.Context) error {
	nodes, err := b.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	type room struct{ cpu, mem, pods int64 }
	free := map[string]*room{}
	byName := map[string]*apiv1.Node{}
	var names []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		byName[n.Name] = n
		free[n.Name] = &room{n.Status.Allocatable.Cpu().MilliValue(), n.Status.Allocatable.Memory().Value(), n.Status.Allocatable.Pods().Value()}
		names = append(names, n.Name)
	}
	sort.Strings(names)
	var pending []*apiv1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" {
			if p.DeletionTimestamp == nil {
				pending = append(pending, p)
			}
			continue
		}
		if r, ok := free[p.Spec.NodeName]; ok {
			c, m := podRequests(p)
			r.cpu, r.mem, r.pods = r.cpu-c, r.mem-m, r.pods-1
		}
	}
	sort.Slice(pending, func(i, j int) bool {
		a, c := pending[i], pending[j]
		if !a.CreationTimestamp.Equal(&c.CreationTimestamp) {
			return a.CreationTimestamp.Before(&c.CreationTimestamp)
		}
		return a.Name < c.Name
	})
	for _, p := range pending {
		c, m := podRequests(p)
		changed := false
		for _, name := range names {
			r := free[name]
			if feasible(p, byName[name]) && r.cpu >= c && r.mem >= m && r.pods >= 1 {
				r.cpu, r.mem, r.pods = r.cpu-c, r.mem-m, r.pods-1
				p.Spec.NodeName = name
				p.Status.Phase = apiv1.PodRunning
				setScheduled(p, apiv1.ConditionTrue, "")
				changed = true
				break
			}
		}
		if p.Spec.NodeName == "" {
			changed = setScheduled(p, apiv1.ConditionFalse, apiv1.PodReasonUnschedulable)
		}
		if !changed {
			continue
		}
		if _, err := b.Kube.CoreV1().Pods(podNamespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// AddPods creates ReplicaSet name with n replicas, each pod requesting cpu and memory, and
// lets its controller and the scheduler run.
func (b *Bridge) AddPods(name string, n int, cpu, mem string) error {
	replicas := int32(n)
	labels := map[string]string{"app": name}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Image: "pause",
					Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: quantity(cpu), apiv1.ResourceMemory: quantity(mem)}}}}},
			},
		},
	}
	ctx := context.Background()
	if _, err := b.Kube.AppsV1().ReplicaSets(podNamespace).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		return err
	}
	return b.pods(ctx, time.Now())
}

// ScaleReplicaSet sets ReplicaSet name's replicas (kubectl scale) and lets its controller
// and the scheduler run.
func (b *Bridge) ScaleReplicaSet(name string, n int) error {
	ctx := context.Background()
	rs, err := b.Kube.AppsV1().ReplicaSets(podNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	replicas := int32(n)
	rs.Spec.Replicas = &replicas
	if _, err := b.Kube.AppsV1().ReplicaSets(podNamespace).Update(ctx, rs, metav1.UpdateOptions{}); err != nil {
		return err
	}
	return b.pods(ctx, time.Now())
}

// PodCounts counts the pods not being deleted: bound and pending.
func (b *Bridge) PodCounts() (bound, pending int) {
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return -1, -1
	}
	for _, p := range pods.Items {
		switch {
		case p.DeletionTimestamp != nil:
		case p.Spec.NodeName != "":
			bound++
		default:
			pending++
		}
	}
	return
}

// Terminating counts the pods being deleted (bound to a node whose kubelet is silent).
func (b *Bridge) Terminating() int {
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return -1
	}
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			n++
		}
	}
	return n
}
