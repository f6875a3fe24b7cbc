package granter

import (
	"cmp"
	"context"
	"crypto/tls"
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

	"cloud.google.com/go/auth"
	"cloud.google.com/go/auth/credentials"

	"github.com/tfstackplan/tfstackplan/internal/gcreds"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
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
// A concurrent modification (HTTP 409, IAM's answer to a stale etag) is re-read and retried; HTTP 429, 5xx and transport failures are retried with exponential backoff and
// jitter; all these within MaxAttempts and the context's deadline. Any other error, a malformed
// answer included, fails at once. Errors name the service account, the IAM method, the HTTP
// status and the message of Google's error answer.
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

	iam *iamClient

	mu   sync.Mutex
	busy map[string]chan struct{} // service accounts being changed, closed when done
}

// NewGCPIAM returns a GCPIAM using cfg; ctx serves only the construction. With no
// CredentialsFile it looks up Application Default Credentials now, which off Google Cloud may
// probe the metadata server; it gives up when ctx ends, though the lookup, which Google's
// library runs without a context, may go on in the background. The credentials' own token
// requests follow no redirects, except those of credentials that sign in with a client
// certificate (gcreds.X509Source) and of the metadata server's, which go through clients
// Google's library makes.
func NewGCPIAM(ctx context.Context, cfg GCPIAMConfig) (*GCPIAM, error) {
	endpoint := ""
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("granter gcp-iam: endpoint %q is not an absolute URL", cfg.Endpoint)
		}
		if u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("granter gcp-iam: endpoint %q has a query or fragment", cfg.Endpoint)
		}
		// Method paths are appended to the endpoint, which may or may not end in a slash.
		endpoint = strings.TrimSuffix(cfg.Endpoint, "/") + "/"
	}
	// Detection does not take ctx, and a file read or the metadata probe can outlast it: the
	// lookup runs aside, and a result that comes too late goes into the buffered channel and
	// is dropped with it.
	done := make(chan lookup, 1)
	go func() { done <- lookUp(ctx, cfg, endpoint == "") }()
	var r lookup
	select {
	case r = <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("granter gcp-iam: gave up looking up the credentials: %w", ctx.Err())
	}
	if r.err != nil {
		return nil, r.err
	}
	if endpoint == "" {
		endpoint = "https://iam." + r.universe + "/"
	}
	return &GCPIAM{iam: newIAMClient(endpoint, r.creds.TokenProvider, r.quotaProject)}, nil
}

// lookup is what NewGCPIAM needs to know of the credentials.
type lookup struct {
	creds        *auth.Credentials
	quotaProject string
	// universe is the credentials' universe domain, looked up only when asked for.
	universe string
	err      error
}

// lookUp loads the credentials cfg names with their quota project and, if withUniverse, their
// universe domain.
func lookUp(ctx context.Context, cfg GCPIAMConfig, withUniverse bool) lookup {
	creds, err := loadCredentials(cfg)
	if err != nil {
		return lookup{err: err}
	}
	quotaProject, err := creds.QuotaProjectID(ctx)
	if err != nil {
		return lookup{err: fmt.Errorf("granter gcp-iam: quota project of the credentials: %w", err)}
	}
	universe := ""
	if withUniverse {
		// IAM lives in the credentials' universe (googleapis.com unless they name another).
		if universe, err = creds.UniverseDomain(ctx); err != nil {
			return lookup{err: fmt.Errorf("granter gcp-iam: universe domain of the credentials: %w", err)}
		}
	}
	return lookup{creds: creds, quotaProject: quotaProject, universe: universe}
}

// loadCredentials returns the credentials cfg names: its CredentialsFile, or Application
// Default Credentials.
func loadCredentials(cfg GCPIAMConfig) (*auth.Credentials, error) {
	if cfg.CredentialsFile != "" {
		data, typ, err := readCredentialsFile(cfg.CredentialsFile)
		if err != nil {
			return nil, err
		}
		return credentialsFromJSON(typ, data, "credentials file "+cfg.CredentialsFile)
	}
	creds, err := credentials.DetectDefault(&credentials.DetectOptions{Scopes: []string{cloudPlatformScope}, Client: tokenClient()})
	if err != nil {
		return nil, fmt.Errorf("granter gcp-iam: application default credentials: %w", err)
	}
	if b := creds.JSON(); gcreds.X509Source(b) {
		// Detected with tokenClient, credentials with a client certificate lack the mTLS client
		// they need: loaded again without it.
		var f struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("granter gcp-iam: application default credentials: %w", err)
		}
		return credentialsFromJSON(credentials.CredType(f.Type), b, "application default credentials")
	}
	return creds, nil
}

// credentialsFromJSON loads the credentials JSON b of type typ, whose own token requests go
// through tokenClient unless they sign in with a client certificate (gcreds.X509Source); what
// names b in errors.
func credentialsFromJSON(typ credentials.CredType, b []byte, what string) (*auth.Credentials, error) {
	client := tokenClient()
	if gcreds.X509Source(b) {
		client = nil // Google's library makes the mTLS client
	}
	creds, err := credentials.NewCredentialsFromJSON(typ, b, &credentials.DetectOptions{Scopes: []string{cloudPlatformScope}, Client: client})
	if err != nil {
		return nil, fmt.Errorf("granter gcp-iam: %s: %w", what, err)
	}
	return creds, nil
}

// tokenTimeout bounds each request the credentials make for an access token.
const tokenTimeout = 30 * time.Second

