// The runner's events: Init, phases, updates (batched), log chunks, heartbeats, Finalize and
// the gate's revoke, each best-effort and answered by an Ack.

package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
)

// Init announces the execution.
func (c *Client) Init(ctx context.Context, in events.Init) error {
	return c.eventJSON(ctx, "Init", in, c.api.InitWithBody)
}

// initBody is Init for an announcement already encoded as JSON (run.init measures it).
func (c *Client) initBody(ctx context.Context, body []byte) error {
	return c.eventBody(ctx, "Init", body, c.api.InitWithBody)
}

// Phase reports that a stack entered a phase.
func (c *Client) Phase(ctx context.Context, p events.PhaseEvent) error {
	return c.event(ctx, "Phase", func(ctx context.Context) (*http.Response, error) { return c.api.Phase(ctx, p) })
}

// MaxPhaseBatch bounds the phase events of one Phases request (the server takes up to 1000).
const MaxPhaseBatch = 500

// Phases reports several phase events of one execution (best-effort), in order, in as few
// requests as MaxPhaseBatch and MaxUpdateBatchBytes allow, falling back as Updates does.
func (c *Client) Phases(ctx context.Context, phases []events.PhaseEvent) error {
	return sendBatched(c, ctx, phases, batchOp{name: "Phases", field: "phases", max: MaxPhaseBatch, none: &c.noPhases,
		post: c.api.PhasesWithBody}, c.Phase)
}

// Update reports a stack's status and classification.
func (c *Client) Update(ctx context.Context, u events.Update) error {
	return c.event(ctx, "Update", func(ctx context.Context) (*http.Response, error) { return c.api.Update(ctx, u) })
}

// Bounds of one Updates request the client sends.
const (
	// MaxUpdateBatch bounds the updates of one request (the server takes up to 1000).
	MaxUpdateBatch = 500
	// MaxUpdateBatchBytes bounds the encoded updates of one request, below the server's body
	// limit; an update larger than it alone goes alone.
	MaxUpdateBatchBytes = 1 << 20
)

// Updates reports several stacks' updates of one execution (best-effort), in order, in as few
// requests as MaxUpdateBatch and MaxUpdateBatchBytes allow; the server stores each request's
// updates together or not at all. A server without the operation (it answers 403, 404 or 405:
// an older tfstackplan refuses a runner an unknown path with 403, where an Update goes through)
// gets one Update a request from then on; a batch refused as invalid is sent again one update
// a request, so that only the invalid update is lost, as with Update. It returns the first
// error, a server-side cancel before any other; every batch is sent whatever the earlier ones
// met.
func (c *Client) Updates(ctx context.Context, updates []events.Update) error {
	return sendBatched(c, ctx, updates, batchOp{name: "Updates", field: "updates", max: MaxUpdateBatch, none: &c.noUpdates,
		post: c.api.UpdatesWithBody}, c.Update)
}

// batchOp describes a batch operation of runner events: its name, the JSON field of its body
// that lists the events, the most events of one request, the flag set once the server showed
// it lacks the operation, and the generated call that posts an encoded body.
type batchOp struct {
	name, field string
	max         int
	none        *atomic.Bool
	post        bodySender
}

// sendBatched sends items with op as Updates describes it, and each one alone with single when
// op cannot carry it. A batch refused with 403, 404 or 405 is the server's lack of the
// operation only when its first event, sent alone, is not refused the same way; otherwise the
// refusal is the execution's (unknown, or another principal's) and the rest of the batch is not
// sent one by one to meet it again.
func sendBatched[T any](c *Client, ctx context.Context, items []T, op batchOp, single func(context.Context, T) error) error {
	if !c.Enabled() || len(items) == 0 {
		return nil
	}
	var errs batchErrors
	if op.none.Load() {
		for _, it := range items {
			errs.add(single(ctx, it))
		}
		return errs.first()
	}
	encoded := make([][]byte, len(items))
	for i, it := range items {
		b, err := json.Marshal(it)
		if err != nil {
			return fmt.Errorf("%s: %w", op.name, err)
		}
		encoded[i] = b
	}
	for start := 0; start < len(items); {
		end, size := start+1, len(encoded[start])
		for end < len(items) && end-start < op.max && size+1+len(encoded[end]) <= MaxUpdateBatchBytes {
			size += 1 + len(encoded[end])
			end++
		}
		body := append(append([]byte(`{"`+op.field+`":[`), bytes.Join(encoded[start:end], []byte(","))...), "]}"...)
		err := c.eventBody(ctx, op.name, body, op.post)
		var ae *APIError
		switch {
		case errors.As(err, &ae) && (ae.StatusCode == http.StatusForbidden || ae.StatusCode == http.StatusNotFound || ae.StatusCode == http.StatusMethodNotAllowed):
			// A server without the operation, or a refusal of the execution itself (not
			// announced, or another principal's), which the single operation meets too: the
			// first event, sent alone, tells them apart.
			first := single(ctx, items[start])
			var fe *APIError
			if errors.As(first, &fe) && fe.StatusCode == ae.StatusCode {
				errs.add(first)
				break
			}
			op.none.Store(true)
			errs.add(first)
			for _, it := range items[start+1 : end] {
				errs.add(single(ctx, it))
			}
		case errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest && end-start > 1:
			for _, it := range items[start:end] {
				errs.add(single(ctx, it))
			}
		default:
			errs.add(err)
		}
		start = end
	}
	return errs.first()
}

