package main

// Outages around two provider replicas (issue 38): CloudStack unreachable for three times the
// provider's staleness bound while a scale-up's job runs and a removal is owed
// (cloudstack-outage), and the Kubernetes API server down for a minute while a scale-up's job
// runs (apiserver-outage). What a user of the cluster would notice: whether upstream's loop
// comes back, whether the provider stays reachable through its Service, what upstream's
// errors name, and that nothing owed is lost nor sent twice.

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The staleness bound the cloudstack-outage replicas run with, and how long CloudStack is
// away: three times it.
const (
	outageStaleness = 10 * time.Second
	cloudStackAway  = 3 * outageStaleness
	// The longest the provider waits before it reads a failing cluster again, with the flags
	// these replicas run with (--staleness-bound 10s, --refresh-min-interval 500ms): a quarter
	// of the staleness bound, at least the refresh interval and 1 s, at most 15 s
	// (cks_domain::keeper::Policy::backoff_cap). With the autoscaler's own 10 s loop and the
	// defaults that cap is 15 s, so its second loop after CloudStack's return succeeds; here the
	// loop is shortened tenfold and the bound twelvefold, so the criterion is the provider's
	// cap, then two loops.
	outageRetryCap = outageStaleness / 4
	// How long the API server is down in apiserver-outage.
	apiServerAway = 60 * time.Second
	// The replicas' --leader-elect-lease-duration (leaderElectFlags).
	leaseDuration = 3 * time.Second
)

// Gate is the replicas' way to CloudStack (cks-sim): a TCP forwarder on loopback that a
// scenario closes, so that CloudStack's API endpoint refuses connections (a management server
// that is down), and opens again on the same port, cks-sim and its jobs having run on
// meanwhile with their state.
type Gate struct {
	URL    string
	port   int
	target string
	done   sync.WaitGroup

	mu    sync.Mutex
	ln    net.Listener // nil while down
	conns map[net.Conn]bool
}

// StartGate opens a gate to the cks-sim at simURL; URL is simURL with the gate's address.
func StartGate(simURL string) (*Gate, error) {
	u, err := url.Parse(simURL)
	if err != nil {
		return nil, err
	}
	port, err := stablePort()
	if err != nil {
		return nil, err
	}
	g := &Gate{port: port, target: u.Host, conns: map[net.Conn]bool{}}
	u.Host = fmt.Sprintf("127.0.0.1:%d", port)
	g.URL = u.String()
	return g, g.Up()
}

// Up listens again on the gate's port.
func (g *Gate) Up() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", g.port))
	if err != nil {
		return err
	}
	g.ln = ln
	g.done.Add(1)
	go func() {
		defer g.done.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go g.forward(c)
		}
	}()
	return nil
}

