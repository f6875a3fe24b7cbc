package storetest

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// RandomLog returns a log of n chunks from offset 0, in offset order: data chunks (1 to 300
// bytes), gap records (1 byte to 1 GiB) and, now and then, bytes never posted (a hole between two
// chunks). A tiled log's chunks never overlap, as a runner posts them; otherwise one chunk in four
// starts up to 400 bytes before the previous one ends, as only a hostile runner's do (at an
// offset no other chunk has).
func RandomLog(r *rand.Rand, n int, tiled bool) []store.LogChunk {
	var out []store.LogChunk
	seen := map[int64]bool{}
	pos := int64(0)
	for len(out) < n {
		off := pos
		if r.IntN(8) == 0 {
			off += 1 + r.Int64N(50)
		}
		if !tiled && r.IntN(4) == 0 && len(out) > 0 {
			off = max(0, pos-1-r.Int64N(400))
		}
		if seen[off] {
			continue
		}
		seen[off] = true
		c := store.LogChunk{Offset: off}
		switch k := r.IntN(10); {
		case k < 7:
			c.Data = make([]byte, 1+r.IntN(300))
			for i := range c.Data {
				c.Data[i] = 'a' + byte(r.IntN(26))
			}
		case k < 9:
			c.GapLength = 1 + r.Int64N(200)
		default:
			c.GapLength = 1 + r.Int64N(1<<30)
		}
		out = append(out, c)
		pos = max(pos, c.End())
	}
	slices.SortFunc(out, func(a, b store.LogChunk) int { return cmp.Compare(a.Offset, b.Offset) })
	return out
}

// ChunksFrom is what Tx.LogChunks returns from a stored log (chunks of one generation, in offset
// order, one per offset), worked out the plain way over the whole log.
func ChunksFrom(log []store.LogChunk, from int64, maxBytes, maxRows int) []store.LogChunk {
	from = max(from, 0)
	var out []store.LogChunk
	last := -1
	for i, c := range log {
		if c.Offset >= 0 && c.Offset < from {
			last = i
		}
	}
	if last >= 0 {
		c := log[last]
		n := int64(len(c.Data))
		if c.GapLength > 0 {
			n = c.GapLength
		}
		if n > from-c.Offset {
			out = append(out, c)
		}
	}
	for _, c := range log {
		if c.Offset >= from {
			out = append(out, c)
		}
	}
	return bound(out, maxBytes, maxRows)
}

// ChunksAfter is what Tx.LogChunksAfter returns from a stored log, worked out the plain way.
func ChunksAfter(log []store.LogChunk, after int64, maxBytes, maxRows int) []store.LogChunk {
	var out []store.LogChunk
	for _, c := range log {
		if c.Offset > after {
			out = append(out, c)
		}
	}
	return bound(out, maxBytes, maxRows)
}

// bound cuts chunks at the one that brings their data to maxBytes or more, or at maxRows.
func bound(chunks []store.LogChunk, maxBytes, maxRows int) []store.LogChunk {
	total := 0
	for i, c := range chunks {
		if i >= maxRows || total >= maxBytes {
			return chunks[:i]
		}
		total += len(c.Data)
	}
	return chunks
}

// WriteLog stores chunks as the log of execution execID's stack in generation, a thousand a
// transaction.
func WriteLog(tb testing.TB, s store.Store, execID, stack string, generation int64, chunks []store.LogChunk) {
	tb.Helper()
	for from := 0; from < len(chunks); from += 1000 {
		part := slices.Clone(chunks[from:min(from+1000, len(chunks))])
		for i := range part {
			part[i].ExecutionID, part[i].Stack, part[i].Generation = execID, stack, generation
		}
		if err := s.Write(context.Background(), func(tx store.Tx) error { _, err := tx.AddLogChunks(part); return err }); err != nil {
			tb.Fatalf("write log: %v", err)
		}
	}
}
