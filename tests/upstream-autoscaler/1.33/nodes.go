package main

// The bridge's nodes: cks-sim's registered nodes as Node objects in the API server, as the
// kubelet, the node lifecycle controller and kubectl (run by CloudStack over SSH) leave them.
// Paths are of kubernetes/kubernetes v1.33.1 unless said otherwise.

import (
	"context"
	"sync"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	controllerutil "k8s.io/kubernetes/pkg/controller/util/node"
)

// The Kubernetes side's timers, shortened as autoscalerFlags shortens the autoscaler's
// (upstream defaults in brackets).
const (
	// kube-controller-manager --node-monitor-grace-period [50s]
	// (pkg/controller/nodelifecycle/config/v1alpha1/defaults.go): how long a node's kubelet
	// may stay silent before the node lifecycle controller marks the node Unknown.
	nodeMonitorGracePeriod = 2 * time.Second
	// pkg/controller/podgc/gc_controller.go quarantineTime [40s, a constant]: how long a pod
	// bound to a deleted node waits before the pod garbage collector deletes it.
	podGCQuarantine = 4 * time.Second
)

// Bridge mirrors the simulator into the API server: the kubelets, the node lifecycle
// controller, CloudStack's kubectl, and pod garbage collection (pods.go).
type Bridge struct {
	Sim  *Sim
	Kube kubernetes.Interface
	// synced: the first Sync is done. Registered: the nodes the first one created, there
	// before the scenario (the scenario backdates them, Kube.Backdate).
	synced     bool
	Registered []string

	// kubeletUp: the node's VM runs, so its kubelet posts status and carries out pod
	// deletions.
	upMu      sync.Mutex
	kubeletUp map[string]bool
	// silentSince: when the node's kubelet was first seen silent (its VM down).
	silentSince map[string]time.Time
	// simCordon: the cordon cks-sim reported last, mirrored into spec.unschedulable when it
	// changes (a cordon set by anyone else is left alone).
	simCordon map[string]bool
	// orphanSince: when a pod's node was first seen missing (pod garbage collection).
	orphanSince map[string]time.Time
	// The node lifecycle controller's events (MarkPodsNotReady records one per pod).
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	// ctx carries the bridge's logger (upstream's functions it calls log through it).
	ctx context.Context
}

// NewBridge is a bridge writing to the API server through kube, logging to logger.
func NewBridge(sim *Sim, kube kubernetes.Interface, logger klog.Logger) *Bridge {
	ctx := klog.NewContext(context.Background(), logger)
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return &Bridge{Sim: sim, Kube: kube, kubeletUp: map[string]bool{}, silentSince: map[string]time.Time{},
		simCordon: map[string]bool{}, orphanSince: map[string]time.Time{}, broadcaster: broadcaster,
		recorder: broadcaster.NewRecorder(scheme.Scheme, apiv1.EventSource{Component: "node-controller"}), ctx: ctx}
}

// Stop ends the bridge's event recording.
func (b *Bridge) Stop() {
	if b != nil {
		b.broadcaster.Shutdown()
	}
}

func quantity(s string) resource.Quantity {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}
	}
	return q
}

func condition(n *apiv1.Node, t apiv1.NodeConditionType) *apiv1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func readyCondition(n *apiv1.Node) *apiv1.NodeCondition { return condition(n, apiv1.NodeReady) }

