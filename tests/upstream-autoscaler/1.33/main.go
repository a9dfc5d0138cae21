// Command upstream-ca runs one scenario: the real cluster-autoscaler (this module's release,
// in process) against the provider and cks-sim, over mutual TLS, and against a real
// Kubernetes API server (etcd and kube-apiserver started for the scenario, kube.go) where
// upstream's controllers and scheduler (controllers.go) and the bridge (bridge.go) play the
// rest of a cluster. It prints one line, PASS or FAIL with the reasons, and exits non-zero on
// failure.
//
//	upstream-ca -scenario scale-up-down -sim target/release/cks-sim \
//	    -provider target/release/cks-autoscaler-provider -kube-bin DIR [-dir DIR] [-keep]
//
// -kube-bin is the directory tools/kube-testenv/build.sh prints (etcd, kube-apiserver); it
// defaults to $CKS_KUBE_BIN_DIR.
//
// Everything after "--" goes to the autoscaler as extra flags.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// Release is the cluster-autoscaler release this module pins.
const Release = "1.33.0"

// ClientName is the autoscaler's client-certificate name, which the provider's --nodes binds.
const ClientName = "cks-cluster-autoscaler"

func main() {
	fs := flag.NewFlagSet("upstream-ca", flag.ExitOnError)
	scenario := fs.String("scenario", "", "scenario to run: "+strings.Join(scenarioNames(), ", "))
	simBin := fs.String("sim", "", "the cks-sim binary")
	provBin := fs.String("provider", "", "the cks-autoscaler-provider binary")
	kubeBin := fs.String("kube-bin", os.Getenv("CKS_KUBE_BIN_DIR"), "the directory holding etcd and kube-apiserver (tools/kube-testenv/build.sh)")
	dir := fs.String("dir", "", "work directory (certificates, logs); a new temporary one by default")
	keep := fs.Bool("keep", false, "keep the work directory")
	list := fs.Bool("list", false, "list the scenarios (not the pending ones, not the benchmarks) and exit")
	check := fs.Bool("check-phrases", false, "check that upstream's source (module cache) logs every phrase the harness watches, and exit")
	args := os.Args[1:]
	var extra []string
	for i, a := range args {
		if a == "--" {
			args, extra = args[:i], args[i+1:]
			break
		}
	}
	fs.Parse(args)
	if *list {
		fmt.Println(strings.Join(scenarioNames(), "\n"))
		return
	}
	if *check {
		found, problems := checkPhrases()
		if len(problems) > 0 {
			fmt.Printf("FAIL %s watched-phrases: %s\n", Release, strings.Join(problems, "; "))
			os.Exit(1)
		}
		fmt.Printf("PASS %s watched-phrases (%d phrases, each in upstream's source at a verbosity --v=%d shows)\n", Release, found, harnessVerbosity())
		return
	}
	sc, ok := scenarios[*scenario]
	if !ok {
		sc, ok = pending[*scenario]
	}
	if !ok {
		sc, ok = benchmarks[*scenario]
	}
	if !ok || *simBin == "" || *provBin == "" || *kubeBin == "" {
		fmt.Fprintf(os.Stderr, "usage: upstream-ca -scenario NAME -sim BIN -provider BIN -kube-bin DIR (scenarios: %s)\n", strings.Join(scenarioNames(), ", "))
		os.Exit(2)
	}
	workDir := *dir
	if workDir == "" {
		d, err := os.MkdirTemp("", "upstream-ca-")
		if err != nil {
			fmt.Println("FAIL:", err)
			os.Exit(1)
		}
		workDir = d
	} else if err := os.MkdirAll(workDir, 0o755); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	start := time.Now()
	e := &Env{Dir: workDir, SimBin: *simBin, ProvBin: *provBin, KubeBin: *kubeBin, ExtraFlags: extra}
	err := e.run(sc)
	e.saveSimRequests()
	e.Close()
	took := time.Since(start).Round(time.Second)
	if err == nil && len(e.failures) == 0 {
		if !*keep && *dir == "" {
			os.RemoveAll(workDir)
		}
		fmt.Printf("PASS %s %s (%s)%s\n", Release, *scenario, took, e.note)
		return
	}
	if err != nil {
		e.failures = append(e.failures, err.Error())
	}
	fmt.Printf("FAIL %s %s (%s): %s [logs: %s]\n", Release, *scenario, took, strings.Join(e.failures, "; "), workDir)
	os.Exit(1)
}

