package service

import (
	"context"
	"math"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Log chunks: storing them once and reading them back contiguously.

// MaxLogOffset bounds where a stack's log may reach (1 TiB): a chunk's offset, a gap's length
// and the offset just past either. The bound keeps every offset sum far from overflowing.
const MaxLogOffset = 1 << 40

func checkChunk(in *api.LogChunk) error {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return err
	}
	if err := checkStack("stack", in.Stack); err != nil {
		return err
	}
	switch {
	case in.Generation < 0:
		return invalid("generation %d is negative", in.Generation)
	case in.Offset < 0:
		return invalid("offset %d is negative", in.Offset)
	case in.Offset > MaxLogOffset:
		return invalid("offset %d exceeds %d", in.Offset, int64(MaxLogOffset))
	case in.GapLength < 0:
		return invalid("gap_length %d is negative", in.GapLength)
	case in.GapLength > MaxLogOffset:
		return invalid("gap_length %d exceeds %d", in.GapLength, int64(MaxLogOffset))
	case in.GapLength > 0 && len(in.Data) > 0:
		return invalid("a chunk carries data or records a gap, not both")
	case len(in.Data) > MaxLogChunk:
		return invalid("chunk of %d bytes exceeds %d", len(in.Data), MaxLogChunk)
	case in.GapLength == 0 && len(in.Data) == 0:
		return invalid("chunk has neither data nor gap_length")
	case in.Offset+in.GapLength+int64(len(in.Data)) > MaxLogOffset:
		return invalid("offset %d + length %d exceeds %d", in.Offset, in.GapLength+int64(len(in.Data)), int64(MaxLogOffset))
	}
	return nil
}

// LogChunk stores log bytes (or a gap) once per (execution, stack, generation, offset).
func (s *Service) LogChunk(ctx context.Context, caller Caller, in *api.LogChunk) (api.Ack, error) {
	return s.LogChunks(ctx, caller, []api.LogChunk{*in})
}

// MaxBatchData bounds the log bytes one LogChunks call carries.
const MaxBatchData = 8 << 20

// MaxChunks bounds the chunks of one LogChunks call (the contract's maxItems).
const MaxChunks = 1000

// LogChunks stores several chunks of one execution in one transaction, each once per
// (execution, stack, generation, offset). Only the principal that announced the execution (or
// an admin) sends its logs.
func (s *Service) LogChunks(ctx context.Context, caller Caller, chunks []api.LogChunk) (api.Ack, error) {
	total := 0
	execOf := func(i int) string { return chunks[i].ExecutionID }
	err := checkBatch("chunks", len(chunks), MaxChunks, execOf, func(i int) error {
		total += len(chunks[i].Data)
		return checkChunk(&chunks[i])
	})
	if err != nil {
		return api.Ack{}, err
	}
	if total > MaxBatchData {
		return api.Ack{}, invalid("chunks carry %d bytes, more than %d", total, MaxBatchData)
	}
	execID := chunks[0].ExecutionID
	if err := s.checkOwner(ctx, caller, execID); err != nil {
		return api.Ack{}, err
	}
	if err := s.checkLogQuota(ctx, execID, int64(total)); err != nil {
		return api.Ack{}, err
	}
	rows := make([]store.LogChunk, len(chunks))
	for i, in := range chunks {
		rows[i] = store.LogChunk{ExecutionID: in.ExecutionID, Stack: in.Stack,
			Generation: in.Generation, Offset: in.Offset, Data: in.Data, GapLength: in.GapLength}
	}
	var ack api.Ack
	var stored int64
	err = s.writeOne(ctx, func(tx store.Tx) error {
		st, missing, added, err := tx.AddLogBatch(execID, rows)
		if err != nil {
			return err
		}
		stored = added
		ack = cancelAck(st.Cancelled, st.CancelReason)
		// A log for a stack the execution never announced would be stored but never shown.
		if len(missing) > 0 {
			return invalid("stack %q is not a stack of execution %q (announce it with init, a phase or an update first)", missing[0], execID)
		}
		if added == 0 {
			return nil
		}
		return tx.Notify(execID)
	})
	if err == nil {
		s.noteSeen(ctx, execID)
	}
	if err != nil || stored == 0 {
		s.uncountLog(execID, int64(total)) // nothing new: a resend is not counted twice
	}
	return ack, err
}

// LogRead returns a stack's log bytes from offset as far as they are contiguous. A recorded gap
// at offset is stepped over (NextOffset moves past it, listed in Gaps); bytes not received yet end
// the slice, and so does a gap after data (listed, not stepped over), the MaxLogReadGaps-th gap and
// the MaxLogReadRows-th chunk. latest selects the newest generation.
func (s *Service) LogRead(ctx context.Context, caller Caller, id, stack string, generation int64, latest bool, offset int64, limit int) (*api.LogSlice, error) {
	if err := checkStack("stack", stack); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, invalid("offset %d is negative", offset)
	}
	if limit <= 0 || limit > MaxLogReadLimit {
		limit = DefaultLogReadMax
	}
	var out *api.LogSlice
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		if err := s.checkReader(tx, caller, id); err != nil {
			return err
		}
		if latest {
			g, err := tx.LatestGeneration(id, stack)
			if err != nil {
				return err
			}
			generation = g
		}
		k := &logWalk{stack: stack, generation: generation, pos: offset, until: math.MaxInt64, limit: limit, maxGaps: MaxLogReadGaps}
		if err := k.read(tx, id); err != nil {
			return err
		}
		out = &api.LogSlice{Stack: stack, Generation: generation, Offset: offset, NextOffset: k.pos}
		for _, p := range k.parts {
			if p.Data != nil {
				out.Data = append(out.Data, p.Data...)
			} else {
				out.Gaps = append(out.Gaps, p.Gap)
			}
		}
		return nil
	})
	return out, err
}

