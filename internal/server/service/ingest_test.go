package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// Offsets and lengths are bounded at the edge, each refusal naming its field; the bound itself
// is accepted.
func TestLogOffsetsAreBounded(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		chunk := func(off, gap int64, data string) error {
			_, err := f.LogChunk(ctx, runner, &api.LogChunk{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: off, GapLength: gap, Data: []byte(data)})
			return err
		}
		wantErr(t, chunk(math.MaxInt64, 0, "x"), store.ErrInvalid, "offset 9223372036854775807 exceeds")
		wantErr(t, chunk(MaxLogOffset+1, 0, "x"), store.ErrInvalid, "offset")
		wantErr(t, chunk(0, math.MaxInt64, ""), store.ErrInvalid, "gap_length 9223372036854775807 exceeds")
		wantErr(t, chunk(10, MaxLogOffset-5, ""), store.ErrInvalid, "offset 10 + length")
		wantErr(t, chunk(MaxLogOffset-1, 0, "xy"), store.ErrInvalid, "offset 1099511627775 + length 2")
		f.must(chunk(0, 0, "abc"))
		f.must(chunk(3, MaxLogOffset-4, ""))
		f.must(chunk(MaxLogOffset-1, 0, "z"))
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if st := x.Stacks[0]; st.LogBytes != MaxLogOffset || len(st.Gaps) != 1 || st.Gaps[0].To != MaxLogOffset-1 {
			t.Fatalf("summary %+v", st)
		}
		sl, err := f.LogRead(ctx, reader, "e1", "a", 1, false, 0, 100)
		f.must(err)
		if string(sl.Data) != "abc" || sl.NextOffset != 3 {
			t.Fatalf("read %+v", sl)
		}
		sl, err = f.LogRead(ctx, reader, "e1", "a", 1, false, 3, 100)
		f.must(err)
		if string(sl.Data) != "z" || sl.NextOffset != MaxLogOffset {
			t.Fatalf("read past the gap %+v", sl)
		}
	})
}

// Rows stored before offsets were bounded (written here straight through the store) leave the
// execution and its logs readable.
func TestHostileStoredLogRowsStayReadable(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a", "b"}})
		f.must(err)
		f.must(f.Store.Write(ctx, func(tx store.Tx) error {
			_, err := tx.AddLogChunks([]store.LogChunk{
				{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 0, Data: []byte("abc")},
				{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 3, GapLength: math.MaxInt64},
				{ExecutionID: "e1", Stack: "b", Generation: 1, Offset: math.MaxInt64 - 1, Data: []byte("xyz")},
			})
			return err
		}))
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if a, b := x.Stacks[0], x.Stacks[1]; a.LogBytes != math.MaxInt64 || len(a.Gaps) != 1 || a.Gaps[0].To != math.MaxInt64 || b.LogBytes != math.MaxInt64 {
			t.Fatalf("stacks %+v %+v", a, b)
		}
		sl, err := f.LogRead(ctx, reader, "e1", "a", 0, true, 0, 100)
		f.must(err)
		if string(sl.Data) != "abc" || sl.NextOffset != 3 {
			t.Fatalf("read a %+v", sl)
		}
		sl, err = f.LogRead(ctx, reader, "e1", "a", 0, true, 3, 100)
		f.must(err)
		if len(sl.Data) != 0 || sl.NextOffset != math.MaxInt64 || len(sl.Gaps) != 1 {
			t.Fatalf("read a past its gap %+v", sl)
		}
		for _, off := range []int64{0, math.MaxInt64 - 1, math.MaxInt64} {
			sl, err = f.LogRead(ctx, reader, "e1", "b", 0, true, off, 100)
			f.must(err)
			if off == math.MaxInt64-1 && (string(sl.Data) != "x" || sl.NextOffset != math.MaxInt64) {
				t.Fatalf("read b at %d: %+v", off, sl)
			}
		}
	})
}

