package service

import (
	"context"

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
	if err := checkName("stack", in.Stack); err != nil {
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
	rows := make([]store.LogChunk, len(chunks))
	for i, in := range chunks {
		rows[i] = store.LogChunk{ExecutionID: in.ExecutionID, Stack: in.Stack,
			Generation: in.Generation, Offset: in.Offset, Data: in.Data, GapLength: in.GapLength}
	}
	var ack api.Ack
	err = s.writeOne(ctx, func(tx store.Tx) error {
		st, missing, added, err := tx.AddLogBatch(execID, rows)
		if err != nil {
			return err
		}
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
	return ack, err
}

// LogRead returns a stack's log bytes from offset as far as they are contiguous. A recorded gap
// at offset is stepped over (NextOffset moves past it, listed in Gaps); bytes not received yet end
// the slice. latest selects the newest generation.
func (s *Service) LogRead(ctx context.Context, id, stack string, generation int64, latest bool, offset int64, limit int) (*api.LogSlice, error) {
	if err := checkName("stack", stack); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, invalid("offset %d is negative", offset)
	}
	if limit <= 0 || limit > 4<<20 {
		limit = DefaultLogReadMax
	}
	var out *api.LogSlice
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		if _, err := tx.Execution(id); err != nil {
			return err
		}
		if latest {
			g, err := tx.LatestGeneration(id, stack)
			if err != nil {
				return err
			}
			generation = g
		}
		chunks, err := tx.LogChunks(id, stack, generation, offset, limit)
		if err != nil {
			return err
		}
		out = assemble(stack, generation, offset, limit, chunks)
		return nil
	})
	return out, err
}

func assemble(stack string, generation, offset int64, limit int, chunks []store.LogChunk) *api.LogSlice {
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
