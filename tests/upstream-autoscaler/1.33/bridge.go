package main

// The bridge: what the components of a real cluster that do not run here do (the kubelets,
// the node lifecycle controller, pod garbage collection, and CloudStack's kubectl), written
// to the scenario's API server (kube.go), each named with the kubernetes/kubernetes (v1.33.1,
// the module cache's copy) file and function whose behaviour it follows. The controllers and
// the scheduler that do run are upstream's own (controllers.go). This file: cks-sim's
// client; nodes.go: the nodes (kubelet, node lifecycle controller, kubectl drain/cordon as
// CloudStack runs them); pods.go: the pods (the kubelet's part, pod garbage collection, the
// evictions of CloudStack's drain).

import (
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
)

// SimNode is one entry of cks-sim's simListNodes.
type SimNode struct {
	Name       string `json:"name"`
	ProviderID string `json:"providerid"`
	VMID       string `json:"vmid"`
	ClusterID  string `json:"clusterid"`
	Ready      bool   `json:"ready"`
	// Cordoned: CloudStack's kubectl drain cordons the node first and a failed drain leaves
	// it so (cks-sim's model of KubernetesClusterScaleWorker).
	Unschedulable bool              `json:"unschedulable"`
	Role          string            `json:"role"`
	Labels        map[string]string `json:"labels"`
	Allocatable   map[string]string `json:"allocatable"`
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
	Names     map[string]string // worker VM id -> VM name
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
	cl := Cluster{ID: c.ID, State: c.State, Size: c.Size, Workers: map[string]string{}, Names: map[string]string{}}
	for _, vm := range c.VMs {
		if strings.Contains(vm.Name, "-node-") && !vm.IsExternal && !vm.IsEtcd {
			cl.Workers[vm.ID] = vm.State
			cl.Names[vm.ID] = vm.Name
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

// VMStates maps every VM of every cluster (listKubernetesClusters) to its state.
func (s *Sim) VMStates() (map[string]string, error) {
	out, err := s.Call("listKubernetesClusters")
	if err != nil {
		return nil, err
	}
	raw, _ := json.Marshal(out["listkubernetesclustersresponse"])
	var r struct {
		Clusters []struct {
			VMs []struct {
				ID    string `json:"id"`
				State string `json:"state"`
			} `json:"virtualmachines"`
		} `json:"kubernetescluster"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("listKubernetesClusters: %v", err)
	}
	states := map[string]string{}
	for _, c := range r.Clusters {
		for _, vm := range c.VMs {
			states[vm.ID] = vm.State
		}
	}
	return states, nil
}
