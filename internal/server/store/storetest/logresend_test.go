package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
)

// readLog reads a stack's log from offset 0 as far as its bytes are contiguous, as a reader
// walks it (by offset, the bytes of the chunk starting first winning where chunks overlap).
func readLog(t *testing.T, s store.Store, execID, stack string, generation int64) string {
	t.Helper()
	var out []byte
	var pos int64
	err := s.Read(ctx, func(tx store.Tx) error {
		chunks, err := tx.LogChunks(execID, stack, generation, 0, 1<<30, 100000)
		for _, c := range chunks {
			if c.Offset > pos || c.GapLength > 0 {
				break
			}
			if end := c.End(); end > pos {
				out = append(out, c.Data[pos-c.Offset:]...)
				pos = end
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// logBatch sends chunks of stack "a", generation 1, of execution e1 as AddLogBatch.
func logBatch(s store.Store, one bool, chunks ...store.LogChunk) (int64, error) {
	for i := range chunks {
		chunks[i].ExecutionID, chunks[i].Stack, chunks[i].Generation = "e1", "a", 1
	}
	var added int64
	err := writeEvent(s, one, func(tx store.Tx) (err error) { _, _, added, err = tx.AddLogBatch("e1", chunks); return })
	return added, err
}

func data(off int64, s string) store.LogChunk { return store.LogChunk{Offset: off, Data: []byte(s)} }

// newLogExecution stores execution e1 with stack "a".
func newLogExecution(t *testing.T, s store.Store) {
	write(t, s, func(tx store.Tx) error {
		if _, err := tx.CreateExecution(exec1("e1", t0)); err != nil {
			return err
		}
		st := &store.Stack{}
		st.StackState.Stack, st.Status = "a", "running"
		return tx.SaveStack("e1", st)
	})
}

// A chunk whose bytes differ from the stored log where it overlaps is refused with
// ErrMismatch naming the offset, stores nothing of its batch and leaves the stored log as it
// was; a resend of the same bytes is a no-op, and one that repeats the stored bytes and goes
// on extends the log; through Write and WriteOne (one statement on PostgreSQL) alike.
func TestLogResendDiffering(t *testing.T) { forEachWrite(t, testLogResendDiffering) }

func testLogResendDiffering(t *testing.T, s store.Store, one bool) {
	newLogExecution(t, s)
	mustAdd := func(want int64, chunks ...store.LogChunk) {
		t.Helper()
		if added, err := logBatch(s, one, chunks...); err != nil || added != want {
			t.Fatalf("batch %+v: added %d, %v; want %d", chunks, added, err, want)
		}
	}
	refused := func(offset string, chunks ...store.LogChunk) {
		t.Helper()
		_, err := logBatch(s, one, chunks...)
		if !errors.Is(err, store.ErrMismatch) || !(strings.Contains(err.Error(), "stored at offset "+offset+";") || strings.Contains(err.Error(), "differs at offset "+offset+" from")) {
			t.Fatalf("batch %+v: %v, want a mismatch at offset %s", chunks, err, offset)
		}
	}
	mustAdd(2, data(0, "hello "), data(6, "wor"))
	// The runner, killed and started again, read further before it posted: the same bytes and
	// more at offset 0, then the rest.
	mustAdd(2, data(0, "hello world\n"), data(12, "more"))
	mustAdd(0, data(0, "hello"), data(6, "wor"), data(12, "more"))
	const want = "hello world\nmore"
	if got := readLog(t, s, "e1", "a", 1); got != want {
		t.Fatalf("log %q, want %q", got, want)
	}
	refused("0", data(0, "HELLO"))
	refused("10", data(16, "!"), data(8, "rlD\nmore"))            // the good chunk at 16 is not stored either
	refused("13", data(12, "mXre and more"))                      // extends, but not the stored bytes
	refused("7", data(3, "lo wXrld"))                             // at an offset no chunk has
	refused("15", data(16, "abc"), data(14, "rE"))                // differs from the stored log only
	refused("20", data(16, "abcd"), data(20, "x"), data(20, "y")) // within the batch
	if got := readLog(t, s, "e1", "a", 1); got != want {
		t.Fatalf("after the refusals the log is %q, want %q", got, want)
	}
	// Gap records: the same again is a resend; another length, or bytes for it, contradict it.
	mustAdd(2, data(16, "tail"), store.LogChunk{Offset: 20, GapLength: 5})
	mustAdd(0, store.LogChunk{Offset: 20, GapLength: 5})
	refused("20", store.LogChunk{Offset: 20, GapLength: 6})
	refused("22", data(22, "x"))
	refused("18", store.LogChunk{Offset: 18, GapLength: 4})
	// Within one batch, the longest of copies that agree is kept.
	mustAdd(1, data(25, "ab"), data(25, "abc"), data(25, "a"))
	var got []store.LogChunk
	_ = s.Read(ctx, func(tx store.Tx) (err error) { got, err = tx.LogChunks("e1", "a", 1, 25, 100, 10); return })
	if len(got) != 1 || string(got[0].Data) != "abc" {
		t.Fatalf("chunks at 25: %+v", got)
	}
	// Chunks on both sides of a stored one, overlapping none of it, are stored.
	mustAdd(1, data(40, "hole!"))
	mustAdd(2, data(30, "ab"), data(50, "xy"))
	refused("44", data(35, "xxxxx"), data(44, "?"))
}

// The scenario of issue 31: a runner killed with -9 mid-run is started again and sends its
// log afresh in chunks of other sizes. Bytes as stored are accepted however they are cut (and
// extend the log); a client that resends other bytes gets a mismatch for every chunk that
// differs, and every chunk acknowledged before stays readable.
func TestLogResendAfterKill(t *testing.T) { forEachWrite(t, testLogResendAfterKill) }

func testLogResendAfterKill(t *testing.T, s store.Store, one bool) {
	newLogExecution(t, s)
	r := rand.New(rand.NewPCG(31, 9))
	text := make([]byte, 60_000)
	for i := range text {
		text[i] = 'a' + byte(r.IntN(26))
	}
	// cut splits text[from:to] into chunks of 1 to max bytes.
	cut := func(src []byte, from, to, maxLen int) []store.LogChunk {
		var out []store.LogChunk
		for from < to {
			n := min(to-from, 1+r.IntN(maxLen))
			out = append(out, store.LogChunk{Offset: int64(from), Data: bytes.Clone(src[from : from+n])})
			from += n
		}
		return out
	}
	send := func(chunks []store.LogChunk, batch int) (acked, refused int) {
		for i := 0; i < len(chunks); i += batch {
			part := chunks[i:min(i+batch, len(chunks))]
			_, err := logBatch(s, one, part...)
			switch {
			case err == nil:
				acked += len(part)
			case errors.Is(err, store.ErrMismatch):
				refused += len(part)
			default:
				t.Fatal(err)
			}
		}
		return acked, refused
	}
	// Before the kill: the first 40,000 bytes, acknowledged.
	if _, refused := send(cut(text, 0, 40_000, 700), 16); refused != 0 {
		t.Fatalf("first run refused %d chunks", refused)
	}
	// The restarted runner resends from 0 in other chunk sizes, and reads on to the end.
	if _, refused := send(cut(text, 0, len(text), 1500), 8); refused != 0 {
		t.Fatalf("a resend of the same bytes: %d chunks refused", refused)
	}
	if got := readLog(t, s, "e1", "a", 1); got != string(text) {
		t.Fatalf("after the resend the log has %d bytes (want %d) or other bytes", len(got), len(text))
	}
	// Another client resends other bytes, one chunk at a time.
	other := bytes.Clone(text)
	for i := range other {
		if r.IntN(500) == 0 {
			other[i] = 'A'
		}
	}
	chunks := cut(other, 0, len(other), 400)
	acked, refused := send(chunks, 1)
	differing := 0
	for _, c := range chunks {
		if !bytes.Equal(c.Data, text[c.Offset:c.End()]) {
			differing++
		}
	}
	if refused != differing || acked != len(chunks)-differing || refused == 0 {
		t.Fatalf("%d chunks, %d differ: %d refused, %d acknowledged", len(chunks), differing, refused, acked)
	}
	if got := readLog(t, s, "e1", "a", 1); got != string(text) {
		t.Fatalf("after the differing resend the log is no longer as acknowledged")
	}
}

// A batch's consecutive chunks of one stack are stored together, as one row up to
// sqlstore.MaxRunBytes (what a reader reads is the same bytes): a resend of any of them, alone
// or cut otherwise, is a no-op, a differing byte inside the joined row is refused naming its
// offset, gap records and holes are never joined over, and every chunk counts as stored.
func TestLogBatchRunsStoredTogether(t *testing.T) { forEachWrite(t, testLogBatchRuns) }

func testLogBatchRuns(t *testing.T, s store.Store, one bool) {
	newLogExecution(t, s)
	r := rand.New(rand.NewPCG(31, 64))
	text := make([]byte, sqlstore.MaxRunBytes+3000)
	for i := range text {
		text[i] = 'a' + byte(r.IntN(26))
	}
	var batch []store.LogChunk
	for off := 0; off < len(text); off += 1000 {
		batch = append(batch, data(int64(off), string(text[off:min(off+1000, len(text))])))
	}
	if added, err := logBatch(s, one, batch...); err != nil || added != int64(len(batch)) {
		t.Fatalf("batch of %d chunks: added %d, %v", len(batch), added, err)
	}
	var rows []store.LogChunk
	_ = s.Read(ctx, func(tx store.Tx) (err error) { rows, err = tx.LogChunks("e1", "a", 1, 0, 1<<30, 1000); return })
	if len(rows) != 2 || len(rows[0].Data) > sqlstore.MaxRunBytes || rows[1].Offset != rows[0].End() {
		t.Fatalf("%d chunks of 1000 bytes stored as %d rows, want 2 of at most %d bytes", len(batch), len(rows), sqlstore.MaxRunBytes)
	}
	if got := readLog(t, s, "e1", "a", 1); got != string(text) {
		t.Fatalf("the log reads %d bytes (want %d) or other bytes", len(got), len(text))
	}
	for _, c := range []store.LogChunk{batch[3], data(2500, string(text[2500:2600])), data(sqlstore.MaxRunBytes-10, string(text[sqlstore.MaxRunBytes-10:sqlstore.MaxRunBytes+10]))} {
		if added, err := logBatch(s, one, c); err != nil || added != 0 {
			t.Fatalf("resend of [%d, %d): added %d, %v", c.Offset, c.End(), added, err)
		}
	}
	bad := []byte(string(text[2000:3000]))
	bad[777] = 'A'
	if _, err := logBatch(s, one, data(2000, string(bad))); !errors.Is(err, store.ErrMismatch) || !strings.Contains(err.Error(), "stored at offset 2777;") {
		t.Fatalf("a differing byte at 2777 inside a joined row: %v", err)
	}
	// Past the end: a run, a hole, a chunk, a gap record, a chunk: only the first two join.
	end := int64(len(text))
	if added, err := logBatch(s, one, data(end, "ab"), data(end+2, "cd"), data(end+10, "ef"), store.LogChunk{Offset: end + 12, GapLength: 3}, data(end+15, "gh")); err != nil || added != 5 {
		t.Fatalf("tail batch: added %d, %v", added, err)
	}
	_ = s.Read(ctx, func(tx store.Tx) (err error) { rows, err = tx.LogChunks("e1", "a", 1, end, 1<<30, 1000); return })
	var got []string
	for _, c := range rows {
		got = append(got, fmt.Sprintf("%d+%d:%s", c.Offset-end, c.End()-c.Offset, c.Data))
	}
	if want := []string{"0+4:abcd", "10+2:ef", "12+3:", "15+2:gh"}; !slices.Equal(got, want) {
		t.Fatalf("tail rows %q, want %q", got, want)
	}
}
