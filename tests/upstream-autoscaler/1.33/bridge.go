package main

// The bridge: the kubelet's, the cloud-controller-manager's and the scheduler's part, on the
// fake clientset. It mirrors cks-sim's registered nodes into Node objects (providerID, labels,
// allocatable, Ready while the VM runs, NotReady while it is down, deleted when the VM goes)
// and binds pending pods to Ready nodes with room, marking the others unschedulable as
// kube-scheduler does (PodScheduled=False, reason Unschedulable).

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// SimNode is one entry of cks-sim's simListNodes.
type SimNode struct {
	Name        string            `json:"name"`
	ProviderID  string            `json:"providerid"`
	VMID        string            `json:"vmid"`
	ClusterID   string            `json:"clusterid"`
	Ready       bool              `json:"ready"`
	Role        string            `json:"role"`
	Labels      map[string]string `json:"labels"`
	Allocatable map[string]string `json:"allocatable"`
}

func (s *Sim) get(params url.Values) ([]byte, error) {
	resp, err := http.Get(s.URL + "?" + params.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return body, fmt.Errorf("%s: HTTP %d: %s", params.Get("command"), resp.StatusCode, body)
	}
	return body, nil
}

// Admin calls a simulator-only command (no signature).
func (s *Sim) Admin(command string, kv ...string) ([]byte, error) {
	p := url.Values{"command": {command}, "response": {"json"}}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Set(kv[i], kv[i+1])
	}
	return s.get(p)
}

