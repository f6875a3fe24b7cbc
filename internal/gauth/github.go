package gauth

import (
	"context"
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

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// Environment variables GitHub Actions sets in a job that may request OIDC tokens: one with
// `permissions: id-token: write`.
const (
	// EnvActionsTokenURL is the URL a job requests its OIDC tokens from.
	EnvActionsTokenURL = "ACTIONS_ID_TOKEN_REQUEST_URL"
	// EnvActionsRequestToken is the bearer token that authorizes those requests.
	EnvActionsRequestToken = "ACTIONS_ID_TOKEN_REQUEST_TOKEN"
)

// ErrNoGitHubToken reports that no GitHub Actions OIDC token could be obtained.
var ErrNoGitHubToken = errors.New("no GitHub Actions OIDC token")

const (
	// actionsRequestTimeout bounds each request to the Actions token endpoint.
	actionsRequestTimeout = 10 * time.Second
	// maxActionsAnswer caps how much of the token endpoint's answer is read: a token is a
	// couple of kilobytes.
	maxActionsAnswer = 64 << 10
)

// GitHubActionsTokenFunc returns a TokenFunc sending the job's GitHub Actions OIDC tokens,
// issued for audience: each is requested with GET $ACTIONS_ID_TOKEN_REQUEST_URL plus
// audience=AUDIENCE, authorized by $ACTIONS_ID_TOKEN_REQUEST_TOKEN (both read through getenv,
// os.Getenv when nil), and the answer's "value" is the token.
//
// The request token goes to the request URL's host only (https, or http to a loopback host), in
// requests that follow no redirects, each bounded to 10 s and its answer to 64 KiB. One token is
// obtained before GitHubActionsTokenFunc returns (within DiscoveryTimeout), so a job without
// `permissions: id-token: write` (GitHub then sets neither variable) or with an endpoint that
// does not answer fails here, wrapped in ErrNoGitHubToken. A token is reused until a minute
// before its exp claim, and then replaced by the call that finds it so, which fails if that
// fails rather than return the old token. No error repeats either token.
func GitHubActionsTokenFunc(audience string, getenv func(string) string) (TokenFunc, error) {
	return actionsMinter{}.tokenFunc(audience, getenv)
}

// actionsMinter obtains GitHub Actions OIDC tokens. Its zero value is what
// GitHubActionsTokenFunc uses; tests shorten its bounds.
type actionsMinter struct {
	// client sends the token requests, always refusing redirects; nil means a client with
	// actionsRequestTimeout.
	client *http.Client
	// discovery bounds obtaining the first token; 0 means DiscoveryTimeout.
	discovery time.Duration
}

// tokenFunc is GitHubActionsTokenFunc with m's client and bounds.
func (m actionsMinter) tokenFunc(audience string, getenv func(string) string) (TokenFunc, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%w for audience %q: %s", ErrNoGitHubToken, audience, fmt.Sprintf(format, a...))
	}
	if audience == "" {
		return nil, fail("no audience to request the token for")
	}
	rawURL, requestToken := strings.TrimSpace(getenv(EnvActionsTokenURL)), strings.TrimSpace(getenv(EnvActionsRequestToken))
	var missing []string
	if rawURL == "" {
		missing = append(missing, EnvActionsTokenURL)
	}
	if requestToken == "" {
		missing = append(missing, EnvActionsRequestToken)
	}
	if len(missing) > 0 {
		verb := "is"
		if len(missing) > 1 {
			verb = "are"
		}
		return nil, fail("%s %s not set: GitHub Actions sets them only in a job with `permissions: id-token: write` (and never for a pull request from a fork)", strings.Join(missing, " and "), verb)
	}
	p, err := newActionsTokenProvider(rawURL, requestToken, audience, m.httpClient())
	if err != nil {
		return nil, fail("%v", err)
	}
	// Synchronous refresh, as for Google ID tokens (see provider): the old token is never
	// handed out while its replacement is being requested.
	tf := fromProvider(auth.NewCachedTokenProvider(p, &auth.CachedTokenProviderOptions{
		ExpireEarly:         refreshEarly,
		DisableAsyncRefresh: true,
	}))
	discovery := m.discovery
	if discovery <= 0 {
		discovery = DiscoveryTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), discovery)
	defer cancel()
	if _, err := tf(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, fail("the GitHub Actions token endpoint %s gave no token within %s", p.endpoint, discovery)
		}
		return nil, fail("%v", err)
	}
	return tf, nil
}

