package store

import (
	"context"
	"time"
)

// Notification outbox: the events the server's notify blocks send (webhooks, Slack) are written
// in the transaction of the change they report, one delivery per event and target, and a
// delivery worker sends them. A store that keeps an outbox implements OutboxTx on its write
// transactions and Outbox on itself.

// Delivery statuses.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// Delivery is one event for one notify target, and how its sending went.
type Delivery struct {
	// ID is the row's number; Delivery the id sent with every attempt (X-Tfstackplan-Delivery).
	ID       int64
	Delivery string
	// Target is the notify block's name, Event the event's name.
	Target, Event string
	// Repo, Environment, PR and ExecutionID say what the event is about.
	Repo, Environment, ExecutionID string
	PR                             int
	// Body is the request body, rendered when the event was written.
	Body []byte
	// Status is DeliveryPending, DeliveryDelivered or DeliveryFailed.
	Status string
	// Attempts counts the requests sent; LastStatus is the last answer's HTTP status (0: none),
	// LastError why the last attempt failed ("" after a success).
	Attempts   int
	LastStatus int
	LastError  string
	// CreatedAt is when the event was written, NextAt when the next attempt is due (while
	// pending), LastAt when the last attempt ended, DeliveredAt when a 2xx answered.
	CreatedAt, NextAt, LastAt, DeliveredAt time.Time
}

// DeliveryResult is how one attempt ended.
type DeliveryResult struct {
	// Status is the answer's HTTP status (0: no answer); Err why the attempt failed.
	Status int
	Err    string
	// Delivered ends the delivery as delivered; Failed ends it as failed; neither leaves it
	// pending until Next.
	Delivered, Failed bool
	Next              time.Time
	At                time.Time
}

// Finished is an attempt's result for FinishDeliveries.
type Finished struct {
	// ID is the delivery's, HeldUntil the hold ClaimDeliveries gave it.
	ID        int64
	HeldUntil time.Time
	Result    DeliveryResult
}

// DeliveryFilter selects deliveries, newest (highest ID) first.
type DeliveryFilter struct {
	// Status, when set, keeps only deliveries of that status.
	Status string
	// Before > 0 keeps only deliveries with a lower ID.
	Before int64
	// Limit > 0 keeps only the first Limit deliveries (0: 50).
	Limit int
}

// OutboxTx is what a write transaction of a store with an outbox adds to Tx.
type OutboxTx interface {
	// Enqueue writes deliveries (pending, due at their NextAt) in the transaction.
	Enqueue(ds []Delivery) error
	// DriftChanges lists, for the stacks whose drift check execution execID recorded as its
	// stack's latest, those whose drifted flag differs from the stack's previous successful
	// check (a stack never checked before counts as not drifted), with their new flag.
	DriftChanges(repo, env, execID string) (map[string]bool, error)
}

// Outbox is what the delivery worker, the API and the pages use of a store with an outbox.
type Outbox interface {
	// ClaimDeliveries takes up to limit pending deliveries due at now that no one else holds,
	// and holds them until now+hold (their NextAt): another worker, of this replica or
	// another, takes them only after that. The returned deliveries' NextAt is the hold, which
	// FinishDelivery names.
	ClaimDeliveries(ctx context.Context, now time.Time, hold time.Duration, limit int) ([]Delivery, error)
	// FinishDeliveries records the results of attempts, in one transaction: each of a delivery
	// held until its HeldUntil. It reports, for each, whether it was recorded: false when the
	// hold was lost meanwhile (another worker took the delivery), and then records nothing.
	FinishDeliveries(ctx context.Context, fs []Finished) ([]bool, error)
	// Deliveries lists deliveries, newest first.
	Deliveries(ctx context.Context, f DeliveryFilter) ([]Delivery, error)
	// Redeliver makes a delivery pending again, due at now, with the same delivery id; or
	// ErrNotFound.
	Redeliver(ctx context.Context, id int64, now time.Time) error
	// PruneDeliveries deletes up to limit delivered or failed deliveries created before
	// `before`, and returns how many it deleted.
	PruneDeliveries(ctx context.Context, before time.Time, limit int) (int64, error)
	// OutboxStats counts deliveries by status and returns when the oldest pending one was
	// written (zero when none is).
	OutboxStats(ctx context.Context) (counts map[string]int64, oldestPending time.Time, err error)
	// NextDue returns when the earliest pending delivery is due (zero when none is).
	NextDue(ctx context.Context) (time.Time, error)
}