// Call calls a CloudStack command, signed as CloudStack wants it.
func (s *Sim) Call(command string, kv ...string) (map[string]any, error) {
	p := url.Values{"command": {command}, "response": {"json"}, "apiKey": {s.Key}}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Set(kv[i], kv[i+1])
	}
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+strings.ReplaceAll(url.QueryEscape(p.Get(k)), "+", "%20"))
	}
	mac := hmac.New(sha1.New, []byte(s.Secret))
	mac.Write([]byte(strings.ToLower(strings.Join(parts, "&"))))
	p.Set("signature", base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	body, err := s.get(p)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Nodes lists the registered Kubernetes nodes the simulator's kubelets present.
func (s *Sim) Nodes() ([]SimNode, error) {
	body, err := s.Admin("simListNodes")
	if err != nil {
		return nil, err
	}
	var r struct {
		R struct {
			Node []SimNode `json:"node"`
		} `json:"simlistnodesresponse"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, err
	}
	return r.R.Node, nil
}

// Cluster is the one cluster of a scenario as listKubernetesClusters shows it.
type Cluster struct {
	ID, State string
	Size      int
	Workers   map[string]string // worker VM id -> state
}

// Cluster lists the scenario's cluster (the first one).
func (s *Sim) Cluster() (Cluster, error) {
	out, err := s.Call("listKubernetesClusters")
	if err != nil {
		return Cluster{}, err
	}
	raw, _ := json.Marshal(out["listkubernetesclustersresponse"])
	var r struct {
		Clusters []struct {
			ID    string `json:"id"`
			State string `json:"state"`
			Size  int    `json:"size"`
			VMs   []struct {
				ID         string `json:"id"`
				Name       string `json:"name"`
				State      string `json:"state"`
				IsExternal bool   `json:"isexternalnode"`
				IsEtcd     bool   `json:"isetcdnode"`
			} `json:"virtualmachines"`
		} `json:"kubernetescluster"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || len(r.Clusters) == 0 {
		return Cluster{}, fmt.Errorf("listKubernetesClusters: %v %s", err, raw)
	}
	c := r.Clusters[0]
	cl := Cluster{ID: c.ID, State: c.State, Size: c.Size, Workers: map[string]string{}}
	for _, vm := range c.VMs {
		if strings.Contains(vm.Name, "-node-") && !vm.IsExternal && !vm.IsEtcd {
			cl.Workers[vm.ID] = vm.State
		}
	}
	return cl, nil
}

// Requests counts the CloudStack requests of one command the simulator received.
func (s *Sim) Requests(command string) ([]map[string]string, error) {
	body, err := s.Admin("simRequests", "cmd", command)
	if err != nil {
		return nil, err
	}
	var r struct {
		R struct {
			Request []struct {
				Params map[string]string `json:"params"`
			} `json:"request"`
		} `json:"simrequestsresponse"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, err
	}
	out := []map[string]string{}
	for _, q := range r.R.Request {
		out = append(out, q.Params)
	}
	return out, nil
}

// Bridge mirrors the simulator into the fake clientset.
type Bridge struct {
	Sim  *Sim
	Kube *fake.Clientset
	// synced: the first Sync is done. Nodes found by the first one were there before the
	// scenario: created an hour ago, so upstream counts them unready, not "not started".
	synced bool
}

const podNamespace = "default"

const unreachableTaint = "node.kubernetes.io/unreachable"

func quantity(s string) resource.Quantity {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}
	}
	return q
}

func readyCondition(n *apiv1.Node) *apiv1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == apiv1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// Sync mirrors the nodes, then schedules the pods.
func (b *Bridge) Sync() error {
	ctx := context.Background()
	simNodes, err := b.Sim.Nodes()
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
	now := metav1.Now()
	seen := map[string]bool{}
	for _, sn := range simNodes {
		seen[sn.Name] = true
		status := apiv1.ConditionFalse
		reason := "NodeStatusUnknown"
		if sn.Ready {
			status, reason = apiv1.ConditionTrue, "KubeletReady"
		}
		alloc := apiv1.ResourceList{}
		for k, v := range sn.Allocatable {
			alloc[apiv1.ResourceName(k)] = quantity(v)
		}
		mutate := func(node *apiv1.Node) bool {
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
			if len(alloc) > 0 && len(node.Status.Allocatable) != len(alloc) {
				node.Status.Allocatable, node.Status.Capacity = alloc, alloc.DeepCopy()
				changed = true
			}
			if c := readyCondition(node); c == nil {
				node.Status.Conditions = append(node.Status.Conditions, apiv1.NodeCondition{
					Type: apiv1.NodeReady, Status: status, Reason: reason, LastTransitionTime: now, LastHeartbeatTime: now})
				changed = true
			} else if c.Status != status {
				c.Status, c.Reason, c.LastTransitionTime, c.LastHeartbeatTime = status, reason, now, now
				changed = true
			}
			// The node lifecycle controller's taint on a node whose kubelet stopped
			// reporting (kube-scheduler, and upstream's simulation of it, skip such a node).
			tainted := -1
			for i, t := range node.Spec.Taints {
				if t.Key == unreachableTaint {
					tainted = i
				}
			}
			if !sn.Ready && tainted < 0 {
				node.Spec.Taints = append(node.Spec.Taints, apiv1.Taint{Key: unreachableTaint, Effect: apiv1.TaintEffectNoSchedule})
				changed = true
			} else if sn.Ready && tainted >= 0 {
				node.Spec.Taints = append(node.Spec.Taints[:tainted], node.Spec.Taints[tainted+1:]...)
				changed = true
			}
			return changed
		}
		if node, ok := existing[sn.Name]; ok {
			if !mutate(node.DeepCopy()) {
				continue
			}
			// Changed: apply the change to the newest copy, so taints the autoscaler wrote
			// since the listing stay.
			fresh, err := b.Kube.CoreV1().Nodes().Get(ctx, sn.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			mutate(fresh)
			if _, err := b.Kube.CoreV1().Nodes().Update(ctx, fresh, metav1.UpdateOptions{}); err != nil {
				return err
			}
			continue
		}
		created := now
		if !b.synced {
			created = metav1.NewTime(now.Add(-time.Hour))
		}
		node := &apiv1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: sn.Name, CreationTimestamp: created, Labels: map[string]string{}},
			Spec:       apiv1.NodeSpec{ProviderID: sn.ProviderID},
		}
		if sn.Role == "control" {
			// kubeadm's control-plane taint (CKS control nodes run no workload).
			node.Spec.Taints = []apiv1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: apiv1.TaintEffectNoSchedule}}
		}
		mutate(node)
		if _, err := b.Kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for name := range existing {
		if !seen[name] {
			// The VM is gone: CloudStack drained and deleted the node.
			if err := b.Kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				return err
			}
		}
	}
	b.synced = true
	return b.Schedule()
}

func podRequests(p *apiv1.Pod) (cpu, mem int64) {
	for _, c := range p.Spec.Containers {
		cpu += c.Resources.Requests.Cpu().MilliValue()
		mem += c.Resources.Requests.Memory().Value()
	}
	return
}

func schedulable(n *apiv1.Node) bool {
	if c := readyCondition(n); c == nil || c.Status != apiv1.ConditionTrue || n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == apiv1.TaintEffectNoSchedule || t.Effect == apiv1.TaintEffectNoExecute {
			return false
		}
	}
	return true
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

// Schedule binds pending pods (by name) to the first Ready node with room; a pod whose node
// is gone is pending again (its controller would recreate it).
func (b *Bridge) Schedule() error {
	ctx := context.Background()
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
			pending = append(pending, p)
			continue
		}
		r, ok := free[p.Spec.NodeName]
		if !ok {
			p.Spec.NodeName = ""
			p.Status.Phase = apiv1.PodPending
			pending = append(pending, p)
			continue
		}
		c, m := podRequests(p)
		r.cpu, r.mem, r.pods = r.cpu-c, r.mem-m, r.pods-1
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i].Name < pending[j].Name })
	for _, p := range pending {
		c, m := podRequests(p)
		bound := false
		for _, name := range names {
			r := free[name]
			if schedulable(byName[name]) && r.cpu >= c && r.mem >= m && r.pods >= 1 {
				r.cpu, r.mem, r.pods = r.cpu-c, r.mem-m, r.pods-1
				p.Spec.NodeName = name
				p.Status.Phase = apiv1.PodRunning
				setScheduled(p, apiv1.ConditionTrue, "")
				bound = true
				break
			}
		}
		if !bound {
			setScheduled(p, apiv1.ConditionFalse, apiv1.PodReasonUnschedulable)
		}
		if _, err := b.Kube.CoreV1().Pods(podNamespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// AddPods creates n pods named prefix-<i>, each requesting cpu and memory.
func (b *Bridge) AddPods(prefix string, n int, cpu, mem string) error {
	for i := 0; i < n; i++ {
		p := &apiv1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: podNamespace, CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Minute))},
			Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Image: "pause",
				Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: quantity(cpu), apiv1.ResourceMemory: quantity(mem)}}}}},
			Status: apiv1.PodStatus{Phase: apiv1.PodPending},
		}
		if _, err := b.Kube.CoreV1().Pods(podNamespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return b.Schedule()
}

// DeletePods deletes every pod whose name starts with prefix.
func (b *Bridge) DeletePods(prefix string) error {
	ctx := context.Background()
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, prefix) {
			if err := b.Kube.CoreV1().Pods(podNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// PodCounts counts bound and pending pods.
func (b *Bridge) PodCounts() (bound, pending int) {
	pods, err := b.Kube.CoreV1().Pods(podNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return -1, -1
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			bound++
		} else {
			pending++
		}
	}
	return
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
