// The operator calls: claims and the admin operations.

package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
)

// ClaimsList returns the current apply-lock claims of a repository's environment (repo empty:
// the server's choice for the principal, see the contract); nil, nil when disabled.
func (c *Client) ClaimsList(ctx context.Context, repo, env string) ([]events.Claim, error) {
	if !c.Enabled() {
		return nil, nil
	}
	params := &api.ClaimsListParams{Repo: repo, Environment: env}
	body, err := c.call(ctx, "ClaimsList", false, func(ctx context.Context) (*http.Response, error) {
		return c.api.ClaimsList(ctx, params)
	})
	if err != nil {
		return nil, err
	}
	var claims []events.Claim
	if err := json.Unmarshal(body, &claims); err != nil {
		return nil, fmt.Errorf("ClaimsList: malformed answer: %w", err)
	}
	return claims, nil
}

// ClaimsRelease releases claims as body says: the claims of the runner's own execution.
func (c *Client) ClaimsRelease(ctx context.Context, body api.ClaimsRelease) error {
	return c.event(ctx, "ClaimsRelease", func(ctx context.Context) (*http.Response, error) { return c.api.ClaimsRelease(ctx, body) })
}

// AdminChecksOverride overrides a check's conclusion.
func (c *Client) AdminChecksOverride(ctx context.Context, body api.ChecksOverride) error {
	return c.admin(ctx, "AdminChecksOverride", func(ctx context.Context) (*http.Response, error) { return c.api.AdminChecksOverride(ctx, body) })
}

// AdminExecutionsCancel cancels a running execution.
func (c *Client) AdminExecutionsCancel(ctx context.Context, id, reason string) error {
	body := api.ExecutionsCancel{ExecutionID: id, Reason: reason}
	return c.admin(ctx, "AdminExecutionsCancel", func(ctx context.Context) (*http.Response, error) { return c.api.AdminExecutionsCancel(ctx, body) })
}

// AdminGatesSatisfy approves a plan's content for one of its gates.
func (c *Client) AdminGatesSatisfy(ctx context.Context, body api.GatesSatisfy) error {
	return c.admin(ctx, "AdminGatesSatisfy", func(ctx context.Context) (*http.Response, error) { return c.api.AdminGatesSatisfy(ctx, body) })
}

// AdminGrantsRelease ends an active grant.
func (c *Client) AdminGrantsRelease(ctx context.Context, body api.GrantsRelease) error {
	return c.admin(ctx, "AdminGrantsRelease", func(ctx context.Context) (*http.Response, error) { return c.api.AdminGrantsRelease(ctx, body) })
}

// admin runs an operator call. Like every call of a disabled client it is a no-op returning
// nil when no server is configured; the CLI checks Enabled first and tells the operator.
func (c *Client) admin(ctx context.Context, op string, send func(context.Context) (*http.Response, error)) error {
	if !c.Enabled() {
		return nil
	}
	_, err := c.call(ctx, op, true, send)
	return err
}
