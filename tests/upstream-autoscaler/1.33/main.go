// Command upstream-ca runs one scenario: the real cluster-autoscaler (this module's release,
// in process, on client-go's fake clientset) against the provider and cks-sim, over mutual
// TLS. It prints one line, PASS or FAIL with the reasons, and exits non-zero on failure.
//
//	upstream-ca -scenario scale-up-down -sim target/release/cks-sim \
//	    -provider target/release/cks-autoscaler-provider [-dir DIR] [-keep]
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

	"k8s.io/client-go/kubernetes/fake"
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
	if !ok || *simBin == "" || *provBin == "" {
		fmt.Fprintf(os.Stderr, "usage: upstream-ca -scenario NAME -sim BIN -provider BIN (scenarios: %s)\n", strings.Join(scenarioNames(), ", "))
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
	e := &Env{Dir: workDir, SimBin: *simBin, ProvBin: *provBin, ExtraFlags: extra}
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

// Env is one scenario's world: cks-sim, the provider, the autoscaler and the bridge.
type Env struct {
	Dir, SimBin, ProvBin string
	ExtraFlags           []string
	StateFile            string // the provider's --state-file, when the scenario gives it one
	Sim                  *Sim
	Prov                 *Provider
	Up                   *Upstream
	Bridge               *Bridge
	Log                  *LogWatch
	failures             []string
	note                 string
	loops                int
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
}

// The flags of deploy/'s autoscaler Deployment, with the timers shortened.
func autoscalerFlags(cloudConfig string) []string {
	return []string{
		"--cloud-provider=externalgrpc",
		"--cloud-config=" + cloudConfig,
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
	}
}

func (e *Env) run(sc Scenario) error {
	tls, err := MakeTLS(e.Dir, ClientName)
	if err != nil {
		return err
	}
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
	args := append(autoscalerFlags(autoscalerCloudConfig(e.Dir)), sc.AutoscalerArg...)
	args = append(args, e.ExtraFlags...)
	opts := ParseFlags(args)
	// deploy/ gives the provider the autoscaler's --max-node-provision-time (one value for
	// both): the value the autoscaler parsed, the scenario's own included.
	provFlags := append([]string{"--max-node-provision-time", opts.NodeGroupDefaults.MaxNodeProvisionTime.String()}, sc.ProvFlags...)
	if sc.StateFile {
		e.StateFile = filepath.Join(e.Dir, "provider-state.json")
		provFlags = append(provFlags, "--state-file", e.StateFile)
	}
	e.Prov, err = StartProvider(e.Dir, e.ProvBin, e.Sim, tls, nodes, provFlags...)
	if err != nil {
		return err
	}
	// Everything to autoscaler.log, nothing to this process's stderr (the run's one line).
	_ = flag.Set("stderrthreshold", "FATAL")
	// Each line once: without it klog writes a warning twice and an error three times to
	// the one output (once per severity at or below the line's).
	_ = flag.Set("one_output", "true")
	kube := fake.NewSimpleClientset()
	e.Bridge = NewBridge(e.Sim, kube)
	if err := e.Bridge.Sync(); err != nil {
		return err
	}
	var wrap = wrapCloudProvider
	if !sc.Wrap {
		wrap = nil
	}
	e.Up, err = Build(opts, kube, wrap)
	if err != nil {
		return err
	}
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

// Close stops our processes (the autoscaler ends with this process).
func (e *Env) Close() {
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