func scenarioNames() []string {
	var names []string
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Env is one scenario's world: cks-sim, the provider, the API server with upstream's
// controllers and scheduler, the autoscaler and the bridge.
type Env struct {
	Dir, SimBin, ProvBin, KubeBin string
	ExtraFlags                    []string
	StateFile                     string // the provider's --state-file, when the scenario gives it one
	Sim                           *Sim
	Prov                          *Provider
	Kube                          *Kube
	Controllers                   *Controllers
	Up                            *Upstream
	Bridge                        *Bridge
	Pods                          *PodHistory
	Log                           *LogWatch
	clusterLog                    *os.File
	Replicas                      map[string]*Provider // leader.go: the replicas by pod name
	Proxy                         *LeaderProxy         // leader.go: the autoscaler's way to the provider (the Service)
	Prober                        *Prober              // service.go: the kubelet's readiness probes of the provider's pods
	CloudStack                    *Gate                // outage.go: the replicas' way to cks-sim, when a scenario cuts it
	logger                        klog.Logger
	failures                      []string
	note                          string
	loops                         int
}

// Scenario is one run: the cluster it starts from, flags, and its steps.
type Scenario struct {
	Cluster       string   // cks-sim scenario file (YAML)
	SimFlags      []string // extra cks-sim flags
	ProvFlags     []string // extra provider flags
	Nodes         string   // the provider's --nodes (MIN:MAX:demo@client)
	AutoscalerArg []string // extra autoscaler flags (after the shared ones)
	StateFile     bool     // the provider's --state-file in the work directory (a restart reads it)
	Wrap          bool     // time the cloud provider's calls (benchmarks)
	Run           func(e *Env) error

	// Providers, when set, starts the provider(s) instead of StartProvider, once the API
	// server, the bridge and the controllers run, before the autoscaler is built (it writes
	// the autoscaler's cloud-config): leader.go's replicas behind their proxy.
	Providers func(e *Env, tls TLSFiles, nodes string, flags []string) error
}

// The flags of deploy/'s autoscaler Deployment, with the timers shortened, and the
// scenario's API server (in a pod the autoscaler finds it through its service account).
func autoscalerFlags(cloudConfig, kubeconfig string) []string {
	return []string{
		"--cloud-provider=externalgrpc",
		"--cloud-config=" + cloudConfig,
		"--kubeconfig=" + kubeconfig,
		"--namespace=kube-system",
		"--v=2",
		// (--stderrthreshold=info in deploy/: here klog's output goes to autoscaler.log.)
		"--skip-nodes-with-local-storage=false",
		"--max-node-provision-time=2m",
		// Shortened timers (upstream defaults in brackets).
		"--scan-interval=1s",                        // [10s]
		"--scale-down-unneeded-time=10s",            // [10m]
		"--scale-down-unready-time=20s",             // [20m]
		"--scale-down-delay-after-add=10s",          // [10m]
		"--scale-down-delay-after-failure=10s",      // [3m]
		"--initial-node-group-backoff-duration=20s", // [5m]
		"--max-node-group-backoff-duration=1m",      // [30m]
		"--node-group-backoff-reset-timeout=2m",     // [3h]
		"--unremovable-node-recheck-timeout=30s",    // [5m]
		"--node-delete-delay-after-taint=1s",        // [5s]
		// Its Kubernetes client's rate limits, ten times as the scan interval is ten times
		// shorter: each iteration's reads and writes at its pace.
		"--kube-client-qps=50",    // [5]
		"--kube-client-burst=100", // [10]
	}
}

func (e *Env) run(sc Scenario) error {
	tls, err := MakeTLS(e.Dir, ClientName)
	if err != nil {
		return err
	}
	// etcd and the API server come up while cks-sim and the provider do; run returns only
	// once StartKube has (Close then stops what it started).
	kubeDone := make(chan error, 1)
	go func() {
		k, err := StartKube(e.Dir, e.KubeBin)
		e.Kube = k
		kubeDone <- err
	}()
	kubeWaited := false
	waitKube := func() error {
		if kubeWaited {
			return nil
		}
		kubeWaited = true
		return <-kubeDone
	}
	defer waitKube()
	e.Sim, err = StartSim(e.Dir, e.SimBin, sc.Cluster, sc.SimFlags...)
	if err != nil {
		return fmt.Errorf("cks-sim: %v", err)
	}
	nodes := sc.Nodes
	if nodes == "" {
		nodes = "1:5:demo@" + ClientName
	}
	e.Log, err = NewLogWatch(e.Dir + "/autoscaler.log")
	if err != nil {
		return err
	}
	args := append(autoscalerFlags(autoscalerCloudConfig(e.Dir), kubeconfigPath(e.Dir)), sc.AutoscalerArg...)
	args = append(args, e.ExtraFlags...)
	opts := ParseFlags(args)
	// deploy/ gives the provider the autoscaler's --max-node-provision-time (one value for
	// both): the value the autoscaler parsed, the scenario's own included.
	provFlags := append([]string{"--max-node-provision-time", opts.NodeGroupDefaults.MaxNodeProvisionTime.String()}, sc.ProvFlags...)
	if sc.StateFile {
		e.StateFile = filepath.Join(e.Dir, "provider-state.json")
		provFlags = append(provFlags, "--state-file", e.StateFile)
	}
	if sc.Providers == nil {
		e.Prov, err = StartProvider(e.Dir, e.ProvBin, e.Sim, tls, nodes, provFlags...)
		if err != nil {
			return err
		}
	}
	// Everything to autoscaler.log, nothing to this process's stderr (the run's one line).
	_ = flag.Set("stderrthreshold", "FATAL")
	// Each line once: without it klog writes a warning twice and an error three times to
	// the one output (once per severity at or below the line's).
	_ = flag.Set("one_output", "true")
	if err := waitKube(); err != nil {
		return err
	}
	// The controllers', the scheduler's and the bridge's own log lines.
	clusterLog, err := os.Create(filepath.Join(e.Dir, "cluster.log"))
	if err != nil {
		return err
	}
	e.clusterLog = clusterLog
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(2), textlogger.Output(clusterLog)))
	e.logger = logger
	// The bridge stands for many components (every kubelet among them): client limits of
	// its own, above any one of theirs.
	bridgeClient, err := kubernetes.NewForConfig(e.Kube.Config(100, 200))
	if err != nil {
		return err
	}
	e.Bridge = NewBridge(e.Sim, bridgeClient, logger.WithName("bridge"))
	e.Pods = WatchPods(bridgeClient)
	if err := e.Bridge.Sync(); err != nil {
		return err
	}
	// The nodes there at the start registered before the scenario: an hour ago.
	for _, name := range e.Bridge.Registered {
		if err := e.Kube.Backdate(name, time.Now().Add(-time.Hour)); err != nil {
			return err
		}
	}
	e.Controllers, err = StartControllers(e.Kube, logger)
	if err != nil {
		return err
	}
	if sc.Providers != nil {
		if err := sc.Providers(e, tls, nodes, provFlags); err != nil {
			return err
		}
	} else if err := e.routeSingle(tls); err != nil {
		// The autoscaler reaches the one provider through its Service too (service.go).
		return err
	}
	var wrap = wrapCloudProvider
	if !sc.Wrap {
		wrap = nil
	}
	e.Up, err = Build(opts, wrap)
	if err != nil {
		return err
	}
	e.Up.Reader = bridgeClient
	if err := sc.Run(e); err != nil {
		return err
	}
	return nil
}

