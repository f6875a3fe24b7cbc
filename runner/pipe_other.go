//go:build !linux

package runner

import "errors"

// growPipe cannot change a pipe's capacity here. It assumes the smallest usual one (a macOS
// pipe holds 16 KiB until large writes grow it): the pauses of a paced copy shorten only when
// the capacity assumed is not more than the real one.
func growPipe(int) (int, error) { return minPipeSize, errors.ErrUnsupported }
