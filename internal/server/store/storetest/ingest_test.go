package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
)

// forEachBackend runs fn against a fresh store of every backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, s store.Store)) {
	for _, b := range Backends() {
		t.Run(b.Name, func(t *testing.T) { fn(t, b.Open(t)) })
	}
}

func stackOf(t *testing.T, s store.Store, execID, name string) *store.Stack {
	t.Helper()
	var st *store.Stack
	if err := s.Read(ctx, func(tx store.Tx) (err error) { st, err = tx.Stack(execID, name); return }); err != nil {
		t.Fatal(err)
	}
	return st
}

// oneWriter is sqlstore.DB's WriteOne.
type oneWriter interface {
	WriteOne(ctx context.Context, fn func(store.Tx) error) error
}

// forEachWrite runs fn on every backend, writing through Write (one false) and WriteOne.
func forEachWrite(t *testing.T, fn func(t *testing.T, s store.Store, one bool)) {
	for _, one := range []bool{false, true} {
		t.Run(fmt.Sprint("one=", one), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, s store.Store) { fn(t, s, one) })
		})
	}
}

// writeEvent runs one event write through WriteOne when the store has it (it is then one
// statement on PostgreSQL), else through Write.
func writeEvent(s store.Store, one bool, fn func(store.Tx) error) error {
	if w, ok := s.(oneWriter); ok && one {
		return w.WriteOne(ctx, fn)
	}
	return s.Write(ctx, fn)
}

// ApplyUpdate and AddPhaseEvent create a missing stack, keep what the other wrote, never move
// a stack back to an older seq, and change nothing but the history once the execution is
// finalized; through Write and WriteOne alike.
func TestEventWritesGuardSeqsAndFinalize(t *testing.T) { forEachWrite(t, testEventWrites) }

