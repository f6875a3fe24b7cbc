package runner

import (
	"context"
	"testing"
	"time"
)

// A drain does not wait for the inotify instance to close: closing one that watches
// directories waits for the kernel to free its watches (an RCU grace period, 10-20 ms), at the
// very end of a run. Here the close is held until the drain has returned; a drain that waited
// for it would never return.
func TestPumpDrainDoesNotWaitForTheInotifyClose(t *testing.T) {
	root := t.TempDir()
	a := openPumpLog(t, root, "a")
	coll := newPumpCollector(31)
	pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{Coalesce: time.Millisecond}, "a"), false)
	w, ok := pump.watcher.(*inotifyWatcher)
	if !ok {
		t.Fatalf("the pump watches with %T, want the inotify watcher", pump.watcher)
	}
	release := make(chan struct{})
	closed := make(chan error, 1)
	w.mu.Lock()
	closeFD := w.closeFD
	w.closeFD = func(fd int) error {
		<-release
		err := closeFD(fd)
		closed <- err
		return err
	}
	w.mu.Unlock()
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	a.write("one line\n")
	drained := make(chan DrainReport, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		drained <- pump.Drain(ctx)
	}()
	select {
	case rep := <-drained:
		if !rep.Complete || len(rep.Gaps) != 0 {
			t.Errorf("report %+v", rep)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Drain waited for the inotify instance to close")
	}
	if got := pumpCollected(t, coll, "a", 0); string(got) != "one line\n" {
		t.Errorf("posted %q", got)
	}
	select {
	case err := <-closed:
		t.Fatalf("the inotify instance was closed while the close was held (%v)", err)
	default:
	}
	close(release)
	if err := <-closed; err != nil {
		t.Errorf("closing the inotify instance: %v", err)
	}
}
