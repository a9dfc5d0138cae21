package main

// The provider as a cluster runs it, seen from Kubernetes: its pods (the Deployment's pod
// template of deploy/kustomize/base/provider-deployment.yaml: labels, container ports and
// readiness probe), their readiness probe run as the kubelet runs it (Prober), their Ready
// condition written through pods/status, and the Service of provider-service.yaml, whose
// EndpointSlices upstream's EndpointSlice controller writes (controllers.go) and
// leader.go's proxy routes by. The processes are ours (procs.go); the Pod objects only carry
// what the kubelet would report about them.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

const (
	// The provider's Deployment and Service, relative to the repository's root.
	deploymentFile = "deploy/kustomize/base/provider-deployment.yaml"
	serviceFile    = "deploy/kustomize/base/provider-service.yaml"
	// The pod of a single provider (no --leader-elect).
	singlePod = "provider-0"
	// How much shorter the kubelet's probe period is here than the manifest says: tenfold, as
	// the autoscaler's --scan-interval (10 s upstream, 1 s here, main.go autoscalerFlags).
	probeTimerScale = 10
)

// readManifest reads the document of kind from the repository file rel into out.
func readManifest(rel, kind string, out any) error {
	path, err := findRepoFile(rel)
	if err != nil {
		return err
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(text), -1) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return fmt.Errorf("%s: %v", rel, err)
		}
		if head.Kind == kind {
			if err := yaml.Unmarshal([]byte(doc), out); err != nil {
				return fmt.Errorf("%s: %v", rel, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: no %s", rel, kind)
}

// deployedContainer is the provider container of the Deployment's pod template, and the
// template's labels.
func deployedContainer() (apiv1.Container, map[string]string, error) {
	var d appsv1.Deployment
	if err := readManifest(deploymentFile, "Deployment", &d); err != nil {
		return apiv1.Container{}, nil, err
	}
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].ReadinessProbe == nil || cs[0].ReadinessProbe.HTTPGet == nil {
		return apiv1.Container{}, nil, fmt.Errorf("%s: want one container with an httpGet readiness probe", deploymentFile)
	}
	return cs[0], d.Spec.Template.Labels, nil
}

// deployedService is provider-service.yaml's Service in the replicas' namespace. Without
// leader election its selector leaves out the role label, as the Helm chart renders it for
// one replica (deploy/helm/cks-autoscaler-provider/templates/service.yaml: the leader label
// only with leaderElect): no replica labels its pod then.
func deployedService(leaderElect bool) (*apiv1.Service, error) {
	var s apiv1.Service
	if err := readManifest(serviceFile, "Service", &s); err != nil {
		return nil, err
	}
	if s.Spec.Selector[roleLabel] != "leader" {
		return nil, fmt.Errorf("%s: the selector %v does not select %s=leader", serviceFile, s.Spec.Selector, roleLabel)
	}
	if !leaderElect {
		delete(s.Spec.Selector, roleLabel)
	}
	s.Namespace = providerNamespace
	return &s, nil
}

// createProviderObjects creates the replicas' pods (bound to a control-plane node: no
// kubelet here runs them, and bound the scheduler and the autoscaler's pending-pod logic
// leave them alone; the template's labels, container name, ports and readiness probe, no
// service-account token mounted) with the status a kubelet gives a started container that
// is not ready yet (each its own pod IP, the proxy's key back to the replica), and the
// Service.
func (e *Env) createProviderObjects(cs kubernetes.Interface, names []string, leaderElect bool) error {
	ctx := context.Background()
	ns := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: providerNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// The ServiceAccount (the ServiceAccount admission plugin refuses a pod naming one that
	// does not exist); providerIdentity made it already with leader election.
	sa := &apiv1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: providerAccount, Namespace: providerNamespace}}
	if _, err := cs.CoreV1().ServiceAccounts(providerNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	c, labels, err := deployedContainer()
	if err != nil {
		return err
	}
	host := "provider-host"
	if list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "node-role.kubernetes.io/control-plane"}); err == nil && len(list.Items) > 0 {
		host = list.Items[0].Name
	}
	no := false
	for i, name := range names {
		p := &apiv1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: providerNamespace, Labels: labels},
			Spec: apiv1.PodSpec{ServiceAccountName: providerAccount, AutomountServiceAccountToken: &no, NodeName: host,
				Containers: []apiv1.Container{{Name: c.Name, Image: c.Image, Ports: c.Ports, ReadinessProbe: c.ReadinessProbe}}},
		}
		created, err := cs.CoreV1().Pods(providerNamespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("pod %s: %v", name, err)
		}
		now := metav1.Now()
		ip := fmt.Sprintf("10.244.0.%d", 10+i)
		created.Status = apiv1.PodStatus{Phase: apiv1.PodRunning, HostIP: "127.0.0.1", HostIPs: []apiv1.HostIP{{IP: "127.0.0.1"}},
			PodIP: ip, PodIPs: []apiv1.PodIP{{IP: ip}}, StartTime: &now,
			Conditions: []apiv1.PodCondition{
				{Type: apiv1.PodScheduled, Status: apiv1.ConditionTrue, LastTransitionTime: now},
				{Type: apiv1.PodInitialized, Status: apiv1.ConditionTrue, LastTransitionTime: now},
				{Type: apiv1.ContainersReady, Status: apiv1.ConditionFalse, LastTransitionTime: now},
				{Type: apiv1.PodReady, Status: apiv1.ConditionFalse, LastTransitionTime: now},
			},
			ContainerStatuses: []apiv1.ContainerStatus{{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: false,
				State: apiv1.ContainerState{Running: &apiv1.ContainerStateRunning{StartedAt: now}}}},
		}
		if _, err := cs.CoreV1().Pods(providerNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("pod %s status: %v", name, err)
		}
	}
	svc, err := deployedService(leaderElect)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Services(providerNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("Service %s: %v", svc.Name, err)
	}
	return nil
}

