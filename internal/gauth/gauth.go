// Package gauth mints the bearer tokens the runner sends to the control plane.
package gauth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/oauth2"
	"google.golang.org/api/idtoken"
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
