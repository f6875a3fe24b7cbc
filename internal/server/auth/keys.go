package auth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

const (
	// defaultKeysTimeout bounds one key-set fetch. go-oidc runs the fetch on a context detached
	// from the request (the request only stops waiting), so without it a hung fetch would block
	// every later refetch.
	defaultKeysTimeout = 10 * time.Second
	// defaultRefetchInterval is the least time between key-set fetches. go-oidc refetches the
	// key set whenever a token's kid is unknown or its signature fails, deduplicating only
	// concurrent fetches, so a stream of tokens with made-up kids would otherwise turn into a
	// stream of requests to the issuer. Issuers publish new keys well before signing with them.
	defaultRefetchInterval = 10 * time.Second
	// clockSkew is how far in the future iat may be, matching go-oidc's leeway for nbf.
	clockSkew = 5 * time.Minute
	// maxVerifiedTokens bounds the tokens verify remembers.
	maxVerifiedTokens = 1024
	// defaultKeysMaxAge is how long a fetched key set is trusted. go-oidc refetches only for an
	// unknown kid, so without an age a key the issuer withdrew (rotated out, or compromised)
	// would stay trusted for the life of the server; Google's own answer allows caching for
	// hours.
	defaultKeysMaxAge = time.Hour
)

// rotatingKeys is an oidc.KeySet on an issuer's JWKS: fetched on the first signature to check,
// fetched again for an unknown kid at most once per limiter interval, and dropped once maxAge
// old, so that the next signature fetches it anew.
type rotatingKeys struct {
	// url returns the JWKS URL: fixed, or found by discovery on first use.
	url func(ctx context.Context) (string, error)
	// fetchCtx carries the client that fetches the keys.
	fetchCtx context.Context
	limiter  *refetchLimiter
	maxAge   time.Duration
	now      func() time.Time

	mu        sync.Mutex
	keys      *oidc.RemoteKeySet
	keysURL   string    // what keys fetches
	keysSince time.Time // when keys was made

	verifiedMu sync.Mutex
	verified   map[[32]byte]verifiedToken // by SHA-256 of the token
}

// verifiedToken is a token that verify accepted. Until the token expires, its key set ages out
// or a key set is fetched again, verifying it anew would give the same answer, so verify gives
// that answer without the signature check (a job sends one token with many requests; the check
// is most of a GitHub token's cost). A fetch counts from when it starts, so a token verified
// by the keys that a fetch under way replaces stays remembered until the next fetch (or its
// expiry, or its key set's age).
type verifiedToken struct {
	idt      *oidc.IDToken
	audience string
	fetches  uint64    // the limiter's count of fetches when the verification began
	keysDue  time.Time // when the key set that verified it ages out, on the clock now
}

// newRotatingKeys returns keys fetched with a copy of client (nil: a default one); the copy's
// transport is wrapped with the refetch limit, and a zero Timeout becomes defaultKeysTimeout.
func newRotatingKeys(ctx context.Context, client *http.Client, url func(context.Context) (string, error)) rotatingKeys {
	c := copyClient(client)
	limiter := &refetchLimiter{next: c.Transport, interval: defaultRefetchInterval}
	if limiter.next == nil {
		limiter.next = http.DefaultTransport
	}
	c.Transport = limiter
	return rotatingKeys{
		url:      url,
		fetchCtx: oidc.ClientContext(ctx, c),
		limiter:  limiter,
		maxAge:   defaultKeysMaxAge,
		now:      time.Now,
	}
}

// copyClient returns a copy of c (nil: an empty client) whose zero Timeout is
// defaultKeysTimeout.
func copyClient(c *http.Client) *http.Client {
	out := &http.Client{}
	if c != nil {
		*out = *c
	}
	if out.Timeout == 0 {
		out.Timeout = defaultKeysTimeout
	}
	return out
}

// VerifySignature checks jwt's signature with the current key set.
func (k *rotatingKeys) VerifySignature(ctx context.Context, jwt string) ([]byte, error) {
	url, err := k.url(ctx)
	if err != nil {
		return nil, err
	}
	return k.current(url).VerifySignature(ctx, jwt)
}

