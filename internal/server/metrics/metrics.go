// Package metrics is the control plane's small Prometheus exposition: counters, gauges and
// histograms, with or without labels, and the Go runtime and process figures operators expect,
// written in the Prometheus text format (version 0.0.4).
//
// It replaces the Prometheus client library, whose package initialization every tfstackplan
// process paid for, a `run tick` from a script included, while only `serve` exposes metrics.
package metrics

import (
	"bufio"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Registry holds metric families in registration order and writes them out.
type Registry struct {
	mu       sync.Mutex
	families []family
	names    map[string]bool
}

// family is one metric name: its HELP and TYPE lines and its series.
type family interface {
	name() string
	write(w *bufio.Writer)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{names: map[string]bool{}} }

func (r *Registry) add(f family) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names[f.name()] {
		panic("metrics: " + f.name() + " registered twice")
	}
	r.names[f.name()] = true
	r.families = append(r.families, f)
}

// Handler serves the registry in the Prometheus text format.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		bw := bufio.NewWriter(w)
		r.WriteTo(bw)
		_ = bw.Flush()
	})
}

// WriteTo writes every family, in registration order.
func (r *Registry) WriteTo(w *bufio.Writer) {
	r.mu.Lock()
	fams := slices.Clone(r.families)
	r.mu.Unlock()
	for _, f := range fams {
		f.write(w)
	}
}

// value is a float64 updated atomically.
type value struct{ bits atomic.Uint64 }

func (v *value) add(d float64) {
	for {
		old := v.bits.Load()
		if v.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+d)) {
			return
		}
	}
}

func (v *value) load() float64 { return math.Float64frombits(v.bits.Load()) }

// Counter only goes up.
type Counter struct{ v value }

// Inc adds one.
func (c *Counter) Inc() { c.v.add(1) }

// Add adds d, which must not be negative (a negative d is ignored).
func (c *Counter) Add(d float64) {
	if d > 0 {
		c.v.add(d)
	}
}

// Gauge goes up and down.
type Gauge struct{ v value }

// Inc adds one.
func (g *Gauge) Inc() { g.v.add(1) }

// Dec subtracts one.
func (g *Gauge) Dec() { g.v.add(-1) }

// Set sets the value.
func (g *Gauge) Set(x float64) { g.v.bits.Store(math.Float64bits(x)) }

// Histogram counts observations in cumulative buckets.
type Histogram struct {
	upper  []float64 // bucket upper bounds, ascending, +Inf excluded
	counts []atomic.Uint64
	count  atomic.Uint64
	sum    value
}

// Observe records one observation.
func (h *Histogram) Observe(x float64) {
	if i, _ := slices.BinarySearch(h.upper, x); i < len(h.counts) {
		h.counts[i].Add(1)
	}
	h.count.Add(1)
	h.sum.add(x)
}

// ExponentialBuckets returns count upper bounds: start, start*factor, start*factor², ...
func ExponentialBuckets(start, factor float64, count int) []float64 {
	out := make([]float64, count)
	for i := range out {
		out[i] = start
		start *= factor
	}
	return out
}

// vec is a family of series keyed by label values.
type vec[T any] struct {
	fname, help, kind string
	labels            []string
	mk                func() *T
	mu                sync.RWMutex
	series            map[string]*T
	values            map[string][]string
	writeOne          func(w *bufio.Writer, name string, labels []string, values []string, s *T)
}

func (v *vec[T]) name() string { return v.fname }

// with returns the series for the label values, creating it on first use.
func (v *vec[T]) with(values ...string) *T {
	if len(values) != len(v.labels) {
		panic("metrics: " + v.fname + " takes " + strconv.Itoa(len(v.labels)) + " label values")
	}
	key := strings.Join(values, "\xff")
	v.mu.RLock()
	s, ok := v.series[key]
	v.mu.RUnlock()
	if ok {
		return s
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if s, ok = v.series[key]; !ok {
		s = v.mk()
		v.series[key] = s
		v.values[key] = slices.Clone(values)
	}
	return s
}

func (v *vec[T]) write(w *bufio.Writer) {
	header(w, v.fname, v.help, v.kind)
	v.mu.RLock()
	keys := make([]string, 0, len(v.series))
	for k := range v.series {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	// Label pairs go out sorted by label name, as the Prometheus client library writes them.
	order := make([]int, len(v.labels))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(v.labels[a], v.labels[b]) })
	labels := make([]string, len(order))
	for i, j := range order {
		labels[i] = v.labels[j]
	}
	values := make([]string, len(order))
	for _, k := range keys {
		for i, j := range order {
			values[i] = v.values[k][j]
		}
		v.writeOne(w, v.fname, labels, values, v.series[k])
	}
	v.mu.RUnlock()
}

func newVec[T any](r *Registry, name, help, kind string, labels []string, mk func() *T,
	writeOne func(*bufio.Writer, string, []string, []string, *T)) *vec[T] {
	v := &vec[T]{fname: name, help: help, kind: kind, labels: labels, mk: mk,
		series: map[string]*T{}, values: map[string][]string{}, writeOne: writeOne}
	r.add(v)
	return v
}

func writeCounter(w *bufio.Writer, name string, labels, values []string, c *Counter) {
	sample(w, name, labels, values, "", "", c.v.load())
}

func writeGauge(w *bufio.Writer, name string, labels, values []string, g *Gauge) {
	sample(w, name, labels, values, "", "", g.v.load())
}

