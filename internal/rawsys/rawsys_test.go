//go:build linux && (amd64 || arm64)

package rawsys

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	if _, e := ReadFile(filepath.Join(dir, "missing")); syscall.Errno(e) != syscall.ENOENT {
		t.Fatalf("a missing file: errno %d (%v), want ENOENT", e, syscall.Errno(e))
	}
	if _, e := Open(filepath.Join(dir, "missing", "f"), O_WRONLY|O_CREAT|O_CLOEXEC, 0o600); syscall.Errno(e) != syscall.ENOENT {
		t.Fatalf("a file in a missing directory: errno %d, want ENOENT", e)
	}
	// The kernel would open "victim"; syscall.Open says EINVAL, and so does Open.
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if fd, e := Open(victim+"\x00/x", O_WRONLY|O_APPEND|O_CLOEXEC, 0); e != EINVAL || fd != -1 {
		t.Fatalf("a path with a NUL: fd %d errno %d, want EINVAL", fd, e)
	}
	if _, e := Write(-1, []byte("x")); syscall.Errno(e) != syscall.EBADF {
		t.Fatalf("a write to fd -1: errno %d, want EBADF", e)
	}
	if e := Close(-1); syscall.Errno(e) != syscall.EBADF {
		t.Fatalf("close(-1): errno %d, want EBADF", e)
	}
}

// Each argument reaches the kernel: a mode (the fourth) shows in the file created, under a
// zero umask, for several modes in turn.
func TestOpenPassesTheMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	for i, mode := range []uint32{0o600, 0o604, 0o640, 0o444} {
		p := filepath.Join(dir, strconv.Itoa(i))
		fd, e := Open(p, O_WRONLY|O_CREAT|O_CLOEXEC, mode)
		if e != 0 {
			t.Fatalf("open %o: errno %d", mode, e)
		}
		Close(fd)
		if fi, err := os.Stat(p); err != nil || uint32(fi.Mode().Perm()) != mode {
			t.Fatalf("created with mode %o: %v, %v", mode, fi.Mode(), err)
		}
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
	got, ok := NowUnixNano()
	after := time.Now().UnixNano()
	if !ok || got < before || got > after {
		t.Fatalf("NowUnixNano() = %d, not within [%d, %d]", got, before, after)
	}
}

// Exit ends the process with its code (checked in a child: the test binary itself).
func TestExit(t *testing.T) {
	if code := os.Getenv("RAWSYS_EXIT"); code != "" {
		n, _ := strconv.Atoi(code)
		Exit(n)
		t.Fatal("Exit returned")
	}
	for _, code := range []int{0, 7} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestExit$")
		cmd.Env = append(os.Environ(), "RAWSYS_EXIT="+strconv.Itoa(code))
		out, err := cmd.CombinedOutput()
		got := 0
		if ee, ok := err.(*exec.ExitError); ok {
			got = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if got != code || len(out) != 0 {
			t.Fatalf("Exit(%d): the child exited %d with %q", code, got, out)
		}
	}
}
