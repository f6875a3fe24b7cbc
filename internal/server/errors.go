package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"google.golang.org/grpc/codes"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
)

// codeNames are the grpc code names the contract carries in Error.code.
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
	codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
	codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
	codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}

// httpStatus follows the grpc-gateway mapping, except FAILED_PRECONDITION answers 412.
var httpStatus = map[codes.Code]int{
	codes.InvalidArgument: 400, codes.NotFound: 404, codes.AlreadyExists: 409, codes.PermissionDenied: 403,
	codes.ResourceExhausted: 429, codes.FailedPrecondition: 412, codes.Aborted: 409, codes.Unauthenticated: 401,
	codes.Unavailable: 503, codes.DeadlineExceeded: 504, codes.Canceled: 499, codes.Internal: 500,
}

// The HTTP layer's own errors. Their messages are written for clients.
var (
	errRateLimited = errors.New("rate limit exceeded for this principal; retry later")
	errTooLarge    = errors.New("request body too large")
	// errBodyTimeout: the client did not send its body within Config.BodyTimeout.
	errBodyTimeout = errors.New("request body not received in time")
	// errMediaType: a body that is not the media type the route reads.
	errMediaType = errors.New("unsupported content type")
)

// statusOverride answers these errors with a status more precise than their code's.
var statusOverride = map[error]int{errBodyTimeout: http.StatusRequestTimeout, errMediaType: http.StatusUnsupportedMediaType}

// publicErrors are the errors whose messages reach clients: the service writes them for users
// (invalid, not found, precondition, denied, mismatch) or the HTTP layer does. Any other error may carry a
// driver's text (SQL, table names, hosts) and is answered with a generic message.
var publicErrors = []error{store.ErrInvalid, store.ErrNotFound, store.ErrPrecondition, store.ErrDenied, store.ErrStale, store.ErrMismatch, store.ErrQuota,
	auth.ErrNoRoles, auth.ErrUnauthenticated, errRateLimited, throttle.ErrThrottled, errTooLarge, errBodyTimeout, errMediaType}

// genericMessages say what a hidden error means to a client, by code.
var genericMessages = map[codes.Code]string{
	codes.Unavailable:      "the database is unavailable; retry",
	codes.AlreadyExists:    "the write conflicts with stored data",
	codes.DeadlineExceeded: "the request timed out; retry",
	codes.Canceled:         "the request was cancelled",
	codes.Internal:         "internal error",
}

// errorResponse is the shape of every generated <Op>defaultJSONResponse.
type errorResponse struct {
	Body       api.Error
	StatusCode int
}

// codeOf maps a domain sentinel to a grpc code: the one place that does.
func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, store.ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, store.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrMismatch):
		return codes.AlreadyExists
	case errors.Is(err, store.ErrPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, store.ErrStale):
		return codes.Aborted
	case errors.Is(err, store.ErrDenied), errors.Is(err, auth.ErrNoRoles):
		return codes.PermissionDenied
	case errors.Is(err, auth.ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, errRateLimited), errors.Is(err, throttle.ErrThrottled), errors.Is(err, store.ErrQuota):
		return codes.ResourceExhausted
	case errors.Is(err, errTooLarge), errors.Is(err, errMediaType):
		return codes.InvalidArgument
	case errors.Is(err, errBodyTimeout):
		return codes.DeadlineExceeded
	case errors.Is(err, store.ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	default:
		return codes.Internal
	}
}

// errorMapper turns errors into the contract's answers and logs the detail of those whose
// message it keeps from the client.
type errorMapper struct{ log *slog.Logger }

// errResp maps err to the HTTP status and Error body the contract specifies.
func (m errorMapper) errResp(err error) errorResponse {
	c := codeOf(err)
	status := httpStatus[c]
	for sentinel, s := range statusOverride {
		if errors.Is(err, sentinel) {
			status = s
		}
	}
	for _, public := range publicErrors {
		if errors.Is(err, public) {
			return errorResponse{StatusCode: status, Body: api.Error{Code: codeNames[c], Message: err.Error()}}
		}
	}
	msg, ok := genericMessages[c]
	if !ok {
		msg = genericMessages[codes.Internal]
	}
	id := rand.Text()[:16]
	if c != codes.Canceled {
		m.log.Error("request failed", "request_id", id, "code", codeNames[c], "err", err)
	}
	return errorResponse{StatusCode: status, Body: api.Error{Code: codeNames[c], Message: fmt.Sprintf("%s (request id %s)", msg, id)}}
}

// writeError writes err as the contract's JSON error.
func (m errorMapper) writeError(w http.ResponseWriter, err error) {
	e := m.errResp(err)
	if e.StatusCode == http.StatusTooManyRequests {
		retry := "1"
		if te := (*throttle.Error)(nil); errors.As(err, &te) {
			retry = throttle.RetryAfter(te.Wait)
		}
		if qe := (*service.QuotaError)(nil); errors.As(err, &qe) {
			retry = throttle.RetryAfter(qe.Wait)
		}
		w.Header().Set("Retry-After", retry)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.StatusCode)
	_ = json.NewEncoder(w).Encode(e.Body)
}

// errorText is the status and message of err for pages that answer in plain text.
func (m errorMapper) errorText(err error) (int, string) {
	e := m.errResp(err)
	return e.StatusCode, e.Body.Message
}
