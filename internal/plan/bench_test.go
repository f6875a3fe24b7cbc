package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	tfjson "github.com/hashicorp/terraform-json"
)

// The large plan is generated once per test process and removed by TestMain.
var (
	planLargeOnce sync.Once
	planLargeDir  string
	planLargePath string
	planLargeRes  genResult
	planLargeErr  error
)

// planLargeChanges and planLargePayload make a plan of about 100 MB: each resource's values
// appear in planned_values, in before/after and in prior_state.
const (
	planLargeChanges = 50000
	planLargePayload = 400
)

func TestMain(m *testing.M) {
	code := m.Run()
	if planLargeDir != "" {
		os.RemoveAll(planLargeDir)
	}
	os.Exit(code)
}

func planLargeFile(b *testing.B) (string, genResult) {
	b.Helper()
	planLargeOnce.Do(func() {
		planLargeDir, planLargeErr = os.MkdirTemp("", "tfstackplan-bench-")
		if planLargeErr != nil {
			return
		}
		planLargePath = filepath.Join(planLargeDir, "large-plan.json")
		f, err := os.Create(planLargePath)
		if err != nil {
			planLargeErr = err
			return
		}
		planLargeRes, planLargeErr = writePlan(f, genOptions{
			Changes: planLargeChanges, Seed: 99, Payload: planLargePayload, Secret: "bench-secret-value", Outputs: 10, Drift: 50,
		})
		if err := f.Close(); planLargeErr == nil {
			planLargeErr = err
		}
	})
	if planLargeErr != nil {
		b.Fatal(planLargeErr)
	}
	return planLargePath, planLargeRes
}

// planPeakHeap runs f and returns how long it took and the peak of live heap objects above
// the level before it, sampled every 200µs with runtime/metrics (no stop-the-world).
func planPeakHeap(f func()) (time.Duration, uint64) {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	base := read()
	var peak uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Microsecond)
		defer t.Stop()
		for {
			peak = max(peak, read())
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	start := time.Now()
	f()
	d := time.Since(start)
	close(stop)
	<-done
	peak = max(peak, read())
	if peak < base {
		return d, 0
	}
	return d, peak - base
}

// BenchmarkClassifyLarge compares the streaming classifier with json.Unmarshal of the whole
// file into tfjson.Plan on a generated ~100 MB plan of 50,000 resource changes, in the same
// run: speedup-x is tfjson's time over ours, heap-ratio our peak heap over tfjson's.
func BenchmarkClassifyLarge(b *testing.B) {
	path, want := planLargeFile(b)
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(fi.Size())
	var streamTime, tfjsonTime time.Duration
	var streamPeak, tfjsonPeak uint64
	n := 0
	b.ResetTimer()
	for b.Loop() {
		n++
		var s *Stack
		d, peak := planPeakHeap(func() {
			s, err = ClassifyFile("large", path)
		})
		if err != nil {
			b.Fatal(err)
		}
		if s.Counts != want.Counts {
			b.Fatalf("counts %+v, want %+v", s.Counts, want.Counts)
		}
		streamTime += d
		streamPeak = max(streamPeak, peak)

		var p tfjson.Plan
		d, peak = planPeakHeap(func() {
			data, rerr := os.ReadFile(path)
			if rerr != nil {
				err = rerr
				return
			}
			err = json.Unmarshal(data, &p)
		})
		if err != nil {
			b.Fatal(err)
		}
		if len(p.ResourceChanges) != planLargeChanges {
			b.Fatalf("tfjson read %d resource changes, want %d", len(p.ResourceChanges), planLargeChanges)
		}
		tfjsonTime += d
		tfjsonPeak = max(tfjsonPeak, peak)
	}
	b.StopTimer()
	b.ReportMetric(float64(fi.Size())/1e6, "plan-MB")
	b.ReportMetric(streamTime.Seconds()*1000/float64(n), "stream-ms/op")
	b.ReportMetric(tfjsonTime.Seconds()*1000/float64(n), "tfjson-ms/op")
	b.ReportMetric(float64(streamPeak)/1e6, "stream-peak-MB")
	b.ReportMetric(float64(tfjsonPeak)/1e6, "tfjson-peak-MB")
	b.ReportMetric(tfjsonTime.Seconds()/streamTime.Seconds(), "speedup-x")
	b.ReportMetric(float64(streamPeak)/float64(tfjsonPeak), "heap-ratio")
}

// BenchmarkClassifyStream measures the streaming classifier alone (classification, secrets,
// diffs and the plan hash) on the generated ~100 MB plan; MB/s is its throughput.
func BenchmarkClassifyStream(b *testing.B) {
	path, want := planLargeFile(b)
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(fi.Size())
	b.ReportAllocs()
	for b.Loop() {
		s, err := ClassifyFile("large", path)
		if err != nil {
			b.Fatal(err)
		}
		if s.Counts != want.Counts || s.PlanHash == "" {
			b.Fatalf("counts %+v hash %q, want %+v and a hash", s.Counts, s.PlanHash, want.Counts)
		}
	}
}

// BenchmarkClassifyRecorded classifies every recorded OpenTofu plan once per op, from memory:
// the per-plan overhead on small, real plans.
func BenchmarkClassifyRecorded(b *testing.B) {
	paths, _ := filepath.Glob(filepath.Join(planTofuDir, "*", "plan.json"))
	var plans [][]byte
	size := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		plans = append(plans, data)
		size += len(data)
	}
	if len(plans) == 0 {
		b.Fatal("no recorded plans")
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		for i, data := range plans {
			if _, err := Classify("recorded", paths[i], bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
