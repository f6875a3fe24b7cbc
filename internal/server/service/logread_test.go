package service

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// plainAssemble is LogRead worked out the plain way: the chunks that reach past offset as the
// store returns them (storetest.ChunksFrom, unbounded in rows), laid out as LogRead always has.
func plainAssemble(log []store.LogChunk, stack string, generation, offset int64, limit int) *api.LogSlice {
	chunks := storetest.ChunksFrom(log, offset, limit, 1<<30)
	out := &api.LogSlice{Stack: stack, Generation: generation, Offset: offset}
	pos := offset
	var data []byte
	for _, c := range chunks {
		if c.Offset > pos || len(data) >= limit {
			break
		}
		end := c.End()
		if c.GapLength > 0 {
			out.Gaps = append(out.Gaps, api.LogGap{Generation: generation, From: c.Offset, To: end})
			if len(data) > 0 {
				break
			}
			pos = max(pos, end)
			continue
		}
		if end <= pos {
			continue
		}
		part := c.Data[pos-c.Offset : end-c.Offset]
		if room := limit - len(data); len(part) > room {
			part = part[:room]
		}
		data = append(data, part...)
		pos += int64(len(part))
	}
	out.Data, out.NextOffset = data, pos
	return out
}

// LogRead answers what the plain reading of the whole log does, from every kind of offset and
// under every limit, for runner-shaped logs and for logs whose chunks overlap.
func TestLogReadMatchesThePlainReading(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"tiled", "overlapping"}})
		f.must(err)
		r := rand.New(rand.NewPCG(5, 6))
		logs := map[string][]store.LogChunk{"tiled": storetest.RandomLog(r, 400, true), "overlapping": storetest.RandomLog(r, 400, false)}
		for stack, log := range logs {
			storetest.WriteLog(t, f.Store, "e1", stack, 1, log)
		}
		for stack, log := range logs {
			end := log[len(log)-1].End()
			for i := range 300 {
				off := r.Int64N(min(end, 200_000) + 10)
				if i%3 == 0 {
					off = log[r.IntN(len(log))].Offset
				}
				limit := 1 + r.IntN(3000)
				got, err := f.LogRead(ctx, reader, "e1", stack, 1, false, off, limit)
				f.must(err)
				if want := plainAssemble(log, stack, 1, off, limit); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("%s from %d, limit %d:\n got %+v\nwant %+v", stack, off, limit, got, want)
				}
			}
		}
	})
}

// A read looks at MaxLogReadRows chunks at most: a log of one-byte chunks is read in slices of
// that many bytes, and followed to its end all the same.
func TestLogReadStopsAtMaxRows(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		n := MaxLogReadRows + 1000
		log := make([]store.LogChunk, n)
		for i := range log {
			log[i] = store.LogChunk{Offset: int64(i), Data: []byte{'a' + byte(i%26)}}
		}
		storetest.WriteLog(t, f.Store, "e1", "a", 1, log)
		sl, err := f.LogRead(ctx, reader, "e1", "a", 1, false, 0, 4<<20)
		f.must(err)
		if len(sl.Data) != MaxLogReadRows || sl.NextOffset != MaxLogReadRows {
			t.Fatalf("one read of %d one-byte chunks: %d bytes, next offset %d; want %d", n, len(sl.Data), sl.NextOffset, MaxLogReadRows)
		}
		var all []byte
		for off := int64(0); ; {
			sl, err := f.LogRead(ctx, reader, "e1", "a", 1, false, off, 4<<20)
			f.must(err)
			all = append(all, sl.Data...)
			if sl.NextOffset == off {
				break
			}
			off = sl.NextOffset
		}
		if len(all) != n || !bytes.Equal(all[:26], []byte("abcdefghijklmnopqrstuvwxyz")) {
			t.Fatalf("followed to its end: %d bytes, want %d", len(all), n)
		}
	})
}