// kubeletConditions are the conditions a running kubelet posts
// (pkg/kubelet/nodestatus/setters.go: ReadyCondition, MemoryPressureCondition,
// DiskPressureCondition, PIDPressureCondition).
func kubeletConditions(ready bool) []apiv1.NodeCondition {
	r := apiv1.NodeCondition{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"}
	if !ready {
		// cks-sim's kubelet not ready yet after its VM (re)started, or forced NotReady.
		r = apiv1.NodeCondition{Type: apiv1.NodeReady, Status: apiv1.ConditionFalse, Reason: "KubeletNotReady", Message: "container runtime status check may not have completed yet"}
	}
	return []apiv1.NodeCondition{
		{Type: apiv1.NodeMemoryPressure, Status: apiv1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: apiv1.NodeDiskPressure, Status: apiv1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: apiv1.NodePIDPressure, Status: apiv1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		r,
	}
}

// postStatus is the kubelet's status update: its conditions, a transition time only where
// the status changed (pkg/kubelet/nodestatus/setters.go). Reports whether anything changed.
func postStatus(node *apiv1.Node, conds []apiv1.NodeCondition, now metav1.Time) bool {
	changed := false
	for _, want := range conds {
		c := condition(node, want.Type)
		if c == nil {
			want.LastHeartbeatTime, want.LastTransitionTime = now, now
			node.Status.Conditions = append(node.Status.Conditions, want)
			changed = true
			continue
		}
		if c.Status != want.Status || c.Reason != want.Reason {
			c.Status, c.Reason, c.Message = want.Status, want.Reason, want.Message
			c.LastHeartbeatTime, c.LastTransitionTime = now, now
			changed = true
		}
	}
	return changed
}

// markUnknown is the node lifecycle controller's verdict on a node whose kubelet stopped
// posting for longer than the grace period: Ready, MemoryPressure, DiskPressure and
// PIDPressure Unknown (pkg/controller/nodelifecycle/node_lifecycle_controller.go,
// tryUpdateNodeHealth).
func markUnknown(node *apiv1.Node, now metav1.Time) bool {
	changed := false
	for _, t := range []apiv1.NodeConditionType{apiv1.NodeReady, apiv1.NodeMemoryPressure, apiv1.NodeDiskPressure, apiv1.NodePIDPressure} {
		c := condition(node, t)
		if c == nil {
			node.Status.Conditions = append(node.Status.Conditions, apiv1.NodeCondition{Type: t, Status: apiv1.ConditionUnknown,
				Reason: "NodeStatusNeverUpdated", Message: "Kubelet never posted node status.", LastHeartbeatTime: node.CreationTimestamp, LastTransitionTime: now})
			changed = true
		} else if c.Status != apiv1.ConditionUnknown {
			c.Status, c.Reason, c.Message, c.LastTransitionTime = apiv1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status.", now
			changed = true
		}
	}
	return changed
}

// conditionTaints are the node lifecycle controller's taints for a node's conditions and
// cordon (node_lifecycle_controller.go): NoSchedule from doNoScheduleTaintingPass
// (nodeConditionToTaintKeyStatusMap: Ready False → not-ready, Ready Unknown → unreachable,
// a pressure condition True → its taint; spec.unschedulable → unschedulable) and NoExecute
// from processTaintBaseEviction (Ready False → not-ready, Unknown → unreachable, swapping the
// other; Ready True → neither, markNodeAsReachable).
func conditionTaints(node *apiv1.Node) []apiv1.Taint {
	var out []apiv1.Taint
	byCondition := map[apiv1.NodeConditionType]map[apiv1.ConditionStatus]string{
		apiv1.NodeReady:          {apiv1.ConditionFalse: apiv1.TaintNodeNotReady, apiv1.ConditionUnknown: apiv1.TaintNodeUnreachable},
		apiv1.NodeMemoryPressure: {apiv1.ConditionTrue: apiv1.TaintNodeMemoryPressure},
		apiv1.NodeDiskPressure:   {apiv1.ConditionTrue: apiv1.TaintNodeDiskPressure},
		apiv1.NodePIDPressure:    {apiv1.ConditionTrue: apiv1.TaintNodePIDPressure},
	}
	for _, c := range node.Status.Conditions {
		if key, ok := byCondition[c.Type][c.Status]; ok {
			out = append(out, apiv1.Taint{Key: key, Effect: apiv1.TaintEffectNoSchedule})
		}
	}
	if node.Spec.Unschedulable {
		out = append(out, apiv1.Taint{Key: apiv1.TaintNodeUnschedulable, Effect: apiv1.TaintEffectNoSchedule})
	}
	if r := readyCondition(node); r != nil {
		switch r.Status {
		case apiv1.ConditionFalse:
			out = append(out, apiv1.Taint{Key: apiv1.TaintNodeNotReady, Effect: apiv1.TaintEffectNoExecute})
		case apiv1.ConditionUnknown:
			out = append(out, apiv1.Taint{Key: apiv1.TaintNodeUnreachable, Effect: apiv1.TaintEffectNoExecute})
		}
	}
	return out
}

// controllerTaint: a taint the node lifecycle controller owns (it adds and removes only
// these; the autoscaler's and kubeadm's stay): node_lifecycle_controller.go
// doNoScheduleTaintingPass touches only the keys of taintKeyToNodeConditionMap and the
// unschedulable taint, the NoExecute passes only UnreachableTaintTemplate and
// NotReadyTaintTemplate.
func controllerTaint(t apiv1.Taint) bool {
	switch t.Key {
	case apiv1.TaintNodeNotReady, apiv1.TaintNodeUnreachable:
		return t.Effect == apiv1.TaintEffectNoSchedule || t.Effect == apiv1.TaintEffectNoExecute
	case apiv1.TaintNodeUnschedulable, apiv1.TaintNodeMemoryPressure, apiv1.TaintNodeDiskPressure, apiv1.TaintNodePIDPressure:
		return t.Effect == apiv1.TaintEffectNoSchedule
	}
	return false
}

// applyTaints brings the controller's taints to want, keeping the time an unchanged taint was
// added and stamping new ones (pkg/controller/util/node/controller_utils.go,
// SwapNodeControllerTaint: TimeAdded = now).
func applyTaints(node *apiv1.Node, want []apiv1.Taint, now metav1.Time) bool {
	has := map[apiv1.Taint]bool{}
	for _, t := range node.Spec.Taints {
		if controllerTaint(t) {
			has[apiv1.Taint{Key: t.Key, Effect: t.Effect}] = true
		}
	}
	wanted := map[apiv1.Taint]bool{}
	for _, t := range want {
		wanted[t] = true
	}
	changed := false
	var kept []apiv1.Taint
	for _, t := range node.Spec.Taints {
		if controllerTaint(t) && !wanted[apiv1.Taint{Key: t.Key, Effect: t.Effect}] {
			changed = true
			continue
		}
		kept = append(kept, t)
	}
	for _, t := range want {
		if !has[t] {
			added := now
			t.TimeAdded = &added
			kept = append(kept, t)
			changed = true
		}
	}
	node.Spec.Taints = kept
	return changed
}

// Sync mirrors the nodes, then runs the kubelets' and pod garbage collection's pass on the
// pods (pods.go).
func (b *Bridge) Sync() error {
	ctx := b.ctx
	simNodes, err := b.Sim.Nodes()
	if err != nil {
		return err
	}
	vmStates, err := b.Sim.VMStates()
	if err != nil {
		return err
	}
	list, err := b.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	existing := map[string]*apiv1.Node{}
	for i := range list.Items {
		existing[list.Items[i].Name] = &list.Items[i]
	}
	now := time.Now()
	stamp := metav1.NewTime(now)
	seen := map[string]bool{}
	for _, sn := range simNodes {
		seen[sn.Name] = true
		// The kubelet runs while its VM does (a VM cks-sim does not list: as its node says).
		up := sn.Ready
		if st, ok := vmStates[sn.VMID]; ok {
			up = st == "Running"
		}
		b.upMu.Lock()
		b.kubeletUp[sn.Name] = up
		b.upMu.Unlock()
		if up {
			delete(b.silentSince, sn.Name)
		} else if _, ok := b.silentSince[sn.Name]; !ok {
			b.silentSince[sn.Name] = now
		}
		_, known := existing[sn.Name]
		// Unknown once silent longer than the grace period; a node first seen silent was
		// silent before (a VM down when the scenario starts, or one that registered while
		// this process was not looking).
		silentLong := !up && (!known || now.Sub(b.silentSince[sn.Name]) >= nodeMonitorGracePeriod)
		cordonChanged := !known || b.simCordon[sn.Name] != sn.Unschedulable
		b.simCordon[sn.Name] = sn.Unschedulable
		alloc := apiv1.ResourceList{}
		for k, v := range sn.Allocatable {
			alloc[apiv1.ResourceName(k)] = quantity(v)
		}
		// What the kubelet posts and the node lifecycle controller decides: the status.
		status := func(node *apiv1.Node) bool {
			changed := false
			if len(alloc) > 0 && len(node.Status.Allocatable) != len(alloc) {
				node.Status.Allocatable, node.Status.Capacity = alloc, alloc.DeepCopy()
				changed = true
			}
			switch {
			case up:
				changed = postStatus(node, kubeletConditions(sn.Ready), stamp) || changed
			case silentLong:
				changed = markUnknown(node, stamp) || changed
			}
			return changed
		}
		// The kubelet's labels, kubectl's cordon and the node lifecycle controller's taints:
		// the object.
		object := func(node *apiv1.Node) bool {
			changed := false
			if node.Labels == nil {
				node.Labels = map[string]string{}
			}
			for k, v := range sn.Labels {
				if cur, ok := node.Labels[k]; !ok || cur != v {
					node.Labels[k] = v
					changed = true
				}
			}
			// kubectl cordon / uncordon (k8s.io/kubectl v0.33.1 pkg/drain/cordon.go
			// CordonHelper: spec.unschedulable, nothing else): kubectl drain cordons the node
			// first (default.go RunCordonOrUncordon, then RunNodeDrain), so CloudStack's drain
			// does, and a failed drain leaves it cordoned; an operator's uncordon lifts it.
			// When CloudStack cordons is cks-sim's model (its kubelet emulation), not
			// verifiable here: CloudStack's source is not in the module cache.
			if cordonChanged && node.Spec.Unschedulable != sn.Unschedulable {
				node.Spec.Unschedulable = sn.Unschedulable
				changed = true
			}
			return applyTaints(node, conditionTaints(node), stamp) || changed
		}
		if node, ok := existing[sn.Name]; ok {
			wasReady := readyCondition(node) != nil && readyCondition(node).Status == apiv1.ConditionTrue
			if !status(node.DeepCopy()) && !object(node.DeepCopy()) {
				continue
			}
			if err := b.updateNode(ctx, sn.Name, status, object); err != nil {
				return err
			}
			if wasReady && silentLong {
				if err := b.markPodsNotReady(ctx, sn.Name); err != nil {
					return err
				}
			}
			continue
		}
		node := &apiv1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: sn.Name, Labels: map[string]string{}},
			Spec:       apiv1.NodeSpec{ProviderID: sn.ProviderID},
		}
		if sn.Role == "control" {
			// kubeadm's control-plane taint (CKS control nodes run no workload).
			node.Spec.Taints = []apiv1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: apiv1.TaintEffectNoSchedule}}
		}
		// The kubelet registers its node with its status (pkg/kubelet/kubelet_node_status.go
		// registerWithAPIServer; the API server keeps a new node's status,
		// pkg/registry/core/node/strategy.go PrepareForCreate). The TaintNodesByCondition
		// admission plugin adds the not-ready NoSchedule taint to every new node
		// (plugin/pkg/admission/nodetaint/admission.go), which the node lifecycle
		// controller's next pass takes off a Ready one (object, below).
		status(node)
		object(node)
		if _, err := b.Kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return err
		}
		if err := b.updateNode(ctx, sn.Name, status, object); err != nil {
			return err
		}
		if !b.synced {
			b.Registered = append(b.Registered, sn.Name)
		}
	}
	for name := range existing {
		if seen[name] {
			continue
		}
		// The VM is gone and CloudStack deleted the node (kubectl delete node). A VM that
		// ran was drained first (pods.go drain); a down VM was not, its pods are left to the
		// pod garbage collector.
		if b.isKubeletUp(name) {
			if err := b.drain(ctx, name); err != nil {
				return err
			}
		}
		if err := b.Kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		b.upMu.Lock()
		delete(b.kubeletUp, name)
		b.upMu.Unlock()
		delete(b.silentSince, name)
		delete(b.simCordon, name)
	}
	b.synced = true
	return b.pods(ctx, now, seen)
}

