package granter

import "errors"

// HTTPStatus returns the HTTP status of the IAM error answer err wraps, if it wraps one.
func HTTPStatus(err error) (int, bool) {
	var aerr *apiError
	if errors.As(err, &aerr) {
		return aerr.Code, true
	}
	return 0, false
}

// Endpoint returns the IAM base URL g calls.
func Endpoint(g *GCPIAM) string { return g.iam.endpoint }
