package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
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

var (
	errRateLimited = errors.New("rate limit exceeded for this principal; retry later")
	errTooLarge    = errors.New("request body too large")
)

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
	case errors.Is(err, store.ErrConflict):
		return codes.AlreadyExists
	case errors.Is(err, store.ErrPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, store.ErrDenied), errors.Is(err, auth.ErrNoRoles):
		return codes.PermissionDenied
	case errors.Is(err, auth.ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, errRateLimited):
		return codes.ResourceExhausted
	case errors.Is(err, errTooLarge):
		return codes.InvalidArgument
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

// errResp maps err to the HTTP status and Error body the contract specifies.
func errResp(err error) errorResponse {
	c := codeOf(err)
	msg := err.Error()
	if c == codes.Internal {
		msg = "internal error"
	}
	return errorResponse{StatusCode: httpStatus[c], Body: api.Error{Code: codeNames[c], Message: msg}}
}

// writeError writes err as the contract's JSON error.
func writeError(w http.ResponseWriter, err error) {
	e := errResp(err)
	if e.StatusCode == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.StatusCode)
	_ = json.NewEncoder(w).Encode(e.Body)
}
