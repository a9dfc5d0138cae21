package main

// A real Kubernetes API server for one scenario: etcd and kube-apiserver, the binaries
// tools/kube-testenv/build.sh builds (kube-apiserver of k8s.io/kubernetes v1.33.1, etcd
// v3.5.21), started on loopback in the scenario's work directory, as crates/testkit's
// kube.rs starts them for the Rust tests: HTTPS with a serving certificate of a CA of our
// own, RBAC, service-account tokens signed by a key generated here, and the admin a static
// bearer token in system:masters. Every wait polls a condition with a bound.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The API server's flags that differ from its defaults for the scenarios' sake (defaults in
// brackets): the tolerations the DefaultTolerationSeconds admission plugin gives every pod
// (plugin/pkg/admission/defaulttolerationseconds/admission.go), shortened as the
// autoscaler's timers are [300].
const defaultTolerationSeconds = 30

// kubeStartBound is how long etcd and the API server may take to come up (a few seconds on
// an idle machine; far more on a loaded one, which makes a scenario slower, never red).
const kubeStartBound = 120 * time.Second

// Kube is etcd and kube-apiserver running for one scenario.
type Kube struct {
	dir, bins  string
	etcd, api  *Proc
	EtcdURL    string
	URL        string // https://127.0.0.1:PORT
	CAFile     string
	Token      string // the admin's bearer token (system:masters)
	Kubeconfig string // the autoscaler's --kubeconfig: the admin
}

// StartKube starts etcd and kube-apiserver from bins (the directory build.sh prints) with
// their files in dir/kube, and returns once /readyz answers 200 and the namespaces the API
// server creates itself (default, kube-system) exist.
func StartKube(dir, bins string) (*Kube, error) {
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if fi, err := os.Stat(filepath.Join(bins, b)); err != nil || fi.IsDir() {
			return nil, fmt.Errorf("no %s in %s: build it with tools/kube-testenv/build.sh", b, bins)
		}
	}
	// Absolute: the processes run in the kube directory (etcd's peer socket is named
	// relative to it, a Unix socket's path being short).
	absDir, err := filepath.Abs(filepath.Join(dir, "kube"))
	if err != nil {
		return nil, err
	}
	absBins, err := filepath.Abs(bins)
	if err != nil {
		return nil, err
	}
	k := &Kube{dir: absDir, bins: absBins}
	// A fresh etcd: nothing of an earlier run in the same directory.
	if err := os.RemoveAll(k.dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(k.dir, 0o755); err != nil {
		return nil, err
	}
	if err := k.writeFiles(); err != nil {
		return nil, err
	}
	if err := k.startEtcd(); err != nil {
		return nil, err
	}
	if err := k.startAPIServer(); err != nil {
		k.Stop()
		return nil, err
	}
	return k, nil
}