func (g *Gate) forward(c net.Conn) {
	b, err := net.DialTimeout("tcp", g.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	g.mu.Lock()
	if g.ln == nil {
		g.mu.Unlock()
		c.Close()
		b.Close()
		return
	}
	g.conns[c], g.conns[b] = true, true
	g.mu.Unlock()
	splice(c, b, func() {
		g.mu.Lock()
		delete(g.conns, c)
		delete(g.conns, b)
		g.mu.Unlock()
	})
}

// Down closes the listener and every connection through the gate: connections to CloudStack
// are refused until Up.
func (g *Gate) Down() {
	g.mu.Lock()
	if g.ln != nil {
		g.ln.Close()
		g.ln = nil
	}
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.done.Wait()
}

// Close is Down at the scenario's end.
func (g *Gate) Close() {
	if g != nil {
		g.Down()
	}
}

// cutCloudStackReplicas is cloudstack-outage's Providers: the replicas of
// startLeaderReplicas, reaching cks-sim through a Gate.
func cutCloudStackReplicas(e *Env, tls TLSFiles, nodes string, flags []string) error {
	g, err := StartGate(e.Sim.URL)
	if err != nil {
		return err
	}
	e.CloudStack = g
	return startLeaderReplicas(e, tls, nodes, flags)
}

// replicaState is what shows that a replica was not restarted nor its pod replaced: its
// process and its pod's UID.
type replicaState struct {
	proc *Proc
	uid  types.UID
}

func (e *Env) replicaStates(cs kubernetes.Interface) map[string]replicaState {
	out := map[string]replicaState{}
	for name, r := range e.Replicas {
		st := replicaState{proc: r.Proc}
		if p, err := cs.CoreV1().Pods(providerNamespace).Get(ctxb(), name, metav1.GetOptions{}); err == nil {
			st.uid = p.UID
		}
		out[name] = st
	}
	return out
}

// cloudStackOutage: two replicas, provider-a leading, --staleness-bound 10s. A worker's VM
// stops (its node NotReady) while the other runs a pod; a second pod does not fit, so
// upstream scales up, and CloudStack's job for it runs 40 s; meanwhile upstream removes the
// NotReady worker (the unready rule) and the leader answers its DeleteNodes OK, the removal
// owed behind the running job. Then CloudStack's endpoint refuses every connection for three
// times the staleness bound, and comes back. Checks: the leader stays Ready and the Service
// keeps it as its endpoint throughout; upstream's errors meanwhile name CloudStack
// (UNAVAILABLE from the provider), never a connection to the provider refused; upstream's loop
// succeeds again within two loops of the provider's retry after CloudStack's return; the scale-up's job is followed to
// its end (its node registers, the pod is placed) and the owed removal is carried out (the
// VM gone), each request sent to CloudStack once; no replica restarted, no pod replaced.
func cloudStackOutage(e *Env) error {
	cs := e.Bridge.Kube
	leader := "provider-a"
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(2) }); err != nil {
		return err
	}
	before := e.replicaStates(cs)
	// One pod of 1.5 CPU on one of the two 2-CPU workers.
	if err := e.Bridge.AddPods("web", 1, "1500m", "512Mi"); err != nil {
		return err
	}
	if err := e.Until("the first pod placed", 30*time.Second, func() bool { b, p := e.Bridge.PodCounts(); return b == 1 && p == 0 }); err != nil {
		return err
	}
	used := map[string]bool{}
	pods, _ := cs.CoreV1().Pods(podNamespace).List(ctxb(), listAll)
	for _, p := range pods.Items {
		used[p.Spec.NodeName] = true
	}
	var stoppedNode, stoppedVM string
	for _, n := range e.Bridge.WorkerNodes() {
		if !used[n.Name] {
			stoppedNode, stoppedVM = n.Name, strings.TrimPrefix(n.Spec.ProviderID, "external-cloudstack://")
		}
	}
	if stoppedVM == "" {
		return fmt.Errorf("no empty worker besides the pod's")
	}
	// CloudStack's scale jobs take 40 s from now: the scale-up's still runs when upstream
	// removes the NotReady worker.
	if _, err := e.Sim.Admin("simConfigure", "jobdurationms", "40000"); err != nil {
		return err
	}
	if _, err := e.Sim.Admin("simResetRequests"); err != nil {
		return err
	}
	if _, err := e.Sim.Admin("simSetVmState", "id", stoppedVM, "state", "Stopped"); err != nil {
		return err
	}
	if err := e.Until("the stopped worker's node NotReady in upstream", 60*time.Second, func() bool {
		g, ok := e.group()
		return ok && g.Health.NodeCounts.Registered.Unready.Total == 1
	}); err != nil {
		return err
	}
	// A second pod: it fits no Ready node, upstream scales up.
	if err := e.Bridge.Scale("web", 2); err != nil {
		return err
	}
	a := e.Replicas[leader]
	if err := e.Until("the scale-up's job running, and DeleteNodes for the NotReady worker answered OK (the removal owed)", 120*time.Second, func() bool {
		c, _ := e.Sim.Cluster()
		ups, _ := e.Sim.Requests("scaleKubernetesCluster")
		return c.State == "Scaling" && len(ups) == 1 && ups[0]["nodeids"] == "" &&
			a.Metric("cks_provider_grpc_requests_total", `method="NodeGroupDeleteNodes"`, `code="Ok"`) >= 1
	}); err != nil {
		return err
	}
	// The removal's own job, once submitted, is short.
	if _, err := e.Sim.Admin("simConfigure", "jobdurationms", "3000"); err != nil {
		return err
	}
	e.Check(e.Proxy.Current() == leader, "the Service's endpoint is %q before the outage, want %s", e.Proxy.Current(), leader)

	// CloudStack away for three times the staleness bound.
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")
	grpcBefore := e.Log.Count(phGrpcError)
	refusedBefore := e.Proxy.WithoutEndpoint()
	flipsBefore := len(e.Prober.Flips(leader))
	e.CloudStack.Down()
	down := time.Now()
	unrouted := 0
	if err := e.Until("three times the staleness bound without CloudStack", cloudStackAway+60*time.Second, func() bool {
		if e.Proxy.Current() != leader || !e.Prober.Ready(leader) {
			unrouted++
		}
		return time.Since(down) >= cloudStackAway
	}); err != nil {
		return err
	}
	outageErrors := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore
	outageLines := e.Log.Lines(phGrpcError)[grpcBefore:]
	if err := e.CloudStack.Up(); err != nil {
		return err
	}
	// The provider stayed reachable: Ready, the Service's endpoint, never without one.
	e.Check(unrouted == 0, "during the outage the leader was not Ready or not the Service's endpoint at %d loops (probe results %v, proxy endpoints %q)", unrouted, e.Prober.Flips(leader), e.Proxy.History)
	e.Check(len(e.Prober.Flips(leader)) == flipsBefore, "the leader's readiness changed during the outage: %v", e.Prober.Flips(leader)[flipsBefore:])
	e.Check(e.Proxy.WithoutEndpoint() == refusedBefore, "the Service had no ready endpoint for %s during the outage (connections refused)", (e.Proxy.WithoutEndpoint() - refusedBefore).Round(100*time.Millisecond))
	// Upstream's errors meanwhile: the provider's UNAVAILABLE naming CloudStack, never a
	// connection to the provider that failed (grpc-go's "connection error", "Error while
	// dialing").
	e.Check(outageErrors > 0 && len(outageLines) > 0, "upstream counted %g errors and logged %d gRPC errors during the outage: the provider answered as if CloudStack were there", outageErrors, len(outageLines))
	for _, l := range outageLines {
		if strings.Contains(l, "connection error") || strings.Contains(l, "Error while dialing") || !strings.Contains(l, "code = Unavailable") || !strings.Contains(l, "CloudStack") {
			e.Fail("an error upstream heard during the outage is not the provider's UNAVAILABLE naming CloudStack: %s", l)
			break
		}
	}

	// Upstream's loop succeeds again within two loops of the provider's retry after
	// CloudStack's return (outageRetryCap): a loop that counts no error and does not fail its
	// Refresh.
	wantLoops := int((outageRetryCap+e.Up.Options.ScanInterval-1)/e.Up.Options.ScanInterval) + 2
	loops := 0
	for loops < 20 {
		errs, refreshFails := Gather().Value("cluster_autoscaler_errors_total"), e.Log.Count(phRefreshFailed)
		if err := e.Step(); err != nil {
			return err
		}
		loops++
		if Gather().Value("cluster_autoscaler_errors_total") == errs && e.Log.Count(phRefreshFailed) == refreshFails {
			break
		}
	}
	e.Check(loops <= wantLoops, "upstream's first loop without an error came %d loops after CloudStack's return, want within %d: the provider's retry (at most %s) and two loops (%s)", loops, wantLoops, outageRetryCap, e.Describe())
	recoveryErrors := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore - outageErrors

	// The scale-up's job followed to its end, the owed removal carried out.
	if err := e.Until("the stopped worker removed, the new worker's node registered, both pods placed, upstream settled at 2", 150*time.Second, func() bool {
		vms, err := e.Sim.VMStates()
		_, present := vms[stoppedVM]
		b, p := e.Bridge.PodCounts()
		c, _ := e.Sim.Cluster()
		return err == nil && !present && !e.nodeExists(stoppedNode) && b == 2 && p == 0 && c.State == "Running" && e.settled(2)
	}); err != nil {
		return err
	}
	e.Steps(3)
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	var sent []string
	for _, r := range reqs {
		sent = append(sent, fmt.Sprintf("size=%s nodeids=%s", r["size"], r["nodeids"]))
	}
	e.Check(len(reqs) == 2 && reqs[0]["nodeids"] == "" && reqs[1]["nodeids"] == stoppedVM,
		"cks-sim received scaleKubernetesCluster %v, want the scale-up then the removal of %s, each once", sent, stoppedVM)
	// No replica restarted, no pod replaced, the leader the same.
	after := e.replicaStates(cs)
	for name, st := range before {
		e.Check(after[name].proc == st.proc && !st.proc.exited(), "replica %s was restarted or ended", name)
		e.Check(after[name].uid == st.uid && st.uid != "", "pod %s was replaced (UID %s, then %s)", name, st.uid, after[name].uid)
	}
	e.Check(podRole(cs, leader) == "leader", "%s's pod is %q at the end, want leader", leader, podRole(cs, leader))
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_down_nodes_total") == 1, "scaled_down_nodes_total %v, want 1", m.Series("cluster_autoscaler_scaled_down_nodes_total"))
	e.note = fmt.Sprintf(" [%g autoscaler errors during the outage, %g after CloudStack's return, first clean loop %d after it, leader's readiness %v]",
		outageErrors, recoveryErrors, loops, e.Prober.Flips(leader))
	e.CheckClean(2, errorsBefore+outageErrors+recoveryErrors)
	return nil
}

