// Package gauth mints the bearer tokens the runner and the operator commands send to the control
// plane, and holds the one transport that sends them only to the configured server.
package gauth

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"cloud.google.com/go/auth"
	"cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/compute/metadata"

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
	"github.com/tfstackplan/tfstackplan/internal/gcreds"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
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
//
// Credentials are found as Google's libraries find them (GOOGLE_APPLICATION_CREDENTIALS, the
// gcloud well-known file, the metadata server) and must be able to mint ID tokens: a
// service_account key, an impersonated_service_account, an external_account that impersonates a
// service account, or the metadata server. One token is minted before IDTokenFunc returns (within
// DiscoveryTimeout), so unusable credentials fail here, wrapped in ErrNoCredentials. A token is
// then reused until a minute (refreshEarly) before its exp claim; from then on the next call
// mints its replacement before returning, and fails if that fails rather than return the old
// token.
// Token requests (to token endpoints, credential_source URLs, IAM, the metadata server) follow
// no redirects, except those of credentials that sign in with a client certificate, which go
// through the mTLS client Google's library makes (see gcreds.X509Source).
func IDTokenFunc(audience string) (TokenFunc, error) {
	return minter{}.tokenFunc(audience)
}

const (
	cloudPlatformScope    = "https://www.googleapis.com/auth/cloud-platform"
	defaultTokenURL       = "https://oauth2.googleapis.com/token"
	defaultUniverseDomain = "googleapis.com"
	identitySuffix        = "instance/service-accounts/default/identity"
	metadataHostEnv       = "GCE_METADATA_HOST"
	defaultMetadataHost   = "169.254.169.254"
	// refreshEarly makes a cached ID token be replaced, by the call that finds it this close to
	// its expiry and before that call returns, while it still has a minute to live: the control
	// plane never receives one that expires in flight (requests take seconds). Kept short,
	// since a refresh that fails in this window fails its request.
	refreshEarly = time.Minute
	// requestTimeout bounds each request to a token endpoint or IAM.
	requestTimeout = 30 * time.Second
	// metadataTimeout bounds each request to the metadata server, as Google's library does.
	metadataTimeout = 5 * time.Second
	// maxTokenResponse caps how much of a token endpoint's answer is read.
	maxTokenResponse = 1 << 20
	// maxErrorExcerpt caps how much of a token endpoint's error body, or of a credential
	// library's error, an error message repeats.
	maxErrorExcerpt = 512
)

// minter turns Application Default Credentials into an ID-token provider. Its zero value talks
// to Google; tests point it at local servers.
type minter struct {
	// iamBase is the IAM Service Account Credentials API base URL; "" means
	// https://iamcredentials.<the credentials' universe domain>.
	iamBase string
	// client sends the requests to token endpoints, credential_source URLs, IAM and the
	// metadata server (not those of credentials with a client certificate: see sourceClient),
	// always refusing redirects (see httpClient and metadataHTTPClient); nil means a client
	// with requestTimeout for the first three and, for the metadata server, one of its own
	// with metadataTimeout that bypasses proxies.
	client *http.Client
}

// tokenFunc is IDTokenFunc with m's endpoints and HTTP client.
func (m minter) tokenFunc(audience string) (TokenFunc, error) {
	if audience == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), DiscoveryTimeout)
	defer cancel()
	type result struct {
		tp  auth.TokenProvider
		err error
	}
	done := make(chan result, 1)
	go func() {
		tp, err := m.provider(ctx, audience)
		if err == nil {
			// Mint one token now: credentials that cannot produce a token (a metadata server
			// that is not there, a revoked key) are as unavailable as missing ones, and the
			// caller decides at start-up, not on every request.
			_, err = tp.Token(ctx)
		}
		done <- result{tp, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("%w for audience %q: %v", ErrNoCredentials, audience, r.err)
		}
		return fromProvider(r.tp), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w for audience %q: discovery timed out after %s", ErrNoCredentials, audience, DiscoveryTimeout)
	}
}

