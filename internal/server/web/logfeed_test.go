package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// countingStore counts the read transactions the service opens.
type countingStore struct {
	store.Store
	reads atomic.Int64
}

func (s *countingStore) Read(ctx context.Context, fn func(store.Tx) error) error {
	s.reads.Add(1)
	return s.Store.Read(ctx, fn)
}

// logText renders the log events among evs as a reader's page shows them: a gap as [-N] (N bytes
// lost), then the text, consecutive gaps added up; it also returns the number of log events.
func logText(t *testing.T, evs [][]byte) (string, int) {
	t.Helper()
	var b strings.Builder
	lost, n := int64(0), 0
	for _, ev := range evs {
		name, data, ok := strings.Cut(string(ev), "\ndata: ")
		if !ok || name != "event: log" {
			continue
		}
		n++
		var le logEvent
		if err := json.Unmarshal([]byte(strings.TrimSpace(data)), &le); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		lost += le.Gap
		if le.Text != "" {
			if lost > 0 {
				fmt.Fprintf(&b, "[-%d]", lost)
				lost = 0
			}
			b.WriteString(le.Text)
		}
	}
	if lost > 0 {
		fmt.Fprintf(&b, "[-%d]", lost)
	}
	return b.String(), n
}

// plainText renders chunks (tiled, without holes) the way logText renders a page.
func plainText(chunks []store.LogChunk) string {
	var b strings.Builder
	lost := int64(0)
	for _, c := range chunks {
		if c.GapLength > 0 {
			lost += c.GapLength
			continue
		}
		if lost > 0 {
			fmt.Fprintf(&b, "[-%d]", lost)
			lost = 0
		}
		b.Write(c.Data)
	}
	if lost > 0 {
		fmt.Fprintf(&b, "[-%d]", lost)
	}
	return b.String()
}

// A log of alternating data bytes and one-byte gaps reaches a new stream's snapshot, and the feed
// update that first shows it, in a few reads: the reads step over the gaps between data instead of
// ending at each (one read per data byte held the feed for seconds).
func TestAlternatingGapsTakeFewReads(t *testing.T) {
	ctx := context.Background()
	const pairs = 4000
	st := &countingStore{Store: storetest.OpenSQLite(t)}
	u := newUI(t, st)
	var want strings.Builder
	chunks := make([]store.LogChunk, 0, 2*pairs)
	for i := range pairs {
		c := 'a' + byte(i%26)
		chunks = append(chunks, store.LogChunk{Offset: int64(2 * i), Data: []byte{c}}, store.LogChunk{Offset: int64(2*i + 1), GapLength: 1})
		want.WriteByte(c)
		want.WriteString("[-1]")
	}
	storetest.WriteLog(t, st, "e1", "a", 1, chunks)

	v := &executionView{ui: u, id: "e1", cursors: map[string]*logCursor{}}
	if _, _, err := v.update(ctx); err != nil {
		t.Fatal(err)
	}
	before := st.reads.Load()
	snap, err := v.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := logText(t, snap); text != want.String() {
		t.Fatalf("snapshot shows %.80q…, want %.80q…", text, want.String())
	}
	if reads := st.reads.Load() - before; reads > 2 {
		t.Fatalf("the snapshot read the log %d times", reads)
	}

	v = &executionView{ui: u, id: "e1", cursors: map[string]*logCursor{}, started: true}
	before = st.reads.Load()
	evs, more, err := v.update(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := logText(t, evs); text != want.String() || more {
		t.Fatalf("the update shows %.80q… (more %v), want %.80q…", text, more, want.String())
	}
	if reads := st.reads.Load() - before; reads > 3 { // the execution, the log, its end
		t.Fatalf("the update read the store %d times", reads)
	}
}

// A log of more pieces than a push may show is shown over several updates, each within the
// bounds, without losing or repeating a piece.
func TestManyPiecesSpreadOverUpdates(t *testing.T) {
	ctx := context.Background()
	const pairs = 3 * maxLogStepsPerPush
	chunks := make([]store.LogChunk, 0, 2*pairs)
	for i := range pairs {
		chunks = append(chunks, store.LogChunk{Offset: int64(2 * i), Data: []byte{'a' + byte(i%26)}}, store.LogChunk{Offset: int64(2*i + 1), GapLength: 1})
	}
	u := logUI(t, chunks)
	v := &executionView{ui: u, id: "e1", cursors: map[string]*logCursor{}, started: true}
	var all [][]byte
	for i := 0; ; i++ {
		evs, more, err := v.update(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, n := logText(t, evs); n > maxLogStepsPerPush {
			t.Fatalf("update %d rendered %d log events, more than %d", i, n, maxLogStepsPerPush)
		}
		all = append(all, evs...)
		if !more {
			break
		}
		if i > 10 {
			t.Fatal("the updates never caught up")
		}
	}
	if text, _ := logText(t, all); text != plainText(chunks) {
		t.Fatalf("the updates show %.80q…, want %.80q…", text, plainText(chunks))
	}
}

// What a page shows of a log (its snapshot, then the updates as the log grows) is the log: every
// byte once, in order, and every gap's lost bytes before the text that follows it.
func TestLogFeedShowsTheLog(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 8))
	for round := range 5 {
		chunks := storetest.RandomLog(r, 300, true)
		pos := int64(0)
		for i := range chunks { // no holes: a page waits at one until its bytes come
			chunks[i].Offset = pos
			if chunks[i].GapLength > 1000 {
				chunks[i].GapLength = 1 + chunks[i].GapLength%1000
			}
			pos = chunks[i].End()
		}
		st := storetest.OpenSQLite(t)
		u := newUI(t, st)
		cut := 1 + r.IntN(len(chunks)-1)
		storetest.WriteLog(t, st, "e1", "a", 1, chunks[:cut])
		v := &executionView{ui: u, id: "e1", cursors: map[string]*logCursor{}}
		if _, _, err := v.update(ctx); err != nil {
			t.Fatal(err)
		}
		shown, err := v.snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if text, _ := logText(t, shown); text != plainText(chunks[:cut]) {
			t.Fatalf("round %d: snapshot of %d chunks:\n got %q\nwant %q", round, cut, text, plainText(chunks[:cut]))
		}
		for cut < len(chunks) {
			next := min(len(chunks), cut+1+r.IntN(40))
			storetest.WriteLog(t, st, "e1", "a", 1, chunks[cut:next])
			cut = next
			evs, _, err := v.update(ctx)
			if err != nil {
				t.Fatal(err)
			}
			shown = append(shown, evs...)
		}
		if text, _ := logText(t, shown); text != plainText(chunks) {
			t.Fatalf("round %d: snapshot and updates:\n got %q\nwant %q", round, text, plainText(chunks))
		}
		later, err := v.snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if text, _ := logText(t, later); !bytes.Equal([]byte(text), []byte(plainText(chunks))) {
			t.Fatalf("round %d: a later snapshot:\n got %q\nwant %q", round, text, plainText(chunks))
		}
	}
}