func testEventWrites(t *testing.T, s store.Store, one bool) {
	e := exec1("e1", t0)
	write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(e); return err })
	apply := func(fn func(tx store.Tx) (store.EventState, bool, error)) bool {
		t.Helper()
		var applied bool
		if err := writeEvent(s, one, func(tx store.Tx) (err error) { _, applied, err = fn(tx); return }); err != nil {
			t.Fatal(err)
		}
		return applied
	}
	up := func(seq int64, status api.StackStatus, hash string) func(store.Tx) (store.EventState, bool, error) {
		st := &store.Stack{Seq: seq}
		st.StackState.Stack, st.Status, st.PlanHash, st.Class = "a", status, hash, "additive"
		st.Destructive, st.UpdatedAt = []string{"x"}, t0
		return func(tx store.Tx) (store.EventState, bool, error) { return tx.ApplyUpdate("e1", st) }
	}
	phase := func(stack string, seq int64, name string) func(store.Tx) (store.EventState, bool, error) {
		return func(tx store.Tx) (store.EventState, bool, error) {
			return tx.AddPhaseEvent(store.Phase{ExecutionID: "e1", Stack: stack, Phase: name, Seq: seq, At: t0}, name+" shown", t0)
		}
	}
	if !apply(up(5, "running", "h5")) || apply(up(4, "failed", "h4")) || !apply(up(5, "succeeded", "h5b")) {
		t.Fatal("update guard: want applied, refused, applied (equal seq)")
	}
	if !apply(phase("b", 3, "plan")) || !apply(phase("b", 2, "init")) || apply(phase("b", 3, "plan")) {
		t.Fatal("phase history: want added, added (older, history only), not added (retry)")
	}
	// A phase on the updated stack keeps its update, and an update keeps the phase.
	if !apply(phase("a", 9, "apply")) || !apply(up(6, "succeeded", "h6")) {
		t.Fatal("cross writes refused")
	}
	a, b := stackOf(t, s, "e1", "a"), stackOf(t, s, "e1", "b")
	if a.Seq != 6 || a.Status != "succeeded" || a.PlanHash != "h6" || a.Class != "additive" || a.Phase != "apply shown" ||
		a.PhaseSeq != 9 || !slices.Equal(a.Destructive, []string{"x"}) {
		t.Errorf("stack a %+v", a)
	}
	if b.Phase != "plan shown" || b.PhaseSeq != 3 || b.Status != "running" || b.Seq != 0 {
		t.Errorf("stack b %+v", b)
	}
	// A pending stack (as init stores it) becomes running on its first phase.
	write(t, s, func(tx store.Tx) error {
		st := &store.Stack{}
		st.StackState.Stack, st.Status = "c", "pending"
		return tx.SaveStack("e1", st)
	})
	apply(phase("c", 1, "init"))
	if c := stackOf(t, s, "e1", "c"); c.Status != "running" || c.Phase != "init shown" {
		t.Errorf("stack c %+v", c)
	}
	// Once finalized (and cancelled), events report it and change only the phase history.
	e.Finalized, e.Cancelled, e.CancelReason = true, true, "stop"
	write(t, s, func(tx store.Tx) error { return tx.SaveExecution(e) })
	var st store.EventState
	var applied bool
	if err := writeEvent(s, one, func(tx store.Tx) (err error) { st, applied, err = up(99, "failed", "forged")(tx); return }); err != nil ||
		applied || st != (store.EventState{Cancelled: true, CancelReason: "stop", Finalized: true}) {
		t.Fatalf("update after finalize: %+v %v %v", st, applied, err)
	}
	if !apply(phase("a", 100, "late")) {
		t.Fatal("a late phase is not in the history")
	}
	if got := stackOf(t, s, "e1", "a"); got.PlanHash != "h6" || got.Phase != "apply shown" || got.Status != "succeeded" {
		t.Fatalf("finalized stack changed: %+v", got)
	}
	for _, fn := range []func(store.Tx) error{
		func(tx store.Tx) error { _, _, err := tx.ApplyUpdate("nope", &store.Stack{}); return err },
		func(tx store.Tx) error {
			_, _, err := tx.AddPhaseEvent(store.Phase{ExecutionID: "nope", Stack: "a"}, "", t0)
			return err
		},
	} {
		if err := writeEvent(s, one, fn); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("event on an unknown execution: %v", err)
		}
	}
	if one {
		if _, ok := s.(oneWriter); ok {
			err := writeEvent(s, one, func(tx store.Tx) error {
				if _, err := tx.Stacks("e1"); err != nil {
					return err
				}
				_, err := tx.Stacks("e1")
				return err
			})
			if s.Kind() == "postgres" && (err == nil || !strings.Contains(err.Error(), "more than one statement")) {
				t.Errorf("a WriteOne of two statements: %v", err)
			}
		}
	}
}

// Concurrent updates and phases of one stack, in shuffled seq order from many writers, end at
// the highest seq.
func TestConcurrentUpdatesOfOneStackEndAtMaxSeq(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("e1", t0)); return err })
		const n, writers = 200, 8
		var wg sync.WaitGroup
		errs := make(chan error, n)
		next := make(chan int, n)
		for _, q := range rand.Perm(n) {
			next <- q + 1
		}
		close(next)
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := range next {
					errs <- writeEvent(s, seq%3 != 0, func(tx store.Tx) error {
						if seq%2 == 0 {
							_, _, err := tx.AddPhaseEvent(store.Phase{ExecutionID: "e1", Stack: "a", Phase: "plan", Seq: int64(seq)}, fmt.Sprint("phase ", seq), t0)
							return err
						}
						st := &store.Stack{Seq: int64(seq)}
						st.StackState.Stack, st.Status, st.PlanHash = "a", "running", fmt.Sprint("h", seq)
						_, _, err := tx.ApplyUpdate("e1", st)
						return err
					})
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		a := stackOf(t, s, "e1", "a")
		if a.Seq != n-1 || a.PlanHash != fmt.Sprint("h", n-1) || a.PhaseSeq != n || a.Phase != fmt.Sprint("phase ", n) {
			t.Fatalf("stack after shuffled concurrent writes: %+v", a)
		}
	})
}

