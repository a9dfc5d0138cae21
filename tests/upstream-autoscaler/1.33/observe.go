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

// LogWatch receives klog's output: it writes it to a file and keeps the lines that show each
// watched phrase (phrases.go).
type LogWatch struct {
	mu      sync.Mutex
	f       *os.File
	partial []byte
	lines   map[Phrase][]string
}

// NewLogWatch routes klog's output (every severity, each line once) to path.
func NewLogWatch(path string) (*LogWatch, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := &LogWatch{f: f, lines: map[Phrase][]string{}}
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
		for _, ph := range watched {
			if strings.Contains(line, ph.Text) {
				w.lines[ph] = append(w.lines[ph], line)
			}
		}
	}
	return len(p), nil
}

// Lines are the lines that showed phrase so far, those that also contain every one of also
// when it is given. A phrase the watch does not know is a bug of the harness: it panics
// rather than count nothing.
func (w *LogWatch) Lines(phrase Phrase, also ...string) []string {
	known := false
	for _, ph := range watched {
		known = known || ph == phrase
	}
	if !known {
		panic(fmt.Sprintf("log phrase %q is not watched (phrases.go)", phrase.Text))
	}
	klog.Flush()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, l := range w.lines[phrase] {
		ok := true
		for _, a := range also {
			ok = ok && strings.Contains(l, a)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// Count is how many lines showed phrase (and every one of also) so far.
func (w *LogWatch) Count(phrase Phrase, also ...string) int {
	return len(w.Lines(phrase, also...))
}

// Never records a failure for every phrase of phrases the log showed.
func (e *Env) Never(phrases ...Phrase) {
	for _, ph := range phrases {
		if l := e.Log.Lines(ph); len(l) > 0 {
			e.Fail("autoscaler log: %d× %q, first: %s", len(l), ph.Text, l[0])
		}
	}
}

// Status reads the autoscaler's ClusterAutoscalerStatus ConfigMap (through the harness's own
// client: the autoscaler's has its rate limits to keep for the autoscaler).
func (u *Upstream) Status() (*api.ClusterAutoscalerStatus, error) {
	cm, err := u.Reader.CoreV1().ConfigMaps(u.Options.ConfigNamespace).Get(context.Background(), u.Options.StatusConfigMapName, metav1.GetOptions{})
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
