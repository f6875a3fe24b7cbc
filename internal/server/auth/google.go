package auth

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// GoogleKeysURL is the JWKS of the keys Google signs ID tokens with.
const GoogleKeysURL = "https://www.googleapis.com/oauth2/v3/certs"

// googleIssuer is the issuer the verifier is built for. go-oidc also accepts the scheme-less
// "accounts.google.com" for exactly this issuer (Google still issues both forms) and no other
// spelling, which is the set Google documents.
const googleIssuer = "https://accounts.google.com"

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
	rotatingKeys
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
	fixed := func(context.Context) (string, error) { return keysURL, nil }
	return &GoogleValidator{newRotatingKeys(ctx, opts.Client, fixed)}, nil
}

// Validate verifies token for audience and returns its claims. ctx bounds the wait for keys.
func (v *GoogleValidator) Validate(ctx context.Context, token, audience string) (*GoogleClaims, error) {
	idt, err := v.verify(ctx, googleIssuer, token, audience)
	if err != nil {
		return nil, err
	}
	var extra struct {
		Email         any `json:"email"`
		EmailVerified any `json:"email_verified"`
	}
	if err := idt.Claims(&extra); err != nil {
		return nil, fmt.Errorf("ID token claims: %w", err)
	}
	email, _ := extra.Email.(string)
	verified, _ := extra.EmailVerified.(bool)
	return &GoogleClaims{
		Email:         email,
		EmailVerified: verified,
		Subject:       idt.Subject,
		Issuer:        idt.Issuer,
		Audience:      audience,
		IssuedAt:      idt.IssuedAt,
		Expires:       idt.Expiry,
	}, nil
}
