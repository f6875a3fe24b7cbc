//go:build linux && (amd64 || arm64)

package tickfile

import "github.com/tfstackplan/tfstackplan/internal/rawsys"

// Path returns the tick file's path in dir.
func Path(dir string) string { return dir + "/" + Name }

// Append appends r (fields clipped to MaxField) as one line to the tick file in dir. O_APPEND
// and a single write keep the lines of concurrent ticks (parallel stacks) from interleaving.
// Raw system calls (internal/rawsys): no *os.File, whose first use sets up the runtime's
// poller (an epoll instance, an eventfd, two epoll_ctl) in a process that writes one line and
// exits, and no os to wait for (see the package comment).
func Append(dir string, r Record) error {
	l, path := line(r), Path(dir)
	fd, e := rawsys.Open(path, rawsys.O_WRONLY|rawsys.O_APPEND|rawsys.O_CREAT|rawsys.O_CLOEXEC, 0o600)
	if e != 0 {
		return &AppendError{Op: "open", Path: path, Errno: uintptr(e)}
	}
	n, e := rawsys.Write(fd, l)
	ce := rawsys.Close(fd)
	switch {
	case e != 0:
		return &AppendError{Op: "write", Path: path, Errno: uintptr(e)}
	case n < len(l):
		return &AppendError{Op: "write", Path: path}
	case ce != 0:
		return &AppendError{Op: "close", Path: path, Errno: uintptr(ce)}
	}
	return nil
}
