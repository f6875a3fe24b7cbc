package web

import (
	"bytes"
	"context"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// scriptedView renders the events queued in it.
type scriptedView struct{ queued [][]byte }

func (v *scriptedView) execID() string { return "x" }

func (v *scriptedView) update(context.Context) ([][]byte, bool, error) {
	evs := v.queued
	v.queued = nil
	return evs, false, nil
}

func (v *scriptedView) snapshot(context.Context) ([][]byte, error) { return nil, nil }

// TestFeedKeepsOnlyWhatReadersNeed: a feed drops the events all its readers have sent, and past
// feedBytes drops the oldest even if a slow reader still needs them; that reader is told so.
func TestFeedKeepsOnlyWhatReadersNeed(t *testing.T) {
	ctx := context.Background()
	u := &UI{}
	v := &scriptedView{}
	f := &feed{v: v, readers: map[*reader]struct{}{}, changed: make(chan struct{})}
	push := func(evs ...[]byte) {
		t.Helper()
		v.queued = evs
		if _, err := u.update(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	_, fast, _ := f.snapshot(ctx)
	_, slow, _ := f.snapshot(ctx)
	push([]byte("a"), []byte("b"))
	if evs, _, ok := f.since(fast); !ok || !bytes.Equal(bytes.Join(evs, nil), []byte("ab")) {
		t.Fatalf("fast reader got %q %v", evs, ok)
	}
	push([]byte("c"))
	if len(f.events) != 3 {
		t.Fatalf("kept %d events, the slow reader needs 3", len(f.events))
	}
	if evs, _, ok := f.since(slow); !ok || len(evs) != 3 {
		t.Fatalf("slow reader got %q %v", evs, ok)
	}
	push([]byte("d"))
	if len(f.events) != 2 || f.first != 2 {
		t.Fatalf("after both sent a..c: events %q from %d, want c (unsent by fast) and d", f.events, f.first)
	}
	f.since(fast)
	big := bytes.Repeat([]byte("x"), feedBytes/2)
	for i := range 3 {
		push(big)
		if evs, _, ok := f.since(fast); !ok || len(evs) != 1 {
			t.Fatalf("big event %d: fast reader got %d events, ok %v", i, len(evs), ok)
		}
		if f.size > feedBytes {
			t.Fatalf("big event %d: the feed holds %d bytes", i, f.size)
		}
	}
	if _, _, ok := f.since(slow); ok {
		t.Fatal("a reader whose events were dropped was not told")
	}
	f.detach(slow)
	f.detach(fast)
	push([]byte("e"))
	if len(f.events) != 0 {
		t.Fatalf("a feed without readers kept %d events", len(f.events))
	}
}

// A live update carries no bidirectional formatting character either.
func TestLiveUpdatesCarryNoBidirectionalOverrides(t *testing.T) {
	ev, err := htmlEvent("rows", "execrows", []api.Execution{{ExecutionID: "x", Repo: "acme/infra", SHA: "abc\u202edef", Actor: "\u2066m\u2069"}})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsFunc(ev, isBidi) || !bytes.Contains(ev, []byte("abc\ufffd")) {
		t.Fatalf("event %s", ev)
	}
}
