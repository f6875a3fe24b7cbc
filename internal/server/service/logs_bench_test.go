package service

import (
	"fmt"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// seedLog returns a service whose execution e1 has stack a, whose generation 1 log is chunks.
func seedLog(tb testing.TB, st store.Store, chunks []store.LogChunk) *Service {
	tb.Helper()
	svc := New(st, nil)
	if _, err := svc.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}}); err != nil {
		tb.Fatal(err)
	}
	storetest.WriteLog(tb, st, "e1", "a", 1, chunks)
	return svc
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

// tiledLog is n chunks of size bytes each, one after the other.
func tiledLog(n, size int) []store.LogChunk {
	out := make([]store.LogChunk, n)
	data := make([]byte, size)
	for i := range data {
		data[i] = 'a' + byte(i%26)
	}
	for i := range out {
		out[i] = store.LogChunk{Offset: int64(i * size), Data: data}
	}
	return out
}

// overlappingGaps is one data byte at 0 and then n gaps at offsets 1..n, each 2^39 bytes long.
func overlappingGaps(n int) []store.LogChunk {
	out := []store.LogChunk{{Offset: 0, Data: []byte("x")}}
	for i := range n {
		out = append(out, store.LogChunk{Offset: int64(i + 1), GapLength: 1 << 39})
	}
	return out
}

// followLog reads a whole log as a client does, from offset 0 following next_offset; it
// returns the reads made and the data bytes read.
func followLog(tb testing.TB, svc *Service) (reads, bytes int) {
	off := int64(0)
	for {
		sl, err := svc.LogRead(ctx, reader, "e1", "a", 1, false, off, DefaultLogReadMax)
		if err != nil {
			tb.Fatal(err)
		}
		reads++
		bytes += len(sl.Data)
		if sl.NextOffset == off {
			return reads, bytes
		}
		off = sl.NextOffset
	}
}

// BenchmarkLogReads times the reads of one stack's log that the audit found costly: following a
// log of alternating data bytes and one-byte gaps from its start; a read at the tail of a big log
// (the last chunk) and Execution (the log summaries); and both over a log of overlapping gaps.
func BenchmarkLogReads(b *testing.B) {
	for _, be := range storetest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			for _, pairs := range []int{1000, 4000} {
				b.Run(fmt.Sprintf("alternating-%d-pairs/follow", pairs), func(b *testing.B) {
					svc := seedLog(b, be.Open(b), alternatingLog(pairs))
					for b.Loop() {
						if _, n := followLog(b, svc); n != pairs {
							b.Fatalf("read %d bytes, want %d", n, pairs)
						}
					}
				})
			}
			for _, shape := range []struct{ n, size int }{{2000, 64 << 10}, {40000, 100}} {
				b.Run(fmt.Sprintf("tiled-%dx%dB", shape.n, shape.size), func(b *testing.B) {
					svc := seedLog(b, be.Open(b), tiledLog(shape.n, shape.size))
					end := int64(shape.n * shape.size)
					b.Run("tail-read", func(b *testing.B) {
						for b.Loop() {
							sl, err := svc.LogRead(ctx, reader, "e1", "a", 1, false, end-int64(shape.size), DefaultLogReadMax)
							if err != nil || len(sl.Data) != shape.size {
								b.Fatalf("tail read: %v %d bytes", err, len(sl.Data))
							}
						}
					})
					b.Run("execution", func(b *testing.B) {
						for b.Loop() {
							x, err := svc.Execution(ctx, reader, "e1")
							if err != nil || x.Stacks[0].LogBytes != end {
								b.Fatalf("execution: %v %+v", err, x)
							}
						}
					})
				})
			}
			b.Run("overlapping-gaps-80000", func(b *testing.B) {
				svc := seedLog(b, be.Open(b), overlappingGaps(80000))
				b.Run("log-read", func(b *testing.B) {
					for b.Loop() {
						if _, err := svc.LogRead(ctx, reader, "e1", "a", 1, false, 1, DefaultLogReadMax); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.Run("execution", func(b *testing.B) {
					for b.Loop() {
						if _, err := svc.Execution(ctx, reader, "e1"); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		})
	}
}
