package policy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// benchPolicy is the benchmarks' policy: two rules over every resource change, as the naive
// measurement in issue 40 used.
const benchPolicy = `package main

deletions := count([rc | some rc in input.resource_changes; "delete" in rc.change.actions])

deny contains sprintf("%d deletions", [deletions]) if deletions > 5

warn contains sprintf("%s is public", [rc.address]) if {
	some rc in input.resource_changes
	rc.change.before.public
}
`

// benchChildEnv makes the test binary a benchmark child: it evaluates one plan one way and
// prints a benchChild as JSON, in a process of its own, so that its peak RSS is its own.
const benchChildEnv = "TFSTACKPLAN_POLICY_BENCH_CHILD"

// benchChild is what a child measured.
type benchChild struct {
	Mode     string  `json:"mode"`
	Seconds  float64 `json:"seconds"`
	PeakRSS  int64   `json:"peak_rss"`  // VmHWM: the process's peak resident set
	BaseRSS  int64   `json:"base_rss"`  // VmRSS before the work: the binary and the runtime
	PeakHeap uint64  `json:"peak_heap"` // the peak of live heap objects, sampled every millisecond
	Read     float64 `json:"read"`      // seconds reading the plan into an input value
	CPU      float64 `json:"cpu"`       // the child's user and system CPU seconds, set by the parent
	Findings int     `json:"findings"`
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(benchChildEnv); spec != "" {
		mode, path, _ := strings.Cut(spec, ":")
		res, err := runBenchChild(mode, path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_ = json.NewEncoder(os.Stdout).Encode(res)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runBenchChild evaluates benchPolicy on the plan at path, "naive"ly (the whole file decoded
// by encoding/json into Go values, then rego.EvalInput, which converts them to a Rego value)
// or as this package does ("engine": Compile, ReadInput, Set.Eval).
func runBenchChild(mode, path string) (*benchChild, error) {
	ctx := context.Background()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, sample[0].Value.Uint64())
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	res := &benchChild{Mode: mode}
	var err error
	if res.BaseRSS, err = procStatus("VmRSS"); err != nil {
		return nil, err
	}
	start := time.Now()
	switch mode {
	case "naive":
		pq, err := rego.New(rego.Query("data.main"), rego.Module("bench.rego", benchPolicy)).PrepareForEval(ctx)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var x any
		if err := json.Unmarshal(data, &x); err != nil {
			return nil, err
		}
		// rego.EvalInput converts x to a Rego value inside Eval: that is part of the read.
		res.Read = time.Since(start).Seconds()
		rs, err := pq.Eval(ctx, rego.EvalInput(x))
		if err != nil {
			return nil, err
		}
		doc := rs[0].Expressions[0].Value.(map[string]any)
		res.Findings = len(doc["deny"].([]any)) + len(doc["warn"].([]any))
	case "engine":
		dir, err := os.MkdirTemp("", "policy-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if err := os.WriteFile(filepath.Join(dir, "bench.rego"), []byte(benchPolicy), 0o644); err != nil {
			return nil, err
		}
		s, err := Compile(ctx, []Definition{{Name: "bench", Files: []string{"bench.rego"}, BaseDir: dir}})
		if err != nil {
			return nil, err
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		input, err := ReadInput(f)
		f.Close()
		if err != nil {
			return nil, err
		}
		res.Read = time.Since(start).Seconds()
		r, err := s.Eval(ctx, input)
		if err != nil {
			return nil, err
		}
		res.Findings = len(r.Failures) + len(r.Warnings)
	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	res.Seconds = time.Since(start).Seconds()
	close(stop)
	<-done
	res.PeakHeap = peak
	if res.PeakRSS, err = procStatus("VmHWM"); err != nil {
		return nil, err
	}
	return res, nil
}

// procStatus returns a size in bytes from /proc/self/status: VmRSS, VmHWM.
func procStatus(field string) (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}

// benchPlans are generated once per test process, in a directory removed at its end.
var (
	benchDirOnce sync.Once
	benchDir     string
)

func benchPlan(b *testing.B, s planShape) (string, int64) {
	benchDirOnce.Do(func() {
		var err error
		if benchDir, err = os.MkdirTemp("", "tfstackplan-policy-bench-"); err != nil {
			b.Fatal(err)
		}
	})
	return genPlanFile(b, benchDir, s)
}

// BenchmarkEval compares, in child processes, this package's evaluation with the naive one on
// generated plans: a 1 MB plan, a 6 MB one, 100,000 deletions (about 100 MB) and 100,000 mixed
// changes (about 140 MB). Per op both run once; the metrics are their wall time (compiling the
// policy, reading the plan and evaluating) and the part of it reading the plan, the child
// process's CPU time (steadier than wall time on a shared machine), peak RSS, RSS before the
// work (the binary and the runtime, part of every peak), peak live heap, and rss-ratio, the engine's peak RSS over the naive one's. The naive read is the
// decoding into Go values; its conversion to a Rego value happens inside Eval.
func BenchmarkEval(b *testing.B) {
	defer func() {
		if benchDir != "" {
			os.RemoveAll(benchDir)
		}
	}()
	for _, tc := range []struct {
		name  string
		shape planShape
	}{
		{"1MB", planShape{Changes: 800, Payload: 300}},
		{"6MB", planShape{Changes: 5000, Payload: 300}},
		{"100k-deletions", planShape{Changes: 100_000, Payload: 300, DeleteOnly: true}},
		{"100k-changes", planShape{Changes: 100_000, Payload: 300}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			path, size := benchPlan(b, tc.shape)
			sum := map[string]*benchChild{"naive": {}, "engine": {}}
			n := 0
			for b.Loop() {
				n++
				var findings []int
				for _, mode := range []string{"naive", "engine"} {
					c := exec.Command(os.Args[0])
					c.Env = append(os.Environ(), benchChildEnv+"="+mode+":"+path)
					c.Stderr = os.Stderr
					out, err := c.Output()
					if err != nil {
						b.Fatalf("%s: %v", mode, err)
					}
					var r benchChild
					if err := json.Unmarshal(out, &r); err != nil {
						b.Fatalf("%s: %v: %s", mode, err, out)
					}
					s := sum[mode]
					s.Seconds += r.Seconds
					s.Read += r.Read
					s.CPU += (c.ProcessState.UserTime() + c.ProcessState.SystemTime()).Seconds()
					s.PeakRSS = max(s.PeakRSS, r.PeakRSS)
					s.BaseRSS = max(s.BaseRSS, r.BaseRSS)
					s.PeakHeap = max(s.PeakHeap, r.PeakHeap)
					findings = append(findings, r.Findings)
				}
				if findings[0] != findings[1] || findings[0] == 0 {
					b.Fatalf("findings: naive %d, engine %d", findings[0], findings[1])
				}
			}
			b.ReportMetric(float64(size)/1e6, "plan-MB")
			for _, mode := range []string{"naive", "engine"} {
				s := sum[mode]
				b.ReportMetric(s.Seconds/float64(n), mode+"-s/op")
				b.ReportMetric(s.Read/float64(n), mode+"-read-s/op")
				b.ReportMetric(s.CPU/float64(n), mode+"-cpu-s/op")
				b.ReportMetric(float64(s.PeakRSS)/1e6, mode+"-peak-rss-MB")
				b.ReportMetric(float64(s.BaseRSS)/1e6, mode+"-base-rss-MB")
				b.ReportMetric(float64(s.PeakHeap)/1e6, mode+"-peak-heap-MB")
			}
			b.ReportMetric(float64(sum["engine"].PeakRSS)/float64(sum["naive"].PeakRSS), "rss-ratio")
		})
	}
}

// BenchmarkReadInput compares, in process, reading a 6 MB plan into a Rego value with
// ReadInput and the naive way (encoding/json into Go values, then ast.InterfaceToValue, as
// rego.EvalInput does).
func BenchmarkReadInput(b *testing.B) {
	defer func() {
		if benchDir != "" {
			os.RemoveAll(benchDir)
		}
	}()
	path, size := benchPlan(b, planShape{Changes: 5000, Payload: 300})
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("engine", func(b *testing.B) {
		b.SetBytes(size)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ReadInput(bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("naive", func(b *testing.B) {
		b.SetBytes(size)
		b.ReportAllocs()
		for b.Loop() {
			var x any
			if err := json.Unmarshal(data, &x); err != nil {
				b.Fatal(err)
			}
			if _, err := ast.InterfaceToValue(x); err != nil {
				b.Fatal(err)
			}
		}
	})
}
