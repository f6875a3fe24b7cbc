// Package gauth mints the bearer tokens the runner and the operator commands send to the control
// plane, and holds the one transport that sends them only to the configured server.
package gauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"google.golang.org/api/idtoken"

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
)

// TokenFunc returns a bearer token for one request. A nil TokenFunc means unauthenticated.
type TokenFunc func(ctx context.Context) (string, error)

// DiscoveryTimeout bounds the discovery of Application Default Credentials, which may probe
// the network (the metadata server) when no credentials file is configured.
const DiscoveryTimeout = 10 * time.Second

// ErrNoCredentials reports that Application Default Credentials could not be found.
var ErrNoCredentials = errors.New("no Google Application Default Credentials")

// IDTokenFunc returns a TokenFunc minting Google OIDC ID tokens for audience from Application
// Default Credentials. An empty audience returns nil, nil without looking at any credentials:
// authentication is opt-in, so a token-less environment never probes ambient credentials.
func IDTokenFunc(audience string) (TokenFunc, error) {
	if audience == "" {
		return nil, nil
	}
	type result struct {
		ts  oauth2.TokenSource
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The context given to NewTokenSource is kept for later token refreshes, so it must
		// not be the bounded discovery context.
		ts, err := idtoken.NewTokenSource(context.Background(), audience)
		if err == nil {
			// Mint one token now: credentials that cannot produce a token (a metadata server
			// that is not there, a revoked key) are as unavailable as missing ones, and the
			// caller decides at start-up, not on every request.
			ts = oauth2.ReuseTokenSource(nil, ts)
			_, err = ts.Token()
		}
		done <- result{ts, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(DiscoveryTimeout):
		return nil, fmt.Errorf("%w for audience %q: discovery timed out after %s", ErrNoCredentials, audience, DiscoveryTimeout)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w for audience %q: %v", ErrNoCredentials, audience, r.err)
	}
	return FromTokenSource(r.ts), nil
}

// FromTokenSource adapts an oauth2.TokenSource (whose Token has no context) to a TokenFunc
// that gives up when ctx ends.
func FromTokenSource(ts oauth2.TokenSource) TokenFunc {
	return func(ctx context.Context) (string, error) {
		type result struct {
			tok *oauth2.Token
			err error
		}
		done := make(chan result, 1)
		go func() {
			tok, err := ts.Token()
			done <- result{tok, err}
		}()
		select {
		case r := <-done:
			if r.err != nil {
				return "", r.err
			}
			if r.tok == nil || r.tok.AccessToken == "" {
				return "", errors.New("token source returned an empty token")
			}
			return r.tok.AccessToken, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// Static returns a TokenFunc that always returns token (for static server tokens).
func Static(token string) TokenFunc {
	if token == "" {
		return nil
	}
	return func(context.Context) (string, error) { return token, nil }
}

// ParseServerURL checks a control plane's base URL: http or https, a host, and no credentials,
// query or fragment (a bearer token goes to exactly this origin).
func ParseServerURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("server URL %q is malformed: %w", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("server URL %q: scheme must be http or https", raw)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("server URL %q has no host", raw)
	case u.User != nil:
		return nil, fmt.Errorf("server URL %q must not carry credentials", raw)
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("server URL %q must not have a query or fragment", raw)
	}
	return u, nil
}

// SameOrigin reports whether two URLs share scheme and host (port included).
func SameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Host, b.Host)
}

// Transport sets the User-Agent on every request and, for requests to Origin only, a bearer
// token from Token: a token never reaches another host, whatever the request names.
type Transport struct {
	// Origin is the control plane's base URL.
	Origin *url.URL
	// Token mints the bearer token (nil: requests go unauthenticated).
	Token TokenFunc
	// Next sends the request.
	Next http.RoundTripper
}

// RoundTrip sends a copy of req with the headers set; a token that cannot be minted fails the
// request with a *TokenError before anything is sent.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set("User-Agent", buildinfo.UserAgent())
	r.Header.Del("Authorization")
	if t.Token != nil && SameOrigin(t.Origin, r.URL) {
		tok, err := t.Token(r.Context())
		if err != nil {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, &TokenError{Err: err}
		}
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	return t.Next.RoundTrip(r)
}

// TokenError is a failure to mint a bearer token: local, not the server's.
type TokenError struct{ Err error }

func (e *TokenError) Error() string { return "minting a bearer token: " + e.Err.Error() }

// Unwrap returns the cause.
func (e *TokenError) Unwrap() error { return e.Err }