// An event holds its execution against finalize (which locks it through Execution) until it
// commits, and finalize holds it against events, on every backend.
func TestEventsExcludeFinalize(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("e1", t0)); return err })
		held := make(chan struct{})
		release := make(chan struct{})
		done := make(chan error, 2)
		go func() {
			done <- s.Write(ctx, func(tx store.Tx) error {
				u := &store.Stack{Seq: 1}
				u.StackState.Stack, u.Status = "a", "running"
				if st, _, err := tx.ApplyUpdate("e1", u); err != nil || st.Finalized {
					return fmt.Errorf("event state %+v %v", st, err)
				}
				close(held)
				<-release
				u.Seq, u.Status = 2, "succeeded"
				_, _, err := tx.ApplyUpdate("e1", u)
				return err
			})
		}()
		<-held
		finalized := make(chan struct{})
		go func() {
			done <- s.Write(ctx, func(tx store.Tx) error {
				e, err := tx.Execution("e1")
				if err != nil {
					return err
				}
				st, err := tx.Stack("e1", "a")
				if err != nil || st.Status != "succeeded" {
					return fmt.Errorf("finalize ran before the event committed: %+v %v", st, err)
				}
				e.Finalized = true
				close(finalized)
				return tx.SaveExecution(e)
			})
		}()
		select {
		case <-finalized:
			t.Fatal("finalize did not wait for the event holding the execution")
		case <-time.After(200 * time.Millisecond):
		}
		close(release)
		for range 2 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	})
}

// AddLogBatch stores a batch only when every stack it names exists, and says which do not, for
// any number of names; through Write and WriteOne alike.
func TestAddLogBatch(t *testing.T) { forEachWrite(t, testAddLogBatch) }

func testAddLogBatch(t *testing.T, s store.Store, one bool) {
	e := exec1("e1", t0)
	write(t, s, func(tx store.Tx) error {
		if _, err := tx.CreateExecution(e); err != nil {
			return err
		}
		for i := range 100 {
			st := &store.Stack{}
			st.StackState.Stack, st.Status = fmt.Sprintf("s%03d", i), "pending"
			if err := tx.SaveStack("e1", st); err != nil {
				return err
			}
		}
		return nil
	})
	batch := func(id string, names ...string) (store.EventState, []string, int64, error) {
		var cs []store.LogChunk
		for i, name := range names {
			cs = append(cs, store.LogChunk{ExecutionID: id, Stack: name, Generation: 1, Offset: int64(i % 3), Data: []byte("x")})
		}
		var st store.EventState
		var missing []string
		var added int64
		err := writeEvent(s, one, func(tx store.Tx) (err error) { st, missing, added, err = tx.AddLogBatch(id, cs); return })
		return st, missing, added, err
	}
	if _, _, _, err := batch("nope", "s000"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown execution: %v", err)
	}
	st, missing, added, err := batch("e1", "s001", "z,z", "s001", "a\"b", "s099", "z,z")
	if err != nil || st != (store.EventState{}) || !slices.Equal(missing, []string{"a\"b", "z,z"}) || added != 0 {
		t.Fatalf("state %+v missing %q added %d err %v", st, missing, added, err)
	}
	var many []string
	for i := range 150 {
		many = append(many, fmt.Sprintf("s%03d", 149-i))
	}
	_, missing, added, err = batch("e1", many...)
	if err != nil || len(missing) != 50 || missing[0] != "s100" || missing[49] != "s149" || added != 0 {
		t.Fatalf("150 names: missing %v added %d err %v", missing, added, err)
	}
	var sums []store.LogSummary
	if err := s.Read(ctx, func(tx store.Tx) (err error) { sums, err = tx.LogSummaries("e1", 100); return }); err != nil || len(sums) != 0 {
		t.Fatalf("refused batches stored %+v %v", sums, err)
	}
	// s000 at offsets 0, 1, 2, then 0 again (a duplicate: the first stays); s001 at 1.
	_, missing, added, err = batch("e1", "s000", "s000", "s000", "s000", "s001")
	if err != nil || len(missing) != 0 || added != 4 {
		t.Fatalf("stored batch: missing %v added %d err %v", missing, added, err)
	}
	if _, _, added, err = batch("e1", "s000", "s000", "s000", "s000", "s001"); err != nil || added != 0 {
		t.Fatalf("retry: added %d err %v", added, err)
	}
	e.Cancelled, e.CancelReason, e.Finalized = true, "stop", true
	write(t, s, func(tx store.Tx) error { return tx.SaveExecution(e) })
	st, missing, added, err = batch("e1", "s002")
	if err != nil || st != (store.EventState{Cancelled: true, CancelReason: "stop", Finalized: true}) || len(missing) != 0 || added != 1 {
		t.Fatalf("state %+v missing %v added %d err %v", st, missing, added, err)
	}
}

