//go:build !linux

package runner

import (
	"errors"

	"github.com/fsnotify/fsnotify"
)

// inotifyWatcher exists on Linux only; elsewhere the pump watches with fsnotify.
type inotifyWatcher struct{}

func newInotifyWatcher() (*inotifyWatcher, error) { return nil, errors.ErrUnsupported }

func (*inotifyWatcher) Add(string) error { return errors.ErrUnsupported }
func (*inotifyWatcher) Close() error     { return nil }
func (*inotifyWatcher) shutdown()        {}
func (*inotifyWatcher) wait() error      { return errors.ErrUnsupported }
func (*inotifyWatcher) rearm() error     { return errors.ErrUnsupported }

func (*inotifyWatcher) read(func(fsnotify.Event)) (int, bool, error) {
	return 0, false, errors.ErrUnsupported
}
