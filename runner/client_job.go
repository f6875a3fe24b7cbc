package runner

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// This file holds the Client calls the CI job (internal/job) makes beyond the reference's.

// InitJSON is Init for an announcement the job already encoded as JSON: it measures the body
// against the server's limit first, and cuts what does not fit.
func (c *Client) InitJSON(ctx context.Context, body []byte) error { return c.initBody(ctx, body) }

// FinalizeJSONRetrying sends a Finalize the job already encoded, trying again while ctx leaves
// time when the server is briefly away: no execution may be left running.
func (c *Client) FinalizeJSONRetrying(ctx context.Context, body []byte) error {
	return c.finalizeRetrying(ctx, body)
}

// SizedBudget is budget plus the upload time of MaxAttempts attempts at a request of size
// bytes: the job's Finalize of thousands of stacks is megabytes, and needs time for a retry.
func SizedBudget(budget time.Duration, size int) time.Duration {
	total, _ := sizedBounds(budget, 0, MaxAttempts, size)
	return total
}

// SetTransport sends the client's requests through rt instead: the job's tests break the wire
// under a run (a transport that panics) to see the run survive it.
func (c *Client) SetTransport(rt http.RoundTripper) error {
	gen, err := api.NewClient(strings.TrimSuffix(c.base.String(), "/")+"/api/v1", api.WithHTTPClient(&http.Client{Transport: rt}))
	if err != nil {
		return err
	}
	c.api = gen
	return nil
}
