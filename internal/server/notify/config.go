// Package notify sends the control plane's notifications: the events the server's `notify`
// blocks subscribe to (a plan waiting for approval, an approval, an apply's end, drift, a stale
// execution), as webhooks signed the way GitHub signs its own (HMAC-SHA256 of the body) or as
// Slack messages. Events are written to the store's outbox in the transaction of the change they
// report (Deliveries renders them); a Worker sends them, at least once.
package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
)

// Event names.
const (
	GateWaiting    = "gate.waiting"
	GateApproved   = "gate.approved"
	ApplySucceeded = "apply.succeeded"
	ApplyFailed    = "apply.failed"
	ApplyDenied    = "apply.denied"
	DriftDetected  = "drift.detected"
	DriftResolved  = "drift.resolved"
	ExecutionStale = "execution.stale"
)

// Events lists every event name, in the order the documentation gives them.
var Events = []string{GateWaiting, GateApproved, ApplySucceeded, ApplyFailed, ApplyDenied, DriftDetected, DriftResolved, ExecutionStale}

// Formats of a target's requests.
const (
	FormatJSON  = "json"
	FormatSlack = "slack"
)

// Block is one `notify "name" { ... }` block of the server's policy file, as written.
type Block struct {
	Name         string   `hcl:"name,label"`
	URL          string   `hcl:"url"`
	SecretEnv    string   `hcl:"secret_env"`
	Events       []string `hcl:"events,optional"`
	Environments []string `hcl:"environments,optional"`
	Repositories []string `hcl:"repositories,optional"`
	Format       string   `hcl:"format,optional"`
}

// Target is one configured receiver. Its secret is read from the server's environment when the
// policy is loaded; no method of Target prints it.
type Target struct {
	// Name is the block's label.
	Name string
	// URL receives the POSTs; it may itself be a secret (a Slack incoming webhook's is), so it
	// is not logged or shown either.
	URL string
	// SecretEnv names the environment variable the secret came from.
	SecretEnv string
	// Events the target receives (every event when empty).
	Events []string
	// Environments and Repositories select the events (all when empty).
	Environments, Repositories []string
	// Format is FormatJSON or FormatSlack.
	Format string

	secret []byte
}

// String names the target without its secret or URL.
func (t Target) String() string { return "notify " + t.Name }

// GoString is String: %#v must not print the secret either.
func (t Target) GoString() string { return t.String() }

// LogValue is what slog logs of a target.
func (t Target) LogValue() slog.Value { return slog.StringValue(t.String()) }

// Wants reports whether the target receives event of repo's environment env.
func (t Target) Wants(event, repo, env string) bool {
	return (len(t.Events) == 0 || slices.Contains(t.Events, event)) &&
		(len(t.Environments) == 0 || slices.Contains(t.Environments, env)) &&
		(len(t.Repositories) == 0 || slices.Contains(t.Repositories, strings.ToLower(repo)))
}

// Sign returns the X-Tfstackplan-Signature-256 value of body: "sha256=" and the hex HMAC-SHA256
// of body keyed by the target's secret.
func (t Target) Sign(body []byte) string { return Signature(t.secret, body) }

// Signature is "sha256=" and the hex HMAC-SHA256 of body keyed by secret.
func Signature(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether signature is body's signature under secret (a receiver's check, in
// constant time).
func Verify(secret, body []byte, signature string) bool {
	return hmac.Equal([]byte(Signature(secret, body)), []byte(signature))
}

// WithSecret returns t keyed by secret (tests and benchmarks build targets with it).
func (t Target) WithSecret(secret []byte) Target {
	t.secret = slices.Clone(secret)
	return t
}

// Parse checks the notify blocks of policy file filename and reads each one's secret with
// getenv. A secret missing from the environment is an error naming the variable, never a value.
func Parse(filename string, blocks []Block, getenv func(string) string) ([]Target, error) {
	out := make([]Target, 0, len(blocks))
	seen := map[string]bool{}
	for _, b := range blocks {
		where := fmt.Sprintf("policy %s: notify %q", filename, b.Name)
		switch {
		case b.Name == "" || strings.ContainsFunc(b.Name, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return nil, fmt.Errorf("policy %s: notify %q: the name must be non-empty, without spaces or control characters", filename, b.Name)
		case seen[b.Name]:
			return nil, fmt.Errorf("%s is defined twice", where)
		}
		seen[b.Name] = true
		if err := checkURL(b.URL); err != nil {
			return nil, fmt.Errorf("%s: url: %w", where, err)
		}
		if b.SecretEnv == "" {
			return nil, fmt.Errorf("%s: secret_env is required: the environment variable holding the HMAC key", where)
		}
		secret := getenv(b.SecretEnv)
		if secret == "" {
			return nil, fmt.Errorf("%s: secret_env %s is not set in the server's environment (or is empty): set it to the webhook's HMAC key", where, b.SecretEnv)
		}
		for _, e := range b.Events {
			if !slices.Contains(Events, e) {
				return nil, fmt.Errorf("%s: event %q is not one of %s", where, e, strings.Join(Events, ", "))
			}
		}
		format := b.Format
		if format == "" {
			format = FormatJSON
		}
		if format != FormatJSON && format != FormatSlack {
			return nil, fmt.Errorf("%s: format %q is not %q or %q", where, b.Format, FormatJSON, FormatSlack)
		}
		repos := make([]string, len(b.Repositories))
		for i, r := range b.Repositories {
			repos[i] = strings.ToLower(r)
		}
		out = append(out, Target{Name: b.Name, URL: b.URL, SecretEnv: b.SecretEnv, Events: b.Events, Environments: b.Environments,
			Repositories: repos, Format: format, secret: []byte(secret)})
	}
	return out, nil
}

// checkURL accepts https URLs, and http ones on a loopback host. Its errors do not repeat the
// URL, which may carry a secret.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL")
	}
	if u.Host == "" || u.User != nil {
		return fmt.Errorf("want https://host/path (without user information)")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if isLoopbackHost(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("http:// is allowed only on a loopback host (127.0.0.1, ::1, localhost); use https://")
	default:
		return fmt.Errorf("scheme %q: want https", u.Scheme)
	}
}

func isLoopbackHost(h string) bool {
	if ip := net.ParseIP(h); ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(h, "localhost")
}
