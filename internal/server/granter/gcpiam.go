package granter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/api/googleapi"
	iam "google.golang.org/api/iam/v1"
	"google.golang.org/api/option"
)

// TokenCreatorRole is the role a GCPIAM grant binds: it lets the member mint access tokens for
// (impersonate) the service account.
const TokenCreatorRole = "roles/iam.serviceAccountTokenCreator"

// Retry defaults of a GCPIAM (its fields of the same names override them).
const (
	DefaultMaxAttempts = 6
	DefaultBaseDelay   = 250 * time.Millisecond
	DefaultMaxDelay    = 8 * time.Second
)

// GCPIAMConfig configures NewGCPIAM.
type GCPIAMConfig struct {
	// Endpoint is the IAM API's base URL; empty is Google's.
	Endpoint string
	// CredentialsFile is a Google credentials JSON file of type service_account,
	// authorized_user, external_account or impersonated_service_account; empty is Application
	// Default Credentials.
	CredentialsFile string
}

// GCPIAM grants a lease as a conditional IAM binding on the requester service account: role
// TokenCreatorRole for the lease's member, under a condition titled ConditionTitle(LeaseID)
// whose expression ends the binding at the lease's expiry.
//
// Every change is a read-modify-write of the account's policy (version 3) guarded by its etag.
// A concurrent modification (HTTP 409) is re-read and retried; HTTP 429, 5xx and transport
// failures are retried with exponential backoff and jitter; all these within MaxAttempts and the
// context's deadline. Any other error fails at once. Errors name the service account and the
// HTTP status, and wrap the *googleapi.Error.
//
// The fields may be changed before first use.
type GCPIAM struct {
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Sleep waits d before a retry, or returns ctx's error when ctx ends first (nil: a timer).
	Sleep func(ctx context.Context, d time.Duration) error
	// MaxAttempts bounds the read-modify-write attempts of one call (0: DefaultMaxAttempts).
	MaxAttempts int
	// BaseDelay is the backoff before the second attempt; it doubles per attempt up to
	// MaxDelay, and each wait is drawn from its upper half (0: the defaults).
	BaseDelay, MaxDelay time.Duration

	svc *iam.Service

	mu   sync.Mutex
	busy map[string]chan struct{} // service accounts being changed, closed when done
}

// NewGCPIAM returns a GCPIAM using cfg; ctx serves only the construction. With no
// CredentialsFile it looks up Application Default Credentials now, which off Google Cloud may
// probe the metadata server.
func NewGCPIAM(ctx context.Context, cfg GCPIAMConfig) (*GCPIAM, error) {
	var opts []option.ClientOption
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("granter gcp-iam: endpoint %q is not an absolute URL", cfg.Endpoint)
		}
		// The client resolves "v1/..." against the endpoint, which drops a last segment that
		// does not end in a slash.
		opts = append(opts, option.WithEndpoint(strings.TrimSuffix(cfg.Endpoint, "/")+"/"))
	}
	if cfg.CredentialsFile != "" {
		typ, err := credentialsType(cfg.CredentialsFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, option.WithAuthCredentialsFile(typ, cfg.CredentialsFile))
	}
	svc, err := iam.NewService(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("granter gcp-iam: %w", err)
	}
	return &GCPIAM{svc: svc}, nil
}

// credentialsType reads the type of a credentials file, for the client's typed option.
func credentialsType(path string) (option.CredentialsType, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("granter gcp-iam: credentials file: %w", err)
	}
	var f struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return "", fmt.Errorf("granter gcp-iam: credentials file %s: %w", path, err)
	}
	for _, t := range []option.CredentialsType{option.ServiceAccount, option.AuthorizedUser, option.ExternalAccount, option.ImpersonatedServiceAccount} {
		if f.Type == string(t) {
			return t, nil
		}
	}
	return "", fmt.Errorf("granter gcp-iam: credentials file %s has type %q (accepted: %s, %s, %s, %s)", path, f.Type,
		option.ServiceAccount, option.AuthorizedUser, option.ExternalAccount, option.ImpersonatedServiceAccount)
}

// Name returns KindGCPIAM.
func (g *GCPIAM) Name() string { return KindGCPIAM }