// saveSimRequests writes the CloudStack requests cks-sim recorded (since the scenario's last
// simResetRequests, when it made one) to sim-requests.json in the work directory, for a
// failure's diagnosis.
func (e *Env) saveSimRequests() {
	if e.Sim == nil {
		return
	}
	if body, err := e.Sim.Admin("simRequests"); err == nil {
		_ = os.WriteFile(filepath.Join(e.Dir, "sim-requests.json"), body, 0o644)
	}
}

// Close stops our processes, the autoscaler's informers, the controllers and the bridge.
func (e *Env) Close() {
	// Replicas first, while the API server they release their Lease on still runs.
	e.Proxy.Stop()
	e.Prober.Stop()
	e.CloudStack.Close()
	for _, r := range e.Replicas {
		r.Stop(syscall.SIGTERM)
	}
	if e.Replicas != nil {
		e.Prov = nil
	}
	e.Up.Stop()
	e.Controllers.Stop()
	e.Bridge.Stop()
	e.Pods.Stop()
	e.Kube.Stop()
	if e.clusterLog != nil {
		e.clusterLog.Close()
	}
	if e.Prov != nil {
		e.Prov.Stop(syscall.SIGTERM)
	}
	if e.Sim != nil {
		e.Sim.Stop(syscall.SIGTERM)
	}
}