// httpClient returns m.client, or one with actionsRequestTimeout, refusing redirects either way.
func (m actionsMinter) httpClient() *http.Client {
	return noRedirects(m.client, actionsRequestTimeout)
}

// actionsTokenProvider requests GitHub Actions OIDC tokens for one audience.
type actionsTokenProvider struct {
	// url is the request URL with the audience.
	url string
	// endpoint names the request URL in messages: without its query.
	endpoint     string
	requestToken string
	client       *http.Client
}

// newActionsTokenProvider checks the request URL rawURL and returns a provider requesting
// tokens for audience from it with requestToken.
func newActionsTokenProvider(rawURL, requestToken, audience string, client *http.Client) (*actionsTokenProvider, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%s is not an absolute URL with a host", EnvActionsTokenURL)
	}
	endpoint := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()
	switch {
	case u.Scheme != "https" && (u.Scheme != "http" || !loopbackHost(u.Hostname())):
		// The request token would cross the network in the clear.
		return nil, fmt.Errorf("%s %s: the scheme must be https (http only to a loopback host)", EnvActionsTokenURL, endpoint)
	case u.User != nil:
		return nil, fmt.Errorf("%s %s must not carry credentials", EnvActionsTokenURL, endpoint)
	case u.Fragment != "" || strings.Contains(rawURL, "#"):
		return nil, fmt.Errorf("%s %s must not have a fragment", EnvActionsTokenURL, endpoint)
	}
	sep := "?"
	switch {
	case u.RawQuery != "":
		sep = "&"
	case u.ForceQuery:
		sep = ""
	}
	return &actionsTokenProvider{
		url:          rawURL + sep + "audience=" + url.QueryEscape(audience),
		endpoint:     endpoint,
		requestToken: requestToken,
		client:       client,
	}, nil
}

// loopbackHost reports whether host is localhost or a loopback address.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Token requests one token from the Actions token endpoint.
func (p *actionsTokenProvider) Token(ctx context.Context) (*auth.Token, error) {
	source := "the GitHub Actions token endpoint " + p.endpoint
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, boundError(err))
	}
	req.Header.Set("Authorization", "Bearer "+p.requestToken)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", buildinfo.UserAgent())
	resp, err := p.client.Do(req)
	if err != nil {
		// A *url.Error repeats the whole URL; the endpoint is named already.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%s: %w", source, boundError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxActionsAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("%s: reading the answer: %w", source, boundError(err))
	}
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode <= 399:
		return nil, fmt.Errorf("%s answered %s (redirects are not followed)", source, resp.Status)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, fmt.Errorf("%s answered %s: %s", source, resp.Status, textfit.Excerpt(p.redact(body), maxErrorExcerpt))
	case len(body) > maxActionsAnswer:
		return nil, fmt.Errorf("%s answered %s with more than %d bytes", source, resp.Status, maxActionsAnswer)
	}
	var answer struct {
		Value string `json:"value"`
	}
	// A successful answer carries a token, so its body never goes into an error.
	if json.Unmarshal(body, &answer) != nil || answer.Value == "" {
		return nil, fmt.Errorf(`%s answered %s without a token (want a JSON object {"value": TOKEN})`, source, resp.Status)
	}
	return idToken(answer.Value, source)
}

// redact returns body with every occurrence of the request token masked.
func (p *actionsTokenProvider) redact(body []byte) []byte {
	if p.requestToken == "" {
		return body
	}
	return []byte(strings.ReplaceAll(string(body), p.requestToken, "[redacted]"))
}
