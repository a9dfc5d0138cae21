package main

// What upstream itself reports: its log (klog), its status ConfigMap and its metrics
// (the legacy registry its /metrics serves).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/autoscaler/cluster-autoscaler/clusterstate/api"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

// LogWatch receives klog's output: it writes it to a file and counts the lines that match
// each watched phrase.
type LogWatch struct {
	mu      sync.Mutex
	f       *os.File
	partial []byte
	phrases []string
	counts  map[string]int
	first   map[string]string
}

// Phrases the autoscaler's log must never show, and phrases scenarios look for.
var watched = []string{
	"panic",
	"Failed to fix node group sizes",
	"Failed to get node infos for groups",
	"Failed to refresh cloud provider config",
	"Error on gRPC call",
	"Failed to scale up",
	"Failed to increase node group size",
	"is not ready for scaleup - backoff",
	"Scale-up: setting group",
	"Disabling scale-up for node group",
	"Failed to delete",
	"Fixing target size",
	"Failed to find readiness information",
	"Removing unregistered node",
	"Deleting node group",
	"DecreaseTargetSize",
	"Scale-down: removing empty node",
	"Scale-down: removing node",
	"deleting created nodes with errors",
	"Failed to remove",
	"Failed to untaint",
	"cleaning up",
	"RunOnce error",
	"Could not get node group",
}

// NewLogWatch routes klog's output (every severity) to path.
func NewLogWatch(path string) (*LogWatch, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := &LogWatch{f: f, phrases: watched, counts: map[string]int{}, first: map[string]string{}}
	klog.LogToStderr(false)
	klog.SetOutput(w)
	return w, nil
}

func (w *LogWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.f.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		line := string(w.partial[:i])
		w.partial = w.partial[i+1:]
		for _, ph := range w.phrases {
			if strings.Contains(line, ph) {
				w.counts[ph]++
				if _, ok := w.first[ph]; !ok {
					w.first[ph] = line
				}
			}
		}
	}
	return len(p), nil
}

// Count is how many lines showed phrase so far.
func (w *LogWatch) Count(phrase string) int {
	klog.Flush()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts[phrase]
}

// First is the first line that showed phrase.
func (w *LogWatch) First(phrase string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first[phrase]
}

// Status reads the autoscaler's ClusterAutoscalerStatus ConfigMap.
func (u *Upstream) Status() (*api.ClusterAutoscalerStatus, error) {
	cm, err := u.Kube.CoreV1().ConfigMaps(u.Options.ConfigNamespace).Get(context.Background(), u.Options.StatusConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var st api.ClusterAutoscalerStatus
	if err := yaml.Unmarshal([]byte(cm.Data["status"]), &st); err != nil {
		return nil, fmt.Errorf("status ConfigMap: %v: %s", err, cm.Data["status"])
	}
	return &st, nil
}

// Metrics is a snapshot of the autoscaler's registry.
type Metrics map[string]*dto.MetricFamily

// Gather reads every metric the autoscaler registered.
func Gather() Metrics {
	fams, err := legacyregistry.DefaultGatherer.Gather()
	out := Metrics{}
	if err != nil {
		return out
	}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Value sums a counter or gauge over the series matching labels (name, value pairs).
func (ms Metrics) Value(name string, labels ...string) float64 {
	f, ok := ms[name]
	if !ok {
		return 0
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		if !matches(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		}
	}
	return total
}

// Histogram gives a histogram's sum and count over the series matching labels.
func (ms Metrics) Histogram(name string, labels ...string) (sum float64, count uint64) {
	f, ok := ms[name]
	if !ok {
		return 0, 0
	}
	for _, m := range f.GetMetric() {
		if matches(m, labels) && m.Histogram != nil {
			sum += m.GetHistogram().GetSampleSum()
			count += m.GetHistogram().GetSampleCount()
		}
	}
	return
}

// Series lists the series of name with a non-zero value, as label=value strings.
func (ms Metrics) Series(name string) []string {
	f, ok := ms[name]
	if !ok {
		return nil
	}
	var out []string
	for _, m := range f.GetMetric() {
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		if v == 0 {
			continue
		}
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		out = append(out, fmt.Sprintf("{%s} %g", strings.Join(ls, ","), v))
	}
	return out
}