// Prober is the kubelet's readiness prober and status manager for the provider's pods: for
// each pod a worker runs the container's readiness probe every period (the manifest's
// periodSeconds shortened probeTimerScale-fold; its timeoutSeconds as it is, a bound on a
// slow answer of a loaded machine rather than a pace of the cluster), counts
// failureThreshold failures or successThreshold successes in a row before it changes the
// result, and writes the pod's ContainersReady and Ready conditions through pods/status when
// the result changes (again at the next period when a write failed: the API server may be
// down). Follows kubernetes/kubernetes v1.33.1 pkg/kubelet/prober/worker.go (run, doProbe:
// the result runs and thresholds, a container that is not running is a failure at once, a
// new container starts not ready), pkg/kubelet/prober/prober.go and
// pkg/probe/http/http.go DoHTTPProbe (2xx and 3xx succeed), and
// pkg/kubelet/status/status_manager.go SetContainerReadiness (both conditions).
type Prober struct {
	kube    kubernetes.Interface
	logger  klog.Logger
	probe   apiv1.Probe
	period  time.Duration
	timeout time.Duration
	stop    chan struct{}
	done    sync.WaitGroup

	mu      sync.Mutex
	ready   map[string]bool // the last result per pod
	written map[string]int  // Ready condition writes per pod
	flips   map[string][]string
}

// StartProber starts a worker per pod of backends (pod -> replica). The probe's port must be
// the container port named "metrics" (the replica's MetricsURL).
func StartProber(kube kubernetes.Interface, logger klog.Logger, backends map[string]*Provider) (*Prober, error) {
	c, _, err := deployedContainer()
	if err != nil {
		return nil, err
	}
	probe := *c.ReadinessProbe
	port := probe.HTTPGet.Port
	metricsPort := int32(0)
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if !(port.Type == intstr.String && port.StrVal == "metrics") && !(port.Type == intstr.Int && port.IntVal == metricsPort) {
		return nil, fmt.Errorf("%s: the readiness probe's port %s is not the metrics port", deploymentFile, port.String())
	}
	// The API server's defaults for what the manifest leaves out (pkg/apis/core/v1/defaults.go
	// SetDefaults_Probe).
	if probe.PeriodSeconds == 0 {
		probe.PeriodSeconds = 10
	}
	if probe.TimeoutSeconds == 0 {
		probe.TimeoutSeconds = 1
	}
	if probe.FailureThreshold == 0 {
		probe.FailureThreshold = 3
	}
	if probe.SuccessThreshold == 0 {
		probe.SuccessThreshold = 1
	}
	p := &Prober{kube: kube, logger: logger, probe: probe,
		period:  time.Duration(probe.PeriodSeconds) * time.Second / probeTimerScale,
		timeout: time.Duration(probe.TimeoutSeconds) * time.Second,
		stop:    make(chan struct{}), ready: map[string]bool{}, written: map[string]int{}, flips: map[string][]string{}}
	for pod, r := range backends {
		p.done.Add(1)
		go p.worker(pod, r)
	}
	return p, nil
}

