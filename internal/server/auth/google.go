package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// GoogleKeysURL is the JWKS of the keys Google signs ID tokens with.
const GoogleKeysURL = "https://www.googleapis.com/oauth2/v3/certs"

// googleIssuer is the issuer the verifier is built for. go-oidc also accepts the scheme-less
// "accounts.google.com" for exactly this issuer (Google still issues both forms) and no other
// spelling, which is the set Google documents.
const googleIssuer = "https://accounts.google.com"

const (
	// defaultKeysTimeout bounds one key-set fetch. go-oidc runs the fetch on a context detached
	// from the request (the request only stops waiting), so without it a hung fetch would block
	// every later refetch.
	defaultKeysTimeout = 10 * time.Second
	// defaultRefetchInterval is the least time between key-set fetches. go-oidc refetches the
	// key set whenever a token's kid is unknown or its signature fails, deduplicating only
	// concurrent fetches, so a stream of tokens with made-up kids would otherwise turn into a
	// stream of requests to Google. Google publishes new keys well before signing with them.
	defaultRefetchInterval = 10 * time.Second
	// clockSkew is how far in the future iat may be, matching go-oidc's leeway for nbf.
	clockSkew = 5 * time.Minute
	// defaultKeysMaxAge is how long a fetched key set is trusted. go-oidc refetches only for an
	// unknown kid, so without an age a key Google withdrew (rotated out, or compromised) would
	// stay trusted for the life of the server; Google's own answer allows caching for hours.
	defaultKeysMaxAge = time.Hour
)

// GoogleClaims are the verified claims of a Google ID token.
type GoogleClaims struct {
	// Email is the email claim ("" when absent or not a string).
	Email string
	// EmailVerified is true only when the email_verified claim is the JSON boolean true.
	EmailVerified bool
	// Subject is the sub claim: Google's stable account ID.
	Subject string
	// Issuer is the iss claim: "https://accounts.google.com" or "accounts.google.com".
	Issuer string
	// Audience is the aud claim, equal to the audience the token was validated for.
	Audience string
	// IssuedAt and Expires are the iat and exp claims.
	IssuedAt, Expires time.Time
}

// GoogleValidatorOptions configure NewGoogleValidator.
type GoogleValidatorOptions struct {
	// KeysURL is the JWKS to verify signatures with (default GoogleKeysURL).
	KeysURL string
	// Client fetches the keys (default: a client with a 10s timeout). It is copied, not
	// modified: the copy's transport is wrapped with the refetch limit, and a zero Timeout
	// becomes 10s.
	Client *http.Client
}

// GoogleValidator verifies Google ID tokens: RS256 signature by a key in the JWKS, iss
// https://accounts.google.com or accounts.google.com, aud exactly the requested audience, exp
// in the future, nbf and iat not in the future. It is safe for concurrent use.
type GoogleValidator struct {
	limiter *refetchLimiter
	// newKeys returns a fresh key set, with nothing fetched yet.
	newKeys func() *oidc.RemoteKeySet
	maxAge  time.Duration
	now     func() time.Time

	mu        sync.Mutex
	keys      *oidc.RemoteKeySet
	keysSince time.Time                        // when keys was made
	verifiers map[string]*oidc.IDTokenVerifier // by audience, on keys
}

// NewGoogleValidator returns a validator that fetches keys lazily, on the first token it
// verifies; constructing it makes no request.
func NewGoogleValidator(ctx context.Context, opts GoogleValidatorOptions) (*GoogleValidator, error) {
	keysURL := opts.KeysURL
	if keysURL == "" {
		keysURL = GoogleKeysURL
	}
	u, err := url.Parse(keysURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("google ID token keys URL %q: want an absolute http(s) URL", keysURL)
	}
	client := &http.Client{Timeout: defaultKeysTimeout}
	if opts.Client != nil {
		c := *opts.Client
		if c.Timeout == 0 {
			c.Timeout = defaultKeysTimeout
		}
		client = &c
	}
	next := client.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	limiter := &refetchLimiter{next: next, interval: defaultRefetchInterval}
	client.Transport = limiter
	keysCtx := oidc.ClientContext(ctx, client)
	return &GoogleValidator{
		limiter: limiter,
		newKeys: func() *oidc.RemoteKeySet { return oidc.NewRemoteKeySet(keysCtx, keysURL) },
		maxAge:  defaultKeysMaxAge,
		now:     time.Now,
	}, nil
}

