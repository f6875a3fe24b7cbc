package runner

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// oneShot waits for a descriptor to become readable while keeping it out of the Go runtime's
// poller. The runtime watches what it polls edge-triggered: every write into a pipe, every
// event queued on an inotify instance, makes its netpoll return and wake a thread, even when
// no goroutine waits to read (the reader deliberately holding back). Here a private epoll
// instance watches the descriptor with EPOLLONESHOT, and that instance is what the runtime
// polls: the descriptor's first readiness wakes wait once, and nothing more does until rearm.
type oneShot struct {
	fd int // the watched descriptor, non-blocking; the caller owns it
	ep *os.File
	rc syscall.RawConn
}

func newOneShot(fd int) (*oneShot, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	o := &oneShot{fd: fd}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, o.event()); err != nil {
		_ = unix.Close(epfd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	// Non-blocking, so that os.NewFile puts it in the runtime's poller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		return nil, os.NewSyscallError("setnonblock", err)
	}
	o.ep = os.NewFile(uintptr(epfd), "oneshot-epoll")
	if o.rc, err = o.ep.SyscallConn(); err != nil {
		_ = o.ep.Close()
		return nil, err
	}
	return o, nil
}

func (o *oneShot) event() *unix.EpollEvent {
	return &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(o.fd)}
}

// wait blocks until the descriptor is readable (or at its end: a pipe whose writers all
// closed it), consuming the one-shot readiness, or until Close.
func (o *oneShot) wait() error {
	var evs [1]unix.EpollEvent
	var werr error
	err := o.rc.Read(func(epfd uintptr) bool {
		for {
			n, err := unix.EpollWait(int(epfd), evs[:], 0)
			switch {
			case err == unix.EINTR:
				continue
			case err != nil:
				werr = os.NewSyscallError("epoll_wait", err)
				return true
			}
			return n > 0
		}
	})
	if err != nil {
		return err
	}
	return werr
}

// rearm has the next readiness reported (at once if the descriptor is readable already).
func (o *oneShot) rearm() error {
	var err error
	if cerr := o.rc.Control(func(epfd uintptr) {
		err = unix.EpollCtl(int(epfd), unix.EPOLL_CTL_MOD, o.fd, o.event())
	}); cerr != nil {
		return cerr
	}
	return os.NewSyscallError("epoll_ctl", err)
}

// Close ends a wait in progress (it returns an error) and releases the epoll instance; the
// watched descriptor stays open.
func (o *oneShot) Close() error { return o.ep.Close() }

// newReadiness is a oneShot for fd.
func newReadiness(fd int) (readiness, error) {
	o, err := newOneShot(fd)
	if err != nil {
		return nil, err
	}
	return o, nil
}
