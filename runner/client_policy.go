// The per-call policy: best-effort (the driver's reporting) or strict (an operator's command).

package runner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/gauth"
)

// CallOptions say how one call treats failure. The zero value is the driver's best-effort
// reporting: a budget of its own, bounded retries, the circuit breaker, and a redirect to
// another host taken as the answer (a non-2xx, so an error).
type CallOptions struct {
	// Strict makes the call an operator's: one attempt, bounded only by the caller's context
	// (the operator's --timeout), not behind the breaker (neither stopped by it nor feeding
	// it), an answer of up to MaxStrictResponseBytes, and a redirect to another host refused
	// with a *RedirectError.
	Strict bool
	// Op names the call in its errors instead of the method's name (e.g. "claims list").
	Op string
}

// Bounds of a strict call.
const (
	// MaxStrictResponseBytes caps a strict call's answer: the largest legitimate one, a 4 MiB
	// log slice, is about 5.6 MB once base64-encoded.
	MaxStrictResponseBytes = 64 << 20
	// MaxStrictRedirects caps the redirects a strict call follows, all to the configured host.
	MaxStrictRedirects = 5
)

// callOptionsKey is the context key of CallOptions.
type callOptionsKey struct{}

// WithCallOptions returns ctx carrying o for the calls made with it.
func WithCallOptions(ctx context.Context, o CallOptions) context.Context {
	return context.WithValue(ctx, callOptionsKey{}, o)
}

// callOptionsOf returns the CallOptions ctx carries (the zero value: best-effort).
func callOptionsOf(ctx context.Context) CallOptions {
	o, _ := ctx.Value(callOptionsKey{}).(CallOptions)
	return o
}

// opName is the name a call's errors give it: o.Op, else the method's.
func (o CallOptions) opName(method string) string {
	if o.Op != "" {
		return o.Op
	}
	return method
}

// RedirectError is a redirect to another host that a strict call refused to follow.
type RedirectError struct {
	To     string // where the server redirected, credentials redacted
	Server string // the configured server
}

// Error says where the redirect went and that credentials go only to the server.
func (e *RedirectError) Error() string {
	return fmt.Sprintf("the server redirected to %s; not followed: credentials go only to %s", e.To, e.Server)
}

// callStrict is callSized for a strict call: one attempt within ctx, not behind the breaker.
func (c *Client) callStrict(ctx context.Context, op string, send func(context.Context) (*http.Response, error)) ([]byte, error) {
	// ctx bounds the attempt; the per-attempt bound only keeps a context without a deadline
	// from waiting forever.
	perAttempt := 24 * time.Hour
	if dl, ok := ctx.Deadline(); ok {
		perAttempt = max(time.Until(dl), time.Millisecond)
	}
	res := c.once(ctx, op, perAttempt, MaxStrictResponseBytes, send)
	if res.transport != nil {
		return nil, res.transport
	}
	body, err := res.answer(op)
	var ae *APIError
	if errors.As(err, &ae) {
		ae.Strict = true
	}
	return body, err
}

// sameHostRedirects follows a redirect only to the configured scheme and host: a bearer token
// must never reach another host. A best-effort call takes the redirect elsewhere as its
// answer; a strict one fails with a *RedirectError.
func sameHostRedirects(base *url.URL) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		strict := callOptionsOf(req.Context()).Strict
		if !gauth.SameOrigin(base, req.URL) {
			if strict {
				return &RedirectError{To: req.URL.Redacted(), Server: base.Redacted()}
			}
			// Not followed: the 3xx itself becomes the answer (a non-2xx, so an error).
			return http.ErrUseLastResponse
		}
		switch {
		case strict && len(via) >= MaxStrictRedirects:
			return fmt.Errorf("stopped after %d redirects", MaxStrictRedirects)
		case !strict && len(via) > MaxRedirects:
			return fmt.Errorf("stopped after %d redirects", MaxRedirects)
		}
		return nil
	}
}
