package runner

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPumpMasksSecretsAcrossChunks(t *testing.T) {
	for _, poll := range []bool{false, true} {
		root := t.TempDir()
		pumpStackDir(t, root, "a")
		coll := newPumpCollector(1)
		pump := pumpSimple(t, root, coll, PumpOptions{MaxChunk: 512, Coalesce: time.Millisecond, Poll: poll, PollInterval: time.Millisecond}, "a")
		if err := pump.Masker().Add("hunter2-v1"); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(root, "a", "tfstackplan.log"))
		if err != nil {
			t.Fatal(err)
		}
		var written []byte
		write := func(s string) {
			written = append(written, s...)
			if _, err := f.WriteString(s); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Millisecond)
		}
		// The secret is split across writes (and, at 512-byte chunks, across chunk limits).
		write(strings.Repeat("x", 508) + "hunt")
		write("er2-v1 and\n::add-")
		write("mask::tok")
		write("en-42\nnow token-42 and hunter2")
		write("-v1 again; tail ends with hunter2-v")
		f.Close()
		rep := pump.Drain(context.Background())
		got := pumpCollected(t, coll, "a", 0)
		want := strings.Repeat("x", 508) + "*** and\n::add-mask::***\nnow *** and *** again; tail ends with hunter2-v"
		if string(got) != want {
			t.Fatalf("poll=%v masked stream:\n got %q\nwant %q", poll, got, want)
		}
		if !rep.Complete || rep.Bytes != int64(len(written)) {
			t.Fatalf("report %+v, wrote %d bytes", rep, len(written))
		}
	}
}