// A log for a stack the execution never announced is refused, naming it; a stack known from
// init, a phase or an update takes logs, and a refused batch stores nothing.
func TestLogsForUnannouncedStacksAreRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		chunk := func(stack string, off int64) api.LogChunk {
			return api.LogChunk{ExecutionID: "e1", Stack: stack, Generation: 1, Offset: off, Data: []byte(stack)}
		}
		_, err = f.LogChunks(ctx, runner, []api.LogChunk{chunk("a", 0), chunk("ghost", 0)})
		wantErr(t, err, store.ErrInvalid, `stack "ghost"`)
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "e1", Stack: "p", Phase: "plan", Seq: 1})
		f.must(err)
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e1", Stack: "u", Seq: 1, Status: "running"})
		f.must(err)
		_, err = f.LogChunks(ctx, runner, []api.LogChunk{chunk("a", 0), chunk("p", 0), chunk("u", 0)})
		f.must(err)
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if len(x.Stacks) != 3 {
			t.Fatalf("stacks %+v", x.Stacks)
		}
		for _, st := range x.Stacks {
			if st.LogBytes != 1 {
				t.Errorf("stack %s: %d log bytes, want 1 (the refused batch stored nothing)", st.Stack, st.LogBytes)
			}
		}
		_, err = f.LogChunk(ctx, runner, &api.LogChunk{ExecutionID: "missing", Stack: "a", Data: []byte("x")})
		wantErr(t, err, store.ErrNotFound, "missing")
	})
}

// Updates and phases of one stack posted concurrently in shuffled seq order end at the highest
// seq; phase and update batches naming the same stacks in opposite orders never deadlock.
func TestConcurrentEventsOfOneStackEndAtMaxSeq(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a", "b"}})
		f.must(err)
		const n = 200
		seqs := make(chan int, n)
		for _, s := range rand.Perm(n) {
			seqs <- s + 1
		}
		close(seqs)
		var wg sync.WaitGroup
		errs := make(chan error, 3*n)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := range seqs {
					_, err := f.Update(ctx, runner, &api.Update{ExecutionID: "e1", Stack: "a", Seq: int64(seq), Status: "running", PlanHash: fmt.Sprint("h", seq)})
					errs <- err
					batch := []api.PhaseEvent{
						{ExecutionID: "e1", Stack: "a", Phase: fmt.Sprint("p", seq), Seq: int64(seq)},
						{ExecutionID: "e1", Stack: "b", Phase: fmt.Sprint("p", seq), Seq: int64(seq)},
					}
					if seq%2 == 0 {
						batch[0], batch[1] = batch[1], batch[0]
					}
					_, err = f.Phases(ctx, runner, batch)
					errs <- err
					updates := []api.Update{
						{ExecutionID: "e1", Stack: "b", Seq: int64(seq), Status: "running", PlanHash: fmt.Sprint("h", seq)},
						{ExecutionID: "e1", Stack: "a", Seq: int64(seq), Status: "running", PlanHash: fmt.Sprint("h", seq)},
					}
					if seq%2 == 0 {
						updates[0], updates[1] = updates[1], updates[0]
					}
					_, err = f.Updates(ctx, runner, updates)
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			f.must(err)
		}
		a, b := f.stackState("e1", "a"), f.stackState("e1", "b")
		if a.PlanHash != fmt.Sprint("h", n) || b.PlanHash != fmt.Sprint("h", n) || a.Phase != fmt.Sprint("p", n) || b.Phase != fmt.Sprint("p", n) || a.Status != "running" {
			t.Fatalf("after shuffled concurrent events: a %+v b %+v", a, b)
		}
	})
}