// provider finds the Application Default Credentials and returns a caching provider of ID
// tokens for audience built on them.
func (m minter) provider(ctx context.Context, audience string) (auth.TokenProvider, error) {
	// With our client, credentials with a client certificate are detected without their mTLS
	// client, which does not matter: fileProvider uses them for their universe domain only and
	// builds the ones that mint from the file again.
	creds, err := credentials.DetectDefault(&credentials.DetectOptions{
		Scopes: []string{cloudPlatformScope},
		Client: m.httpClient(),
	})
	if err != nil {
		return nil, err
	}
	var tp auth.TokenProvider
	if b := creds.JSON(); len(b) > 0 {
		if tp, err = m.fileProvider(ctx, b, creds, audience); err != nil {
			return nil, err
		}
	} else {
		// Only the metadata server's credentials come without a file, and their access tokens
		// are no ID tokens: the metadata server has an identity endpoint of its own.
		mc := metadata.NewClient(m.metadataHTTPClient())
		tp = &metadataIDTokenProvider{client: mc, audience: audience}
	}
	// The refresh is synchronous: by default the cache hands out the old token during the
	// ExpireEarly window while refreshing in the background, and keeps handing it out until it
	// expires if that refresh fails. fromProvider bounds a caller's wait on a blocking refresh.
	return auth.NewCachedTokenProvider(tp, &auth.CachedTokenProviderOptions{
		ExpireEarly:         refreshEarly,
		DisableAsyncRefresh: true,
	}), nil
}

// credentialsFile holds the fields of a credentials file that decide how an ID token is minted.
type credentialsFile struct {
	Type                           string          `json:"type"`
	ClientEmail                    string          `json:"client_email"`
	PrivateKey                     string          `json:"private_key"`
	PrivateKeyID                   string          `json:"private_key_id"`
	TokenURI                       string          `json:"token_uri"`
	TokenURL                       string          `json:"token_url"`
	ServiceAccountImpersonationURL string          `json:"service_account_impersonation_url"`
	Delegates                      []string        `json:"delegates"`
	SourceCredentials              json.RawMessage `json:"source_credentials"`
}

// fileProvider returns an uncached ID-token provider for the credentials file b, which creds
// (detected from it) holds.
func (m minter) fileProvider(ctx context.Context, b []byte, creds *auth.Credentials, audience string) (auth.TokenProvider, error) {
	var f credentialsFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("credentials file is not a JSON object: %w", err)
	}
	universe, err := creds.UniverseDomain(ctx)
	if err != nil {
		return nil, fmt.Errorf("universe domain of the %s credentials: %w", f.Type, err)
	}
	switch credentials.CredType(f.Type) {
	case credentials.ServiceAccount:
		if universe != defaultUniverseDomain {
			// Outside Google's default universe no OAuth endpoint mints ID tokens; Google's
			// library asks IAM instead, authenticated by the key's self-signed JWT, which is
			// what DetectDefault gives such a key.
			return m.iamProvider(ctx, universe, f.ClientEmail, nil, audience, creds, "service_account key (self-signed JWT)")
		}
		tokenURL := f.TokenURI
		if tokenURL == "" {
			tokenURL = defaultTokenURL
		}
		tp, err := auth.New2LOTokenProvider(&auth.Options2LO{
			Email:         f.ClientEmail,
			PrivateKey:    []byte(f.PrivateKey),
			PrivateKeyID:  f.PrivateKeyID,
			TokenURL:      tokenURL,
			UseIDToken:    true,
			PrivateClaims: map[string]any{"target_audience": audience},
			Client:        m.httpClient(),
		})
		if err != nil {
			return nil, fmt.Errorf("service_account key: %w", err)
		}
		return keyIDTokenProvider{tp: tp, tokenURL: tokenURL}, nil
	case credentials.ExternalAccount:
		if f.ServiceAccountImpersonationURL == "" {
			return nil, errors.New("external_account credentials without service_account_impersonation_url cannot mint ID tokens: only a service account can sign them")
		}
		target, err := impersonationTarget(f.ServiceAccountImpersonationURL)
		if err != nil {
			return nil, err
		}
		// The detected credentials already impersonate the target; generateIdToken needs the
		// federated identity's own access token, or it would impersonate the target twice.
		baseJSON, err := withoutField(b, "service_account_impersonation_url")
		if err != nil {
			return nil, err
		}
		base, err := credentials.NewCredentialsFromJSON(credentials.ExternalAccount, baseJSON, &credentials.DetectOptions{
			Scopes: []string{cloudPlatformScope},
			Client: m.sourceClient(b),
		})
		if err != nil {
			return nil, fmt.Errorf("external_account credentials without impersonation: %w", err)
		}
		stsURL := f.TokenURL
		if stsURL == "" {
			stsURL = "https://sts." + universe + "/v1/token"
		}
		return m.iamProvider(ctx, universe, target, nil, audience, base, "external_account credentials (token_url "+stsURL+")")
	case credentials.ImpersonatedServiceAccount:
		target, err := impersonationTarget(f.ServiceAccountImpersonationURL)
		if err != nil {
			return nil, err
		}
		var source struct {
			Type string `json:"type"`
		}
		if len(f.SourceCredentials) == 0 || json.Unmarshal(f.SourceCredentials, &source) != nil || source.Type == "" {
			return nil, errors.New("impersonated_service_account credentials have no source_credentials object with a type")
		}
		base, err := credentials.NewCredentialsFromJSON(credentials.CredType(source.Type), f.SourceCredentials, &credentials.DetectOptions{
			Scopes: []string{cloudPlatformScope},
			Client: m.sourceClient(f.SourceCredentials),
		})
		if err != nil {
			return nil, fmt.Errorf("source_credentials of the impersonated_service_account: %w", err)
		}
		delegates := make([]string, 0, len(f.Delegates))
		for _, d := range f.Delegates {
			if !strings.HasPrefix(d, "projects/") {
				d = "projects/-/serviceAccounts/" + d
			}
			delegates = append(delegates, d)
		}
		return m.iamProvider(ctx, universe, target, delegates, audience, base, "source_credentials ("+source.Type+")")
	default:
		return nil, fmt.Errorf("%s credentials cannot mint ID tokens (usable: service_account, impersonated_service_account, external_account with service account impersonation, or the metadata server)", f.Type)
	}
}

