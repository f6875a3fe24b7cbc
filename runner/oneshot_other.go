//go:build !linux

package runner

import "errors"

// newReadiness has no one-shot waiter to offer here: an empty paced pipe is looked at again
// on a timer.
func newReadiness(int) (readiness, error) { return nil, errors.ErrUnsupported }

// growPipe cannot change a pipe's capacity here; it assumes the usual one.
func growPipe(int) int { return defaultPipeSize }
