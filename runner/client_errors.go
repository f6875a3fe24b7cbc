// The errors the client returns: no server, an open breaker, a cancel, the server's non-2xx
// answers (APIError) and transport failures (TransportError).

package runner

import (
	"errors"
	"fmt"
	"net/http"

	"google.golang.org/grpc/codes"
)

// ErrDisabled is returned by operations that need a server when none is configured.
var ErrDisabled = errors.New("no tfstackplan server configured")

// ErrCircuitOpen is returned, fast, while the breaker is open after repeated transport failures.
var ErrCircuitOpen = errors.New("tfstackplan server unreachable recently; skipping call (circuit open)")

// ErrCancelRequested is wrapped by the error a runner event returns when an administrator
// cancelled the execution: the event was stored, and the runner should stop.
var ErrCancelRequested = errors.New("execution cancelled on the server")

// CancelledError carries the administrator's reason for a cancellation.
type CancelledError struct{ Reason string }

// Error says the execution was cancelled, with the reason when there is one.
func (e *CancelledError) Error() string {
	if e.Reason == "" {
		return ErrCancelRequested.Error()
	}
	return ErrCancelRequested.Error() + ": " + e.Reason
}

// Is makes errors.Is(err, ErrCancelRequested) true.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelRequested }

// APIError is a non-2xx answer from the server.
type APIError struct {
	Op         string     // the operation, e.g. "Phase"
	StatusCode int        // HTTP status
	Code       codes.Code // the grpc code named in the body; codes.Unknown when absent or unparsable
	CodeName   string     // the code as the server spelled it
	Message    string     // the server's message, bounded
}

// Error names the operation, the HTTP status, the code and the server's message.
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	name := e.CodeName
	if name == "" {
		name = "no code"
	}
	return fmt.Sprintf("%s: server answered %d (%s): %s", e.Op, e.StatusCode, name, msg)
}

// TransportError is a failure to get any answer: refused, reset, timeout, TLS, DNS, redirect
// refused, or a body cut short.
type TransportError struct {
	Op  string
	Err error
}

// Error names the operation and the transport failure.
func (e *TransportError) Error() string { return e.Op + ": " + e.Err.Error() }

// Unwrap returns the transport failure.
func (e *TransportError) Unwrap() error { return e.Err }