// httpClient returns the client for requests to token endpoints, credential_source URLs and
// IAM: m.client, or one with requestTimeout, refusing redirects either way.
func (m minter) httpClient() *http.Client { return noRedirects(m.client, requestTimeout) }

// noRedirects returns a copy of client (nil: a client with timeout) that refuses redirects.
func noRedirects(client *http.Client, timeout time.Duration) *http.Client {
	c := http.Client{Timeout: timeout}
	if client != nil {
		c = *client
	}
	c.CheckRedirect = refuseRedirect
	return &c
}

// sourceClient is the client for the credentials JSON b's own token requests: httpClient, or
// none for credentials that sign in with a client certificate, for which Google's library
// makes its own mTLS client (see gcreds.X509Source).
func (m minter) sourceClient(b []byte) *http.Client {
	if gcreds.X509Source(b) {
		return nil
	}
	return m.httpClient()
}

// metadataTransport sends requests to the metadata server when minter.client is nil: never
// through a proxy (the server is link-local), with the dial and idle timeouts of Google's
// library.
var metadataTransport = &http.Transport{
	DialContext:     (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	IdleConnTimeout: 60 * time.Second,
}

// metadataHTTPClient returns the client for requests to the metadata server: m.client, or one
// with metadataTransport and metadataTimeout, refusing redirects and sending our User-Agent
// (the metadata library sets its own, which the transport replaces).
func (m minter) metadataHTTPClient() *http.Client {
	c := http.Client{Transport: metadataTransport, Timeout: metadataTimeout}
	if m.client != nil {
		c = *m.client
	}
	c.CheckRedirect = refuseRedirect
	c.Transport = userAgentTransport{next: c.Transport}
	return &c
}

// refuseRedirect makes an http.Client return a 3xx answer as it is, so a token request is never
// sent on to wherever a redirect points.
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// userAgentTransport sends each request with buildinfo.UserAgent as its User-Agent.
type userAgentTransport struct{ next http.RoundTripper }

func (t userAgentTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set("User-Agent", buildinfo.UserAgent())
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}

// iamProvider returns a provider calling IAM's generateIdToken for the service account email,
// authenticated by base's access tokens and billed to base's quota project if it has one;
// baseDesc names base in errors.
func (m minter) iamProvider(ctx context.Context, universe, email string, delegates []string, audience string, base *auth.Credentials, baseDesc string) (auth.TokenProvider, error) {
	if email == "" {
		return nil, errors.New("no service account email to mint ID tokens for")
	}
	quotaProject, err := base.QuotaProjectID(ctx)
	if err != nil {
		return nil, fmt.Errorf("quota project of the %s: %w", baseDesc, boundError(err))
	}
	iamBase := m.iamBase
	if iamBase == "" {
		iamBase = "https://iamcredentials." + universe
	}
	body, err := json.Marshal(struct {
		Audience     string   `json:"audience"`
		IncludeEmail bool     `json:"includeEmail"`
		Delegates    []string `json:"delegates,omitempty"`
	}{audience, true, delegates})
	if err != nil {
		return nil, err
	}
	return &iamIDTokenProvider{
		endpoint:     strings.TrimSuffix(iamBase, "/") + "/v1/projects/-/serviceAccounts/" + url.PathEscape(email) + ":generateIdToken",
		body:         body,
		base:         base,
		baseDesc:     baseDesc,
		quotaProject: quotaProject,
		client:       m.httpClient(),
	}, nil
}

// impersonationTarget returns the service account a service_account_impersonation_url
// (".../serviceAccounts/EMAIL:generateAccessToken") names.
func impersonationTarget(impersonationURL string) (string, error) {
	const marker = "/serviceAccounts/"
	i := strings.LastIndex(impersonationURL, marker)
	if i < 0 {
		return "", fmt.Errorf("service_account_impersonation_url %q names no service account (want .../serviceAccounts/EMAIL:generateAccessToken)", impersonationURL)
	}
	email, _, _ := strings.Cut(impersonationURL[i+len(marker):], ":")
	if email == "" || strings.ContainsAny(email, "/?#") {
		return "", fmt.Errorf("service_account_impersonation_url %q names no service account (want .../serviceAccounts/EMAIL:generateAccessToken)", impersonationURL)
	}
	return email, nil
}

// withoutField returns the JSON object b without its field key.
func withoutField(b []byte, key string) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("credentials file is not a JSON object: %w", err)
	}
	delete(obj, key)
	return json.Marshal(obj)
}