// updateNode applies status (through the status subresource, as the kubelet writes it,
// pkg/kubelet/kubelet_node_status.go tryUpdateNodeStatus, and the node lifecycle controller,
// tryUpdateNodeHealth) then object (labels, cordon, taints) to the newest copy of node name,
// again on a conflict: the autoscaler writes its taints to the same object.
func (b *Bridge) updateNode(ctx context.Context, name string, status, object func(*apiv1.Node) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := b.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if next := node.DeepCopy(); status(next) {
			if node, err = b.Kube.CoreV1().Nodes().UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		if next := node.DeepCopy(); object(next) {
			_, err = b.Kube.CoreV1().Nodes().Update(ctx, next, metav1.UpdateOptions{})
		}
		return err
	})
}

// markPodsNotReady is the node lifecycle controller's step when a node stops being Ready
// (node_lifecycle_controller.go monitorNodeHealth): its pods' Ready condition set False,
// by upstream's own function (pkg/controller/util/node/controller_utils.go
// MarkPodsNotReady).
func (b *Bridge) markPodsNotReady(ctx context.Context, node string) error {
	list, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var pods []*apiv1.Pod
	for i := range list.Items {
		if list.Items[i].Spec.NodeName == node {
			pods = append(pods, &list.Items[i])
		}
	}
	return controllerutil.MarkPodsNotReady(ctx, b.Kube, b.recorder, pods, node)
}

// WorkerNodes lists the Node objects that are not control-plane nodes.
func (b *Bridge) WorkerNodes() []apiv1.Node {
	list, err := b.Kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []apiv1.Node
	for _, n := range list.Items {
		if _, control := n.Labels["node-role.kubernetes.io/control-plane"]; !control {
			out = append(out, n)
		}
	}
	return out
}