func writeHistogram(w *bufio.Writer, name string, labels, values []string, h *Histogram) {
	var cum uint64
	for i, up := range h.upper {
		cum += h.counts[i].Load()
		sample(w, name+"_bucket", labels, values, "le", formatFloat(up), float64(cum))
	}
	total := h.count.Load()
	sample(w, name+"_bucket", labels, values, "le", "+Inf", float64(total))
	sample(w, name+"_sum", labels, values, "", "", h.sum.load())
	sample(w, name+"_count", labels, values, "", "", float64(total))
}

// CounterVec is counters keyed by label values.
type CounterVec struct{ v *vec[Counter] }

// NewCounterVec registers a counter family with the given label names.
func (r *Registry) NewCounterVec(name, help string, labels ...string) *CounterVec {
	return &CounterVec{newVec(r, name, help, "counter", labels, func() *Counter { return &Counter{} }, writeCounter)}
}

// WithLabelValues returns the counter of these label values (in the family's label order).
func (c *CounterVec) WithLabelValues(values ...string) *Counter { return c.v.with(values...) }

// NewCounter registers a counter without labels.
func (r *Registry) NewCounter(name, help string) *Counter {
	return newVec(r, name, help, "counter", nil, func() *Counter { return &Counter{} }, writeCounter).with()
}

// NewGauge registers a gauge without labels.
func (r *Registry) NewGauge(name, help string) *Gauge {
	return newVec(r, name, help, "gauge", nil, func() *Gauge { return &Gauge{} }, writeGauge).with()
}

// HistogramVec is histograms keyed by label values.
type HistogramVec struct{ v *vec[Histogram] }

// NewHistogramVec registers a histogram family with the given bucket upper bounds (ascending)
// and label names.
func (r *Registry) NewHistogramVec(name, help string, buckets []float64, labels ...string) *HistogramVec {
	upper := slices.Clone(buckets)
	slices.Sort(upper)
	return &HistogramVec{newVec(r, name, help, "histogram", labels, func() *Histogram {
		return &Histogram{upper: upper, counts: make([]atomic.Uint64, len(upper))}
	}, writeHistogram)}
}

// WithLabelValues returns the histogram of these label values.
func (h *HistogramVec) WithLabelValues(values ...string) *Histogram { return h.v.with(values...) }

// funcFamily is a gauge or counter read when written.
type funcFamily struct {
	fname, help, kind string
	read              func() float64
}

func (f *funcFamily) name() string { return f.fname }

func (f *funcFamily) write(w *bufio.Writer) {
	header(w, f.fname, f.help, f.kind)
	sample(w, f.fname, nil, nil, "", "", f.read())
}

// NewGaugeFunc registers a gauge whose value read returns when the registry is written.
func (r *Registry) NewGaugeFunc(name, help string, read func() float64) {
	r.add(&funcFamily{fname: name, help: help, kind: "gauge", read: read})
}

// NewCounterFunc registers a counter whose value read returns when the registry is written.
func (r *Registry) NewCounterFunc(name, help string, read func() float64) {
	r.add(&funcFamily{fname: name, help: help, kind: "counter", read: read})
}

// RegisterRuntime adds the Go runtime and process figures: goroutines, heap, GC, threads, CPU
// time, resident memory, open files and start time, under their usual names.
func (r *Registry) RegisterRuntime() {
	start := float64(time.Now().Unix())
	mem := func(f func(*runtime.MemStats) uint64) func() float64 {
		return func() float64 {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return float64(f(&m))
		}
	}
	r.NewGaugeFunc("go_goroutines", "Number of goroutines that currently exist.", func() float64 { return float64(runtime.NumGoroutine()) })
	r.NewGaugeFunc("go_memstats_heap_alloc_bytes", "Bytes of allocated heap objects.", mem(func(m *runtime.MemStats) uint64 { return m.HeapAlloc }))
	r.NewGaugeFunc("go_memstats_sys_bytes", "Bytes of memory obtained from the OS.", mem(func(m *runtime.MemStats) uint64 { return m.Sys }))
	r.NewCounterFunc("go_gc_cycles_total", "Completed GC cycles.", mem(func(m *runtime.MemStats) uint64 { return uint64(m.NumGC) }))
	r.NewGaugeFunc("go_threads", "Number of OS threads created.", func() float64 { n, _ := runtime.ThreadCreateProfile(nil); return float64(n) })
	r.NewCounterFunc("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", func() float64 {
		var ru syscall.Rusage
		if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
			return math.NaN()
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	})
	r.NewGaugeFunc("process_resident_memory_bytes", "Resident memory size in bytes.", residentBytes)
	r.NewGaugeFunc("process_open_fds", "Number of open file descriptors.", func() float64 {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return math.NaN()
		}
		return float64(len(ents))
	})
	r.NewGaugeFunc("process_start_time_seconds", "Start time of the process since the Unix epoch in seconds.", func() float64 { return start })
}

// residentBytes reads the resident set size from /proc (NaN where there is none).
func residentBytes() float64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return math.NaN()
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return math.NaN()
	}
	pages, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		return math.NaN()
	}
	return pages * float64(os.Getpagesize())
}

func header(w *bufio.Writer, name, help, kind string) {
	w.WriteString("# HELP " + name + " ")
	w.WriteString(strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(help))
	w.WriteString("\n# TYPE " + name + " " + kind + "\n")
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// sample writes one line: name{labels="values",extra="extraValue"} value.
func sample(w *bufio.Writer, name string, labels, values []string, extra, extraValue string, v float64) {
	w.WriteString(name)
	if len(labels) > 0 || extra != "" {
		w.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(l + `="` + labelEscaper.Replace(values[i]) + `"`)
		}
		if extra != "" {
			if len(labels) > 0 {
				w.WriteByte(',')
			}
			w.WriteString(extra + `="` + extraValue + `"`)
		}
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(formatFloat(v))
	w.WriteByte('\n')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
