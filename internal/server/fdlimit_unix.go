//go:build unix

package server

import (
	"math"
	"syscall"
)

// openFileLimit is the process's soft RLIMIT_NOFILE (0: unknown or unlimited). The Go runtime
// has already raised it to the hard limit when the process started.
func openFileLimit() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur >= math.MaxInt32 {
		return 0
	}
	return int(l.Cur)
}