// ReadLogSpan, followed from any offset in bounded steps, gives the log's bytes once each in order,
// every gap's bytes past the offset as lost before the bytes after it, and stops where bytes were
// never received; each step keeps to its limit and gap bound.
func TestReadLogSpanCoversTheLog(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		r := rand.New(rand.NewPCG(9, 10))
		log := storetest.RandomLog(r, 600, true)
		storetest.WriteLog(t, f.Store, "e1", "a", 1, log)
		for range 40 {
			from := r.Int64N(log[len(log)-1].End() + 10)
			var want strings.Builder
			wantEnd, lost, pos := from, int64(0), from
			for _, c := range storetest.ChunksFrom(log, from, 1<<30, 1<<30) {
				if c.Offset > pos {
					break
				}
				if c.GapLength > 0 {
					lost += c.End() - pos
				} else {
					if lost > 0 {
						fmt.Fprintf(&want, "[-%d]", lost)
						lost = 0
					}
					want.Write(c.Data[pos-c.Offset:])
				}
				pos = c.End()
				wantEnd = pos
			}
			if lost > 0 {
				fmt.Fprintf(&want, "[-%d]", lost)
			}
			var got strings.Builder
			lost, off := 0, from
			for {
				limit, maxGaps := 1+r.IntN(500), 1+r.IntN(20)
				sp, err := f.ReadLogSpan(ctx, reader, "e1", "a", 1, off, math.MaxInt64, limit, maxGaps)
				f.must(err)
				data, gaps := 0, 0
				for _, p := range sp.Parts {
					if p.Data == nil {
						gaps++
						lost += p.Lost
						continue
					}
					if lost > 0 {
						fmt.Fprintf(&got, "[-%d]", lost)
						lost = 0
					}
					data += len(p.Data)
					got.Write(p.Data)
				}
				if data > limit || gaps > maxGaps {
					t.Fatalf("from %d: a read of limit %d, %d gaps gave %d bytes, %d gaps", off, limit, maxGaps, data, gaps)
				}
				if sp.NextOffset == off {
					break
				}
				off = sp.NextOffset
			}
			if lost > 0 {
				fmt.Fprintf(&got, "[-%d]", lost)
			}
			if got.String() != want.String() || off != wantEnd {
				t.Fatalf("from %d: read to %d:\n%q\nwant to %d:\n%q", from, off, got.String(), wantEnd, want.String())
			}
		}
	})
}

// Gap lists are bounded: a log of thousands of overlapping gaps (one request can hold them) is
// read MaxLogReadGaps gaps a slice, to its end in a few reads, and its execution lists the first
// MaxStackGaps of them, saying there are more.
func TestGapListsAreBounded(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a", "b"}})
		f.must(err)
		const n = 5 * MaxLogReadGaps
		log := []store.LogChunk{{Offset: 0, Data: []byte("x")}}
		for i := range n {
			log = append(log, store.LogChunk{Offset: int64(i + 1), GapLength: 1 << 39})
		}
		storetest.WriteLog(t, f.Store, "e1", "a", 1, log)
		storetest.WriteLog(t, f.Store, "e1", "b", 1, []store.LogChunk{{Offset: 0, Data: []byte("ok")}, {Offset: 2, GapLength: 5}})
		listed := map[int64]bool{}
		reads := 0
		for off := int64(0); ; reads++ {
			sl, err := f.LogRead(ctx, reader, "e1", "a", 1, false, off, 100)
			f.must(err)
			if len(sl.Gaps) > MaxLogReadGaps {
				t.Fatalf("a read from %d lists %d gaps", off, len(sl.Gaps))
			}
			for _, g := range sl.Gaps {
				listed[g.From] = true
			}
			if sl.NextOffset == off {
				break
			}
			off = sl.NextOffset
		}
		if reads > 4 || !listed[1] || !listed[MaxLogReadGaps] || !listed[n] {
			t.Fatalf("followed in %d reads, listing gaps at 1: %v, %d: %v, %d: %v", reads, listed[1], MaxLogReadGaps, listed[MaxLogReadGaps], n, listed[n])
		}
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		a, b := x.Stacks[0], x.Stacks[1]
		if len(a.Gaps) != MaxStackGaps || !a.GapsTruncated || a.Gaps[0].From != 1 || a.Gaps[MaxStackGaps-1].From != MaxStackGaps {
			t.Fatalf("stack a lists %d gaps (truncated %v) from %+v", len(a.Gaps), a.GapsTruncated, a.Gaps[0])
		}
		if len(b.Gaps) != 1 || b.GapsTruncated || b.LogBytes != 7 {
			t.Fatalf("stack b: %+v", b)
		}
	})
}
