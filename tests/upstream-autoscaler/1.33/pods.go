package main

// The bridge's pods: what the kubelet does with the pods bound to its node, pod garbage
// collection, and the pod side of CloudStack's drain. Paths are of kubernetes/kubernetes
// v1.33.1 (the module cache's copy) unless said otherwise. The rest of a pod's life is the
// API server's and upstream's own code (controllers.go): creation by the ReplicaSet
// controller (a Deployment's) with the API server's defaults and admission (generated name, the
// DefaultTolerationSeconds tolerations), binding by kube-scheduler, graceful deletion and the
// eviction subresource with its PodDisruptionBudget checks
// (pkg/registry/core/pod/storage/eviction.go), the budgets' status by the disruption
// controller, eviction off a NoExecute taint by the taint eviction controller. Not modelled:
// the kubelet's grace period on a live node (the containers, pause, stop at once), container
// restarts, probes (a running pod is Ready), the pod's IPs.

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

const podNamespace = "default"

func (b *Bridge) isKubeletUp(node string) bool {
	b.upMu.Lock()
	defer b.upMu.Unlock()
	return node != "" && b.kubeletUp[node]
}

func terminal(p *apiv1.Pod) bool {
	return p.Status.Phase == apiv1.PodSucceeded || p.Status.Phase == apiv1.PodFailed
}

func podCondition(p *apiv1.Pod, t apiv1.PodConditionType) *apiv1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// setPodCondition is pkg/api/v1/pod/util.go UpdatePodCondition: the transition time moves
// only when the status does. Reports whether anything changed.
func setPodCondition(p *apiv1.Pod, t apiv1.PodConditionType, status apiv1.ConditionStatus, reason string, now metav1.Time) bool {
	if c := podCondition(p, t); c != nil {
		if c.Status == status && c.Reason == reason {
			return false
		}
		if c.Status != status {
			c.LastTransitionTime = now
		}
		c.Status, c.Reason = status, reason
		return true
	}
	p.Status.Conditions = append(p.Status.Conditions, apiv1.PodCondition{Type: t, Status: status, Reason: reason, LastTransitionTime: now})
	return true
}

// runPod is the status the kubelet posts for a pod whose containers run (pkg/kubelet/
// kubelet_pods.go generateAPIPodStatus and getPhase: every container running → Running;
// pkg/kubelet/status/generate.go GeneratePodInitializedCondition,
// GenerateContainersReadyCondition, GeneratePodReadyCondition: no init container, every
// container ready (no readiness probe) → True; GeneratePodReadyToStartContainersCondition:
// the sandbox is up). Reports whether anything changed.
func runPod(p *apiv1.Pod, now metav1.Time) bool {
	changed := false
	if p.Status.Phase != apiv1.PodRunning {
		p.Status.Phase = apiv1.PodRunning
		changed = true
	}
	if p.Status.StartTime == nil {
		p.Status.StartTime = &now
		changed = true
	}
	for _, t := range []apiv1.PodConditionType{apiv1.PodReadyToStartContainers, apiv1.PodInitialized, apiv1.ContainersReady, apiv1.PodReady} {
		changed = setPodCondition(p, t, apiv1.ConditionTrue, "", now) || changed
	}
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		p.Status.ContainerStatuses = nil
		started := true
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, apiv1.ContainerStatus{
				Name: c.Name, Image: c.Image, Ready: true, Started: &started,
				State: apiv1.ContainerState{Running: &apiv1.ContainerStateRunning{StartedAt: now}}})
		}
		changed = true
	}
	return changed
}

// finishDeletion is the kubelet's end of a graceful deletion of a pod of its node: it stops
// the containers and posts the terminal phase (kubelet_pods.go getPhase: a terminal pod whose
// containers all stopped; Succeeded, pause exiting 0 on SIGTERM, *unverified*: pause's source
// is not in the module cache), then the status manager deletes the pod for good
// (pkg/kubelet/status/status_manager.go syncPod and canBeDeleted: grace period 0, the pod's
// UID as precondition).
func (b *Bridge) finishDeletion(ctx context.Context, p *apiv1.Pod) error {
	if !terminal(p) {
		done := p.DeepCopy()
		done.Status.Phase = apiv1.PodSucceeded
		now := metav1.Now()
		for _, t := range []apiv1.PodConditionType{apiv1.ContainersReady, apiv1.PodReady} {
			setPodCondition(done, t, apiv1.ConditionFalse, "PodCompleted", now)
		}
		if _, err := b.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, done, metav1.UpdateOptions{}); err != nil {
			return ignoreGone(err)
		}
	}
	zero := int64(0)
	return ignoreGone(b.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: metav1.NewUIDPreconditions(string(p.UID))}))
}