// Rows stored before offsets were bounded (a chunk at 2^63-1, a gap of that length) leave the
// execution's log summaries and reads working on every backend.
func TestHostileLogRowsStayReadable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error {
			if _, err := tx.CreateExecution(exec1("e1", t0)); err != nil {
				return err
			}
			_, err := tx.AddLogChunks([]store.LogChunk{
				{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 0, Data: []byte("abc")},
				{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: math.MaxInt64, Data: []byte("xyz")},
				{ExecutionID: "e1", Stack: "b", Generation: 1, Offset: 0, Data: []byte("ok")},
				{ExecutionID: "e1", Stack: "b", Generation: 1, Offset: 2, GapLength: math.MaxInt64},
				{ExecutionID: "e1", Stack: "c", Generation: 1, Offset: math.MaxInt64 - 1, Data: []byte("hi")},
			})
			return err
		})
		var sums []store.LogSummary
		if err := s.Read(ctx, func(tx store.Tx) (err error) { sums, err = tx.LogSummaries("e1", 100); return }); err != nil {
			t.Fatalf("LogSummaries: %v", err)
		}
		if len(sums) != 3 || sums[0].Bytes != math.MaxInt64 || sums[1].Bytes != math.MaxInt64 || sums[2].Bytes != math.MaxInt64 ||
			len(sums[1].Gaps) != 1 || sums[1].Gaps[0].From != 2 || sums[1].Gaps[0].To != math.MaxInt64 {
			t.Fatalf("summaries %+v", sums)
		}
		for _, tc := range []struct {
			stack string
			from  int64
			want  int
		}{{"a", 0, 2}, {"a", 3, 1}, {"a", math.MaxInt64 - 1, 1}, {"b", 5, 1}, {"b", math.MaxInt64, 1}, {"c", 0, 1}} {
			var got []store.LogChunk
			if err := s.Read(ctx, func(tx store.Tx) (err error) { got, err = tx.LogChunks("e1", tc.stack, 1, tc.from, 1<<20, 100); return }); err != nil {
				t.Fatalf("LogChunks %s from %d: %v", tc.stack, tc.from, err)
			}
			if len(got) != tc.want {
				t.Errorf("LogChunks %s from %d: %d chunks, want %d", tc.stack, tc.from, len(got), tc.want)
			}
		}
	})
}

// Text PostgreSQL cannot store (a NUL byte, invalid UTF-8) is ErrInvalid, never unavailable, and
// the store keeps working; SQLite stores it as it is.
func TestUnstorableTextIsInvalid(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("e1", t0)); return err })
		for _, bad := range []string{"nul\x00byte", "bad \xff utf-8"} {
			err := s.Write(ctx, func(tx store.Tx) error {
				_, err := tx.AddPhase(store.Phase{ExecutionID: "e1", Stack: "a", Phase: "plan", Message: bad, Seq: 1})
				return err
			})
			switch {
			case s.Kind() == "postgres" && !errors.Is(err, store.ErrInvalid):
				t.Errorf("%q: %v, want ErrInvalid", bad, err)
			case s.Kind() == "postgres" && errors.Is(err, store.ErrUnavailable):
				t.Errorf("%q: %v is also unavailable", bad, err)
			case s.Kind() != "postgres" && err != nil:
				t.Errorf("%q: %v", bad, err)
			}
			if err != nil && !strings.Contains(err.Error(), "invalid") {
				t.Errorf("%q: message %q", bad, err)
			}
			write(t, s, func(tx store.Tx) error {
				st := &store.Stack{Seq: 1}
				st.StackState.Stack, st.Status = "a", "running"
				_, _, err := tx.ApplyUpdate("e1", st)
				return err
			})
		}
	})
}

