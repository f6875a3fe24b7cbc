package granter

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"cloud.google.com/go/auth"

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// This file is a REST client for the two IAM v1 methods the granter calls,
// projects.serviceAccounts.getIamPolicy and setIamPolicy. It stands in for the generated
// google.golang.org/api/iam/v1 client, whose transport links gRPC, OpenTelemetry and protobuf
// into every binary that imports this package.

const (
	// cloudPlatformScope is the OAuth scope both methods accept.
	cloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform"
	// maxAnswerBytes bounds how much of an answer is read. A service account's policy is far
	// smaller (IAM caps it at 1,500 principals).
	maxAnswerBytes = 1 << 20
	// maxMessageBytes bounds the part of an error answer quoted in an error, which reaches the
	// audit record and the gate's answer.
	maxMessageBytes = 512
)

// iamPolicy is IAM's Policy resource, with the fields the generated client kept.
type iamPolicy struct {
	Version  int64         `json:"version,omitempty"`
	Etag     string        `json:"etag,omitempty"`
	Bindings []*iamBinding `json:"bindings,omitempty"`
	// AuditConfigs is carried through a read-modify-write untouched.
	AuditConfigs json.RawMessage `json:"auditConfigs,omitempty"`
}

// iamBinding is IAM's Binding.
type iamBinding struct {
	Role      string   `json:"role,omitempty"`
	Members   []string `json:"members,omitempty"`
	Condition *iamExpr `json:"condition,omitempty"`
}

// iamExpr is IAM's Expr, a binding's condition.
type iamExpr struct {
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	Expression  string `json:"expression,omitempty"`
	Location    string `json:"location,omitempty"`
}

// apiError is an IAM answer with a status other than 2xx.
type apiError struct {
	// Code is the HTTP status.
	Code int
	// Message is the message of Google's error JSON, else the start of the body as text, cut
	// to maxMessageBytes.
	Message string
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("IAM answered HTTP %d %s", e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// iamClient calls IAM v1 at endpoint (an absolute URL ending in '/') through hc, whose
// transport signs requests in. hc follows no redirect: the transport would sign the next
// request in too, wherever it went.
type iamClient struct {
	endpoint string
	hc       *http.Client
}

// newIAMClient returns a client of endpoint signing in with tokens (the credentials' own
// provider, which caches) and naming quotaProject when it is not empty.
func newIAMClient(endpoint string, tokens auth.TokenProvider, quotaProject string) *iamClient {
	return &iamClient{
		endpoint: endpoint,
		hc: &http.Client{
			Transport: &bearerTransport{tokens: tokens, quotaProject: quotaProject, base: http.DefaultTransport},
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
	}
}

// getIamPolicy reads account's policy in version 3, which keeps conditional bindings intact.
func (c *iamClient) getIamPolicy(ctx context.Context, account string) (*iamPolicy, error) {
	// IAM takes the version as a query parameter; the method's request body must be empty.
	p, err := c.call(ctx, account, "getIamPolicy", url.Values{"options.requestedPolicyVersion": {"3"}}, nil)
	if err == nil && p.Etag == "" {
		// Writing back a policy without its etag would be a blind write, which can drop
		// conditional bindings and overwrite a concurrent writer's change.
		err = errors.New("malformed answer: the policy has no etag")
	}
	return p, err
}

// setIamPolicy writes p as account's policy, failing with HTTP 409 when p.Etag is stale, and
// returns the policy IAM then holds.
func (c *iamClient) setIamPolicy(ctx context.Context, account string, p *iamPolicy) (*iamPolicy, error) {
	body, err := json.Marshal(struct {
		Policy *iamPolicy `json:"policy"`
	}{p})
	if err != nil {
		return nil, fmt.Errorf("encoding the policy: %w", err)
	}
	return c.call(ctx, account, "setIamPolicy", nil, body)
}

// call POSTs body (nil: none) to one method of account and decodes the policy it answers with.
func (c *iamClient) call(ctx context.Context, account, method string, query url.Values, body []byte) (*iamPolicy, error) {
	if err := checkAccount(account); err != nil {
		return nil, err
	}
	q := url.Values{"alt": {"json"}}
	for k, v := range query {
		q[k] = v
	}
	u := c.endpoint + "v1/projects/-/serviceAccounts/" + url.PathEscape(account) + ":" + method + "?" + q.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", buildinfo.UserAgent())
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, maxAnswerBytes+1))
	if err != nil {
		// Kept wrapped: a connection lost mid-answer is a network error, hence retried.
		return nil, fmt.Errorf("reading the HTTP %d answer: %w", res.StatusCode, err)
	}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return nil, parseError(res.StatusCode, data)
	}
	if len(data) > maxAnswerBytes {
		return nil, fmt.Errorf("malformed answer: the HTTP %d body is larger than %d bytes", res.StatusCode, maxAnswerBytes)
	}
	p, err := decodePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("malformed answer: the HTTP %d body is not a policy: %w", res.StatusCode, err)
	}
	return p, nil
}

// decodePolicy decodes exactly one JSON policy object, rejecting what the read-modify-write
// could not work on.
func decodePolicy(data []byte) (*iamPolicy, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("the body is empty")
	}
	var p *iamPolicy
	// Unmarshal, unlike a Decoder, rejects data after the value and never reports a cut
	// body as io.ErrUnexpectedEOF, which would pass for a broken connection and be retried.
	if err := json.Unmarshal(data, &p); err != nil {
		var terr *json.UnmarshalTypeError
		if errors.As(err, &terr) && terr.Field != "" {
			return nil, fmt.Errorf("field %q holds a JSON %s, which is not its type", terr.Field, terr.Value)
		}
		return nil, err
	}
	if p == nil {
		return nil, errors.New("the body is null")
	}
	for i, b := range p.Bindings {
		if b == nil {
			return nil, fmt.Errorf("binding %d is null", i)
		}
		if b.Role == "" {
			return nil, fmt.Errorf("binding %d has no role", i)
		}
	}
	return p, nil
}

// parseError makes the apiError of a failed answer. Google's error JSON is
// {"error":{"code":403,"message":"...","status":"PERMISSION_DENIED"}}; any other body (a
// proxy's page, say) is quoted.
func parseError(code int, data []byte) *apiError {
	var g struct {
		Error *struct {
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	msg := data
	if len(data) <= maxAnswerBytes && json.Unmarshal(data, &g) == nil && g.Error != nil {
		msg = []byte(cmp.Or(g.Error.Message, g.Error.Status))
	}
	return &apiError{Code: code, Message: textfit.Excerpt(msg, maxMessageBytes)}
}

// bearerTransport signs each request in with an access token from tokens, and names the
// quota project when the credentials have one.
type bearerTransport struct {
	tokens       auth.TokenProvider
	quotaProject string
	base         http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tok, err := t.tokens.Token(req.Context())
	if err != nil {
		// A RoundTripper must close the body even when it fails.
		if req.Body != nil {
			req.Body.Close()
		}
		// The auth library's error can hold the token endpoint's whole answer, which would
		// reach the audit record: the message is cut, the cause kept for errors.As.
		return nil, textfit.Wrap("getting an access token: "+textfit.Excerpt([]byte(err.Error()), maxMessageBytes), err)
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", cmp.Or(tok.Type, "Bearer")+" "+tok.Value)
	if t.quotaProject != "" {
		// Calls made with user credentials are billed and rate-limited against this project,
		// and Google refuses some of them without one.
		req.Header.Set("X-Goog-User-Project", t.quotaProject)
	}
	return t.base.RoundTrip(req)
}
