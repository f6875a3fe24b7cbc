//go:build !linux

package runner

import "errors"

// newReadiness has no one-shot waiter to offer here: an empty paced pipe is looked at again
// on a timer.
func newReadiness(int) (readiness, error) { return nil, errors.ErrUnsupported }