// Validate verifies token for audience and returns its claims. ctx bounds the wait for keys.
func (v *GoogleValidator) Validate(ctx context.Context, token, audience string) (*GoogleClaims, error) {
	if audience == "" {
		return nil, errors.New("no audience to validate the ID token for")
	}
	idt, err := v.verifier(audience).Verify(ctx, token)
	if err != nil {
		return nil, err
	}
	var extra struct {
		Aud           json.RawMessage `json:"aud"`
		Email         any             `json:"email"`
		EmailVerified any             `json:"email_verified"`
	}
	if err := idt.Claims(&extra); err != nil {
		return nil, fmt.Errorf("ID token claims: %w", err)
	}
	// go-oidc accepts a list of audiences that contains ours; Google issues a single string, and
	// a token meant for several parties is not one to accept.
	var aud string
	if err := json.Unmarshal(extra.Aud, &aud); err != nil || aud != audience {
		return nil, fmt.Errorf("ID token aud is %s, want exactly %q", extra.Aud, audience)
	}
	if idt.IssuedAt.IsZero() {
		return nil, errors.New("ID token has no iat")
	}
	if now := v.now(); idt.IssuedAt.After(now.Add(clockSkew)) {
		return nil, fmt.Errorf("ID token iat %s is in the future", idt.IssuedAt.UTC().Format(time.RFC3339))
	}
	email, _ := extra.Email.(string)
	verified, _ := extra.EmailVerified.(bool)
	return &GoogleClaims{
		Email:         email,
		EmailVerified: verified,
		Subject:       idt.Subject,
		Issuer:        idt.Issuer,
		Audience:      aud,
		IssuedAt:      idt.IssuedAt,
		Expires:       idt.Expiry,
	}, nil
}

// verifier returns the verifier for audience, on a key set younger than maxAge: an older one is
// dropped, and the next token fetches the keys anew.
func (v *GoogleValidator) verifier(audience string) *oidc.IDTokenVerifier {
	v.mu.Lock()
	defer v.mu.Unlock()
	if now := v.now(); v.keys == nil || now.Sub(v.keysSince) >= v.maxAge {
		v.keys, v.keysSince = v.newKeys(), now
		v.verifiers = map[string]*oidc.IDTokenVerifier{}
		// The new set holds no keys until it fetches: its first fetch must not wait out a
		// refetch that a made-up kid spent on the old set, or every token would be refused.
		v.limiter.mu.Lock()
		v.limiter.last = time.Time{}
		v.limiter.mu.Unlock()
	}
	vf, ok := v.verifiers[audience]
	if !ok {
		vf = oidc.NewVerifier(googleIssuer, v.keys, &oidc.Config{
			ClientID:             audience,
			SupportedSigningAlgs: []string{"RS256"},
		})
		v.verifiers[audience] = vf
	}
	return vf
}

// refetchLimiter lets at most one key-set request through per interval and fails the others
// without touching the network; go-oidc then keeps its cached keys.
type refetchLimiter struct {
	next     http.RoundTripper
	interval time.Duration

	mu   sync.Mutex
	last time.Time
}

// RoundTrip forwards r unless a fetch went through less than interval ago. A redirect's
// request (r.Response set) is part of the fetch that was let through.
func (l *refetchLimiter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Response != nil {
		return l.next.RoundTrip(r)
	}
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < l.interval {
		wait := l.interval - now.Sub(l.last)
		l.mu.Unlock()
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, fmt.Errorf("not refetching the key set: last fetch was under %s ago (next allowed in %s)", l.interval, wait.Round(time.Millisecond))
	}
	l.last = now
	l.mu.Unlock()
	return l.next.RoundTrip(r)
}
