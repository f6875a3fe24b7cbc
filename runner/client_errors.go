// The errors the client returns: no server, an open breaker, a cancel, the server's non-2xx
// answers (APIError) and transport failures (TransportError).

package runner

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

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

// APIError is a non-2xx answer from the server, for every call of the client: the driver's
// best-effort reports and an operator's strict calls alike.
type APIError struct {
	Op         string     // the operation, e.g. "Phase", or the command that made the call
	StatusCode int        // HTTP status
	Code       codes.Code // the grpc code named in the body; codes.Unknown when absent or unparsable
	CodeName   string     // the code as the server spelled it
	Message    string     // the server's message, bounded and safe for a terminal
	// Strict says a strict call (an operator's command) got the answer: its message is the
	// command's words alone, without the status and code the driver's messages end with.
	Strict bool
}

// Error names the operation, what the status means and the server's message, then (unless
// Strict) the status and the code the server gave when the status does not say it already,
// with a hint on how to authenticate after a 401.
func (e *APIError) Error() string {
	var what, implied string
	switch e.StatusCode {
	case http.StatusBadRequest:
		what, implied = "invalid argument", "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		what, implied = "unauthenticated", "UNAUTHENTICATED"
	case http.StatusForbidden:
		what, implied = "permission denied", "PERMISSION_DENIED"
	case http.StatusNotFound:
		what, implied = "not found", "NOT_FOUND"
	case http.StatusConflict:
		what, implied = "already exists", "ALREADY_EXISTS"
	case http.StatusPreconditionFailed:
		what, implied = "failed precondition", "FAILED_PRECONDITION"
	case http.StatusTooManyRequests:
		what = "rate limited (retry later)"
	default:
		what = fmt.Sprintf("the server failed (HTTP %d)", e.StatusCode)
	}
	// The server's messages start with the same words (its error kinds): say them once.
	s := e.Op + ": " + what
	if msg := strings.TrimPrefix(e.Message, what+": "); msg != "" && msg != what {
		s += ": " + msg
	}
	var detail []string
	if !e.Strict && !strings.Contains(what, "(HTTP ") {
		detail = append(detail, fmt.Sprintf("HTTP %d", e.StatusCode))
	}
	if !e.Strict && e.CodeName != "" && e.CodeName != implied {
		detail = append(detail, e.CodeName)
	}
	if len(detail) > 0 {
		s += " (" + strings.Join(detail, ", ") + ")"
	}
	if e.StatusCode == http.StatusUnauthorized {
		s += " (set TFSTACKPLAN_TOKEN to a token of the server's tokens file, or --audience/TFSTACKPLAN_AUDIENCE for Google ID tokens)"
	}
	return s
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
