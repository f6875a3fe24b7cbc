// Package tickfile appends ticks to the driver's tick file (the format is internal/tickline's)
// with ordinary system calls, for the full command line and for the platforms where the early
// tick path (internal/earlytick) does not make raw ones.
package tickfile

import (
	"io"
	"os"
	"syscall"

	"github.com/tfstackplan/tfstackplan/internal/tickline"
)

// Append appends r (fields clipped to tickline.MaxField) as one line to the tick file in dir.
// O_APPEND and a single write keep the lines of concurrent ticks (parallel stacks) from
// interleaving. Plain system calls, not os.OpenFile: an *os.File sets up the runtime's poller
// (an epoll instance, an eventfd, two epoll_ctl and an epoll_pwait) for a file it cannot
// poll, in a process that writes one line and exits.
func Append(dir string, r tickline.Record) error {
	line, path := tickline.Line(r), tickline.Path(dir)
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := syscall.Write(fd, line)
	if err == nil && n < len(line) {
		err = io.ErrShortWrite
	}
	if cerr := syscall.Close(fd); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}
