package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Exit codes of every tfstackplan command (DESIGN.md §9).
const (
	ExitOK         = 0 // success
	ExitFailure    = 1 // a stack, terramate or anything else failed
	ExitUsage      = 2 // bad flags, unknown command, bare invocation
	ExitGateDenied = 3 // the apply-time gate check did not allow the apply
	ExitDrift      = 4 // run drift --fail-on-drift: a stack drifted
	ExitPolicy     = 5 // policy test: a policy failed a plan
)

// UsageError is a command-line mistake: it exits 2.
type UsageError struct{ Err error }

// Error returns the underlying message.
func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef builds a UsageError.
func Usagef(format string, a ...any) error {
	return &UsageError{Err: fmt.Errorf(format, a...)}
}

// ErrGateDenied marks an error as a gate denial: it exits 3. Wrap it with %w.
var ErrGateDenied = errors.New("gate denied")

// ErrSilent reports failure without printing anything more (the command already did).
var ErrSilent = errors.New("")

// ExitCode maps an error returned by a command to the process exit code. It is the one place
// that does so.
func ExitCode(err error) int {
	var ue *UsageError
	var se *SignalError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &se):
		return se.Code()
	case errors.As(err, &ue):
		return ExitUsage
	case errors.Is(err, ErrGateDenied):
		return ExitGateDenied
	case errors.Is(err, ErrDrift):
		return ExitDrift
	case errors.Is(err, ErrPolicyFailed):
		return ExitPolicy
	case errors.Is(err, context.Canceled):
		return ExitFailure
	default:
		return ExitFailure
	}
}

// SignalError reports that a run ended because of a signal: it exits 128+signal (130 for
// SIGINT, 143 for SIGTERM), as shells do.
type SignalError struct{ Signal os.Signal }

// Error names the signal.
func (e *SignalError) Error() string { return "interrupted by " + e.Signal.String() }

// Code returns 128 plus the signal number.
func (e *SignalError) Code() int {
	if s, ok := e.Signal.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return ExitFailure
}