// replica opens one more PostgreSQL store on the schema u selects, closed when the test ends.
func replica(t *testing.T, u, channel string) store.Store {
	t.Helper()
	s, err := postgres.Open(ctx, u, postgres.Options{Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Notifications leave the writes' transactions and are coalesced: a burst of writes from
// several goroutines on one replica is still heard, every execution of it, on another.
func TestPostgresNotificationsCoalesceWithoutLoss(t *testing.T) {
	u, channel := PostgresURL(t)
	a, b := replica(t, u, channel), replica(t, u, channel)
	heard := make(chan string, 1024)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = b.Listen(lctx, func(id string) { heard <- id }) }()
	// The LISTEN is up once a probe write is heard.
	deadline := time.After(15 * time.Second)
	for probed := false; !probed; {
		write(t, a, func(tx store.Tx) error { return tx.Notify("probe") })
		select {
		case <-heard:
			probed = true
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("replica b heard nothing")
		}
	}
	const n = 50
	done := make(chan error, n)
	for i := range n {
		go func() {
			done <- a.Write(ctx, func(tx store.Tx) error {
				if _, err := tx.CreateExecution(exec1(fmt.Sprint("c", i), t0)); err != nil {
					return err
				}
				for range 3 {
					if err := tx.Notify(fmt.Sprint("c", i)); err != nil {
						return err
					}
				}
				return nil
			})
		}()
	}
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]bool{}
	for i := range n {
		want[fmt.Sprint("c", i)] = true
	}
	for len(want) > 0 {
		select {
		case id := <-heard:
			delete(want, id)
		case <-deadline:
			t.Fatalf("never heard %d executions, e.g. %v", len(want), want)
		}
	}
}

// sameStacks fails the test unless executions one and many have the same stacks.
func sameStacks(t *testing.T, s store.Store, one, many, what string) {
	t.Helper()
	var want, got []store.Stack
	if err := s.Read(ctx, func(tx store.Tx) (err error) {
		if want, err = tx.Stacks(one); err != nil {
			return err
		}
		got, err = tx.Stacks(many)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", want) != fmt.Sprintf("%+v", got) {
		t.Fatalf("%s:\none by one %+v\nin a batch %+v", what, want, got)
	}
}

// AddPhaseEvents leaves an execution exactly as AddPhaseEvent called for each event in turn
// does: the same stacks (phase shown, its seq, status, update time), the same events new, the
// same state; with retried events, equal seqs, duplicates inside the batch, pending stacks,
// events older than the phase shown, and finalized executions.
func TestAddPhaseEventsIsAddPhaseEventInTurn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		rng := rand.New(rand.NewPCG(7, 11))
		stacks := []string{"a", "b", "c", "d"}
		phases := []string{"init", "plan", "show"}
		event := func(id string) (store.Phase, string) {
			p := store.Phase{ExecutionID: id, Stack: stacks[rng.IntN(len(stacks))], Phase: phases[rng.IntN(len(phases))],
				Seq: int64(rng.IntN(6)), Status: []string{"", "ok", "failed"}[rng.IntN(3)], Message: fmt.Sprint("m", rng.IntN(3)), At: t0}
			return p, fmt.Sprintf("%s shown %d", p.Phase, rng.IntN(1000))
		}
		for round := range 60 {
			one, many := fmt.Sprintf("one-%d", round), fmt.Sprintf("many-%d", round)
			// The same history before the batch: some stacks pending, some with a phase shown.
			var before []store.Phase
			var beforeShown []string
			for range rng.IntN(4) {
				p, sh := event("")
				before, beforeShown = append(before, p), append(beforeShown, sh)
			}
			pending := stacks[rng.IntN(len(stacks))]
			finalized := rng.IntN(4) == 0
			var batch []store.Phase
			var shown []string
			for range 1 + rng.IntN(12) {
				p, sh := event("")
				if len(batch) > 0 && rng.IntN(4) == 0 { // the same event again, maybe shown otherwise
					p = batch[rng.IntN(len(batch))]
				}
				batch, shown = append(batch, p), append(shown, sh)
			}
			if rng.IntN(3) == 0 && len(before) > 0 { // a retry of an event already stored
				batch, shown = append(batch, before[0]), append(shown, "retried")
			}
			for _, id := range []string{one, many} {
				write(t, s, func(tx store.Tx) error {
					e := exec1(id, t0)
					if _, err := tx.CreateExecution(e); err != nil {
						return err
					}
					st := &store.Stack{}
					st.StackState.Stack, st.Status = pending, "pending"
					if err := tx.SaveStack(id, st); err != nil {
						return err
					}
					for i, p := range before {
						p.ExecutionID = id
						if _, _, err := tx.AddPhaseEvent(p, beforeShown[i], t0); err != nil {
							return err
						}
					}
					if finalized {
						e.Finalized = true
						return tx.SaveExecution(e)
					}
					return nil
				})
			}
			later := t0.Add(time.Hour)
			var stOne, stMany store.EventState
			addedOne, addedMany := 0, 0
			write(t, s, func(tx store.Tx) error {
				for i, p := range batch {
					p.ExecutionID = one
					st, added, err := tx.AddPhaseEvent(p, shown[i], later)
					if err != nil {
						return err
					}
					stOne = st
					if added {
						addedOne++
					}
				}
				return nil
			})
			write(t, s, func(tx store.Tx) (err error) {
				ps := slices.Clone(batch)
				for i := range ps {
					ps[i].ExecutionID = many
				}
				stMany, addedMany, err = tx.AddPhaseEvents(many, ps, shown, later)
				return err
			})
			if stOne != stMany || addedOne != addedMany {
				t.Fatalf("round %d: state %+v, %d new one by one; %+v, %d new in a batch", round, stOne, addedOne, stMany, addedMany)
			}
			sameStacks(t, s, one, many, fmt.Sprintf("round %d (batch %+v)", round, batch))
		}
	})
}

