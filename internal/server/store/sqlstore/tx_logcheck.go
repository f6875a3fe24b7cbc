package sqlstore

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Checking log chunks against the stored log (AddLogBatch): a chunk must agree with every
// stored chunk it overlaps, so that what a reader was given never changes. A runner's chunks
// tile the log (each starts where the previous ended), so its new chunks overlap nothing and
// the check costs one index probe per stack and generation of a batch; only a resend (a retry,
// or a runner started again after kill -9) reads stored bytes to compare.

// errNeedsTransaction is returned by AddLogBatch inside a WriteOne (one statement, no
// transaction) when some chunk overlaps the stored log: its statement stored nothing, and
// WriteOne runs the write again in a transaction, where the chunks are checked one by one.
var errNeedsTransaction = errors.New("sqlstore: the log batch overlaps the stored log and needs a transaction")

// overlapProbeSQL is true for a range c (columns stack, generation, off, n: the span of a
// batch's chunks of one stack and generation, see probeSpans) when the stored chunk of its
// stack and generation that starts last before c's end reaches past c's start: one seek of the
// primary key, backwards. As the chunks AddLogBatch stores never overlap, it holds whenever a
// chunk of the span overlaps a stored one (and sometimes when a stored chunk lies in a hole
// between them: the chunks are then compared one by one for nothing); only a chunk nested in
// an older, longer one stored before this check, by a hostile runner, escapes it (readers, which
// go by offset, show the older chunk's bytes there anyway).
const overlapProbeSQL = "EXISTS (SELECT 1 FROM (SELECT l.off, l.n FROM log_chunks l WHERE l.execution_id = ? AND l.stack = c.stack " +
	"AND l.generation = c.generation AND l.off >= 0 AND l.off < c.off + c.n ORDER BY l.off DESC LIMIT 1) p WHERE p.n > c.off - p.off)"

// mismatch reports whether chunk c disagrees with chunk s of the same stack and generation,
// and the first offset where it does. Data chunks disagree where they overlap with different
// bytes; a gap record agrees only with the same gap record at the same offset (a gap says the
// bytes were lost: bytes for it, or another gap across it, contradict it). Chunks that do not
// overlap agree.
func mismatch(c, s store.LogChunk) (int64, bool) {
	lo, hi := max(c.Offset, s.Offset), min(c.End(), s.End())
	if lo >= hi {
		return 0, false
	}
	if c.GapLength > 0 || s.GapLength > 0 {
		if c.Offset == s.Offset && c.GapLength == s.GapLength {
			return 0, false
		}
		return lo, true
	}
	a, b := c.Data[lo-c.Offset:hi-c.Offset], s.Data[lo-s.Offset:hi-s.Offset]
	for i := range a {
		if a[i] != b[i] {
			return lo + int64(i), true
		}
	}
	return 0, false
}

// mismatchError is the ErrMismatch of chunk c, which differs from what is stored at offset at.
func mismatchError(c store.LogChunk, at int64) error {
	return fmt.Errorf("%w: the log chunk of stack %q, generation %d, at offset %d (%s) differs from the log stored at offset %d; the stored log is kept",
		store.ErrMismatch, c.Stack, c.Generation, c.Offset, chunkSize(c), at)
}

// batchMismatchError is the ErrMismatch of chunk c, which differs at offset at from another
// chunk of its batch.
func batchMismatchError(c store.LogChunk, at int64) error {
	return fmt.Errorf("%w: the log chunk of stack %q, generation %d, at offset %d (%s) differs at offset %d from another chunk of the batch",
		store.ErrMismatch, c.Stack, c.Generation, c.Offset, chunkSize(c), at)
}

// chunkSize says how long a chunk is, in a message.
func chunkSize(c store.LogChunk) string {
	if c.GapLength > 0 {
		return fmt.Sprintf("a gap of %d bytes", c.GapLength)
	}
	return fmt.Sprintf("%d bytes", len(c.Data))
}

