package storetest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// LogChunks and LogChunksAfter return what their contracts say, worked out over the whole log by
// ChunksFrom and ChunksAfter, from every kind of offset (a chunk's start, inside one, in a hole,
// past the end) and under every bound, for runner-shaped logs and for logs whose chunks overlap.
func TestLogChunksMatchThePlainReading(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("e1", t0)); return err })
		r := rand.New(rand.NewPCG(1, 2))
		logs := map[string][]store.LogChunk{"tiled": RandomLog(r, 400, true), "overlapping": RandomLog(r, 400, false)}
		for stack, log := range logs {
			WriteLog(t, s, "e1", stack, 3, log)
			// Another generation and another stack around it must not show.
			WriteLog(t, s, "e1", stack, 2, RandomLog(r, 20, true))
			WriteLog(t, s, "e1", stack+"x", 3, RandomLog(r, 20, true))
		}
		for stack, log := range logs {
			end := log[len(log)-1].End()
			for i := range 300 {
				from := r.Int64N(min(end, 200_000) + 10)
				if i%3 == 0 {
					from = log[r.IntN(len(log))].Offset
				}
				maxBytes, maxRows := 1+r.IntN(3000), 1+r.IntN(60)
				var got []store.LogChunk
				if err := s.Read(ctx, func(tx store.Tx) (err error) {
					got, err = tx.LogChunks("e1", stack, 3, from, maxBytes, maxRows)
					return
				}); err != nil {
					t.Fatal(err)
				}
				want := ChunksFrom(log, from, maxBytes, maxRows)
				if d := diffChunks(got, want); d != "" {
					t.Fatalf("%s from %d, %d bytes, %d rows: %s", stack, from, maxBytes, maxRows, d)
				}
				if err := s.Read(ctx, func(tx store.Tx) (err error) {
					got, err = tx.LogChunksAfter("e1", stack, 3, from-1, maxBytes, maxRows)
					return
				}); err != nil {
					t.Fatal(err)
				}
				want = ChunksAfter(log, from-1, maxBytes, maxRows)
				if d := diffChunks(got, want); d != "" {
					t.Fatalf("%s after %d, %d bytes, %d rows: %s", stack, from-1, maxBytes, maxRows, d)
				}
			}
		}
	})
}

func diffChunks(got, want []store.LogChunk) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d chunks, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Offset != w.Offset || g.GapLength != w.GapLength || !bytes.Equal(g.Data, w.Data) {
			return fmt.Sprintf("chunk %d at %d (gap %d, %d bytes), want at %d (gap %d, %d bytes)", i, g.Offset, g.GapLength, len(g.Data), w.Offset, w.GapLength, len(w.Data))
		}
	}
	return ""
}

// LogSummaries gives each stack's latest generation, where its last chunk ends and its first gaps
// (saying when there are more), as worked out over every chunk.
func TestLogSummariesMatchThePlainReading(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("e1", t0)); return err })
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("e2", t0)); return err })
		r := rand.New(rand.NewPCG(3, 4))
		want := map[string]store.LogSummary{}
		for i := range 12 {
			stack := fmt.Sprintf("s%02d", i)
			var log []store.LogChunk
			for g := range int64(1 + i%3) {
				log = RandomLog(r, 1+r.IntN(150), true)
				WriteLog(t, s, "e1", stack, g, log)
			}
			sum := store.LogSummary{Stack: stack, Generation: int64(i % 3), Bytes: log[len(log)-1].End()}
			for _, c := range log {
				if c.GapLength > 0 {
					sum.Gaps = append(sum.Gaps, api.LogGap{Generation: sum.Generation, From: c.Offset, To: c.End()})
				}
			}
			want[stack] = sum
			WriteLog(t, s, "e2", stack, 9, RandomLog(r, 5, true))
		}
		for _, maxGaps := range []int{1000, 5, 1, 0} {
			var got []store.LogSummary
			if err := s.Read(ctx, func(tx store.Tx) (err error) { got, err = tx.LogSummaries("e1", maxGaps); return }); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d summaries, want %d", len(got), len(want))
			}
			for i, g := range got {
				w := want[fmt.Sprintf("s%02d", i)]
				if len(w.Gaps) > maxGaps {
					w.Gaps, w.GapsTruncated = w.Gaps[:maxGaps], true
				}
				if fmt.Sprint(g) != fmt.Sprint(w) {
					t.Fatalf("summary %d, %d gaps at most:\n got %+v\nwant %+v", i, maxGaps, g, w)
				}
			}
		}
		var none []store.LogSummary
		if err := s.Read(ctx, func(tx store.Tx) (err error) { none, err = tx.LogSummaries("none", 100); return }); err != nil || len(none) != 0 {
			t.Fatalf("an execution without logs: %+v %v", none, err)
		}
	})
}
