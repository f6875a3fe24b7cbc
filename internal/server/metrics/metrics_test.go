package metrics

import (
	"bufio"
	"bytes"
	"math"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// parse reads the exposition back with Prometheus's own text parser.
func parse(t *testing.T, r *Registry) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("content type %q", ct)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, rec.Body.String())
	}
	return fams
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestExpositionParsesAndCounts(t *testing.T) {
	r := NewRegistry()
	req := r.NewCounterVec("t_requests_total", "Requests by operation and code.\nSecond line \\ too.", "operation", "code")
	lat := r.NewHistogramVec("t_seconds", "Latency.", ExponentialBuckets(0.001, 10, 3), "operation")
	c := r.NewCounter("t_chunks_total", "Chunks.")
	g := r.NewGauge("t_conns", "Connections.")
	r.RegisterRuntime()

	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				req.WithLabelValues("Health", "200").Inc()
				c.Add(2)
			}
		}()
	}
	wg.Wait()
	req.WithLabelValues(`we"ird\op`+"\n", "500").Inc()
	c.Add(-5) // ignored: counters only go up
	g.Inc()
	g.Inc()
	g.Dec()
	for _, x := range []float64{0.0005, 0.001, 0.005, 0.5, 3} {
		lat.WithLabelValues("Health").Observe(x)
	}

	fams := parse(t, r)
	reqs := fams["t_requests_total"]
	if reqs.GetType() != dto.MetricType_COUNTER || reqs.GetHelp() != "Requests by operation and code.\nSecond line \\ too." || len(reqs.Metric) != 2 {
		t.Fatalf("requests family %v", reqs)
	}
	for _, m := range reqs.Metric {
		switch label(m, "code") {
		case "200":
			if label(m, "operation") != "Health" || m.GetCounter().GetValue() != 8000 {
				t.Errorf("Health 200: %v", m)
			}
		case "500":
			if label(m, "operation") != `we"ird\op`+"\n" || m.GetCounter().GetValue() != 1 {
				t.Errorf("escaped labels: %v", m)
			}
		}
	}
	if v := fams["t_chunks_total"].Metric[0].GetCounter().GetValue(); v != 16000 {
		t.Errorf("chunks %v", v)
	}
	if v := fams["t_conns"].Metric[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("conns %v", v)
	}
	h := fams["t_seconds"].Metric[0].GetHistogram()
	// Buckets are cumulative and "less or equal": 0.001 holds 0.0005 and 0.001.
	want := map[float64]uint64{0.001: 2, 0.01: 3, 0.1: 3}
	for _, b := range h.GetBucket() {
		if w, ok := want[b.GetUpperBound()]; ok && b.GetCumulativeCount() != w {
			t.Errorf("bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
		}
	}
	if h.GetSampleCount() != 5 || math.Abs(h.GetSampleSum()-3.5065) > 1e-9 {
		t.Errorf("histogram count %d sum %v", h.GetSampleCount(), h.GetSampleSum())
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} {
		f, ok := fams[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		m := f.Metric[0]
		if v := m.GetGauge().GetValue() + m.GetCounter().GetValue(); !(v > 0) {
			t.Errorf("%s = %v", name, v)
		}
	}
}

func TestRegisteringANameTwicePanics(t *testing.T) {
	r := NewRegistry()
	r.NewCounter("x_total", "x")
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	r.NewGauge("x_total", "again")
}

func TestWrongLabelCountPanics(t *testing.T) {
	v := NewRegistry().NewCounterVec("y_total", "y", "a", "b")
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	v.WithLabelValues("only-one")
}

func TestEmptyFamiliesStillParse(t *testing.T) {
	r := NewRegistry()
	r.NewCounterVec("z_total", "nothing yet", "kind")
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	r.WriteTo(w)
	_ = w.Flush()
	if !strings.Contains(b.String(), "# TYPE z_total counter") {
		t.Fatalf("%q", b.String())
	}
	parse(t, r)
}
