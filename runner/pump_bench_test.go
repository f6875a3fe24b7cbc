package runner

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// pumpBenchStacks makes n stack directories under a fresh root, in RAM (/dev/shm) when
// available so that gigabytes of log writes do not turn into disk writeback on a shared machine.
func pumpBenchStacks(b *testing.B, n int) (string, []string) {
	b.Helper()
	root, err := os.MkdirTemp("/dev/shm", "pumpbench")
	if err != nil {
		root = b.TempDir()
	} else {
		b.Cleanup(func() { os.RemoveAll(root) })
	}
	stacks := make([]string, n)
	for i := range stacks {
		stacks[i] = fmt.Sprintf("stacks/s%04d", i)
		if err := os.MkdirAll(filepath.Join(root, stacks[i]), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	return root, stacks
}

// pumpReceipt is one chunk as the loopback server received it.
type pumpReceipt struct {
	gen, off, end int64
	at            time.Time
}

// BenchmarkPumpLatency: 200 stacks append lines concurrently at 5 MB/s in total for 3 s; the
// pump posts to a collector over loopback HTTP (JSON-decoded events.LogChunk). Reports the
// append-to-receipt latency of every write (p50-ms, p99-ms), lost-bytes and the requests the
// collector received.
func BenchmarkPumpLatency(b *testing.B) {
	const (
		nStacks  = 200
		rate     = 5 << 20 // bytes per second, all stacks together
		tick     = 10 * time.Millisecond
		duration = 3 * time.Second
		writers  = 4
	)
	perWrite := rate / nStacks / int(time.Second/tick) // bytes per stack per tick
	for b.Loop() {
		root, stacks := pumpBenchStacks(b, nStacks)
		var mu sync.Mutex
		recv := map[string][]pumpReceipt{}
		var requests atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			chunks, err := pumpDecodeChunks(r)
			if err != nil {
				http.Error(w, `{"code":"INVALID_ARGUMENT","message":"bad chunk"}`, http.StatusBadRequest)
				return
			}
			at := time.Now()
			requests.Add(1)
			mu.Lock()
			for _, lc := range chunks {
				recv[lc.Stack] = append(recv[lc.Stack], pumpReceipt{lc.Generation, lc.Offset, lc.Offset + int64(len(lc.Data)) + lc.GapLength, at})
			}
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{}`))
		}))
		// The real client: it batches (LogChunks) and keeps its own bounds.
		poster, err := NewClient(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		pump := pumpSimple(b, root, poster, PumpOptions{}, stacks...)
		type write struct {
			end int64
			at  time.Time
		}
		written := make([][]write, nStacks)
		var wg sync.WaitGroup
		line := []byte(fmt.Sprintf("%0*d\n", perWrite-1, 0))
		for w := range writers {
			wg.Go(func() {
				var files []*os.File
				var idx []int
				for i := w; i < nStacks; i += writers {
					f, err := os.Create(filepath.Join(root, stacks[i], "tfstackplan.log"))
					if err != nil {
						b.Error(err)
						return
					}
					files = append(files, f)
					idx = append(idx, i)
				}
				t := time.NewTicker(tick)
				defer t.Stop()
				stop := time.Now().Add(duration)
				for now := time.Now(); now.Before(stop); now = <-t.C {
					for j, f := range files {
						if _, err := f.Write(line); err != nil {
							b.Error(err)
							return
						}
						i := idx[j]
						prev := int64(0)
						if n := len(written[i]); n > 0 {
							prev = written[i][n-1].end
						}
						written[i] = append(written[i], write{prev + int64(len(line)), time.Now()})
					}
				}
				for _, f := range files {
					f.Close()
				}
			})
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rep := pump.Drain(ctx)
		cancel()
		srv.Close()

		var lats []time.Duration
		var total, lost int64
		for i, s := range stacks {
			rs := recv[s]
			sort.Slice(rs, func(a, c int) bool { return rs[a].off < rs[c].off })
			var got int64
			for _, r := range rs {
				if r.gen == 0 && r.off == got {
					got = r.end
				}
			}
			ws := written[i]
			if len(ws) == 0 {
				continue
			}
			total += ws[len(ws)-1].end
			lost += ws[len(ws)-1].end - got
			k := 0
			for _, w := range ws {
				for k < len(rs) && rs[k].end < w.end {
					k++
				}
				if k < len(rs) {
					lats = append(lats, rs[k].at.Sub(w.at))
				}
			}
		}
		slices.Sort(lats)
		pct := func(p float64) float64 {
			if len(lats) == 0 {
				return 0
			}
			return float64(lats[min(len(lats)-1, int(p*float64(len(lats))))]) / float64(time.Millisecond)
		}
		b.ReportMetric(pct(0.50), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
		b.ReportMetric(float64(lost), "lost-bytes")
		b.ReportMetric(float64(total)/duration.Seconds()/1e6, "MB/s-written")
		b.ReportMetric(float64(rep.Chunks), "chunks")
		b.ReportMetric(float64(requests.Load()), "requests")
		if lost != 0 || len(rep.Gaps) != 0 {
			b.Errorf("lost %d bytes, gaps %v", lost, rep.Gaps)
		}
	}
}

// BenchmarkPumpDeadServer: 1000 stacks each write 10 MB (ten 1 MiB generations, as ten
// commands tee'd without -a) while the server is dead: the poster fails every call at once with
// ECONNREFUSED, as a client whose connections are refused. Reports the peak live heap.
func BenchmarkPumpDeadServer(b *testing.B) {
	const (
		nStacks  = 1000
		perStack = 10 << 20
		genSize  = 1 << 20
		writeSz  = 256 << 10
		writers  = 4
	)
	dead := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error { return pumpConnRefused })
	for b.Loop() {
		root, stacks := pumpBenchStacks(b, nStacks)
		runtime.GC()
		var peak atomic.Uint64
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		stopSampling := make(chan struct{})
		var sampler sync.WaitGroup
		sampler.Go(func() {
			t := time.NewTicker(2 * time.Millisecond)
			defer t.Stop()
			for {
				metrics.Read(sample)
				if v := sample[0].Value.Uint64(); v > peak.Load() {
					peak.Store(v)
				}
				select {
				case <-stopSampling:
					return
				case <-t.C:
				}
			}
		})
		pump := pumpSimple(b, root, dead, PumpOptions{}, stacks...)
		buf := make([]byte, writeSz)
		for i := range buf {
			buf[i] = "0123456789abcdef\n"[i%17]
		}
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for g := 0; g < perStack/genSize; g++ {
					for i := w; i < nStacks; i += writers {
						f, err := os.Create(filepath.Join(root, stacks[i], "tfstackplan.log")) // truncates
						if err != nil {
							b.Error(err)
							return
						}
						for n := 0; n < genSize; n += writeSz {
							if _, err := f.Write(buf); err != nil {
								b.Error(err)
							}
						}
						f.Close()
					}
				}
			})
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		rep := pump.Drain(ctx)
		cancel()
		close(stopSampling)
		sampler.Wait()
		b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MB")
		b.ReportMetric(float64(len(rep.Gaps)), "gaps")
		b.ReportMetric(float64(rep.LostBytes())/(1<<20), "unsent-or-lost-MB")
		if rep.Complete || rep.Bytes != 0 {
			b.Errorf("a dead server acknowledged something: %+v", rep.Bytes)
		}
	}
}