// current returns the key set of url, younger than maxAge.
func (k *rotatingKeys) current(url string) *oidc.RemoteKeySet {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now := k.now(); k.keys == nil || k.keysURL != url || now.Sub(k.keysSince) >= k.maxAge {
		k.keys, k.keysURL, k.keysSince = oidc.NewRemoteKeySet(k.fetchCtx, url), url, now
		// The new set holds no keys until it fetches: its first fetch must not wait out a
		// refetch that a made-up kid spent on the old set, or every token would be refused.
		k.limiter.mu.Lock()
		k.limiter.last = time.Time{}
		k.limiter.mu.Unlock()
	}
	return k.keys
}

// verify checks token with go-oidc (an RS256 signature by one of the keys, iss exactly issuer,
// aud holding audience, exp in the future, nbf not in the future) and then what go-oidc leaves
// out: aud is exactly audience, and iat is present and not in the future.
func (k *rotatingKeys) verify(ctx context.Context, issuer, token, audience string) (*oidc.IDToken, error) {
	if audience == "" {
		return nil, errors.New("no audience to validate the ID token for")
	}
	sum := sha256.Sum256([]byte(token))
	if idt := k.remembered(sum, audience); idt != nil {
		return idt, nil
	}
	fetches := k.limiter.fetches.Load()
	idt, err := oidc.NewVerifier(issuer, k, &oidc.Config{
		ClientID:             audience,
		SupportedSigningAlgs: []string{oidc.RS256},
	}).Verify(ctx, token)
	if err != nil {
		return nil, err
	}
	var claims struct {
		Aud json.RawMessage `json:"aud"`
	}
	if err := idt.Claims(&claims); err != nil {
		return nil, fmt.Errorf("ID token claims: %w", err)
	}
	// go-oidc accepts a list of audiences that contains ours; the issuers issue a single string,
	// and a token meant for several parties is not one to accept.
	var aud string
	if err := json.Unmarshal(claims.Aud, &aud); err != nil || aud != audience {
		return nil, fmt.Errorf("ID token aud is %s, want exactly %q", claims.Aud, audience)
	}
	if idt.IssuedAt.IsZero() {
		return nil, errors.New("ID token has no iat")
	}
	if idt.IssuedAt.After(k.now().Add(clockSkew)) {
		return nil, fmt.Errorf("ID token iat %s is in the future", idt.IssuedAt.UTC().Format(time.RFC3339))
	}
	k.remember(sum, verifiedToken{idt: idt, audience: audience, fetches: fetches})
	return idt, nil
}

// remembered returns the token of sum if verify accepted it for audience and the answer
// still holds.
func (k *rotatingKeys) remembered(sum [32]byte, audience string) *oidc.IDToken {
	k.verifiedMu.Lock()
	defer k.verifiedMu.Unlock()
	v, ok := k.verified[sum]
	if !ok || v.audience != audience || !k.holds(v) {
		return nil
	}
	return v.idt
}

// holds reports whether verifying v's token anew would still accept it.
func (k *rotatingKeys) holds(v verifiedToken) bool {
	return v.fetches == k.limiter.fetches.Load() && !time.Now().After(v.idt.Expiry) && k.now().Before(v.keysDue)
}

// remember records v, first dropping the answers that no longer hold, or all of them when
// maxVerifiedTokens still do.
func (k *rotatingKeys) remember(sum [32]byte, v verifiedToken) {
	k.mu.Lock()
	v.keysDue = k.keysSince.Add(k.maxAge)
	k.mu.Unlock()
	k.verifiedMu.Lock()
	defer k.verifiedMu.Unlock()
	if len(k.verified) >= maxVerifiedTokens {
		maps.DeleteFunc(k.verified, func(_ [32]byte, old verifiedToken) bool { return !k.holds(old) })
		if len(k.verified) >= maxVerifiedTokens {
			clear(k.verified)
		}
	}
	if k.verified == nil {
		k.verified = map[[32]byte]verifiedToken{}
	}
	k.verified[sum] = v
}

// refetchLimiter lets at most one key-set request through per interval and fails the others
// without touching the network; go-oidc then keeps its cached keys.
type refetchLimiter struct {
	next     http.RoundTripper
	interval time.Duration

	// fetches counts the fetches let through.
	fetches atomic.Uint64

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
	l.fetches.Add(1)
	l.mu.Unlock()
	return l.next.RoundTrip(r)
}