// normalizeBatch checks the chunks of one batch against each other and returns them without
// overlaps: sorted by stack, generation and offset, a chunk the others already cover is
// dropped and one that goes on past them keeps only its bytes past them (a chunk resent
// longer in the same batch). Chunks that disagree fail the batch with ErrMismatch.
func normalizeBatch(cs []store.LogChunk) ([]store.LogChunk, error) {
	sorted := slices.Clone(cs)
	slices.SortStableFunc(sorted, func(a, b store.LogChunk) int {
		return cmp.Or(cmp.Compare(a.Stack, b.Stack), cmp.Compare(a.Generation, b.Generation), cmp.Compare(a.Offset, b.Offset),
			cmp.Compare(b.End(), a.End()))
	})
	out := make([]store.LogChunk, 0, len(sorted))
	group := 0 // where the chunks of the current stack and generation start in out
	for _, c := range sorted {
		if group < len(out) && (out[group].Stack != c.Stack || out[group].Generation != c.Generation) {
			group = len(out)
		}
		kept := out[group:]
		// Kept chunks do not overlap, so their ends increase: those c overlaps are the last ones.
		for j := len(kept) - 1; j >= 0 && kept[j].End() > c.Offset; j-- {
			if off, bad := mismatch(c, kept[j]); bad {
				return nil, batchMismatchError(c, off)
			}
		}
		if len(kept) > 0 {
			covered := kept[len(kept)-1].End()
			if c.End() <= covered {
				continue
			}
			if c.Offset < covered {
				c.Data, c.Offset = c.Data[covered-c.Offset:], covered
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// MaxRunBytes bounds the data of one stored row of consecutive chunks (see joinRuns).
const MaxRunBytes = 64 << 10

// joinRuns returns the chunks cs of normalizeBatch (sorted by stack, generation and offset, not
// overlapping) as the rows AddLogBatch stores: each run of data chunks of one stack and
// generation that follow each other without a hole (each starting where the one before ends)
// becomes one row, up to MaxRunBytes of data; gap records and longer chunks stay rows of their
// own. counts[i] is how many chunks of cs rows[i] holds. A runner's batch is such runs (64
// chunks of a stack are one row, not 64): every row costs the database its index entries,
// which is what the log ingest of PostgreSQL spent its time on. Readers go by offset and do
// not see how the bytes were cut.
func joinRuns(cs []store.LogChunk) (rows []store.LogChunk, counts []int64) {
	for i := 0; i < len(cs); {
		c, j, size := cs[i], i+1, len(cs[i].Data)
		for c.GapLength == 0 && j < len(cs) && cs[j].GapLength == 0 && cs[j].Stack == c.Stack && cs[j].Generation == c.Generation &&
			cs[j].Offset == cs[j-1].End() && size+len(cs[j].Data) <= MaxRunBytes {
			size += len(cs[j].Data)
			j++
		}
		if j > i+1 {
			c.Data = make([]byte, 0, size)
			for _, d := range cs[i:j] {
				c.Data = append(c.Data, d.Data...)
			}
		}
		rows, counts = append(rows, c), append(counts, int64(j-i))
		i = j
	}
	return rows, counts
}

// probeSpans returns, for the chunks cs of normalizeBatch (sorted by stack, generation and
// offset), the span of each stack and generation: its stack, generation, first offset and
// length to the end of its last chunk, as overlapProbeSQL takes them.
func probeSpans(cs []store.LogChunk) (stacks []string, gens, offs, lens []int64) {
	for i, c := range cs {
		if i == 0 || c.Stack != cs[i-1].Stack || c.Generation != cs[i-1].Generation {
			stacks, gens, offs, lens = append(stacks, c.Stack), append(gens, c.Generation), append(offs, c.Offset), append(lens, 0)
		}
		last := len(lens) - 1
		lens[last] = max(lens[last], c.End()-offs[last])
	}
	return stacks, gens, offs, lens
}

// overlapPage is how many stored chunks one read of addChecked fetches at a time.
const overlapPage = 256

// storedOver calls fn with the stored chunks of c's stack and generation that overlap c, in
// offset order (see LogChunks for the one starting before c).
func (t *sqlTx) storedOver(execID string, c store.LogChunk, fn func(store.LogChunk) error) error {
	end := c.End()
	page, err := t.LogChunks(execID, c.Stack, c.Generation, c.Offset, MaxOverlapBytes, overlapPage)
	for {
		if err != nil {
			return err
		}
		for _, s := range page {
			if s.Offset >= end {
				return nil
			}
			if err := fn(s); err != nil {
				return err
			}
		}
		if len(page) == 0 {
			return nil
		}
		page, err = t.LogChunksAfter(execID, c.Stack, c.Generation, page[len(page)-1].Offset, MaxOverlapBytes, overlapPage)
	}
}

// MaxOverlapBytes bounds the stored bytes one read of addChecked fetches.
const MaxOverlapBytes = 4 << 20

// addChecked stores the chunks cs (normalized, of one execution) of which some overlap the
// stored log: each is compared with the stored chunks it overlaps, and only its bytes no
// stored chunk covers are stored, as chunks of their own (a resend that read further than the
// first send extends the log; the stored chunks stay as they are, never overlapped). A gap
// record that overlaps anything is the same record again. It returns how many chunks were
// inserted, or ErrMismatch (nothing of the batch is to be kept then: the caller's transaction
// rolls back).
func (t *sqlTx) addChecked(execID string, cs []store.LogChunk) (int64, error) {
	var fresh []store.LogChunk
	for _, c := range cs {
		pos, overlapped := c.Offset, false
		err := t.storedOver(execID, c, func(s store.LogChunk) error {
			if off, bad := mismatch(c, s); bad {
				return mismatchError(c, off)
			}
			overlapped = true
			if s.Offset > pos {
				fresh = append(fresh, piece(c, pos, s.Offset))
			}
			pos = max(pos, s.End())
			return nil
		})
		if err != nil {
			return 0, err
		}
		switch {
		case !overlapped:
			fresh = append(fresh, c)
		case c.GapLength == 0 && pos < c.End():
			fresh = append(fresh, piece(c, pos, c.End()))
		}
	}
	return t.addRuns(fresh)
}

// piece is the part [from, to) of data chunk c.
func piece(c store.LogChunk, from, to int64) store.LogChunk {
	c.Data, c.Offset = c.Data[from-c.Offset:to-c.Offset], from
	return c
}