// start is the kubelet starting the container again: the process on the replica's ports and
// flags, without waiting for it to be ready (procs.go Restart waits).
func (r *Provider) start() error {
	proc, err := startProcEnv("", r.dir, "provider", r.bin, r.env, r.args...)
	if err != nil {
		return err
	}
	r.Proc = proc
	return nil
}

// restartExited is the kubelet's restart of an exited container (restartPolicy Always), with
// its back-off (pkg/kubelet/kuberuntime/kuberuntime_manager.go: 10 s doubling, here shortened
// tenfold as the probe periods are): it starts every replica whose process ended once its
// back-off has passed, and returns how many it started.
func (e *Env) restartExited(backoff map[string]time.Time) int {
	n := 0
	for name, r := range e.Replicas {
		if r.Proc == nil || !r.exited() {
			continue
		}
		if until, ok := backoff[name]; ok && time.Now().Before(until) {
			continue
		}
		if err := r.start(); err == nil {
			n++
			backoff[name] = time.Now().Add(time.Second)
		}
	}
	return n
}

// leaseHolder is the provider's Lease's holder and its last renewal ("" when unreadable). The
// renewal, not the acquire time: a replica that takes the Lease again under the name it held
// it with keeps the acquire time (client-go's leaderelection does the same).
func leaseHolder(cs kubernetes.Interface) (string, time.Time) {
	var l *coordinationv1.Lease
	l, err := cs.CoordinationV1().Leases(providerNamespace).Get(ctxb(), "cks-autoscaler-provider", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
		return "", time.Time{}
	}
	return *l.Spec.HolderIdentity, l.Spec.RenewTime.Time
}