// BenchmarkEventBatches stores what a runner's relay period brings as one Phases or Updates
// request (32 events, 4 on each of 8 stacks, new seqs), one transaction a batch: one event at
// a time (AddPhaseEvent, ApplyUpdate: in-turn) or the batch at once (AddPhaseEvents,
// ApplyUpdates: batched). Reports events/s.
func BenchmarkEventBatches(b *testing.B) {
	const perBatch = 32
	type writer func(tx store.Tx, seq int64) error
	phases := func(batched bool) writer {
		ps, shown := make([]store.Phase, perBatch), make([]string, perBatch)
		return func(tx store.Tx, seq int64) error {
			for i := range ps {
				ps[i] = store.Phase{ExecutionID: "bench", Stack: fmt.Sprintf("stacks/s%02d", i/4), Phase: "plan", Seq: seq + int64(i), At: t0}
				shown[i] = "plan"
			}
			if batched {
				_, _, err := tx.AddPhaseEvents("bench", ps, shown, t0)
				return err
			}
			for i, p := range ps {
				if _, _, err := tx.AddPhaseEvent(p, shown[i], t0); err != nil {
					return err
				}
			}
			return nil
		}
	}
	updates := func(batched bool) writer {
		ss := make([]*store.Stack, perBatch)
		return func(tx store.Tx, seq int64) error {
			for i := range ss {
				st := &store.Stack{Seq: seq + int64(i)}
				st.StackState.Stack, st.Status, st.Class, st.PlanHash = fmt.Sprintf("stacks/s%02d", i/4), "succeeded", "additive", "h"
				st.UpdatedAt = t0
				ss[i] = st
			}
			if batched {
				_, _, err := tx.ApplyUpdates("bench", ss)
				return err
			}
			for _, st := range ss {
				if _, _, err := tx.ApplyUpdate("bench", st); err != nil {
					return err
				}
			}
			return nil
		}
	}
	for _, be := range Backends() {
		for _, kind := range []struct {
			name string
			w    func(batched bool) writer
		}{{"phases", phases}, {"updates", updates}} {
			for _, batched := range []bool{false, true} {
				name := be.Name + "/" + kind.name + "/in-turn"
				if batched {
					name = be.Name + "/" + kind.name + "/batched"
				}
				b.Run(name, func(b *testing.B) {
					s := be.Open(b)
					if err := s.Write(ctx, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("bench", t0)); return err }); err != nil {
						b.Fatal(err)
					}
					w := kind.w(batched)
					seq := int64(0)
					start := time.Now()
					for b.Loop() {
						if err := s.Write(ctx, func(tx store.Tx) error { return w(tx, seq) }); err != nil {
							b.Fatal(err)
						}
						seq += perBatch
					}
					b.ReportMetric(float64(b.N*perBatch)/time.Since(start).Seconds(), "events/s")
				})
			}
		}
	}
}

