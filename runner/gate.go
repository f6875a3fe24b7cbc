package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tfstackplan/tfstackplan/events"
)

// VerdictKind is the typed outcome of the apply-time gate check.
type VerdictKind int

// Gate verdicts (DESIGN.md §3). Only VerdictSatisfied allows an apply.
const (
	VerdictSatisfied     VerdictKind = iota // apply may proceed (incl. "no server, not gated")
	VerdictNotClassified                    // the PR never finalized a plan
	VerdictNotSatisfied                     // a required grant is not active, or any unknown answer
	VerdictUnconfirmable                    // the gate state could not be freshly confirmed
	VerdictUnreachable                      // the server could not be reached
)

var verdictNames = [...]string{"satisfied", "not-classified", "not-satisfied", "unconfirmable", "unreachable"}

// String returns the verdict's name, e.g. not-satisfied.
func (k VerdictKind) String() string {
	if int(k) >= 0 && int(k) < len(verdictNames) {
		return verdictNames[k]
	}
	return fmt.Sprintf("verdict(%d)", int(k))
}

// GateVerdict is the result of GateCheck. Callers switch on Kind; Allowed is true only for
// VerdictSatisfied, so every unforeseen path denies.
type GateVerdict struct {
	Kind      VerdictKind
	Requester string     // leased service account to impersonate; set only when Satisfied
	Code      codes.Code // server-reported code on a non-2xx (codes.OK otherwise)
	Err       error      // underlying error, for logging
}

// Allowed reports whether the apply may proceed.
func (v GateVerdict) Allowed() bool { return v.Kind == VerdictSatisfied }

// String describes the verdict for logs and the result document.
func (v GateVerdict) String() string {
	switch {
	case v.Kind == VerdictSatisfied && v.Requester != "":
		return "satisfied (requester " + v.Requester + ")"
	case v.Err != nil:
		return v.Kind.String() + ": " + v.Err.Error()
	default:
		return v.Kind.String()
	}
}

// ErrGatedWithoutServer is the verdict error of an environment marked `gated = true` that has
// no server configured: a configuration error, denied.
var ErrGatedWithoutServer = errors.New("environment is gated but no tfstackplan server is configured")

// GateCheck is the apply-time, fail-closed gate check. No server (environment not gated):
// Satisfied. Gated environment without a server: NotSatisfied. Transport failure: Unreachable.
// Non-2xx: the verdict its code names, unknown codes NotSatisfied. Only a well-formed 200
// carrying a requester is Satisfied.
func (c *Client) GateCheck(ctx context.Context, g events.GateCheck) GateVerdict {
	if !c.Enabled() {
		if err := c.Broken(); err != nil {
			return GateVerdict{Kind: VerdictNotSatisfied, Err: fmt.Errorf("the tfstackplan server cannot be used: %w", err)}
		}
		if c != nil && c.gated {
			return GateVerdict{Kind: VerdictNotSatisfied, Err: ErrGatedWithoutServer}
		}
		return GateVerdict{Kind: VerdictSatisfied}
	}
	body, err := json.Marshal(g)
	if err != nil {
		return GateVerdict{Kind: VerdictNotSatisfied, Err: fmt.Errorf("gate check: %w", err)}
	}
	// A check of thousands of stacks is megabytes: each attempt also gets the time its bytes
	// take at SlowestUpload, as other large posts do.
	budget, each := sizedBounds(c.gateBudget, c.gateAttempt, MaxAttempts, len(body))
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	// The gate bypasses the breaker: it is the one decision that must be asked fresh.
	res := c.attempts(ctx, "GateCheck", MaxAttempts, each, func(ctx context.Context) (*http.Response, error) {
		return c.api.GateCheckWithBody(ctx, "application/json", bytes.NewReader(body))
	}, nil)
	return verdictFrom(res)
}

func verdictFrom(res result) GateVerdict {
	if res.transport != nil {
		var te *gauth.TokenError
		if errors.As(res.transport, &te) {
			return GateVerdict{Kind: VerdictUnconfirmable, Err: res.transport}
		}
		return GateVerdict{Kind: VerdictUnreachable, Err: res.transport}
	}
	if res.status == http.StatusOK {
		lease, err := parseLease(res)
		if err != nil {
			return GateVerdict{Kind: VerdictNotSatisfied, Err: fmt.Errorf("GateCheck: malformed 200 answer: %w", err)}
		}
		return GateVerdict{Kind: VerdictSatisfied, Requester: lease.Requester}
	}
	if res.status >= 200 && res.status < 300 {
		return GateVerdict{Kind: VerdictNotSatisfied, Err: fmt.Errorf("GateCheck: unexpected HTTP %d", res.status)}
	}
	apiErr := res.apiError("GateCheck")
	v := GateVerdict{Kind: VerdictNotSatisfied, Code: apiErr.Code, Err: apiErr}
	if apiErr.CodeName == "" {
		return v
	}
	switch apiErr.Code {
	case codes.FailedPrecondition:
		v.Kind = VerdictNotClassified
	case codes.PermissionDenied:
		v.Kind = VerdictNotSatisfied
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		v.Kind = VerdictUnconfirmable
	}
	return v
}

// parseLease accepts only a JSON object with a non-empty requester.
func parseLease(res result) (events.GateLease, error) {
	var lease events.GateLease
	if !isJSON(res.contentType) {
		return lease, fmt.Errorf("content type %q is not JSON", res.contentType)
	}
	body := bytes.TrimSpace(res.body)
	if len(body) == 0 || body[0] != '{' {
		return lease, errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&lease); err != nil {
		return lease, err
	}
	if dec.More() {
		return lease, errors.New("trailing data after the JSON object")
	}
	if strings.TrimSpace(lease.Requester) == "" {
		return lease, errors.New("no requester")
	}
	return lease, nil
}