// BenchmarkServiceIngest is BenchmarkIngest (internal/server) without HTTP: 8 clients post
// events (phase and update, alternating) flat out on their own stacks while 8 more post logs
// at 20,000 chunks/s in batches of 64, straight into the service. b.N counts events.
func BenchmarkServiceIngest(b *testing.B) {
	for _, be := range storetest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			svc := New(be.Open(b), nil)
			const clients, per, pace = 8, 64, 20000
			stacks := make([]string, 2*clients)
			for i := range stacks {
				stacks[i] = fmt.Sprintf("stacks/s%02d", i)
			}
			if _, err := svc.Init(ctx, runner, &api.Init{ExecutionID: "bench", Environment: "prod", Op: "plan", Stacks: stacks}); err != nil {
				b.Fatal(err)
			}
			data := []byte(strings.Repeat("terraform output line ...\n", 20))[:512]
			interval := time.Duration(float64(time.Second) * per * clients / pace)
			var next, chunks atomic.Int64
			stop := make(chan struct{})
			var evLat, logLat [clients][]time.Duration
			var failed atomic.Value
			var wg, logs sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for seq := int64(1); next.Add(1) <= int64(b.N); seq++ {
						t0 := time.Now()
						var err error
						if seq%2 == 0 {
							_, err = svc.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "bench", Stack: stacks[c], Phase: "plan", Seq: seq})
						} else {
							_, err = svc.Update(ctx, runner, &api.Update{ExecutionID: "bench", Stack: stacks[c], Seq: seq, Status: "running"})
						}
						if err != nil {
							failed.Store(err)
							return
						}
						evLat[c] = append(evLat[c], time.Since(t0))
					}
				}()
				logs.Add(1)
				go func() {
					defer logs.Done()
					var off int64
					due := time.Now()
					batch := make([]api.LogChunk, per)
					for {
						select {
						case <-stop:
							return
						case <-time.After(time.Until(due)):
						}
						for k := range batch {
							batch[k] = api.LogChunk{ExecutionID: "bench", Stack: stacks[clients+c], Generation: 1, Offset: off, Data: data}
							off += int64(len(data))
						}
						if _, err := svc.LogChunks(ctx, runner, batch); err != nil {
							failed.Store(err)
							return
						}
						chunks.Add(per)
						logLat[c] = append(logLat[c], time.Since(due))
						due = due.Add(interval)
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			close(stop)
			logs.Wait()
			b.StopTimer()
			if err, _ := failed.Load().(error); err != nil {
				b.Fatal(err)
			}
			p99 := func(l [clients][]time.Duration) float64 {
				var all []time.Duration
				for _, x := range l {
					all = append(all, x...)
				}
				if len(all) == 0 {
					return 0
				}
				slices.Sort(all)
				return float64(all[len(all)*99/100].Microseconds()) / 1000
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(chunks.Load())/elapsed.Seconds(), "chunks/s")
			b.ReportMetric(p99(evLat), "event-p99-ms")
			b.ReportMetric(p99(logLat), "log-p99-ms")
		})
	}
}

// readCounter counts the store's read transactions, each held a little so that concurrent
// ones overlap.
type readCounter struct {
	store.Store
	reads atomic.Int64
}

func (r *readCounter) Read(ctx context.Context, fn func(store.Tx) error) error {
	r.reads.Add(1)
	time.Sleep(20 * time.Millisecond)
	return r.Store.Read(ctx, fn)
}

// The first events of a run, arriving together at a replica that has not seen the execution,
// wait for one read of its owner instead of each reading it (each on a connection of its own);
// an unknown execution is refused to every one of them.
func TestConcurrentOwnerChecksReadOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		counted := &readCounter{Store: f.Store}
		replica := New(counted, f.Policy)
		for _, c := range []struct {
			id   string
			want error
		}{{"e1", nil}, {"nope", store.ErrNotFound}} {
			counted.reads.Store(0)
			errs := make(chan error, 16)
			for range 16 {
				go func() { errs <- replica.checkOwner(ctx, runner, c.id) }()
			}
			for range 16 {
				if err := <-errs; !errors.Is(err, c.want) {
					t.Fatalf("%s: %v, want %v", c.id, err, c.want)
				}
			}
			if n := counted.reads.Load(); c.want == nil && n != 1 {
				t.Fatalf("16 concurrent checks of %s read its owner %d times, want once", c.id, n)
			}
		}
	})
}
