package runner

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

func TestPumpDeadServerBoundsMemoryAndReportsGaps(t *testing.T) {
	root := t.TempDir()
	coll := newPumpCollector(2)
	coll.setFailure(0, 0, 0, true)
	var stacks []string
	for i := range 20 {
		stacks = append(stacks, fmt.Sprintf("s%d", i))
		pumpStackDir(t, root, stacks[i])
	}
	opts := PumpOptions{MaxChunk: 4096, MaxBuffered: 8 * 4096, Coalesce: time.Millisecond, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond}
	pump := pumpSimple(t, root, coll, opts, stacks...)
	block := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	for _, s := range stacks {
		pumpWriteLog(t, filepath.Join(root, s, "tfstackplan.log"), block)
	}
	// Let the pump fill its budget and retry against the dead server for a while.
	deadline := time.Now().Add(5 * time.Second)
	for pump.budgetUsed() < opts.MaxBuffered-int64(opts.MaxChunk) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if used := pump.budgetUsed(); used > opts.MaxBuffered {
		t.Fatalf("pump holds %d bytes with a budget of %d", used, opts.MaxBuffered)
	}
	// Every log is rewritten while the server is down: what was not read is lost, and said so.
	for _, s := range stacks {
		pumpWaitObserved(t, pump, s, 0, int64(len(block)))
		pumpWriteLog(t, filepath.Join(root, s, "tfstackplan.log"), []byte("second generation\n"))
	}
	for _, s := range stacks {
		pumpWaitObserved(t, pump, s, 1, -1)
	}
	coll.setFailure(0, 0, 0, false) // the server comes back
	rep := pump.Drain(context.Background())
	if !rep.Complete {
		t.Fatalf("drain after recovery incomplete: %+v", rep)
	}
	var lost int64
	for _, g := range rep.Gaps {
		if g.Generation != 0 || g.Unsent || !g.Reported {
			t.Fatalf("unexpected gap %+v", g)
		}
		lost += g.To - g.From
	}
	if lost == 0 || lost+rep.Bytes != int64(len(stacks)*(len(block)+len("second generation\n"))) {
		t.Fatalf("lost %d + sent %d bytes != written", lost, rep.Bytes)
	}
	for _, s := range stacks {
		if got := pumpCollected(t, coll, s, 1); string(got) != "second generation\n" {
			t.Fatalf("stack %s generation 1 = %q", s, got)
		}
	}
}