// worker is one pod's probe loop (worker.go run and doProbe) and its status writes.
func (p *Prober) worker(pod string, r *Provider) {
	defer p.done.Done()
	t := time.NewTicker(p.period)
	defer t.Stop()
	var container *Proc // the container the counts are of
	lastResult, resultRun := false, 0
	result := false // the result the kubelet reports (a new container: not ready)
	wrote, known := false, false
	for {
		proc := r.Proc
		ok := false
		switch {
		case proc == nil || proc.exited():
			// Not running: not ready at once (doProbe: "No container status" / not running).
			container, lastResult, resultRun, result = nil, false, 0, false
		default:
			if proc != container {
				// A new container (restarted): its worker starts over, not ready.
				container, lastResult, resultRun, result = proc, false, 0, false
			}
			ok = p.get(r)
			if ok == lastResult {
				resultRun++
			} else {
				lastResult, resultRun = ok, 1
			}
			if (!ok && resultRun >= int(p.probe.FailureThreshold)) || (ok && resultRun >= int(p.probe.SuccessThreshold)) {
				result = ok
			}
		}
		p.mu.Lock()
		if prev, seen := p.ready[pod]; !seen || prev != result {
			p.flips[pod] = append(p.flips[pod], fmt.Sprintf("%s %v", time.Now().Format("15:04:05.000"), result))
		}
		p.ready[pod] = result
		p.mu.Unlock()
		if !known || wrote != result {
			if err := p.writeReady(pod, result); err != nil {
				p.logger.Info("kubelet: pod status not written", "pod", pod, "ready", result, "err", err)
				known = false
			} else {
				wrote, known = result, true
			}
		}
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

// get is one HTTP probe of the replica's metrics address (pkg/probe/http/http.go).
func (p *Prober) get(r *Provider) bool {
	u, err := url.Parse(r.MetricsURL)
	if err != nil {
		return false
	}
	host, port, _ := net.SplitHostPort(u.Host)
	c := http.Client{Timeout: p.timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get("http://" + net.JoinHostPort(host, port) + p.probe.HTTPGet.Path)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

// writeReady sets the pod's ContainersReady and Ready conditions and its container's ready
// flag (status_manager.go SetContainerReadiness, then its sync: pods/status).
func (p *Prober) writeReady(pod string, ready bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur, err := p.kube.CoreV1().Pods(providerNamespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	status := apiv1.ConditionFalse
	if ready {
		status = apiv1.ConditionTrue
	}
	now := metav1.Now()
	for _, t := range []apiv1.PodConditionType{apiv1.ContainersReady, apiv1.PodReady} {
		found := false
		for i := range cur.Status.Conditions {
			c := &cur.Status.Conditions[i]
			if c.Type == t {
				found = true
				if c.Status != status {
					c.Status, c.LastTransitionTime = status, now
				}
			}
		}
		if !found {
			cur.Status.Conditions = append(cur.Status.Conditions, apiv1.PodCondition{Type: t, Status: status, LastTransitionTime: now})
		}
	}
	for i := range cur.Status.ContainerStatuses {
		cur.Status.ContainerStatuses[i].Ready = ready
	}
	if _, err := p.kube.CoreV1().Pods(providerNamespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return err
	}
	p.mu.Lock()
	p.written[pod]++
	p.mu.Unlock()
	return nil
}

// Ready is the probe's last result for pod.
func (p *Prober) Ready(pod string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready[pod]
}

// Flips is every change of pod's result, "HH:MM:SS.mmm true|false", for a failure's message.
func (p *Prober) Flips(pod string) []string {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string{}, p.flips[pod]...)
}

// Stop ends the workers.
func (p *Prober) Stop() {
	if p == nil {
		return
	}
	close(p.stop)
	p.done.Wait()
}

// routeProviders puts the pods, the prober and the proxy in front of the replicas (pod ->
// replica) and writes the autoscaler's cloud-config with the proxy's address: the proxy
// forwards TCP, the TLS session is the autoscaler's with the replica.
func (e *Env) routeProviders(cs kubernetes.Interface, tls TLSFiles, replicas map[string]*Provider, leaderElect bool) error {
	var names []string
	for n := range replicas {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := e.createProviderObjects(cs, names, leaderElect); err != nil {
		return err
	}
	svc, err := deployedService(leaderElect)
	if err != nil {
		return err
	}
	e.Prober, err = StartProber(cs, e.logger.WithName("kubelet"), replicas)
	if err != nil {
		return err
	}
	e.Proxy, err = StartLeaderProxy(cs, svc.Name, replicas)
	if err != nil {
		return err
	}
	yaml := "address: \"localhost:" + strconv.Itoa(e.Proxy.Port) + "\"\nkey: " + tls.ClientKey + "\ncert: " + tls.ClientCert + "\ncacert: " + tls.CA + "\ngrpc_timeout: 10s\n"
	return os.WriteFile(autoscalerCloudConfig(e.Dir), []byte(yaml), 0o600)
}

// routeSingle is routeProviders for the one provider a scenario without Providers starts:
// its pod, Ready once its probe succeeds, and the Service's endpoint before upstream starts.
func (e *Env) routeSingle(tls TLSFiles) error {
	cs, err := kubernetes.NewForConfig(e.Kube.Config(50, 100))
	if err != nil {
		return err
	}
	if err := e.routeProviders(cs, tls, map[string]*Provider{singlePod: e.Prov}, false); err != nil {
		return err
	}
	return e.waitEndpoint(singlePod, 60*time.Second)
}

// waitEndpoint waits (bounded) for the proxy to send new connections to pod.
func (e *Env) waitEndpoint(pod string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for e.Proxy.Current() != pod {
		if time.Now().After(deadline) {
			return fmt.Errorf("the Service's ready endpoint is %q, not %s, after %s (probe results %v)", e.Proxy.Current(), pod, within, e.Prober.Flips(pod))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
