// The transport of one call: budgets sized by the body, bounded attempts with backoff
// honouring Retry-After, bounded answers, and non-2xx answers as APIError.

package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
	"github.com/tfstackplan/tfstackplan/internal/termsafe"
)

// uploadTime is how long size bytes take to upload at SlowestUpload: what a post of that size
// gets on top of the usual bounds, per attempt.
func uploadTime(size int) time.Duration {
	return time.Duration(int64(max(size, 0)) * int64(time.Second) / SlowestUpload)
}

// sizedBounds is the budget of a call of attempts attempts at a request of size bytes, and the
// timeout of each attempt: the usual bounds (budget, attempt) and, per attempt, uploadTime(size).
func sizedBounds(budget, attempt time.Duration, attempts, size int) (total, each time.Duration) {
	upload := uploadTime(size)
	return budget + time.Duration(attempts)*upload, attempt + upload
}

// call runs one best-effort request within CallBudget: bounded attempts, backoff honouring
// Retry-After, the breaker. It returns the 2xx body or an *APIError / *TransportError.
func (c *Client) call(ctx context.Context, op string, idempotent bool, send func(context.Context) (*http.Response, error)) ([]byte, error) {
	return c.callSized(ctx, op, idempotent, 0, MaxResponseBytes, send)
}

// callSized is call for a request body of about size bytes: each attempt, and the budget for
// each, get the time that many bytes take at SlowestUpload on top of the usual bounds. It reads
// at most maxBody bytes of the answer.
func (c *Client) callSized(ctx context.Context, op string, idempotent bool, size, maxBody int, send func(context.Context) (*http.Response, error)) ([]byte, error) {
	o := callOptionsOf(ctx)
	op = o.opName(op)
	if o.Strict {
		return c.callStrict(ctx, op, send)
	}
	if !c.breaker.allow() {
		return nil, &TransportError{Op: op, Err: ErrCircuitOpen}
	}
	defer c.breaker.settle()
	attempts := 1
	if idempotent {
		attempts = MaxAttempts
	}
	budget, each := sizedBounds(c.callBudget, c.attemptTimeout, attempts, size)
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	select {
	case c.inflight <- struct{}{}:
		defer func() { <-c.inflight }()
	case <-ctx.Done():
		return nil, &TransportError{Op: op, Err: fmt.Errorf("waiting for a free connection: %w", ctx.Err())}
	}
	// The breaker may have opened while this call waited for a slot.
	if !c.breaker.allowWaiting() {
		return nil, &TransportError{Op: op, Err: ErrCircuitOpen}
	}
	res := c.attemptsUpTo(ctx, op, attempts, each, maxBody, send, c.breaker)
	if res.transport != nil {
		return nil, res.transport
	}
	return res.answer(op)
}

// result is the outcome of the last attempt of a call.
type result struct {
	status      int
	contentType string
	body        []byte
	retryAfter  time.Duration
	transport   *TransportError
}

// answer is the 2xx JSON body of r, or the error that says why there is none.
func (r result) answer(op string) ([]byte, error) {
	if r.status < 200 || r.status > 299 {
		return nil, r.apiError(op)
	}
	if !isJSON(r.contentType) {
		return nil, fmt.Errorf("%s: answer is %q, not JSON", op, r.contentType)
	}
	return r.body, nil
}

// apiError is r's non-2xx answer as an *APIError, the server's message bounded and made safe
// for a terminal.
func (r result) apiError(op string) *APIError {
	e := &APIError{Op: op, StatusCode: r.status, Code: codes.Unknown}
	var body api.Error
	if err := json.Unmarshal(r.body, &body); err == nil && body.Code != "" {
		e.CodeName = truncate(termsafe.Line(body.Code), maxCodeBytes)
		e.Message = truncate(termsafe.Line(body.Message), maxMessageBytes)
		var code codes.Code
		if err := code.UnmarshalJSON([]byte(strconv.Quote(body.Code))); err == nil {
			e.Code = code
		}
	} else {
		e.Message = truncate(termsafe.Line(strings.TrimSpace(string(r.body))), maxRawMessageBytes)
	}
	return e
}

// Bounds of the server's message in an APIError.
const (
	maxMessageBytes    = 1024 // a message of the server's JSON error body
	maxRawMessageBytes = 256  // an answer that is not one (a proxy's page)
	maxCodeBytes       = 64   // the code the body names
)

// retryable statuses: the server is overloaded or restarting.
func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// attempts sends up to n attempts within ctx, reading at most MaxResponseBytes of an answer.
// br, when not nil, records transport outcomes.
func (c *Client) attempts(ctx context.Context, op string, n int, perAttempt time.Duration, send func(context.Context) (*http.Response, error), br *breaker) result {
	return c.attemptsUpTo(ctx, op, n, perAttempt, MaxResponseBytes, send, br)
}

// attemptsUpTo is attempts reading at most maxBody bytes of an answer.
func (c *Client) attemptsUpTo(ctx context.Context, op string, n int, perAttempt time.Duration, maxBody int, send func(context.Context) (*http.Response, error), br *breaker) result {
	var res result
	backoff := 100 * time.Millisecond
	for i := 0; i < n; i++ {
		if i > 0 {
			wait := backoff
			if res.retryAfter > 0 {
				wait = res.retryAfter
			}
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+10*time.Millisecond {
				break // the wait would outlast the budget: report what we have
			}
			if err := c.sleep(ctx, wait); err != nil {
				break
			}
			backoff *= 2
		}
		res = c.once(ctx, op, perAttempt, maxBody, send)
		if res.transport != nil {
			var te *gauth.TokenError
			if errors.As(res.transport, &te) {
				return res // local failure; retrying will not help and the server is not at fault
			}
			// A caller that cancelled is not evidence against the server.
			if br != nil && !errors.Is(ctx.Err(), context.Canceled) && br.failure() {
				return res
			}
			if ctx.Err() != nil {
				return res
			}
			continue
		}
		if br != nil {
			br.success()
		}
		if !retryable(res.status) {
			return res
		}
	}
	return res
}

// once sends one attempt and reads at most maxBody bytes of its body, all within perAttempt.
func (c *Client) once(ctx context.Context, op string, perAttempt time.Duration, maxBody int, send func(context.Context) (*http.Response, error)) result {
	actx, cancel := context.WithTimeout(ctx, perAttempt)
	defer cancel()
	resp, err := send(actx)
	if err != nil {
		return result{transport: &TransportError{Op: op, Err: err}}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxBody)+1))
	if err != nil {
		return result{transport: &TransportError{Op: op, Err: fmt.Errorf("reading answer (HTTP %d): %w", resp.StatusCode, err)}}
	}
	res := result{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: body}
	if len(body) > maxBody {
		// Too large to be one of ours: keep the status, drop the body so it cannot parse.
		res.body = nil
		res.contentType = "oversized"
	}
	res.retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	return res
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or invalid.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
