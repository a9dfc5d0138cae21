package main

// Two provider replicas with --leader-elect, as deploy/ runs them: each with the pod's name
// and namespace (POD_NAME, POD_NAMESPACE), the shared ledger in a ConfigMap
// (--state-configmap), the Kubernetes API reached as from inside a pod (in-cluster config:
// KUBERNETES_SERVICE_HOST/PORT and the service account's token, ca.crt and namespace, from the
// directory CKS_PROVIDER_SERVICE_ACCOUNT_DIR names) with a token of its own ServiceAccount
// bound to the Roles of deploy/kustomize/base/provider-rbac.yaml, read from that file. As
// tests/it/leader.rs runs them. The Pod objects carry the role label and the Ready condition
// the kubelet's readiness probe decides (service.go): no kubelet runs them (the processes run
// here), they are bound to the control-plane node so the scheduler and the autoscaler leave
// them alone.
//
// The autoscaler reaches the leader through LeaderProxy: in a cluster, the Service
// (provider-service.yaml) selects the pods labelled cks-autoscaler-provider/role=leader, the
// EndpointSlice controller lists them with their readiness, and kube-proxy sends each new
// connection to a ready one among them.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apiv1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"
)

const (
	// The replicas' namespace, ServiceAccount and ledger (provider-deployment.yaml's names).
	providerNamespace = "cks-provider"
	providerAccount   = "cks-autoscaler-provider"
	stateConfigMap    = "cks-autoscaler-provider-state"
	// The label the leader puts on its pod (src/app.rs ROLE_LABEL), which the Service selects.
	roleLabel = "cks-autoscaler-provider/role"
	// The RBAC the replicas get, relative to the repository's root.
	rbacFile = "deploy/kustomize/base/provider-rbac.yaml"
)

// Short timings of the defaults' shape (15 s / 10 s / 2 s), as tests/it/leader.rs has them.
var leaderElectFlags = []string{"--leader-elect",
	"--leader-elect-lease-duration", "3s", "--leader-elect-renew-deadline", "2s", "--leader-elect-retry-period", "200ms"}

// findRepoFile finds rel (a path inside the repository) above the driver's executable (built
// into target/upstream-autoscaler/) or above the working directory.
func findRepoFile(rel string) (string, error) {
	var starts []string
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, d := range starts {
		for {
			p := filepath.Join(d, rel)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
			up := filepath.Dir(d)
			if up == d {
				break
			}
			d = up
		}
	}
	return "", fmt.Errorf("no %s above the driver nor the working directory", rel)
}

// deployedRBAC reads the Roles and RoleBindings of the kustomize base's provider RBAC, the
// RoleBindings' ServiceAccount subjects in namespace ns (what kustomize fills in). The
// ClusterRole (nodes, for --confirm-node-marks, not used here) is left out.
func deployedRBAC(ns string) ([]rbacv1.Role, []rbacv1.RoleBinding, error) {
	path, err := findRepoFile(rbacFile)
	if err != nil {
		return nil, nil, err
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var roles []rbacv1.Role
	var bindings []rbacv1.RoleBinding
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(text), -1) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, nil, fmt.Errorf("%s: %v", rbacFile, err)
		}
		switch head.Kind {
		case "Role":
			var r rbacv1.Role
			if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
				return nil, nil, fmt.Errorf("%s: %v", rbacFile, err)
			}
			r.Namespace = ns
			roles = append(roles, r)
		case "RoleBinding":
			var b rbacv1.RoleBinding
			if err := yaml.Unmarshal([]byte(doc), &b); err != nil {
				return nil, nil, fmt.Errorf("%s: %v", rbacFile, err)
			}
			b.Namespace = ns
			for i := range b.Subjects {
				if b.Subjects[i].Kind == "ServiceAccount" && b.Subjects[i].Namespace == "" {
					b.Subjects[i].Namespace = ns
				}
			}
			bindings = append(bindings, b)
		}
	}
	if len(roles) == 0 || len(bindings) == 0 {
		return nil, nil, fmt.Errorf("%s: %d Roles, %d RoleBindings", rbacFile, len(roles), len(bindings))
	}
	return roles, bindings, nil
}