// batchErrors keeps the first error of a batch's calls, and the first server-side cancel.
type batchErrors struct{ err, cancel error }

func (e *batchErrors) add(err error) {
	if e.err == nil {
		e.err = err
	}
	if e.cancel == nil && errors.Is(err, ErrCancelRequested) {
		e.cancel = err
	}
}

func (e *batchErrors) first() error {
	if e.cancel != nil {
		return e.cancel
	}
	return e.err
}

// LogChunk posts a slice of one stack's log, or a gap (best-effort).
func (c *Client) LogChunk(ctx context.Context, lc events.LogChunk) error {
	return c.eventJSON(ctx, "LogChunk", lc, c.api.LogChunkWithBody)
}

// LogChunks posts several chunks of one execution's logs in one request (best-effort); the
// server stores them together or not at all.
func (c *Client) LogChunks(ctx context.Context, chunks []events.LogChunk) error {
	if len(chunks) == 0 {
		return nil
	}
	return c.eventJSON(ctx, "LogChunks", api.LogChunks{Chunks: chunks}, c.api.LogChunksWithBody)
}

// Heartbeat says that the run of an execution goes on (best-effort, through the breaker: while
// the server is unreachable it costs nothing).
func (c *Client) Heartbeat(ctx context.Context, id string) error {
	return c.event(ctx, "Heartbeat", func(ctx context.Context) (*http.Response, error) {
		return c.api.Heartbeat(ctx, events.Heartbeat{ExecutionID: id})
	})
}

// Finalize ends the execution.
func (c *Client) Finalize(ctx context.Context, f events.Finalize) error {
	return c.eventJSON(ctx, "Finalize", f, c.api.FinalizeWithBody)
}

// finalizeBody is Finalize for a body already encoded as JSON (run.finalize sizes its budget
// by it).
func (c *Client) finalizeBody(ctx context.Context, body []byte) error {
	return c.eventBody(ctx, "Finalize", body, c.api.FinalizeWithBody)
}

// finalizeRetrying is finalizeBody, tried again while it fails at the transport level (the
// server went away, the breaker is open) and ctx leaves time for another try: each retry goes
// once the breaker's cool-down lets a probe through, so an execution whose server came back
// within the budget is not left running. A cool-down that outlasts ctx ends it at once (a dead
// server costs no more than it did).
func (c *Client) finalizeRetrying(ctx context.Context, body []byte) error {
	for {
		err := c.finalizeBody(ctx, body)
		var te *TransportError
		if err == nil || !errors.As(err, &te) {
			return err
		}
		wait := max(c.breaker.untilProbe(), minFinalizeRetry)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+c.attemptTimeout {
			return err
		}
		if c.sleep(ctx, wait) != nil {
			return err
		}
	}
}

// minFinalizeRetry spaces out Finalize's retries when the breaker lets calls through at once
// (it opens only after BreakerThreshold failures).
const minFinalizeRetry = time.Second

// GateRevoke ends the lease a gate check granted (best-effort post-apply cleanup).
func (c *Client) GateRevoke(ctx context.Context, g events.GateRevoke) error {
	return c.event(ctx, "GateRevoke", func(ctx context.Context) (*http.Response, error) { return c.api.GateRevoke(ctx, g) })
}

// event sends one best-effort runner event and interprets the Ack.
func (c *Client) event(ctx context.Context, op string, send func(context.Context) (*http.Response, error)) error {
	return c.eventSized(ctx, op, 0, send)
}

// eventJSON is event for a body encoded once here, so that the request gets time for its size
// (see callSized): an Init or Finalize of thousands of stacks, or a batch of log chunks, is
// megabytes.
func (c *Client) eventJSON(ctx context.Context, op string, v any, send bodySender) error {
	if !c.Enabled() {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return c.eventBody(ctx, op, b, send)
}

// bodySender is a generated client's ...WithBody operation.
type bodySender func(context.Context, string, io.Reader, ...api.RequestEditorFn) (*http.Response, error)

// eventBody is event for a JSON body, sent afresh on every attempt with time for its size.
func (c *Client) eventBody(ctx context.Context, op string, body []byte, send bodySender) error {
	return c.eventSized(ctx, op, len(body), func(ctx context.Context) (*http.Response, error) {
		return send(ctx, "application/json", bytes.NewReader(body))
	})
}

// eventSized is event for a request of about size bytes (see callSized).
func (c *Client) eventSized(ctx context.Context, op string, size int, send func(context.Context) (*http.Response, error)) error {
	if !c.Enabled() {
		return nil
	}
	body, err := c.callSized(ctx, op, true, size, MaxResponseBytes, send)
	if err != nil {
		return err
	}
	var ack events.Ack
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &ack); err != nil {
			return fmt.Errorf("%s: malformed answer: %w", op, err)
		}
	}
	if ack.Cancel {
		return &CancelledError{Reason: ack.Reason}
	}
	return nil
}