// Grant binds b.Member to TokenCreatorRole on b.Requester under the lease's condition,
// replacing any earlier binding of the same lease. It fails without calling IAM when b.ExpiresAt
// has passed. When it returns nil IAM holds the binding, which IAM then takes up to a few
// minutes (usually well under one) to enforce everywhere: the runner's first impersonation
// should retry a permission denial for that long.
func (g *GCPIAM) Grant(ctx context.Context, b Binding) error {
	if err := checkAccount(b.Requester); err != nil {
		return err
	}
	switch {
	case b.LeaseID == "":
		return errors.New("granter gcp-iam: grant needs a lease id")
	case !strings.Contains(b.Member, ":"):
		return fmt.Errorf("granter gcp-iam: member %q is not an IAM principal (e.g. serviceAccount:EMAIL or principalSet://...)", b.Member)
	case !g.now().Before(b.ExpiresAt):
		return fmt.Errorf("granter gcp-iam: lease %s on %s already expired at %s", b.LeaseID, b.Requester, b.ExpiresAt.UTC().Format(time.RFC3339))
	}
	want := leaseBinding(b)
	what := fmt.Sprintf("grant lease %s", b.LeaseID)
	p, err := g.update(ctx, what, b.Requester, func(p *iam.Policy) bool {
		found := false
		kept := p.Bindings[:0]
		for _, x := range p.Bindings {
			if !isLease(x, want.Condition.Title) {
				kept = append(kept, x)
			} else if !found && sameBinding(x, want) {
				found = true
				kept = append(kept, x)
			}
		}
		changed := len(kept) != len(p.Bindings) || !found
		if !found {
			kept = append(kept, want)
		}
		p.Bindings = kept
		return changed
	})
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(p.Bindings, func(x *iam.Binding) bool { return sameBinding(x, want) }) {
		return fmt.Errorf("granter gcp-iam: %s on service account %s: the policy IAM returned lacks the binding", what, b.Requester)
	}
	return nil
}

// Revoke removes every TokenCreatorRole binding under the lease's condition from b.Requester,
// whatever its members; other bindings are left as they are.
func (g *GCPIAM) Revoke(ctx context.Context, b Binding) error {
	if err := checkAccount(b.Requester); err != nil {
		return err
	}
	if b.LeaseID == "" {
		return errors.New("granter gcp-iam: revoke needs a lease id")
	}
	title := ConditionTitle(b.LeaseID)
	_, err := g.update(ctx, "revoke lease "+b.LeaseID, b.Requester, func(p *iam.Policy) bool {
		n := len(p.Bindings)
		p.Bindings = slices.DeleteFunc(p.Bindings, func(x *iam.Binding) bool { return isLease(x, title) })
		return len(p.Bindings) != n
	})
	return err
}