// An execution's state shows the first gaps of a stack's log and says there are more, instead of
// a line per gap however many.
func TestStateShowsBoundedGaps(t *testing.T) {
	ctx := context.Background()
	chunks := []store.LogChunk{{Offset: 0, Data: []byte("x")}}
	for i := range 3 * service.MaxStackGaps {
		chunks = append(chunks, store.LogChunk{Offset: int64(i + 1), GapLength: 1 << 39})
	}
	u := logUI(t, chunks)
	v := &executionView{ui: u, id: "e1", cursors: map[string]*logCursor{}}
	if _, _, err := v.update(ctx); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(v.state), "lost bytes "); n != service.MaxStackGaps+1 || !strings.Contains(string(v.state), "more gaps than listed") {
		t.Fatalf("the state lists %d gaps: %.300s", n, v.state)
	}
}

// An update reads only the logs that grew since the last one: with nothing new it reads the
// execution and nothing else, however many stacks have logs, and then only the log that grew.
func TestIdleUpdateReadsNoLog(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Store: storetest.OpenSQLite(t)}
	const stacks = 50
	v := manyLogsView(t, st, stacks)
	evs, _, err := v.update(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, n := logText(t, evs); n != stacks {
		t.Fatalf("the first update shows %d logs, want %d", n, stacks)
	}
	before := st.reads.Load()
	evs, _, err = v.update(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if reads := st.reads.Load() - before; reads != 1 || len(evs) != 0 {
		t.Fatalf("an update with nothing new read the store %d times and sent %d events, want 1 and 0", reads, len(evs))
	}
	storetest.WriteLog(t, st, "e1", "s007", 1, []store.LogChunk{{Offset: 13, Data: []byte("applied\n")}})
	before = st.reads.Load()
	evs, _, err = v.update(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := logText(t, evs); text != "applied\n" {
		t.Fatalf("the update shows %q, want the new line", text)
	}
	if reads := st.reads.Load() - before; reads != 2 {
		t.Fatalf("an update after one log grew read the store %d times, want 2 (the execution, that log)", reads)
	}
}

// manyLogsView is a started page of execution e1 of n stacks (s000, s001, ...), each with a
// 13-byte log ("sNNN planned\n").
func manyLogsView(tb testing.TB, st store.Store, n int) *executionView {
	tb.Helper()
	svc := service.New(st, nil)
	stacks := make([]string, n)
	for i := range stacks {
		stacks[i] = fmt.Sprintf("s%03d", i)
	}
	if _, err := svc.Init(context.Background(), service.Caller{Name: "runner", Repositories: []string{"acme/infra"}}, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: stacks}); err != nil {
		tb.Fatal(err)
	}
	for _, s := range stacks {
		storetest.WriteLog(tb, st, "e1", s, 1, []store.LogChunk{{Offset: 0, Data: []byte(s + " planned\n")}})
	}
	return &executionView{ui: &UI{Service: svc}, id: "e1", cursors: map[string]*logCursor{}, started: true}
}
