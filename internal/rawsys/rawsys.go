//go:build linux && (amd64 || arm64)

// Package rawsys makes the handful of Linux system calls the early tick needs (open, read,
// write, close, the clock, exit) without importing syscall or os.
//
// Why: Go initializes packages one at a time, each time the first in import-path order whose
// imports are all initialized (the Go specification, "Package initialization"). A package
// that imports os waits for os and everything os needs, and meanwhile every ready package
// whose path sorts earlier runs first; in tfstackplan's binary that is about 25 packages,
// 3 to 4 ms of a tick's start on a slow machine. A package that imports nothing (this one
// imports only unsafe, which has no initialization) is ready from the start. internal/earlytick
// builds on it to answer a tick as the fifth package initialized (after the runtime's own and
// one whose path sorts first).
//
// The calls are raw: the runtime is not told that the goroutine is in a system call, as
// syscall.RawSyscall does not tell it: a call that blocks holds its processor, and a garbage
// collection waits for it. That is right for what these are used for, short calls on local
// files during package initialization of a process that has nothing else to do, and wrong
// anywhere else (internal/tickfile appends ticks for everyone else).
package rawsys

import "unsafe"

// Errno is a Linux error number, as a system call returned it (0: no error). It is a number,
// not an error: the names and messages live in syscall, which this package must not import;
// syscall.Errno(e) gives them where syscall is at hand.
type Errno uintptr

// The errors this package retries (EINTR) or returns itself (EINVAL).
const (
	EINTR  Errno = 4
	EINVAL Errno = 22
)

// Flags of Open (the same values on amd64 and arm64).
const (
	O_RDONLY  = 0x0
	O_WRONLY  = 0x1
	O_CREAT   = 0x40
	O_APPEND  = 0x400
	O_CLOEXEC = 0x80000
)

const atFDCWD = ^uintptr(99) // AT_FDCWD, -100

// rawSyscall makes system call trap with up to four arguments, the second of them a pointer
// (every call this package makes has its pointer there), and returns the result or the
// error number. Assembly, in rawsys_linux_$GOARCH.s. p is typed as a pointer so that the
// memory it points to stays alive for the call; the assembly is NOSPLIT, so the stack (where p
// may point) cannot grow and move during it.
//
//go:noescape
func rawSyscall(trap, a1 uintptr, p unsafe.Pointer, a3, a4 uintptr) (r1 uintptr, errno Errno)

// Open opens path (openat relative to the working directory) and returns its descriptor. A
// path with a NUL byte in it is EINVAL, as syscall.Open has it (the kernel would stop there).
func Open(path string, flags int, mode uint32) (int, Errno) {
	for i := 0; i < len(path); i++ {
		if path[i] == 0 {
			return -1, EINVAL
		}
	}
	p := make([]byte, len(path)+1) // NUL-terminated
	copy(p, path)
	for {
		fd, e := rawSyscall(sysOpenat, atFDCWD, unsafe.Pointer(&p[0]), uintptr(flags), uintptr(mode))
		if e != EINTR {
			return int(fd), e
		}
	}
}

// Read reads up to len(b) bytes from fd.
func Read(fd int, b []byte) (int, Errno) { return transfer(sysRead, fd, b) }

// Write makes one write of b to fd and returns how much of it was written.
func Write(fd int, b []byte) (int, Errno) { return transfer(sysWrite, fd, b) }

// transfer makes one read or write (trap) of b on fd, again when interrupted.
func transfer(trap uintptr, fd int, b []byte) (int, Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	for {
		n, e := rawSyscall(trap, uintptr(fd), unsafe.Pointer(&b[0]), uintptr(len(b)), 0)
		if e != EINTR {
			return int(n), e
		}
	}
}

// Close closes fd. An interrupted close is not retried: the descriptor is gone either way on
// Linux.
func Close(fd int) Errno {
	_, e := rawSyscall(sysClose, uintptr(fd), nil, 0, 0)
	return e
}

// ReadFile returns the whole content of the file at path, read until end of file (so that it
// also reads files of /proc, whose size stat does not know).
func ReadFile(path string) ([]byte, Errno) {
	fd, e := Open(path, O_RDONLY|O_CLOEXEC, 0)
	if e != 0 {
		return nil, e
	}
	b := make([]byte, 0, 4096)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, e := Read(fd, b[len(b):cap(b)])
		if e != 0 {
			Close(fd)
			return nil, e
		}
		if n == 0 {
			break
		}
		b = b[:len(b)+n]
	}
	return b, Close(fd)
}

// NowUnixNano returns the wall clock (CLOCK_REALTIME) in nanoseconds since the Unix epoch, as
// time.Now().UnixNano() does, and false should the clock fail (time reads it through the
// vDSO; a system call filter may refuse the system call).
func NowUnixNano() (int64, bool) {
	var ts [2]int64 // struct timespec: seconds, nanoseconds
	if _, e := rawSyscall(sysClockGettime, 0, unsafe.Pointer(&ts), 0, 0); e != 0 {
		return 0, false
	}
	return ts[0]*1e9 + ts[1], true
}

// Exit ends the process at once with code (exit_group): no deferred calls, no flush, and
// unlike os.Exit not even the runtime's exit hooks (the race detector's report, coverage
// counters), which a tick has nothing for.
func Exit(code int) {
	for {
		rawSyscall(sysExitGroup, uintptr(code), nil, 0, 0)
	}
}
