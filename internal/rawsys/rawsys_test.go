//go:build linux && (amd64 || arm64)

package rawsys

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestReadFileReadsWhatOsReads(t *testing.T) {
	dir := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef\x00\xff"), 5000) // several reads, grown buffer
	for name, content := range map[string][]byte{"empty": nil, "small": []byte("a\x00b\n"), "big": big} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		got, e := ReadFile(p)
		if e != 0 || !bytes.Equal(got, content) {
			t.Fatalf("%s: ReadFile = %d bytes, errno %d; want the %d bytes written", name, len(got), e, len(content))
		}
	}
	// A file of /proc: its size is unknown to stat, it is read until the end.
	want, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	got, e := ReadFile("/proc/self/cmdline")
	if e != 0 || !bytes.Equal(got, want) {
		t.Fatalf("/proc/self/cmdline: %q errno %d, os reads %q", got, e, want)
	}
}

func TestErrorsAreTheKernels(t *testing.T) {
	dir := t.TempDir()
	if _, e := ReadFile(filepath.Join(dir, "missing")); e != ENOENT || syscall.Errno(e) != syscall.ENOENT {
		t.Fatalf("a missing file: errno %d (%v), want ENOENT", e, syscall.Errno(e))
	}
	if _, e := Open(filepath.Join(dir, "missing", "f"), O_WRONLY|O_CREAT|O_CLOEXEC, 0o600); e != ENOENT {
		t.Fatalf("a file in a missing directory: errno %d, want ENOENT", e)
	}
	if _, e := Write(-1, []byte("x")); syscall.Errno(e) != syscall.EBADF {
		t.Fatalf("a write to fd -1: errno %d, want EBADF", e)
	}
	if e := Close(-1); syscall.Errno(e) != syscall.EBADF {
		t.Fatalf("close(-1): errno %d, want EBADF", e)
	}
}

func TestOpenWriteAppends(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ticks")
	for _, line := range []string{"one\n", "two\n"} {
		fd, e := Open(p, O_WRONLY|O_APPEND|O_CREAT|O_CLOEXEC, 0o640)
		if e != 0 {
			t.Fatalf("open: errno %d", e)
		}
		if n, e := Write(fd, []byte(line)); n != len(line) || e != 0 {
			t.Fatalf("write: %d, errno %d", n, e)
		}
		if e := Close(fd); e != 0 {
			t.Fatalf("close: errno %d", e)
		}
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "one\ntwo\n" {
		t.Fatalf("file: %q, %v", b, err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm()&^0o640 != 0 {
		t.Fatalf("mode %v, %v: want at most 0640", fi.Mode(), err)
	}
}

func TestNowUnixNanoIsTheWallClock(t *testing.T) {
	before := time.Now().UnixNano()
	got := NowUnixNano()
	after := time.Now().UnixNano()
	if got < before || got > after {
		t.Fatalf("NowUnixNano() = %d, not within [%d, %d]", got, before, after)
	}
}