// Step is one scan interval: the bridge mirrors, the autoscaler runs once, the bridge
// places what can be placed.
func (e *Env) Step() error {
	start := time.Now()
	if err := e.Bridge.Sync(); err != nil {
		return fmt.Errorf("bridge: %v", err)
	}
	e.Up.RunOnce()
	e.loops++
	if err := e.Bridge.Sync(); err != nil {
		return fmt.Errorf("bridge: %v", err)
	}
	if d := e.Up.Options.ScanInterval - time.Since(start); d > 0 {
		time.Sleep(d)
	}
	return nil
}

// Until steps until cond holds, failing after within.
func (e *Env) Until(what string, within time.Duration, cond func() bool) error {
	deadline := time.Now().Add(within)
	for {
		if err := e.Step(); err != nil {
			return err
		}
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (%s)", within, what, e.Describe())
		}
	}
}

// Between waits for cond as Until does, the bridge mirroring every scan interval, without
// running upstream's loop: what happens between two of its iterations (its scan interval is
// 10 s upstream, 1 s here), such as a workload deployed and Ready before it looks again.
func (e *Env) Between(what string, within time.Duration, cond func() bool) error {
	deadline := time.Now().Add(within)
	for {
		if err := e.Bridge.Sync(); err != nil {
			return fmt.Errorf("bridge: %v", err)
		}
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (%s)", within, what, e.Describe())
		}
		time.Sleep(e.Up.Options.ScanInterval)
	}
}

// Steps runs n scan intervals.
func (e *Env) Steps(n int) error {
	for i := 0; i < n; i++ {
		if err := e.Step(); err != nil {
			return err
		}
	}
	return nil
}

// Fail records a failed check (the scenario goes on).
func (e *Env) Fail(format string, a ...any) {
	e.failures = append(e.failures, fmt.Sprintf(format, a...))
}

// Check records a failed check when ok is false.
func (e *Env) Check(ok bool, format string, a ...any) {
	if !ok {
		e.Fail(format, a...)
	}
}

// Describe summarises the world for a failure message.
func (e *Env) Describe() string {
	var parts []string
	if c, err := e.Sim.Cluster(); err == nil {
		states := map[string]int{}
		for _, s := range c.Workers {
			states[s]++
		}
		parts = append(parts, fmt.Sprintf("cluster %s size %d workers %v", c.State, c.Size, states))
	}
	bound, pending := e.Bridge.PodCounts()
	parts = append(parts, fmt.Sprintf("pods bound %d pending %d terminating %d, worker nodes %d", bound, pending, e.Bridge.Terminating(), len(e.Bridge.WorkerNodes())))
	if st, err := e.Up.Status(); err == nil && len(st.NodeGroups) > 0 {
		g := st.NodeGroups[0]
		parts = append(parts, fmt.Sprintf("upstream: target %d registered %d ready %d unready %d notStarted %d beingDeleted %d unregistered %d longUnregistered %d, health %s, scaleUp %s %s",
			g.Health.CloudProviderTarget, g.Health.NodeCounts.Registered.Total, g.Health.NodeCounts.Registered.Ready,
			g.Health.NodeCounts.Registered.Unready.Total, g.Health.NodeCounts.Registered.NotStarted,
			g.Health.NodeCounts.Registered.BeingDeleted, g.Health.NodeCounts.Unregistered, g.Health.NodeCounts.LongUnregistered,
			g.Health.Status, g.ScaleUp.Status, g.ScaleUp.BackoffInfo.ErrorCode))
	} else if err != nil {
		parts = append(parts, "status: "+err.Error())
	}
	return strings.Join(parts, "; ")
}
