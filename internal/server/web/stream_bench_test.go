package web

import (
	"context"
	"fmt"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// logUI returns a UI over a SQLite store whose execution e1 has stack a, whose generation 1 log is
// chunks.
func logUI(tb testing.TB, chunks []store.LogChunk) *UI {
	tb.Helper()
	st := storetest.OpenSQLite(tb)
	u := newUI(tb, st)
	storetest.WriteLog(tb, st, "e1", "a", 1, chunks)
	return u
}

// newUI returns a UI over st, where execution e1 has stack a.
func newUI(tb testing.TB, st store.Store) *UI {
	tb.Helper()
	svc := service.New(st, nil)
	if _, err := svc.Init(context.Background(), service.Caller{Name: "runner", Repositories: []string{"acme/infra"}}, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}}); err != nil {
		tb.Fatal(err)
	}
	return &UI{Service: svc}
}

// alternatingLog is pairs of one data byte at 2i and a one-byte gap at 2i+1.
func alternatingLog(pairs int) []store.LogChunk {
	out := make([]store.LogChunk, 0, 2*pairs)
	for i := range pairs {
		out = append(out, store.LogChunk{Offset: int64(2 * i), Data: []byte{'a' + byte(i%26)}},
			store.LogChunk{Offset: int64(2*i + 1), GapLength: 1})
	}
	return out
}

// BenchmarkExecutionViewAlternatingGaps times what a live page of an execution costs when its
// log alternates data bytes and one-byte gaps (the whole log is within the tail a page shows):
// a new stream's snapshot, and the feed update that first renders the stack.
func BenchmarkExecutionViewAlternatingGaps(b *testing.B) {
	ctx := context.Background()
	for _, pairs := range []int{1000, 2000, 4000} {
		b.Run(fmt.Sprintf("%d-pairs", pairs), func(b *testing.B) {
			u := logUI(b, alternatingLog(pairs))
			b.Run("snapshot", func(b *testing.B) {
				v := &executionView{ui: u, id: "e1", cursors: map[string]*logCursor{}}
				if _, _, err := v.update(ctx); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if _, err := v.snapshot(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("update", func(b *testing.B) {
				for b.Loop() {
					v := &executionView{ui: u, id: "e1", cursors: map[string]*logCursor{}, started: true}
					if _, _, err := v.update(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkExecutionViewIdle times an update of a live page of an execution whose stacks all
// have logs, when nothing is new (what every viewer's page pays on each state change).
func BenchmarkExecutionViewIdle(b *testing.B) {
	for _, n := range []int{50, 200} {
		b.Run(fmt.Sprintf("stacks=%d", n), func(b *testing.B) {
			v := manyLogsView(b, storetest.OpenSQLite(b), n)
			if _, _, err := v.update(context.Background()); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, _, err := v.update(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