// ignoreGone: a pod deleted meanwhile (not found), or replaced by another of the same name
// (the UID precondition: conflict), is nothing to do.
func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// drain is kubectl drain's part of CloudStack's removal of a running VM's node (cks-sim
// removes the VM, the bridge its node, nodes.go), as k8s.io/kubectl v0.33.1 pkg/drain does it
// (drain.go evictPods: an eviction per pod, policy/v1, with the pod's own grace period, then
// waitForDelete until each is gone, which its kubelet, still up at that moment, makes
// short). The flags CloudStack passes (--ignore-daemonsets, --delete-emptydir-data: no
// DaemonSet pod or emptyDir runs here anyway) are cks-sim's model, unverified here. cks-sim
// decides whether CloudStack's drain fails (its faildrains); an eviction the API server
// refuses here (a PodDisruptionBudget, which kubectl tries again every 5 s until its
// --timeout) is not fed back to it: the pod is left, to the pod garbage collector once the
// node is gone.
func (b *Bridge) drain(ctx context.Context, node string) error {
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node {
			continue
		}
		if p.DeletionTimestamp == nil {
			err := b.Kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			if apierrors.IsTooManyRequests(err) {
				klog.FromContext(ctx).Info("CloudStack's drain: eviction refused", "node", node, "pod", p.Name, "err", err)
				continue
			}
			if err := ignoreGone(err); err != nil {
				return err
			}
			fresh, err := b.Kube.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return err
			}
			p = fresh
		}
		if err := b.finishDeletion(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// pods runs one pass of the kubelets and of pod garbage collection; nodes are the nodes
// that exist.
func (b *Bridge) pods(ctx context.Context, now time.Time, nodes map[string]bool) error {
	podList, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	stamp := metav1.NewTime(now)
	orphaned := map[string]bool{}
	for i := range podList.Items {
		p := &podList.Items[i]
		switch {
		case p.Spec.NodeName == "":
		case !nodes[p.Spec.NodeName]:
			// pkg/controller/podgc/gc_controller.go gcOrphaned: a pod bound to a node that
			// no longer exists, still missing after quarantineTime, is marked Failed with the
			// DisruptionTarget condition DeletionByPodGC and deleted at once
			// (markFailedAndDeletePodWithCondition).
			orphaned[p.Spec.NodeName] = true
			since, ok := b.orphanSince[p.Spec.NodeName]
			if !ok {
				b.orphanSince[p.Spec.NodeName] = now
			} else if now.Sub(since) >= podGCQuarantine {
				if err := b.collect(ctx, p, stamp); err != nil {
					return err
				}
			}
		case !b.isKubeletUp(p.Spec.NodeName):
			// A silent kubelet does nothing: its pods stay as they are (Terminating when
			// deleted) until it comes back or its node is deleted.
		case p.DeletionTimestamp != nil:
			if err := b.finishDeletion(ctx, p); err != nil {
				return err
			}
		case !terminal(p):
			// The kubelet starts a pod bound to its node, and posts Ready again for its pods
			// when it comes back (the node lifecycle controller marked them not ready).
			run := p.DeepCopy()
			if runPod(run, stamp) {
				if _, err := b.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, run, metav1.UpdateOptions{}); err != nil && ignoreGone(err) != nil {
					return err
				}
			}
		}
	}
	for n := range b.orphanSince {
		if !orphaned[n] {
			delete(b.orphanSince, n)
		}
	}
	return nil
}

// collect is gc_controller.go markFailedAndDeletePodWithCondition for an orphaned pod.
func (b *Bridge) collect(ctx context.Context, p *apiv1.Pod, now metav1.Time) error {
	if !terminal(p) {
		failed := p.DeepCopy()
		failed.Status.Phase = apiv1.PodFailed
		c := podCondition(failed, apiv1.DisruptionTarget)
		if c == nil {
			failed.Status.Conditions = append(failed.Status.Conditions, apiv1.PodCondition{Type: apiv1.DisruptionTarget})
			c = &failed.Status.Conditions[len(failed.Status.Conditions)-1]
		}
		c.Status, c.Reason, c.Message, c.LastTransitionTime = apiv1.ConditionTrue, "DeletionByPodGC", "PodGC: node no longer exists", now
		if _, err := b.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, failed, metav1.UpdateOptions{}); err != nil {
			return ignoreGone(err)
		}
	}
	zero := int64(0)
	return ignoreGone(b.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
}

// podTemplate is the pods of a workload: one container requesting cpu and memory.
func podTemplate(labels map[string]string, cpu, mem string) apiv1.PodTemplateSpec {
	return apiv1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Image: "pause",
			Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: quantity(cpu), apiv1.ResourceMemory: quantity(mem)}}}}},
	}
}

// AddPods creates Deployment name with n replicas, each pod requesting cpu and memory; its
// controller, the ReplicaSet's and the scheduler do the rest.
func (b *Bridge) AddPods(name string, n int, cpu, mem string) error {
	replicas := int32(n)
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate(labels, cpu, mem)},
	}
	_, err := b.Kube.AppsV1().Deployments(podNamespace).Create(context.Background(), d, metav1.CreateOptions{})
	return err
}

// AddPDB creates a PodDisruptionBudget name over the pods labelled app=app, with
// minAvailable.
func (b *Bridge) AddPDB(name, app string, minAvailable int) error {
	min := intstr.FromInt32(int32(minAvailable))
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &min,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}
	_, err := b.Kube.PolicyV1().PodDisruptionBudgets(podNamespace).Create(context.Background(), pdb, metav1.CreateOptions{})
	return err
}

// Scale sets Deployment name's replicas (kubectl scale).
func (b *Bridge) Scale(name string, n int) error {
	ctx := context.Background()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := b.Kube.AppsV1().Deployments(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		replicas := int32(n)
		d.Spec.Replicas = &replicas
		_, err = b.Kube.AppsV1().Deployments(podNamespace).Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
}

// PodCounts counts the pods not being deleted: bound and pending.
func (b *Bridge) PodCounts() (bound, pending int) {
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return -1, -1
	}
	for _, p := range pods.Items {
		switch {
		case p.DeletionTimestamp != nil || terminal(&p):
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
