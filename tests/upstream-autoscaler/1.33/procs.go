package main

// The two processes of ours: cks-sim (CloudStack) and the provider (`serve`), on loopback.

import (
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stablePort is a free port below the kernel's ephemeral range (net.ipv4.ip_local_port_range),
// for a server started again on the same port: no outgoing connection of any process (nor the
// autoscaler's gRPC client reconnecting to it, which can be given the port it dials as its own)
// can hold such a port while the server is down. freePort's when the range is unknown.
func stablePort() (int, error) {
	low := 0
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &low)
	}
	const first = 10000
	if low <= first+1000 {
		return freePort()
	}
	start := first + rand.Intn(low-first)
	for i := 0; i < low-first; i++ {
		port := first + (start-first+i)%(low-first)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			l.Close()
			return port, nil
		}
	}
	return freePort()
}

func waitHTTP(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not answering 200 within %s", url, within)
}

// Proc is a child process with its output in a file.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string
	done chan struct{}
}

func startProc(dir, name, bin string, args ...string) (*Proc, error) {
	return startProcIn("", dir, name, bin, args...)
}

// startProcIn starts bin in the working directory cwd (this process's when empty), its output
// to dir/name.log.
func startProcIn(cwd, dir, name, bin string, args ...string) (*Proc, error) {
	return startProcEnv(cwd, dir, name, bin, nil, args...)
}

// startProcEnv is startProcIn with env (KEY=VALUE) added to this process's environment.
func startProcEnv(cwd, dir, name, bin string, env []string, args ...string) (*Proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = cwd
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(append(os.Environ(), "RUST_LOG=info"), env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Stop sends sig and waits for the process to end (SIGKILL after 10 s).
func (p *Proc) Stop(sig syscall.Signal) {
	if p == nil {
		return
	}
	_ = p.Cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Sim is a running cks-sim.
type Sim struct {
	*Proc
	URL, Key, Secret string
}

// StartSim starts cks-sim on a free port with a scenario file and test timings.
func StartSim(dir, bin, scenario string, extra ...string) (*Sim, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	scen := filepath.Join(dir, "scenario.yaml")
	if err := os.WriteFile(scen, []byte(scenario), 0o644); err != nil {
		return nil, err
	}
	s := &Sim{URL: fmt.Sprintf("http://127.0.0.1:%d/client/api", port), Key: "upstream-test-key", Secret: "upstream-test-secret"}
	timings := map[string]string{"--job-duration-ms": "3000", "--kubelet-delay-ms": "1000",
		"--scanner-interval-ms": "1000", "--vm-op-ms": "500", "--ready-poll-ms": "200", "--max-cluster-size": "1100"}
	for i := 0; i+1 < len(extra); i += 2 {
		delete(timings, extra[i]) // a scenario's own value wins
	}
	args := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--scenario", scen, "--api-key", s.Key, "--secret-key", s.Secret}
	for k, v := range timings {
		args = append(args, k, v)
	}
	args = append(args, extra...)
	p, err := startProc(dir, "cks-sim", bin, args...)
	if err != nil {
		return nil, err
	}
	s.Proc = p
	if err := waitHTTP(s.URL+"?command=simListNodes&response=json", 20*time.Second); err != nil {
		p.Stop(syscall.SIGKILL)
		return nil, err
	}
	return s, nil
}

// Provider is the provider's serve process; Restart starts it again on the same ports.
type Provider struct {
	*Proc
	dir, bin    string
	args        []string
	env         []string // KEY=VALUE added to the environment (leader.go's replicas)
	Addr        string
	MetricsURL  string
	CloudConfig string // the autoscaler's cloud-config (YAML)
}

// StartProvider writes the provider's ini cloud-config and the autoscaler's YAML
// cloud-config, then starts `serve` with mutual TLS.
func StartProvider(dir, bin string, sim *Sim, tls TLSFiles, nodes string, extra ...string) (*Provider, error) {
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
	if err := os.WriteFile(ini, []byte(fmt.Sprintf("[Global]\napi-url = %s\napi-key = %s\nsecret-key = %s\n", sim.URL, sim.Key, sim.Secret)), 0o600); err != nil {
		return nil, err
	}
	cc := autoscalerCloudConfig(dir)
	yaml := fmt.Sprintf("address: \"localhost:%d\"\nkey: %s\ncert: %s\ncacert: %s\ngrpc_timeout: 10s\n", port, tls.ClientKey, tls.ClientCert, tls.CA)
	if err := os.WriteFile(cc, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	p := &Provider{dir: dir, bin: bin, Addr: fmt.Sprintf("127.0.0.1:%d", port),
		MetricsURL: fmt.Sprintf("http://127.0.0.1:%d", mport), CloudConfig: cc}
	p.args = append([]string{"serve",
		"--listen", p.Addr, "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", mport),
		"--cloud-config", ini, "--nodes", nodes,
		"--tls-cert", tls.ServerCert, "--tls-key", tls.ServerKey, "--tls-client-ca", tls.CA,
		"--job-poll-interval", "500ms", "--refresh-min-interval", "500ms",
	}, extra...)
	return p, p.Restart()
}

// autoscalerCloudConfig is where StartProvider writes the autoscaler's cloud-config.
func autoscalerCloudConfig(dir string) string {
	return filepath.Join(dir, "autoscaler-cloud-config.yaml")
}

// Restart starts the provider process (again), on the ports it had. A port the kernel lent a
// moment before to an outgoing connection (the autoscaler's gRPC client reconnecting to the
// dead provider's port can be given that very port as its own, a loopback self-connection)
// makes the start fail with "Address already in use": the start is tried again while that
// lasts, for at most 15 s.
func (p *Provider) Restart() error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		from := int64(0)
		if fi, err := os.Stat(filepath.Join(p.dir, "provider.log")); err == nil {
			from = fi.Size()
		}
		proc, err := startProcEnv("", p.dir, "provider", p.bin, p.env, p.args...)
		if err != nil {
			return err
		}
		p.Proc = proc
		err = waitReady(p.MetricsURL+"/readyz", 30*time.Second, proc.done)
		if err == nil {
			return nil
		}
		if proc.exited() && proc.logSince(from, "Address already in use") && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		return fmt.Errorf("provider: %v (log %s)", err, proc.Log)
	}
}

// waitReady polls url until it answers 200, failing at once when the process ends (done).
func waitReady(url string, within time.Duration, done <-chan struct{}) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("the process ended before %s answered 200", url)
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not answering 200 within %s", url, within)
}

// exited is whether the process has ended.
func (p *Proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logSince is whether the process's log, from byte offset from on, contains text.
func (p *Proc) logSince(from int64, text string) bool {
	b, err := os.ReadFile(p.Log)
	if err != nil || int64(len(b)) < from {
		return false
	}
	return strings.Contains(string(b[from:]), text)
}

// Metric sums the provider's /metrics samples of name whose labels contain every one of
// labels (each `key="value"`).
func (p *Provider) Metric(name string, labels ...string) float64 {
	resp, err := http.Get(p.MetricsURL + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	return sumSamples(string(body), name, labels)
}

// sumSamples sums the samples of name in a Prometheus text page whose labels contain every
// one of labels (each `key="value"`).
func sumSamples(body, name string, labels []string) float64 {
	total := 0.0
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		f := strings.Fields(line)
		if ok && len(f) >= 2 {
			var v float64
			fmt.Sscan(f[len(f)-1], &v)
			total += v
		}
	}
	return total
}