// tokenClient returns the client for the credentials' own requests (token endpoints, STS,
// credential_source URLs, impersonation). It follows no redirect, which would re-post a signed
// assertion or a subject token to wherever it pointed, and gives each request tokenTimeout.
func tokenClient() *http.Client {
	return &http.Client{
		Timeout: tokenTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// readCredentialsFile reads a credentials file and its type, for the typed constructor, which
// loads only the type it is told.
func readCredentialsFile(path string) ([]byte, credentials.CredType, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("granter gcp-iam: credentials file: %w", err)
	}
	var f struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, "", fmt.Errorf("granter gcp-iam: credentials file %s: %w", path, err)
	}
	for _, t := range acceptedCredTypes {
		if f.Type == string(t) {
			return data, t, nil
		}
	}
	return nil, "", fmt.Errorf("granter gcp-iam: credentials file %s has type %q (accepted: %s, %s, %s, %s)", path, f.Type,
		credentials.ServiceAccount, credentials.AuthorizedUser, credentials.ExternalAccount, credentials.ImpersonatedServiceAccount)
}

// acceptedCredTypes are the credentials file types GCPIAMConfig.CredentialsFile may have.
var acceptedCredTypes = []credentials.CredType{
	credentials.ServiceAccount, credentials.AuthorizedUser, credentials.ExternalAccount, credentials.ImpersonatedServiceAccount,
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
	p, err := g.update(ctx, what, b.Requester, func(p *iamPolicy) bool {
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
	if !slices.ContainsFunc(p.Bindings, func(x *iamBinding) bool { return sameBinding(x, want) }) {
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
	_, err := g.update(ctx, "revoke lease "+b.LeaseID, b.Requester, func(p *iamPolicy) bool {
		n := len(p.Bindings)
		p.Bindings = slices.DeleteFunc(p.Bindings, func(x *iamBinding) bool { return isLease(x, title) })
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
	_, err := g.update(ctx, "remove expired leases", requester, func(p *iamPolicy) bool {
		removed = removed[:0]
		p.Bindings = slices.DeleteFunc(p.Bindings, func(x *iamBinding) bool {
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
func leaseBinding(b Binding) *iamBinding {
	desc := fmt.Sprintf("tfstackplan lease of environment %s to apply execution %s", b.Environment, b.LeaseID)
	if len(desc) > maxDescriptionLen {
		desc = strings.ToValidUTF8(desc[:maxDescriptionLen-3], "") + "..."
	}
	return &iamBinding{
		Role:    TokenCreatorRole,
		Members: []string{b.Member},
		Condition: &iamExpr{
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

func isLease(x *iamBinding, title string) bool {
	return x.Role == TokenCreatorRole && x.Condition != nil && x.Condition.Title == title
}

func sameBinding(x, y *iamBinding) bool {
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
func (g *GCPIAM) update(ctx context.Context, what, account string, edit func(*iamPolicy) bool) (*iamPolicy, error) {
	unlock, err := g.lock(ctx, account)
	if err != nil {
		return nil, fmt.Errorf("granter gcp-iam: %s on service account %s: %w", what, account, err)
	}
	defer unlock()
	maxAttempts := cmp.Or(g.MaxAttempts, DefaultMaxAttempts)
	for attempt := 1; ; attempt++ {
		call := "getIamPolicy"
		p, err := g.iam.getIamPolicy(ctx, account)
		if err == nil {
			if !edit(p) {
				return p, nil
			}
			// Version 3 keeps conditions; the etag makes the write fail if another writer
			// changed the policy since the read.
			p.Version = 3
			call = "setIamPolicy"
			p, err = g.iam.setIamPolicy(ctx, account, p)
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

// describe puts the HTTP status first in an IAM error answer, keeping the error to unwrap.
func describe(err error) error {
	var aerr *apiError
	if !errors.As(err, &aerr) {
		return err
	}
	msg := ""
	if aerr.Message != "" {
		msg = ": " + aerr.Message
	}
	hint := ""
	if aerr.Code == http.StatusForbidden {
		hint = " (the control plane's identity needs iam.serviceAccounts.getIamPolicy and setIamPolicy on the account, e.g. roles/iam.serviceAccountAdmin)"
	}
	return textfit.Wrap(fmt.Sprintf("HTTP %d %s%s%s", aerr.Code, http.StatusText(aerr.Code), msg, hint), err)
}

// retryable tells a failure worth a fresh read-modify-write: a concurrent modification, a
// throttle, a server error, or a broken connection (a write whose
// answer was lost is safe to redo, since every attempt starts from a fresh read).
func retryable(err error) bool {
	var aerr *apiError
	if errors.As(err, &aerr) {
		return aerr.Code == http.StatusConflict || aerr.Code == http.StatusTooManyRequests || aerr.Code >= 500
	}
	// Every failure of a round trip, a sign-in refused included, comes as a *url.Error, which
	// is itself a net.Error: only what it wraps tells a network failure.
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	// TLS failures are net.Errors too, and some are the same next time: a certificate the
	// client does not trust, or the server's alert refusing the client's certificate or access
	// (an alert such as internal_error from a front end may be gone on the next attempt).
	var verr *tls.CertificateVerificationError
	var oerr *net.OpError
	if errors.As(err, &verr) || errors.As(err, &oerr) && oerr.Op == "remote error" && permanentAlert(oerr.Err) {
		return false
	}
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, io.ErrUnexpectedEOF)
}

// permanentAlerts are the texts of the TLS alerts (crypto/tls gives them no exported type)
// that refuse the client's certificate or access: the same handshake meets them again.
var permanentAlerts = []string{
	"bad certificate", "unsupported certificate", "revoked certificate", "expired certificate",
	"unknown certificate", "unknown certificate authority", "access denied", "certificate required",
}

// permanentAlert reports whether err, the error of a TLS alert from the server, is one of
// permanentAlerts.
func permanentAlert(err error) bool {
	return err != nil && slices.Contains(permanentAlerts, strings.TrimPrefix(err.Error(), "tls: "))
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