// providerIdentity creates the replicas' namespace, ServiceAccount and RBAC, mints a token
// for the ServiceAccount (TokenRequest) and writes the service-account directory a pod would
// have mounted: token, ca.crt, namespace.
func (e *Env) providerIdentity(cs kubernetes.Interface) (string, error) {
	ctx := context.Background()
	ns := &apiv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: providerNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	sa := &apiv1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: providerAccount, Namespace: providerNamespace}}
	if _, err := cs.CoreV1().ServiceAccounts(providerNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	roles, bindings, err := deployedRBAC(providerNamespace)
	if err != nil {
		return "", err
	}
	for i := range roles {
		if _, err := cs.RbacV1().Roles(providerNamespace).Create(ctx, &roles[i], metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("Role %s: %v", roles[i].Name, err)
		}
	}
	for i := range bindings {
		if _, err := cs.RbacV1().RoleBindings(providerNamespace).Create(ctx, &bindings[i], metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("RoleBinding %s: %v", bindings[i].Name, err)
		}
	}
	expiry := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(providerNamespace).CreateToken(ctx, providerAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest: %v", err)
	}
	dir := filepath.Join(e.Dir, "serviceaccount")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	ca, err := os.ReadFile(e.Kube.CAFile)
	if err != nil {
		return "", err
	}
	for name, body := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": ca, "namespace": []byte(providerNamespace)} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// startLeaderReplicas is leader-failover's Providers: the identity, the replicas' pods and
// Service, their probes and the proxy (service.go routeProviders; the autoscaler's
// cloud-config names the proxy), provider-a started and leading, then provider-b started and
// standing by. e.Prov is provider-a.
func startLeaderReplicas(e *Env, tls TLSFiles, nodes string, flags []string) error {
	cs, err := kubernetes.NewForConfig(e.Kube.Config(50, 100))
	if err != nil {
		return err
	}
	saDir, err := e.providerIdentity(cs)
	if err != nil {
		return err
	}
	names := []string{"provider-a", "provider-b"}
	apiPort := e.Kube.URL[strings.LastIndex(e.Kube.URL, ":")+1:]
	e.Replicas = map[string]*Provider{}
	for _, name := range names {
		p, err := newReplica(e, name, tls, nodes, flags, []string{
			"POD_NAME=" + name, "POD_NAMESPACE=" + providerNamespace,
			"KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=" + apiPort,
			"CKS_PROVIDER_SERVICE_ACCOUNT_DIR=" + saDir,
		})
		if err != nil {
			return err
		}
		e.Replicas[name] = p
	}
	if err := e.routeProviders(cs, tls, e.Replicas, true); err != nil {
		return err
	}
	e.Prov = e.Replicas["provider-a"]
	if err := e.Prov.Restart(); err != nil {
		return err
	}
	if err := waitRole(cs, "provider-a", "leader", 60*time.Second); err != nil {
		return err
	}
	if err := e.waitEndpoint("provider-a", 60*time.Second); err != nil {
		return err
	}
	if err := e.Replicas["provider-b"].Restart(); err != nil {
		return err
	}
	return waitRole(cs, "provider-b", "standby", 60*time.Second)
}

// newReplica is a provider (not started) in its own directory e.Dir/<name>, with StartProvider's
// flags and the leader-election ones.
func newReplica(e *Env, name string, tls TLSFiles, nodes string, flags, env []string) (*Provider, error) {
	dir := filepath.Join(e.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := stablePort()
	if err != nil {
		return nil, err
	}
	mport, err := stablePort()
	for err == nil && mport == port {
		mport, err = stablePort()
	}
	if err != nil {
		return nil, err
	}
	ini := filepath.Join(dir, "cloudstack.ini")
	api := e.Sim.URL
	if e.CloudStack != nil {
		// The way to CloudStack a scenario can cut (outage.go).
		api = e.CloudStack.URL
	}
	if err := os.WriteFile(ini, []byte(fmt.Sprintf("[Global]\napi-url = %s\napi-key = %s\nsecret-key = %s\n", api, e.Sim.Key, e.Sim.Secret)), 0o600); err != nil {
		return nil, err
	}
	p := &Provider{dir: dir, bin: e.ProvBin, env: env, Addr: fmt.Sprintf("127.0.0.1:%d", port),
		MetricsURL: fmt.Sprintf("http://127.0.0.1:%d", mport), CloudConfig: autoscalerCloudConfig(e.Dir)}
	p.args = append([]string{"serve",
		"--listen", p.Addr, "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", mport),
		"--cloud-config", ini, "--nodes", nodes,
		"--tls-cert", tls.ServerCert, "--tls-key", tls.ServerKey, "--tls-client-ca", tls.CA,
		"--job-poll-interval", "500ms", "--refresh-min-interval", "500ms",
		"--state-configmap", stateConfigMap,
	}, append(append([]string{}, leaderElectFlags...), flags...)...)
	return p, nil
}

// podRole is a replica's pod's role label ("" when absent or unreadable).
func podRole(cs kubernetes.Interface, pod string) string {
	p, err := cs.CoreV1().Pods(providerNamespace).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return p.Labels[roleLabel]
}

func waitRole(cs kubernetes.Interface, pod, role string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for podRole(cs, pod) != role {
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s not labelled %s=%s within %s (it is %q)", pod, roleLabel, role, within, podRole(cs, pod))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// LeaderProxy imitates kube-proxy for the provider's Service (provider-service.yaml, its
// selector the leader's label with leader election) on loopback: it watches the Service's
// EndpointSlices, which upstream's EndpointSlice controller writes from the pods' Ready
// condition (controllers.go; the kubelet's part is service.go's Prober), and sends each new
// connection to an endpoint listed with conditions.ready=true (the Service has no
// publishNotReadyAddresses), its pod mapped back to the replica. Follows kubernetes/kubernetes
// v1.33.1 pkg/proxy: config/config.go EndpointSliceConfig (the informer's events),
// endpointslicecache.go and endpoints.go (an endpoint is used when Ready; a terminating one
// is left out as the Service has no traffic policy that would use it), and the iptables
// proxier's rules (iptables/proxier.go syncProxyRules: a Service without endpoints gets a
// REJECT rule, so a connection is refused; with endpoints a new connection goes to one of
// them). Where kube-proxy picks among several ready endpoints at random, this proxy takes the
// first by name, so a run is repeatable. A connection already open to an endpoint that is no
// longer ready is closed, as the pod's connections break when it dies, so the autoscaler's
// gRPC client connects again. With no endpoint it stops listening: connections are refused,
// as the REJECT rule makes them. It forwards bytes: the TLS session is the autoscaler's with
// the replica. A model, not kube-proxy's code: its timing is the informer's.
type LeaderProxy struct {
	Port     int
	kube     kubernetes.Interface
	service  string
	backends map[string]*Provider // pod -> replica
	stop     chan struct{}
	done     sync.WaitGroup
	changed  chan struct{}

	mu         sync.Mutex
	ln         net.Listener        // nil while there is no ready endpoint
	ready      map[string]bool     // the pods the EndpointSlices list ready
	current    string              // the pod new connections go to, "" for none
	conns      map[net.Conn]string // open connections (both sides) -> the pod
	History    []string            // every endpoint change, "" for none
	accepted   map[string]int      // connections forwarded, by pod
	noEndpoint time.Duration       // how long there was no endpoint, summed
	noSince    time.Time           // since when there is none (zero when there is one)
}

// StartLeaderProxy takes a port below the ephemeral range (listened on while the Service has
// a ready endpoint) and starts the watch of the Service's EndpointSlices.
func StartLeaderProxy(kube kubernetes.Interface, service string, backends map[string]*Provider) (*LeaderProxy, error) {
	port, err := stablePort()
	if err != nil {
		return nil, err
	}
	p := &LeaderProxy{Port: port, kube: kube, service: service, backends: backends, stop: make(chan struct{}),
		changed: make(chan struct{}, 1), ready: map[string]bool{}, conns: map[net.Conn]string{}, accepted: map[string]int{},
		noSince: time.Now()}
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(providerNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + service
		}))
	inf := f.Discovery().V1().EndpointSlices()
	poke := func(any) {
		select {
		case p.changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, DeleteFunc: poke, UpdateFunc: func(_, n any) { poke(n) },
	}); err != nil {
		return nil, err
	}
	lister := inf.Lister()
	f.Start(p.stop)
	p.done.Add(1)
	go p.sync(lister)
	return p, nil
}

// sync applies the EndpointSlices on every change (the proxier's syncProxyRules).
func (p *LeaderProxy) sync(lister discoverylisters.EndpointSliceLister) {
	defer p.done.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-p.changed:
		}
		slices, err := lister.EndpointSlices(providerNamespace).List(labels.Everything())
		if err != nil {
			continue
		}
		ready := map[string]bool{}
		for _, s := range slices {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready == nil || !*ep.Conditions.Ready || ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
					continue
				}
				if _, ok := p.backends[ep.TargetRef.Name]; ok {
					ready[ep.TargetRef.Name] = true
				}
			}
		}
		var endpoints []string
		for pod := range ready {
			endpoints = append(endpoints, pod)
		}
		sort.Strings(endpoints)
		next := ""
		if len(endpoints) > 0 {
			next = endpoints[0]
		}
		p.mu.Lock()
		p.ready = ready
		for c, pod := range p.conns {
			if !ready[pod] {
				c.Close()
			}
		}
		if next != p.current {
			p.current = next
			p.History = append(p.History, next)
		}
		switch {
		case next == "" && p.ln != nil:
			p.ln.Close()
			p.ln = nil
			p.noSince = time.Now()
		case next != "" && p.ln == nil:
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port))
			if err != nil {
				// Tried again at the next change, or now.
				p.mu.Unlock()
				time.Sleep(100 * time.Millisecond)
				select {
				case p.changed <- struct{}{}:
				default:
				}
				continue
			}
			p.ln = ln
			p.noEndpoint += time.Since(p.noSince)
			p.noSince = time.Time{}
			p.done.Add(1)
			go p.accept(ln)
		}
		p.mu.Unlock()
	}
}

