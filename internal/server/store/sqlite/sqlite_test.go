package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// TestWALPacer walks the checkpointer's decisions through a run: no checkpoint while commits
// keep coming (until CheckpointMaxDelay), one at the first look after they pause, none while
// nothing new was committed, and a retry when a checkpoint could not copy the whole WAL.
func TestWALPacer(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p := walPacer{last: t0}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	look := func(commits uint64, now time.Time, want bool) {
		t.Helper()
		if got := p.due(commits, now); got != want {
			t.Fatalf("due(%d, +%v) = %v, want %v (pacer %+v)", commits, now.Sub(t0), got, want, p)
		}
	}
	look(0, at(CheckpointEvery), false) // nothing written yet
	// A run: commits between every two looks.
	var n uint64
	var now time.Duration
	for now = CheckpointEvery * 2; now < CheckpointMaxDelay; now += CheckpointEvery {
		n += 3
		look(n, at(now), false)
	}
	n += 3
	look(n, at(now), true) // writes still going on, but the last checkpoint is too old
	p.checkpointed(n, at(now), true)
	n += 3
	now += CheckpointEvery
	look(n, at(now), false)
	// The run ends: the first look that sees no new commit checkpoints, the next ones do not.
	now += CheckpointEvery
	look(n, at(now), true)
	p.checkpointed(n, at(now), true)
	for i := 0; i < 3; i++ {
		now += CheckpointEvery
		look(n, at(now), false)
	}
	// One more commit, then quiet; the checkpoint finds a reader holding frames back: it is
	// tried again at the next look, and not after it completed.
	n++
	now += CheckpointEvery
	look(n, at(now), false)
	now += CheckpointEvery
	look(n, at(now), true)
	p.checkpointed(n, at(now), false)
	now += CheckpointEvery
	look(n, at(now), true)
	p.checkpointed(n, at(now), true)
	now += CheckpointEvery
	look(n, at(now), false)
}

// TestCheckpointAfterWritesPause checks the checkpointer on a real database: once writes
// pause, what they committed reaches the database file itself (in WAL mode nothing else
// writes pages there).
func TestCheckpointAfterWritesPause(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	// Let a checkpoint of the migrations happen first, so that the size below is settled.
	time.Sleep(3 * CheckpointEvery)
	before := size()
	before0 := s.Commits()
	err = s.Write(context.Background(), func(tx store.Tx) error {
		for i := range 300 {
			e := &store.Execution{}
			e.ExecutionID = fmt.Sprintf("exec-%04d", i)
			e.Op, e.Environment, e.Status = "plan", "prod", "running"
			e.StartedAt = time.Unix(int64(i), 0)
			if _, err := tx.CreateExecution(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Commits(); got != before0+1 {
		t.Errorf("Commits() = %d after one write, want %d", got, before0+1)
	}
	// Bounded: two looks after the write are enough; allow many more on a slow machine.
	deadline := time.Now().Add(20 * CheckpointEvery)
	for size() == before {
		if time.Now().After(deadline) {
			t.Fatalf("the database file is still %d bytes %v after the write: no checkpoint", before, 20*CheckpointEvery)
		}
		time.Sleep(CheckpointEvery / 5)
	}
}
