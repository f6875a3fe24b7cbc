//go:build !(linux && (amd64 || arm64))

package tickfile

import (
	"os"
	"syscall"
)

// Path returns the tick file's path in dir.
func Path(dir string) string { return dir + string(os.PathSeparator) + Name }

// Append appends r (fields clipped to MaxField) as one line to the tick file in dir. O_APPEND
// and a single write keep the lines of concurrent ticks (parallel stacks) from interleaving.
// Plain system calls, not os.OpenFile: an *os.File sets up the runtime's poller (an epoll
// instance or kqueue, and more) for a file it cannot poll, in a process that writes one line
// and exits.
func Append(dir string, r Record) error {
	l, path := line(r), Path(dir)
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return &AppendError{Op: "open", Path: path, Errno: errno(err)}
	}
	n, err := syscall.Write(fd, l)
	cerr := syscall.Close(fd)
	switch {
	case err != nil:
		return &AppendError{Op: "write", Path: path, Errno: errno(err)}
	case n < len(l):
		return &AppendError{Op: "write", Path: path}
	case cerr != nil:
		return &AppendError{Op: "close", Path: path, Errno: errno(cerr)}
	}
	return nil
}

// errno is err's system error number (1, EPERM, should it be something else).
func errno(err error) uintptr {
	if e, ok := err.(syscall.Errno); ok && e != 0 {
		return uintptr(e)
	}
	return 1
}