func (p *LeaderProxy) accept(ln net.Listener) {
	defer p.done.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		pod := p.current
		if pod == "" {
			p.mu.Unlock()
			c.Close()
			continue
		}
		addr := p.backends[pod].Addr
		p.mu.Unlock()
		go p.forward(c, pod, addr)
	}
}

func (p *LeaderProxy) forward(c net.Conn, pod, addr string) {
	b, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if !p.ready[pod] {
		// The endpoint went while this connection was dialled.
		p.mu.Unlock()
		c.Close()
		b.Close()
		return
	}
	p.conns[c], p.conns[b] = pod, pod
	p.accepted[pod]++
	p.mu.Unlock()
	splice(c, b, func() {
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, b)
		p.mu.Unlock()
	})
}

// splice copies bytes both ways between c and b until either side ends, then closes both and
// calls forget once: a broken pipe on one side ends the other, as a dead peer's connection does.
func splice(c, b net.Conn, forget func()) {
	var once sync.Once
	end := func() {
		once.Do(func() {
			c.Close()
			b.Close()
			forget()
		})
	}
	go func() { io.Copy(b, c); end() }()
	io.Copy(c, b)
	end()
}

// Current is the pod new connections go to ("" for none).
func (p *LeaderProxy) Current() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.current
}

// Accepted is how many connections were forwarded to pod.
func (p *LeaderProxy) Accepted(pod string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted[pod]
}