// keyIDTokenProvider mints ID tokens with a service account key: a JWT assertion carrying
// target_audience, exchanged at the key's token endpoint.
type keyIDTokenProvider struct {
	tp       auth.TokenProvider
	tokenURL string
}

// Token exchanges a fresh assertion for an ID token.
func (p keyIDTokenProvider) Token(ctx context.Context) (*auth.Token, error) {
	t, err := p.tp.Token(ctx)
	if ae := (*auth.Error)(nil); errors.As(err, &ae) {
		return nil, fmt.Errorf("service_account key: %w", boundError(err)) // names the endpoint
	} else if err != nil {
		return nil, fmt.Errorf("token endpoint %s: %w", p.tokenURL, boundError(err))
	}
	return idToken(t.Value, "token endpoint "+p.tokenURL)
}

// iamIDTokenProvider mints ID tokens with IAM's generateIdToken.
type iamIDTokenProvider struct {
	endpoint string
	body     []byte
	base     auth.TokenProvider
	baseDesc string
	// quotaProject, if not "", goes in X-Goog-User-Project.
	quotaProject string
	client       *http.Client
}

// Token asks generateIdToken for an ID token, authenticated by an access token of the base
// credentials.
func (p *iamIDTokenProvider) Token(ctx context.Context) (*auth.Token, error) {
	access, err := p.base.Token(ctx)
	if err != nil {
		return nil, fmt.Errorf("getting an access token from the %s: %w", p.baseDesc, boundError(err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.endpoint, bytes.NewReader(p.body))
	if err != nil {
		return nil, fmt.Errorf("generateIdToken endpoint %s: %w", p.endpoint, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+access.Value)
	req.Header.Set("User-Agent", buildinfo.UserAgent())
	if p.quotaProject != "" {
		req.Header.Set("X-Goog-User-Project", p.quotaProject)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("generateIdToken endpoint %s: %w", p.endpoint, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse))
	if err != nil {
		return nil, fmt.Errorf("generateIdToken endpoint %s: reading the answer: %w", p.endpoint, err)
	}
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		return nil, fmt.Errorf("generateIdToken endpoint %s answered %s (redirects are not followed): %s", p.endpoint, resp.Status, textfit.Excerpt(body, maxErrorExcerpt))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("generateIdToken endpoint %s answered %s: %s", p.endpoint, resp.Status, textfit.Excerpt(body, maxErrorExcerpt))
	}
	var answer struct {
		Token string `json:"token"`
	}
	// A successful answer carries a token, so its body never goes into an error.
	if json.Unmarshal(body, &answer) != nil || answer.Token == "" {
		return nil, fmt.Errorf("generateIdToken endpoint %s answered %s without a token", p.endpoint, resp.Status)
	}
	return idToken(answer.Token, "generateIdToken endpoint "+p.endpoint)
}

// metadataIDTokenProvider mints ID tokens with the metadata server's identity endpoint.
type metadataIDTokenProvider struct {
	client   *metadata.Client
	audience string
}

// Token asks the metadata server for an ID token of the instance's default service account.
func (p *metadataIDTokenProvider) Token(ctx context.Context) (*auth.Token, error) {
	host := os.Getenv(metadataHostEnv)
	if host == "" {
		host = defaultMetadataHost
	}
	endpoint := "http://" + host + "/computeMetadata/v1/" + identitySuffix
	q := url.Values{"audience": {p.audience}, "format": {"full"}}
	tok, err := p.client.GetWithContext(ctx, identitySuffix+"?"+q.Encode())
	var me *metadata.Error
	switch {
	case errors.As(err, &me):
		return nil, fmt.Errorf("metadata server %s answered %d: %s", endpoint, me.Code, textfit.Excerpt([]byte(me.Message), maxErrorExcerpt))
	case err != nil:
		return nil, fmt.Errorf("metadata server %s: %w", endpoint, boundError(err))
	}
	return idToken(strings.TrimSpace(tok), "metadata server "+endpoint)
}

// idToken wraps an ID token minted by source, its expiry read from the token's exp claim.
func idToken(value, source string) (*auth.Token, error) {
	if value == "" {
		return nil, fmt.Errorf("%s returned an empty ID token", source)
	}
	exp, err := jwtExpiry(value)
	if err != nil {
		return nil, fmt.Errorf("the ID token from %s is unusable: %w", source, err)
	}
	return &auth.Token{Value: value, Type: "Bearer", Expiry: exp}, nil
}

// jwtExpiry returns the exp claim of a JWT, read without verifying the signature: the token is
// only sent on, and its issuer is the one that checks it.
func jwtExpiry(token string) (time.Time, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, fmt.Errorf("it is not a JWT (%d dot-separated parts, want 3)", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, fmt.Errorf("its JWT payload is not base64url: %w", err)
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, fmt.Errorf("its JWT payload is not a JSON object of claims: %w", err)
	}
	if claims.Exp == "" {
		return time.Time{}, errors.New("its JWT has no exp claim")
	}
	exp, err := claims.Exp.Float64()
	if err != nil || exp <= 0 {
		return time.Time{}, fmt.Errorf("its JWT exp claim %q is not a positive number of seconds", claims.Exp.String())
	}
	return time.Unix(int64(exp), 0), nil
}

// fromProvider adapts a token provider to a TokenFunc that gives up when ctx ends, even while
// another caller holds the provider's cache refreshing it.
func fromProvider(tp auth.TokenProvider) TokenFunc {
	return func(ctx context.Context) (string, error) {
		type result struct {
			tok *auth.Token
			err error
		}
		done := make(chan result, 1)
		go func() {
			tok, err := tp.Token(ctx)
			done <- result{tok, err}
		}()
		select {
		case r := <-done:
			if r.err != nil {
				return "", r.err
			}
			if r.tok == nil || r.tok.Value == "" {
				return "", errors.New("token provider returned an empty token")
			}
			return r.tok.Value, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// boundError rewrites a credential library's error for a message: an *auth.Error's whole
// response body becomes its endpoint, status and an excerpt, and any other text is cut to
// maxErrorExcerpt. The cause stays reachable through errors.As and errors.Is.
func boundError(err error) error {
	var ae *auth.Error
	if errors.As(err, &ae) && ae.Response != nil {
		endpoint := "the token endpoint"
		if r := ae.Response.Request; r != nil && r.URL != nil {
			u := *r.URL
			u.User, u.RawQuery, u.Fragment = nil, "", ""
			endpoint = u.String()
		}
		return textfit.Wrap(fmt.Sprintf("%s answered %s: %s", endpoint, ae.Response.Status, textfit.Excerpt(ae.Body, maxErrorExcerpt)), err)
	}
	return textfit.Wrap(textfit.Excerpt([]byte(err.Error()), maxErrorExcerpt), err)
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