// RemoveExpired removes from requester the lease bindings (TokenCreatorRole, a condition titled
// with TitlePrefix and written by Grant) that expired at or before now.
func (g *GCPIAM) RemoveExpired(ctx context.Context, requester string, now time.Time) ([]string, error) {
	if err := checkAccount(requester); err != nil {
		return nil, err
	}
	var removed []string
	_, err := g.update(ctx, "remove expired leases", requester, func(p *iam.Policy) bool {
		removed = removed[:0]
		p.Bindings = slices.DeleteFunc(p.Bindings, func(x *iam.Binding) bool {
			if x.Role != TokenCreatorRole || x.Condition == nil || !strings.HasPrefix(x.Condition.Title, TitlePrefix) {
				return false
			}
			at, ok := parseExpiry(x.Condition.Expression)
			if ok && !now.Before(at) {
				removed = append(removed, x.Condition.Title)
				return true
			}
			return false
		})
		return len(removed) > 0
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(removed)
	return slices.Compact(removed), nil
}

// leaseBinding is the binding Grant adds for b.
func leaseBinding(b Binding) *iam.Binding {
	desc := fmt.Sprintf("tfstackplan lease of environment %s to apply execution %s", b.Environment, b.LeaseID)
	if len(desc) > maxDescriptionLen {
		desc = strings.ToValidUTF8(desc[:maxDescriptionLen-3], "") + "..."
	}
	return &iam.Binding{
		Role:    TokenCreatorRole,
		Members: []string{b.Member},
		Condition: &iam.Expr{
			Title:       ConditionTitle(b.LeaseID),
			Description: desc,
			Expression:  expiryExpression(b.ExpiresAt),
		},
	}
}

const (
	expiryPrefix = `request.time < timestamp("`
	expirySuffix = `")`
)

// expiryExpression is the condition that holds until at. Seconds are cut, never rounded up, so
// the binding never outlives the lease.
func expiryExpression(at time.Time) string {
	return expiryPrefix + at.UTC().Truncate(time.Second).Format(time.RFC3339) + expirySuffix
}

// parseExpiry inverts expiryExpression.
func parseExpiry(expr string) (time.Time, bool) {
	s, ok := strings.CutPrefix(expr, expiryPrefix)
	if !ok {
		return time.Time{}, false
	}
	if s, ok = strings.CutSuffix(s, expirySuffix); !ok {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339, s)
	return at, err == nil
}

func isLease(x *iam.Binding, title string) bool {
	return x.Role == TokenCreatorRole && x.Condition != nil && x.Condition.Title == title
}

func sameBinding(x, y *iam.Binding) bool {
	return x.Role == y.Role && slices.Equal(x.Members, y.Members) && x.Condition != nil && y.Condition != nil &&
		x.Condition.Title == y.Condition.Title && x.Condition.Description == y.Condition.Description &&
		x.Condition.Expression == y.Condition.Expression
}

func checkAccount(email string) error {
	if strings.Count(email, "@") != 1 || strings.HasPrefix(email, "@") || strings.HasSuffix(email, "@") ||
		strings.ContainsAny(email, "/ \t\r\n?#") {
		return fmt.Errorf("granter gcp-iam: requester %q is not a service account email", email)
	}
	return nil
}

// update applies edit to account's policy by read-modify-write and returns the policy IAM
// holds afterwards; edit reports whether it changed anything (if not, nothing is written).
// edit may run more than once, each time on a fresh read.
func (g *GCPIAM) update(ctx context.Context, what, account string, edit func(*iam.Policy) bool) (*iam.Policy, error) {
	unlock, err := g.lock(ctx, account)
	if err != nil {
		return nil, fmt.Errorf("granter gcp-iam: %s on service account %s: %w", what, account, err)
	}
	defer unlock()
	sa := g.svc.Projects.ServiceAccounts
	resource := "projects/-/serviceAccounts/" + account
	maxAttempts := cmp.Or(g.MaxAttempts, DefaultMaxAttempts)
	for attempt := 1; ; attempt++ {
		call := "getIamPolicy"
		p, err := sa.GetIamPolicy(resource).OptionsRequestedPolicyVersion(3).Context(ctx).Do()
		if err == nil {
			if !edit(p) {
				return p, nil
			}
			// Version 3 keeps conditions; the etag makes the write fail if another writer
			// changed the policy since the read.
			p.Version = 3
			call = "setIamPolicy"
			p, err = sa.SetIamPolicy(resource, &iam.SetIamPolicyRequest{Policy: p}).Context(ctx).Do()
			if err == nil {
				return p, nil
			}
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("granter gcp-iam: %s on service account %s: %s%s: %w", what, account, call, fmt.Sprintf(format, args...), describe(err))
		}
		if ctx.Err() != nil || !retryable(err) {
			return nil, fail("")
		}
		if attempt >= maxAttempts {
			return nil, fail(" (gave up after %d attempts)", attempt)
		}
		d := g.backoff(attempt)
		if deadline, ok := ctx.Deadline(); ok && deadline.Sub(g.now()) < d {
			return nil, fail(" (gave up after %d attempts: the deadline is too near to wait %s)", attempt, d.Round(time.Millisecond))
		}
		if serr := g.sleep(ctx, d); serr != nil {
			return nil, fail(" (%v after %d attempts)", serr, attempt)
		}
	}
}

// describe puts the HTTP status first in an IAM error, keeping the error to unwrap.
func describe(err error) error {
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) {
		return err
	}
	msg := gerr.Message
	if msg == "" {
		msg = strings.TrimSpace(gerr.Body)
	}
	hint := ""
	if gerr.Code == http.StatusForbidden {
		hint = " (the control plane's identity needs iam.serviceAccounts.getIamPolicy and setIamPolicy on the account, e.g. roles/iam.serviceAccountAdmin)"
	}
	return &statusError{msg: fmt.Sprintf("HTTP %d %s: %s%s", gerr.Code, http.StatusText(gerr.Code), msg, hint), err: err}
}

type statusError struct {
	msg string
	err error
}

func (e *statusError) Error() string { return e.msg }
func (e *statusError) Unwrap() error { return e.err }

// retryable tells a failure worth a fresh read-modify-write: a concurrent modification, a
// throttle, a server error, or a broken connection (a write whose answer was lost is safe to
// redo, since every attempt starts from a fresh read).
func retryable(err error) bool {
	var gerr *googleapi.Error
	if errors.As(err, &gerr) {
		return gerr.Code == http.StatusConflict || gerr.Code == http.StatusTooManyRequests || gerr.Code >= 500
	}
	// Every failure of a round trip, a sign-in refused included, comes as a *url.Error, which
	// is itself a net.Error: only what it wraps tells a network failure.
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, io.ErrUnexpectedEOF)
}

// backoff is the wait after a failed attempt (1 for the first): full exponential growth capped
// at MaxDelay, drawn from its upper half so that competing writers spread out.
func (g *GCPIAM) backoff(attempt int) time.Duration {
	d, ceiling := cmp.Or(g.BaseDelay, DefaultBaseDelay), cmp.Or(g.MaxDelay, DefaultMaxDelay)
	for i := 1; i < attempt && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return d/2 + rand.N(d/2+1)
}

// lock serializes this process's changes to one account's policy, which would otherwise only
// conflict with each other and use up attempts.
func (g *GCPIAM) lock(ctx context.Context, account string) (func(), error) {
	for {
		g.mu.Lock()
		held, ok := g.busy[account]
		if !ok {
			if g.busy == nil {
				g.busy = map[string]chan struct{}{}
			}
			done := make(chan struct{})
			g.busy[account] = done
			g.mu.Unlock()
			return func() {
				g.mu.Lock()
				delete(g.busy, account)
				g.mu.Unlock()
				close(done)
			}, nil
		}
		g.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (g *GCPIAM) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

func (g *GCPIAM) sleep(ctx context.Context, d time.Duration) error {
	if g.Sleep != nil {
		return g.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