// WithoutEndpoint is how long the Service has had no ready endpoint since the proxy started
// (while it had none, every connection was refused).
func (p *LeaderProxy) WithoutEndpoint() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.noEndpoint
	if !p.noSince.IsZero() {
		d += time.Since(p.noSince)
	}
	return d
}

// Stop closes the listener and every connection.
func (p *LeaderProxy) Stop() {
	if p == nil {
		return
	}
	close(p.stop)
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.done.Wait()
}

// kill ends a replica with SIGKILL.
func (r *Provider) kill() { r.Stop(syscall.SIGKILL) }

// awaitLeader steps the autoscaler until pod is labelled leader and the proxy sends new
// connections to it, and returns how long that took from since.
func (e *Env) awaitLeader(cs kubernetes.Interface, pod string, since time.Time) (time.Duration, error) {
	var took time.Duration
	err := e.Until(pod+" labelled leader and the proxy's endpoint", 60*time.Second, func() bool {
		if podRole(cs, pod) != "leader" {
			return false
		}
		if took == 0 {
			took = time.Since(since)
		}
		return e.Proxy.Current() == pod
	})
	return took, err
}

// leaderFailover: two replicas, provider-a leading. Upstream scales up for a pending pod
// and provider-a is killed (SIGKILL) while CloudStack's scale-up job runs: provider-b leads
// within 15 s, takes over the ledger and the running job, and upstream's loops go on against
// it; the pod is placed, nothing sent twice. provider-a comes back (the kubelet restarts its
// container) as the standby. Then upstream removes an empty worker, provider-b answers its
// DeleteNodes OK and is killed while CloudStack's removal job runs: provider-a leads and
// carries the owed removal through. Each scaleKubernetesCluster sent once, the VM
// upstream was told is being deleted gone, the cluster at its one worker.
//
// The restarted provider-a's pod still carries the leader label of its previous life until it
// labels it standby; it is not a ready endpoint meanwhile (its container new, its probe not yet
// passed, and the provider not Ready before that label), so the proxy's endpoint history is
// "provider-a", "", "provider-b", "", "provider-a" (none while the kubelet's probe and the
// EndpointSlice controller catch up).
func leaderFailover(e *Env) error {
	cs := e.Bridge.Kube
	a, b := e.Replicas["provider-a"], e.Replicas["provider-b"]
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	e.Check(e.Proxy.Current() == "provider-a", "the proxy sends connections to %q, want provider-a", e.Proxy.Current())
	e.Check(podRole(cs, "provider-b") == "standby", "provider-b's pod is %q, want standby", podRole(cs, "provider-b"))

	// 1. A scale-up: two pods of 1.5 CPU on 2-CPU workers, one fits the worker there is.
	if err := e.Bridge.AddPods("web", 2, "1500m", "512Mi"); err != nil {
		return err
	}
	if err := e.Until("the scale-up job running in cks-sim", 60*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
		return c.State == "Scaling" && len(reqs) == 1
	}); err != nil {
		return err
	}
	upOK := a.Metric("cks_provider_grpc_requests_total", `method="NodeGroupIncreaseSize"`, `code="Ok"`)
	e.Check(upOK == 1, "provider-a answered %g IncreaseSize OK, want 1", upOK)
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")
	a.kill()
	killedA := time.Now()
	tookB, err := e.awaitLeader(cs, "provider-b", killedA)
	if err != nil {
		return err
	}
	e.Check(tookB < 15*time.Second, "provider-b labelled leader %s after provider-a was killed, want within 15s", tookB.Round(100*time.Millisecond))
	stillScaling := false
	if c, err := e.Sim.Cluster(); err == nil {
		stillScaling = c.State == "Scaling"
	}
	// The kubelet restarts the killed container: provider-a comes back as the standby.
	if err := a.Restart(); err != nil {
		return err
	}
	if err := e.Until("provider-a back as the standby", 30*time.Second, func() bool { return podRole(cs, "provider-a") == "standby" }); err != nil {
		return err
	}
	if err := e.Until("every pod placed after the failover", 120*time.Second, func() bool { bound, p := e.Bridge.PodCounts(); return bound == 2 && p == 0 }); err != nil {
		return err
	}
	if err := e.Until("upstream settled at 2", 60*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	// Upstream's loops succeed against provider-b: no error counted over the next loops, and
	// provider-b answered its Refresh.
	errorsFirst := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore
	e.Steps(5)
	e.Check(Gather().Value("cluster_autoscaler_errors_total")-errorsBefore == errorsFirst, "upstream counted errors after it settled against provider-b: %v", Gather().Series("cluster_autoscaler_errors_total"))
	refreshB := b.Metric("cks_provider_grpc_requests_total", `method="Refresh"`, `code="Ok"`)
	e.Check(refreshB > 0, "provider-b answered no Refresh OK")
	ups, _ := e.Sim.Requests("scaleKubernetesCluster")
	e.Check(len(ups) == 1, "cks-sim received %d scaleKubernetesCluster after the scale-up, want 1: %v", len(ups), ups)
	_, total := e.simWorkers()
	e.Check(total == 2, "cks-sim has %d workers after the scale-up, want 2", total)

	// 2. A removal: the pods go, both workers are empty, upstream removes one (min 1). The
	// removal job: 8 s of its own, then 3 s per node.
	if _, err := e.Sim.Admin("simConfigure", "jobdurationms", "8000", "removalpernodems", "3000"); err != nil {
		return err
	}
	if err := e.Bridge.Scale("web", 0); err != nil {
		return err
	}
	var node, vm string
	if err := e.Until("DeleteNodes answered OK by provider-b, the removal job running in cks-sim", 150*time.Second, func() bool {
		if node == "" {
			node, vm = e.taintedToBeDeleted()
		}
		c, _ := e.Sim.Cluster()
		return node != "" && Gather().Value("cluster_autoscaler_scaled_down_nodes_total") == 1 &&
			c.State == "Scaling" && e.removalRequests() == 1
	}); err != nil {
		return err
	}
	okDeletes := b.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`, `code="Ok"`)
	e.Check(okDeletes == 1, "provider-b answered %g DeleteNodes OK before it was killed, want 1", okDeletes)
	errorsBefore2 := Gather().Value("cluster_autoscaler_errors_total")
	e.Check(errorsBefore2 == errorsBefore+errorsFirst, "upstream counted %g errors between the failovers (provider-b leading), want 0: %v",
		errorsBefore2-errorsBefore-errorsFirst, Gather().Series("cluster_autoscaler_errors_total"))
	b.kill()
	killedB := time.Now()
	tookA, err := e.awaitLeader(cs, "provider-a", killedB)
	if err != nil {
		return err
	}
	e.Check(tookA < 15*time.Second, "provider-a labelled leader %s after provider-b was killed, want within 15s", tookA.Round(100*time.Millisecond))
	removalRunning := false
	if c, err := e.Sim.Cluster(); err == nil {
		removalRunning = c.State == "Scaling"
	}
	if err := e.Until("the worker removed in cks-sim and in Kubernetes", 120*time.Second, func() bool {
		vms, err := e.Sim.VMStates()
		_, present := vms[vm]
		_, total := e.simWorkers()
		return err == nil && !present && total == 1 && !e.nodeExists(node) && len(e.Bridge.WorkerNodes()) == 1
	}); err != nil {
		return err
	}
	if err := e.Until("the cluster Running and upstream settled at 1", 60*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		return c.State == "Running" && e.settled(1)
	}); err != nil {
		return err
	}
	errorsSecond := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore2
	e.Steps(5)
	e.Check(Gather().Value("cluster_autoscaler_errors_total")-errorsBefore2 == errorsSecond, "upstream counted errors after it settled against provider-a: %v", Gather().Series("cluster_autoscaler_errors_total"))

	// Every node upstream was told is being deleted is gone (checked above: the one tainted
	// ToBeDeleted whose DeleteNodes provider-b answered OK); CloudStack received each request
	// once: the scale-up, then the removal of that VM.
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	var sent []string
	seen := map[string]int{}
	for _, r := range reqs {
		key := fmt.Sprintf("size=%s nodeids=%s", r["size"], r["nodeids"])
		sent = append(sent, key)
		seen[key]++
	}
	e.Check(len(reqs) == 2, "cks-sim received %d scaleKubernetesCluster, want 2 (the scale-up, the removal): %v", len(reqs), sent)
	for k, n := range seen {
		e.Check(n == 1, "cks-sim received scaleKubernetesCluster %s %d times", k, n)
	}
	e.Check(len(reqs) == 2 && reqs[1]["nodeids"] == vm, "the second scaleKubernetesCluster names %v, want the removed VM %s", sent, vm)
	e.Check(len(e.vmStops()) == 0, "cks-sim was asked to stop %v", e.vmStops())
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_up_nodes_total") == 1, "scaled_up_nodes_total %g, want 1", m.Value("cluster_autoscaler_scaled_up_nodes_total"))
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 1, "scaled_down_nodes_total %v, want 1", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.Check(e.Log.Count(phRemovingEmpty) == 1, "autoscaler log: %d× %q, want 1 (the one scale-down)", e.Log.Count(phRemovingEmpty), phRemovingEmpty.Text)
	// The provider that took over got no DeleteNodes: upstream does not retry what it was
	// told is done.
	deletesA := a.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`)
	e.Check(deletesA == 0, "provider-a received %g DeleteNodes after it took over, want 0", deletesA)
	e.Check(podRole(cs, "provider-a") == "leader", "provider-a's pod is %q at the end, want leader", podRole(cs, "provider-a"))
	e.note = fmt.Sprintf(" [b led %s after a's kill (scale-up job still running %v), a led %s after b's kill (removal job still running %v), proxy endpoints %q, %g+%g autoscaler errors during the failovers]",
		tookB.Round(100*time.Millisecond), stillScaling, tookA.Round(100*time.Millisecond), removalRunning, e.Proxy.History, errorsFirst, errorsSecond)
	e.CheckClean(1, errorsBefore2+errorsSecond)
	return nil
}