// writeFiles writes the CA, the serving certificate, the service-account key pair, the
// token file and the admin's kubeconfig.
func (k *Kube) writeFiles() error {
	now := time.Now().Add(-time.Hour)
	ca, caKey, caPath, _, err := issue(k.dir, "ca", &x509.Certificate{
		SerialNumber: newSerial(), Subject: pkixName("upstream-autoscaler kube CA"),
		NotBefore: now, NotAfter: now.Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	if err != nil {
		return err
	}
	if _, _, _, _, err := issue(k.dir, "serving", serverTemplate("kube-apiserver", now), ca, caKey); err != nil {
		return err
	}
	k.CAFile = caPath
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	priv, err := x509.MarshalPKCS8PrivateKey(sa)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(k.dir, "sa-key.pem"), "PRIVATE KEY", priv); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(k.dir, "sa-pub.pem"), "PUBLIC KEY", pub); err != nil {
		return err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	k.Token = "admin-" + base64.RawURLEncoding.EncodeToString(raw)
	return os.WriteFile(filepath.Join(k.dir, "tokens.csv"), []byte(k.Token+",upstream-admin,upstream-admin,\"system:masters\"\n"), 0o600)
}

// startEtcd starts etcd with its client on a free loopback port (the harness reads and writes
// it through etcd's JSON gateway, Backdate) and its peer on a Unix socket in the kube
// directory; another port is tried when the one chosen was taken in between.
func (k *Kube) startEtcd() error {
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		k.EtcdURL = fmt.Sprintf("http://127.0.0.1:%d", port)
		p, err := startProcIn(k.dir, k.dir, "etcd", filepath.Join(k.bins, "etcd"),
			"--name=default", "--data-dir="+filepath.Join(k.dir, "etcd-data"),
			"--listen-client-urls="+k.EtcdURL, "--advertise-client-urls="+k.EtcdURL,
			"--listen-peer-urls=unix://etcd-peer:0", "--initial-advertise-peer-urls=unix://etcd-peer:0",
			"--initial-cluster=default=unix://etcd-peer:0",
			// The scenario's data is thrown away with it.
			"--unsafe-no-fsync", "--log-level=warn")
		if err != nil {
			return err
		}
		k.etcd = p
		last = waitFor(kubeStartBound, p, func() bool {
			resp, err := http.Get(k.EtcdURL + "/health")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
		if last == nil {
			return nil
		}
		p.Stop(syscall.SIGKILL)
		if !p.logSince(0, "address already in use") {
			break
		}
	}
	return fmt.Errorf("etcd: %v (log %s)", last, filepath.Join(k.dir, "etcd.log"))
}

func (k *Kube) startAPIServer() error {
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		// Below the ephemeral range: RestartAPIServer starts it again on this port, which no
		// client's outgoing connection can hold meanwhile (procs.go stablePort).
		port, err := stablePort()
		if err != nil {
			return err
		}
		k.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
		if last = k.launchAPIServer(port); last == nil {
			break
		}
		if !k.api.logSince(0, "address already in use") {
			return fmt.Errorf("kube-apiserver: %v (log %s)", last, k.api.Log)
		}
	}
	if last != nil {
		return fmt.Errorf("kube-apiserver: %v", last)
	}
	if err := k.writeKubeconfig(); err != nil {
		return err
	}
	// The namespaces the API server's own controller creates at start (default, kube-system;
	// pkg/controlplane/controller/systemnamespaces), and the ServiceAccount "default" that
	// kube-controller-manager's serviceaccount controller creates in each namespace
	// (pkg/controller/serviceaccount/serviceaccounts_controller.go) and without which the
	// ServiceAccount admission plugin refuses every pod (plugin/pkg/admission/serviceaccount).
	cs, err := kubernetes.NewForConfig(k.Config(50, 100))
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := waitFor(kubeStartBound, k.api, func() bool {
		_, e1 := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		_, e2 := cs.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
		return e1 == nil && e2 == nil
	}); err != nil {
		return fmt.Errorf("kube-apiserver: the namespaces default and kube-system: %v", err)
	}
	sa := &apiv1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: podNamespace}}
	if _, err := cs.CoreV1().ServiceAccounts(podNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// launchAPIServer starts kube-apiserver on port (etcd's data as it is) and waits for its
// /readyz; on failure the process is killed.
func (k *Kube) launchAPIServer(port int) error {
	f := func(name string) string { return filepath.Join(k.dir, name) }
	p, err := startProcIn(k.dir, k.dir, "kube-apiserver", filepath.Join(k.bins, "kube-apiserver"),
		"--etcd-servers="+k.EtcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file="+f("serving.crt"), "--tls-private-key-file="+f("serving.key"),
		"--token-auth-file="+f("tokens.csv"), "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+f("sa-pub.pem"), "--service-account-signing-key-file="+f("sa-key.pem"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--enable-priority-and-fairness=false", "--profiling=false",
		fmt.Sprintf("--default-not-ready-toleration-seconds=%d", defaultTolerationSeconds),
		fmt.Sprintf("--default-unreachable-toleration-seconds=%d", defaultTolerationSeconds),
		// Objects stored as JSON, so Backdate can rewrite a Node's creation time in etcd.
		"--storage-media-type=application/json")
	if err != nil {
		return err
	}
	k.api = p
	err = waitFor(kubeStartBound, p, func() bool { code, _, err := k.Raw("GET", "/readyz", nil); return err == nil && code == 200 })
	if err != nil {
		p.Stop(syscall.SIGKILL)
	}
	return err
}

// StopAPIServer kills kube-apiserver (etcd keeps running): the API is down.
func (k *Kube) StopAPIServer() { k.api.Stop(syscall.SIGKILL) }

// RestartAPIServer starts kube-apiserver again on its port with the same etcd, certificates
// and tokens (what a restarted control plane node serves), and returns once /readyz answers.
func (k *Kube) RestartAPIServer() error {
	port, err := strconv.Atoi(k.URL[strings.LastIndex(k.URL, ":")+1:])
	if err != nil {
		return err
	}
	return k.launchAPIServer(port)
}

// waitFor polls cond until it holds, failing when p ends or within passes.
func waitFor(within time.Duration, p *Proc, cond func() bool) error {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited (log %s)", p.Name, p.Log)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s (log %s)", p.Name, within, p.Log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kubeconfigPath is where StartKube writes the admin's kubeconfig for a work directory (the
// autoscaler's --kubeconfig, known before the API server is up).
func kubeconfigPath(dir string) string { return filepath.Join(dir, "kube", "admin.kubeconfig") }

func (k *Kube) writeKubeconfig() error {
	k.Kubeconfig = filepath.Join(k.dir, "admin.kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: upstream
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: upstream
  context:
    cluster: upstream
    user: admin
current-context: upstream
`, k.URL, k.CAFile, k.Token)
	return os.WriteFile(k.Kubeconfig, []byte(cfg), 0o600)
}

// Config is a client configuration of the admin with the given client-side rate limits.
func (k *Kube) Config(qps float32, burst int) *rest.Config {
	return &rest.Config{Host: k.URL, BearerToken: k.Token, TLSClientConfig: rest.TLSClientConfig{CAFile: k.CAFile}, QPS: qps, Burst: burst}
}

// Raw sends one request as the admin and returns the status code and body.
func (k *Kube) Raw(method, path string, body []byte) (int, []byte, error) {
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(k.CAFile)
	if err != nil {
		return 0, nil, err
	}
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(method, k.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+k.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Metric sums the API server's /metrics samples of name whose labels contain every one of
// labels (each `key="value"`).
func (k *Kube) Metric(name string, labels ...string) float64 {
	code, body, err := k.Raw("GET", "/metrics", nil)
	if err != nil || code != 200 {
		return -1
	}
	return sumSamples(string(body), name, labels)
}

// Backdate rewrites the creation time of the Node name in etcd to at: a node the scenario
// finds registered was registered before it (a cluster's workers are not minutes old), and
// upstream counts a node that is not Ready as still starting for MaxNodeStartupTime after its
// creation (clusterstate.go updateReadinessStats). The API server sets creationTimestamp
// itself on create and keeps it on update (k8s.io/apiserver pkg/registry/rest
// BeforeCreate/BeforeUpdate), so the stored object is changed where it is stored; the API
// server's watch of etcd then sends every watcher the change as an update.
func (k *Kube) Backdate(name string, at time.Time) error {
	key := "/registry/minions/" + name
	var rng struct {
		Kvs []struct {
			Value       string `json:"value"`
			ModRevision string `json:"mod_revision"`
		} `json:"kvs"`
	}
	if err := k.etcdCall("/v3/kv/range", map[string]any{"key": b64(key)}, &rng); err != nil {
		return err
	}
	if len(rng.Kvs) != 1 {
		return fmt.Errorf("etcd has no %s", key)
	}
	raw, err := base64.StdEncoding.DecodeString(rng.Kvs[0].Value)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return fmt.Errorf("%s is not JSON (--storage-media-type): %v", key, err)
	}
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		return fmt.Errorf("%s has no metadata", key)
	}
	meta["creationTimestamp"] = at.UTC().Format(time.RFC3339)
	value, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var txn struct {
		Succeeded bool `json:"succeeded"`
	}
	req := map[string]any{
		"compare": []map[string]any{{"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": rng.Kvs[0].ModRevision}},
		"success": []map[string]any{{"request_put": map[string]any{"key": b64(key), "value": base64.StdEncoding.EncodeToString(value)}}},
	}
	if err := k.etcdCall("/v3/kv/txn", req, &txn); err != nil {
		return err
	}
	if !txn.Succeeded {
		return fmt.Errorf("%s changed while it was backdated", key)
	}
	return nil
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func (k *Kube) etcdCall(path string, req any, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	resp, err := http.Post(k.EtcdURL+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("etcd %s: HTTP %d: %s", path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return json.Unmarshal(b, out)
}

// Stop kills the API server, then etcd: their data is thrown away with the scenario, a
// graceful shutdown would only cost time.
func (k *Kube) Stop() {
	if k == nil {
		return
	}
	if k.api != nil {
		k.api.Stop(syscall.SIGKILL)
	}
	if k.etcd != nil {
		k.etcd.Stop(syscall.SIGKILL)
	}
}