// ApplyUpdates leaves an execution exactly as ApplyUpdate called for each update in turn does
// (the same stacks, whether any was written, the same state): with older, equal and newer seqs
// than the stored ones and than each other, several updates of one stack, new stacks, and
// finalized executions.
func TestApplyUpdatesIsApplyUpdateInTurn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		rng := rand.New(rand.NewPCG(8, 12))
		names := []string{"a", "b", "c", "d"}
		update := func(i int) *store.Stack {
			st := &store.Stack{Seq: int64(rng.IntN(6))}
			st.StackState.Stack = names[rng.IntN(len(names))]
			st.Status = []api.StackStatus{"running", "succeeded", "failed"}[rng.IntN(3)]
			st.Class = []api.Class{"additive", "destructive", "no-changes"}[rng.IntN(3)]
			st.PlanHash, st.Error = fmt.Sprintf("h%d", i), fmt.Sprintf("e%d", rng.IntN(2))
			st.Destructive = []string{fmt.Sprint("x", i)}
			st.UpdatedAt = t0.Add(time.Duration(i) * time.Second)
			return st
		}
		for round := range 60 {
			one, many := fmt.Sprintf("one-%d", round), fmt.Sprintf("many-%d", round)
			var before, batch []*store.Stack
			for i := range rng.IntN(4) {
				before = append(before, update(i))
			}
			for i := range 1 + rng.IntN(10) {
				batch = append(batch, update(100+i))
			}
			finalized := rng.IntN(4) == 0
			for _, id := range []string{one, many} {
				write(t, s, func(tx store.Tx) error {
					e := exec1(id, t0)
					if _, err := tx.CreateExecution(e); err != nil {
						return err
					}
					for _, u := range before {
						if _, _, err := tx.ApplyUpdate(id, u); err != nil {
							return err
						}
					}
					if finalized {
						e.Finalized = true
						return tx.SaveExecution(e)
					}
					return nil
				})
			}
			var stOne, stMany store.EventState
			anyOne := false
			var appliedMany int64
			write(t, s, func(tx store.Tx) error {
				for _, u := range batch {
					st, applied, err := tx.ApplyUpdate(one, u)
					if err != nil {
						return err
					}
					stOne, anyOne = st, anyOne || applied
				}
				return nil
			})
			write(t, s, func(tx store.Tx) (err error) {
				stMany, appliedMany, err = tx.ApplyUpdates(many, batch)
				return err
			})
			if stOne != stMany || anyOne != (appliedMany > 0) {
				t.Fatalf("round %d: state %+v, written %v one by one; %+v, %d written in a batch", round, stOne, anyOne, stMany, appliedMany)
			}
			sameStacks(t, s, one, many, fmt.Sprintf("round %d", round))
		}
	})
}