// readyz is whether the replica's /readyz answers 200.
func (r *Provider) readyz() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(r.MetricsURL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// apiServerOutage: two replicas, provider-a leading. Upstream scales up for a pending pod;
// while CloudStack's job runs, the Kubernetes API server goes down for a minute (etcd stays):
// the Lease cannot be renewed, so the leader stops acting (src/app.rs: it ends, to start again
// as a standby; the kubelet restarts it). The API server comes back on the same port with the
// same etcd. Checks: the leader ended within the renew deadline and a bit; nothing was sent to
// CloudStack while no replica held the Lease; once the API server is back a replica renews
// the Lease within the lease duration and serves (labelled leader, Ready, the Service's
// endpoint); the scale-up's job is followed to its end (the pod placed, upstream settled),
// nothing owed lost, each scaleKubernetesCluster sent once.
func apiServerOutage(e *Env) error {
	cs := e.Bridge.Kube
	if err := e.Until("the node group in upstream's status", 30*time.Second, func() bool { return e.settled(1) }); err != nil {
		return err
	}
	// Two pods of 1.5 CPU on 2-CPU workers: one fits the worker there is.
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
	a := e.Replicas["provider-a"]
	e.Check(a.Metric("cks_provider_grpc_requests_total", `method="NodeGroupIncreaseSize"`, `code="Ok"`) == 1, "provider-a answered no IncreaseSize OK")
	errorsBefore := Gather().Value("cluster_autoscaler_errors_total")

	e.Kube.StopAPIServer()
	down := time.Now()
	// The autoscaler's loop runs on (its informers serve what they hold); the bridge, whose
	// every write needs the API server, waits as the kubelets' writes wait. The kubelet
	// restarts a replica that ends.
	backoff := map[string]time.Time{}
	var leaderEnded time.Duration
	restarts := 0
	for time.Since(down) < apiServerAway {
		start := time.Now()
		e.Up.RunOnce()
		e.loops++
		if leaderEnded == 0 && a.exited() {
			leaderEnded = time.Since(down)
		}
		restarts += e.restartExited(backoff)
		if d := e.Up.Options.ScanInterval - time.Since(start); d > 0 {
			time.Sleep(d)
		}
	}
	sentDuring, _ := e.Sim.Requests("scaleKubernetesCluster")
	if err := e.Kube.RestartAPIServer(); err != nil {
		return err
	}
	back := time.Now()
	e.Check(leaderEnded > 0 && leaderEnded < leaseDuration+5*time.Second, "provider-a (the leader) ended %s after the API server went down, want within the lease duration and 5 s", leaderEnded.Round(100*time.Millisecond))
	e.Check(len(sentDuring) == 1, "cks-sim received %d scaleKubernetesCluster by the API server's return, want 1 (the scale-up, before the outage)", len(sentDuring))

	// A leader again: the Lease renewed within the lease duration of the API server's return,
	// then serving through the Service.
	var holder string
	var renewed time.Time
	if err := e.Until("a replica holding the Lease, renewed after the API server's return", 60*time.Second, func() bool {
		e.restartExited(backoff)
		holder, renewed = leaseHolder(cs)
		return holder != "" && renewed.After(back)
	}); err != nil {
		return err
	}
	took := renewed.Sub(back)
	e.Check(took <= leaseDuration, "%s held the Lease %s after the API server's return, want within the lease duration (%s)", holder, took.Round(100*time.Millisecond), leaseDuration)
	var serving time.Duration
	// Ready and the Service's endpoint once the informers of the EndpointSlice controller and of
	// the proxy list again (client-go's reflector back-off after the outage).
	if err := e.Until("the new leader labelled leader, Ready and the Service's endpoint", 150*time.Second, func() bool {
		e.restartExited(backoff)
		if podRole(cs, holder) == "leader" && e.Proxy.Current() == holder && e.Replicas[holder].readyz() {
			serving = time.Since(back)
			return true
		}
		return false
	}); err != nil {
		return err
	}
	// The scale-up's job followed to its end.
	if err := e.Until("every pod placed and upstream settled at 2", 150*time.Second, func() bool {
		e.restartExited(backoff)
		b, p := e.Bridge.PodCounts()
		return b == 2 && p == 0 && e.settled(2)
	}); err != nil {
		return err
	}
	errorsOutage := Gather().Value("cluster_autoscaler_errors_total") - errorsBefore
	e.Steps(3)
	// Upstream's own pod lister comes back from the outage by a re-list whose back-off the
	// harness does not shorten (client-go's reflector, up to about a minute): until it has, its
	// cache may still hold a pod pending that the API server shows bound, and upstream counts it
	// unschedulable. Its view settling is client-go's timing, not the provider's.
	if err := e.Until("upstream's pod cache to show no unschedulable pod", 120*time.Second, func() bool {
		return Gather().Value("cluster_autoscaler_unschedulable_pods_count", "type", "unschedulable") == 0
	}); err != nil {
		return err
	}
	reqs, _ := e.Sim.Requests("scaleKubernetesCluster")
	e.Check(len(reqs) == 1, "cks-sim received %d scaleKubernetesCluster, want 1 (the scale-up, sent once)", len(reqs))
	_, total := e.simWorkers()
	e.Check(total == 2, "cks-sim has %d workers, want 2", total)
	e.Check(len(e.vmStops()) == 0, "cks-sim was asked to stop %v", e.vmStops())
	m := Gather()
	e.Check(m.Value("cluster_autoscaler_scaled_up_nodes_total") == 1, "scaled_up_nodes_total %g, want 1", m.Value("cluster_autoscaler_scaled_up_nodes_total"))
	e.note = fmt.Sprintf(" [leader ended %s into the outage, %d restart(s) by the kubelet, %s took the Lease %s and served %s after the API server's return, %g autoscaler errors]",
		leaderEnded.Round(100*time.Millisecond), restarts, holder, took.Round(100*time.Millisecond), serving.Round(100*time.Millisecond), errorsOutage)
	e.CheckClean(2, errorsBefore+errorsOutage)
	return nil
}
