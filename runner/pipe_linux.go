package runner

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// growPipe raises the capacity of the pipe whose end is fd to pacedPipeSize (best effort: an
// unprivileged process may go up to /proc/sys/fs/pipe-max-size, 1 MiB by default, within its
// user's pipe page budget) and returns the capacity the pipe has, with the error that kept it
// from growing (nil: it grew).
func growPipe(fd int) (int, error) {
	n, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pacedPipeSize)
	if err == nil && n > 0 {
		return n, nil
	}
	if err == nil {
		err = fmt.Errorf("F_SETPIPE_SZ returned %d", n)
	}
	if got, gerr := unix.FcntlInt(uintptr(fd), unix.F_GETPIPE_SZ, 0); gerr == nil && got > 0 {
		return got, err
	}
	return linuxPipeSize, err
}

// linuxPipeSize is a Linux pipe's usual capacity.
const linuxPipeSize = 64 << 10
