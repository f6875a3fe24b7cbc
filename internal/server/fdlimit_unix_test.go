//go:build unix

package server

import (
	"syscall"
	"testing"
)

// TestOpenFileLimitRaised: the process may open as many files as its hard limit allows (the Go
// runtime raises the soft limit at start; Listener sizes the cap from it).
func TestOpenFileLimitRaised(t *testing.T) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Skip(err)
	}
	if l.Cur < l.Max-1 {
		t.Fatalf("soft RLIMIT_NOFILE %d, hard %d", l.Cur, l.Max)
	}
	if got := openFileLimit(); got != 0 && uint64(got) != l.Cur {
		t.Fatalf("openFileLimit %d, soft limit %d", got, l.Cur)
	}
}