func TestPumpRefusesEscapingStacks(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "ok"), filepath.Join(root, "linkfile"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pumpWriteLog(t, filepath.Join(outside, "tfstackplan.log"), []byte("TOP SECRET\n"))
	if err := os.Symlink(outside, filepath.Join(root, "linkdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "tfstackplan.log"), filepath.Join(root, "linkfile", "tfstackplan.log")); err != nil {
		t.Fatal(err)
	}
	coll := newPumpCollector(4)
	pump := NewLogPump(coll, root, "tfstackplan.log", "exec-1")
	for _, bad := range []string{"../outside", "/etc", "linkdir", "linkfile", "ok/../../outside", ""} {
		if err := pump.AddStack(bad); err == nil {
			t.Errorf("AddStack(%q) accepted a path escaping the root", bad)
		}
	}
	if err := pump.AddStack("ok"); err != nil {
		t.Fatal(err)
	}
	if err := pump.AddStack("ok"); err == nil {
		t.Error("a stack added twice was accepted")
	}
	if err := pump.SetOptions(PumpOptions{Poll: true, PollInterval: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := pump.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The log file turns into a link pointing outside after the stack was accepted.
	if err := os.Symlink(filepath.Join(outside, "tfstackplan.log"), filepath.Join(root, "ok", "tfstackplan.log")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	rep := pump.Drain(context.Background())
	coll.mu.Lock()
	defer coll.mu.Unlock()
	if len(coll.data) != 0 || rep.Bytes != 0 {
		t.Fatalf("bytes from outside the root were posted: %v", coll.data)
	}
	if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], `"ok"`) {
		t.Fatalf("refusal not reported: %v", rep.Errors)
	}
}

// A stack directory that does not exist yet is looked at cheaply while it is absent; when it
// appears as a link pointing outside the root, the log inside is refused, and a log appearing
// in a real directory is read.
func TestPumpRefusesADirectoryThatAppearsAsALink(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pumpWriteLog(t, filepath.Join(outside, "tfstackplan.log"), []byte("TOP SECRET\n"))
	coll := newPumpCollector(5)
	pump := NewLogPump(coll, root, "tfstackplan.log", "exec-1")
	for _, st := range []string{"later/link", "later/real"} {
		if err := pump.AddStack(st); err != nil {
			t.Fatal(err)
		}
	}
	if err := pump.SetOptions(PumpOptions{Poll: true, PollInterval: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := pump.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // both looked at while absent
	if err := os.MkdirAll(filepath.Join(root, "later", "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "later", "link")); err != nil {
		t.Fatal(err)
	}
	pumpWriteLog(t, filepath.Join(root, "later", "real", "tfstackplan.log"), []byte("fine\n"))
	time.Sleep(20 * time.Millisecond)
	rep := pump.Drain(context.Background())
	coll.mu.Lock()
	defer coll.mu.Unlock()
	for st, chunks := range coll.data {
		for _, data := range chunks {
			if strings.Contains(string(data), "SECRET") {
				t.Fatalf("stack %v posted bytes from outside the root: %q", st, data)
			}
		}
	}
	if rep.Bytes != int64(len("fine\n")) {
		t.Fatalf("%d bytes posted, want the real stack's 5: %+v", rep.Bytes, rep)
	}
	if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], `"later/link"`) {
		t.Fatalf("refusal not reported: %v", rep.Errors)
	}
}

// A stack reached through a link inside the root: the link is repointed before the log is
// written, and the log is read where the link points now (the cheap look at a missing log
// follows the link as it is, not as it was first resolved).
func TestPumpFollowsARepointedLinkToAMissingLog(t *testing.T) {
	for _, poll := range []bool{true, false} {
		root := t.TempDir()
		for _, d := range []string{"gen1/a", "gen2/a"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink("gen1", filepath.Join(root, "cur")); err != nil {
			t.Fatal(err)
		}
		coll := newPumpCollector(6)
		pump := NewLogPump(coll, root, "tfstackplan.log", "exec-1")
		if err := pump.AddStack("cur/a"); err != nil {
			t.Fatal(err)
		}
		if err := pump.SetOptions(PumpOptions{Poll: poll, PollInterval: time.Millisecond, SafetyPoll: 5 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if err := pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // looked at while missing
		if err := os.Symlink("gen2", filepath.Join(root, "cur.new")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(root, "cur.new"), filepath.Join(root, "cur")); err != nil {
			t.Fatal(err)
		}
		pumpWriteLog(t, filepath.Join(root, "cur", "a", "tfstackplan.log"), []byte("hello\n"))
		time.Sleep(20 * time.Millisecond)
		if rep := pump.Drain(context.Background()); rep.Bytes != 6 || len(rep.Errors) != 0 {
			t.Fatalf("poll %v: %+v, want the 6 bytes of the log behind the repointed link", poll, rep)
		}
	}
}

func TestPumpRandomizedMasking(t *testing.T) {
	secrets := []string{"hunter2-v1", "hunter2", "s3cr3t-token", "ab"}
	for run := range 200 {
		rng := rand.New(rand.NewPCG(uint64(run), 9))
		root := t.TempDir()
		pumpStackDir(t, root, "a")
		coll := newPumpCollector(uint64(run))
		coll.setFailure(0.1, 0.1, 0, false)
		pump := pumpSimple(t, root, coll, PumpOptions{
			MaxChunk: 64 + rng.IntN(200), Coalesce: time.Duration(rng.IntN(2)) * time.Millisecond,
			Poll: run%2 == 0, PollInterval: time.Millisecond, RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond,
		}, "a")
		for _, v := range secrets {
			if err := pump.Masker().Add(v); err != nil {
				t.Fatal(err)
			}
		}
		f, err := os.Create(filepath.Join(root, "a", "tfstackplan.log"))
		if err != nil {
			t.Fatal(err)
		}
		var written []byte
		for range 5 + rng.IntN(30) {
			var piece []byte
			for range rng.IntN(6) {
				piece = append(piece, "plain text a b\n"[:1+rng.IntN(15)]...)
				piece = append(piece, secrets[rng.IntN(len(secrets))]...)
			}
			// Writes split anywhere, secrets included.
			for len(piece) > 0 {
				n := 1 + rng.IntN(len(piece))
				if _, err := f.Write(piece[:n]); err != nil {
					t.Fatal(err)
				}
				written = append(written, piece[:n]...)
				piece = piece[n:]
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
				}
			}
		}
		f.Close()
		coll.setFailure(0.1, 0.1, 0, false)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		rep := pump.Drain(ctx)
		cancel()
		if !rep.Complete || rep.Bytes != int64(len(written)) {
			t.Fatalf("run %d: report %+v, wrote %d", run, rep, len(written))
		}
		got := pumpCollected(t, coll, "a", 0)
		if want := NewMasker(secrets...).Mask(written); !bytes.Equal(got, want) {
			t.Fatalf("run %d: streamed masking differs from masking the whole log:\n got %q\nwant %q", run, got, want)
		}
		for _, v := range secrets[:3] {
			if bytes.Contains(got, []byte(v)) {
				t.Fatalf("run %d: %q leaked", run, v)
			}
		}
	}
}

func TestPumpReadsBeforeCoalescingSoTruncationLosesNothing(t *testing.T) {
	root := t.TempDir()
	path := pumpStackDir(t, root, "a")
	coll := newPumpCollector(8)
	// A long coalescing delay: the next command truncates the log before the pump posts.
	pump := pumpSimple(t, root, coll, PumpOptions{Coalesce: 300 * time.Millisecond}, "a")
	last := []byte("Plan: 1 to add, 0 to change, 0 to destroy.\n")
	pumpWriteLog(t, path, last)
	pump.mu.Lock()
	st := pump.byName["a"]
	pump.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for st.obsRead.Load() < int64(len(last)) || st.obsGen.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pump did not read the appended bytes")
		}
		time.Sleep(100 * time.Microsecond)
	}
	pumpWriteLog(t, path, []byte("next command\n")) // tee without -a
	pumpWaitObserved(t, pump, "a", 1, -1)
	rep := pump.Drain(context.Background())
	if len(rep.Gaps) != 0 || !rep.Complete {
		t.Fatalf("bytes read before the truncation were lost: %+v", rep)
	}
	if got := pumpCollected(t, coll, "a", 0); !bytes.Equal(got, last) {
		t.Fatalf("generation 0 = %q", got)
	}
	if got := pumpCollected(t, coll, "a", 1); string(got) != "next command\n" {
		t.Fatalf("generation 1 = %q", got)
	}
}