// LogSpan is a stretch of a stack's log read across its gaps.
type LogSpan struct {
	// Parts are the stretch's data and gaps in offset order.
	Parts []LogPart
	// NextOffset is where the stretch ends.
	NextOffset int64
}

// LogPart is consecutive bytes of a log, or (Data nil) a gap record met on the way.
type LogPart struct {
	// Data are the bytes from where the previous part ended (or the read started).
	Data []byte
	// Gap is the gap record as stored; Lost is how many of its bytes the stretch had not
	// already passed (those before where the read started, or covered by what came before, are
	// not counted).
	Gap  api.LogGap
	Lost int64
}

// ReadLogSpan reads a stack's log from offset up to until, stepping over the gaps on the way (a
// page shows where bytes were lost and goes on): at most limit bytes of data, maxGaps gap
// records (so at most maxGaps+1 data parts) and MaxLogReadRows chunks. Bytes not received yet
// end it.
func (s *Service) ReadLogSpan(ctx context.Context, caller Caller, id, stack string, generation, offset, until int64, limit, maxGaps int) (*LogSpan, error) {
	if offset < 0 {
		return nil, invalid("offset %d is negative", offset)
	}
	out := &LogSpan{NextOffset: offset}
	if limit <= 0 || maxGaps <= 0 || until <= offset {
		return out, nil
	}
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		if err := s.checkReader(tx, caller, id); err != nil {
			return err
		}
		k := &logWalk{stack: stack, generation: generation, pos: offset, until: until, limit: limit, maxGaps: maxGaps, span: true}
		if err := k.read(tx, id); err != nil {
			return err
		}
		out.Parts, out.NextOffset = k.parts, k.pos
		return nil
	})
	return out, err
}

// firstLogPage is how many chunks a read asks the store for first; each later page is four times
// the one before, up to MaxLogReadRows in all: a read that stops early (at the first gap after
// data) fetches little, a long one takes a few queries.
const firstLogPage = 64

// logWalk is a read of a log: where it got to (pos) and what it met (parts), under its bounds:
// it ends at until, after limit bytes of data or maxGaps gap records, and (unless span) at a gap
// record after data, which it lists without stepping over.
type logWalk struct {
	stack          string
	generation     int64
	pos, until     int64
	limit, maxGaps int
	span           bool

	parts      []LogPart
	data, gaps int
	done       bool
}

// read walks the log from k.pos, a page of chunks at a time, until the walk ends or runs out of
// chunks: the pages together are what one LogChunks from k.pos of k.limit bytes and
// MaxLogReadRows chunks returns, fetched only as far as the walk goes.
func (k *logWalk) read(tx store.Tx, execID string) error {
	page, bytes, rows := firstLogPage, k.limit, 0
	chunks, err := tx.LogChunks(execID, k.stack, k.generation, k.pos, bytes, page)
	for {
		if err != nil {
			return err
		}
		rows += len(chunks)
		k.walk(chunks)
		for _, c := range chunks {
			bytes -= len(c.Data)
		}
		// A page short of its rows is the end of the log or of the bytes.
		if k.done || len(chunks) < page || bytes <= 0 || rows >= MaxLogReadRows {
			return nil
		}
		page = min(4*page, MaxLogReadRows-rows)
		chunks, err = tx.LogChunksAfter(execID, k.stack, k.generation, chunks[len(chunks)-1].Offset, bytes, page)
	}
}

// walk lays out the next chunks (in offset order, the first reaching past k.pos) as a reader
// meets them; a chunk starting past k.pos (bytes not received) ends the walk. Consecutive bytes
// make one part; with span, a gap record adding no byte (within until) is counted, not listed.
func (k *logWalk) walk(chunks []store.LogChunk) {
	for _, c := range chunks {
		if c.Offset > k.pos || k.data >= k.limit || k.gaps >= k.maxGaps || k.pos >= k.until {
			k.done = true
			return
		}
		end := c.End()
		if c.GapLength > 0 {
			k.gaps++
			lost := max(0, min(end, k.until)-k.pos)
			if !k.span || lost > 0 {
				k.parts = append(k.parts, LogPart{Gap: api.LogGap{Generation: k.generation, From: c.Offset, To: end}, Lost: lost})
			}
			if k.data > 0 && !k.span {
				k.done = true
				return
			}
			k.pos = max(k.pos, min(end, k.until))
			continue
		}
		if end <= k.pos {
			continue
		}
		part := c.Data[k.pos-c.Offset : end-c.Offset]
		if room := min(int64(k.limit-k.data), k.until-k.pos); int64(len(part)) > room {
			part = part[:room]
		}
		if n := len(k.parts); n > 0 && k.parts[n-1].Data != nil {
			k.parts[n-1].Data = append(k.parts[n-1].Data, part...)
		} else {
			k.parts = append(k.parts, LogPart{Data: append([]byte{}, part...)})
		}
		k.data += len(part)
		k.pos += int64(len(part))
	}
	k.done = k.data >= k.limit || k.gaps >= k.maxGaps || k.pos >= k.until
}
