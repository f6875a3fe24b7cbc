package service

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Notifications: the events of the policy's notify blocks are written to the store's outbox in
// the transaction of the change they report (notify.Worker sends them). Each hook below is
// called from the write it reports; with no notify block it costs nothing.

// notify writes ev's deliveries, for the targets that want it, into tx.
func (s *Service) notify(tx store.Tx, ev notify.Event, now time.Time) error {
	if len(s.Policy.Notify) == 0 {
		return nil
	}
	ev.URL = s.pageURL(ev.ExecutionID)
	ds, err := notify.Deliveries(s.Policy.Notify, ev, now)
	if err != nil || len(ds) == 0 {
		return err
	}
	ot, ok := tx.(store.OutboxTx)
	if !ok {
		return fmt.Errorf("%w: the store keeps no notification outbox", store.ErrUnavailable)
	}
	return ot.Enqueue(ds)
}

// pageURL is the page of an execution: under ExternalURL when set.
func (s *Service) pageURL(execID string) string {
	if execID == "" {
		return ""
	}
	base := strings.TrimSuffix(s.ExternalURL, "/")
	return base + "/ui/executions/" + url.PathEscape(execID)
}

func prKey(e *store.Execution) string {
	return target(store.PRKey{Repo: e.Repo, Environment: e.Environment, PR: e.PR})
}

// notifyFinalized reports what a Finalize ended: a plan whose gates wait for an approval, an
// apply's end (denied when its gate refused it), a drift run's changes.
func (s *Service) notifyFinalized(tx store.Tx, e *store.Execution, stacks []store.Stack, now time.Time) error {
	if len(s.Policy.Notify) == 0 {
		return nil
	}
	base := notify.Event{Repo: e.Repo, Environment: e.Environment, PR: e.PR, ExecutionID: e.ExecutionID}
	switch {
	case e.Op == api.ExecutionOp(events.OpPlan) && e.PR != 0 && e.Status == events.ExecutionSucceeded:
		return s.notifyWaiting(tx, e, stacks, base, now)
	case e.Op == api.ExecutionOp(events.OpApply):
		return s.notifyApply(tx, e, base, now)
	case e.Op == OpDrift:
		return s.notifyDrift(tx, e, base, now)
	}
	return nil
}

func (s *Service) notifyWaiting(tx store.Tx, e *store.Execution, stacks []store.Stack, ev notify.Event, now time.Time) error {
	gates, _, err := s.requiredGates(tx, e, stacks, now)
	if err != nil {
		return err
	}
	d := notify.GateWaitingData{SHA: e.SHA}
	for _, g := range gates {
		if g.Satisfied {
			continue
		}
		d.Gates = append(d.Gates, notify.Gate{Class: string(g.Class), Target: g.Target, Stacks: g.Stacks})
		d.Commands = append(d.Commands, fmt.Sprintf("tfstackplan admin gates satisfy --repo %s --environment %s --pr %d --class %s --target '%s' --execution %s --reason '...'",
			e.Repo, e.Environment, e.PR, g.Class, g.Target, e.ExecutionID))
	}
	if len(d.Gates) == 0 {
		return nil
	}
	ev.Name, ev.Data = notify.GateWaiting, d
	ev.Summary = fmt.Sprintf("%s: plan %s waits for approval of %d gate(s)", prKey(e), e.ExecutionID, len(d.Gates))
	return s.notify(tx, ev, now)
}

// notifyApply reports an apply's end. An apply the gate refused ends failed, as any failed apply
// does; it is told apart by its lease: none was granted (the gate denied the only check), or the
// lease was revoked by a denial ("denied on re-check"). An apply whose lease is in place failed
// after the gate allowed it.
func (s *Service) notifyApply(tx store.Tx, e *store.Execution, ev notify.Event, now time.Time) error {
	d := notify.ApplyData{SHA: e.SHA, Status: string(e.Status), Error: clip(e.Error, 2000)}
	l, err := tx.Lease(e.ExecutionID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		l = nil
	case err != nil:
		return err
	default:
		d.Plan = l.PlanID
	}
	switch {
	case e.Status == events.ExecutionSucceeded:
		ev.Name = notify.ApplySucceeded
		ev.Summary = fmt.Sprintf("%s: apply %s succeeded", prKey(e), e.ExecutionID)
	case e.Status == events.ExecutionFailed && (l == nil || strings.HasPrefix(l.Outcome, "denied")):
		ev.Name = notify.ApplyDenied
		ev.Summary = fmt.Sprintf("%s: apply %s was denied by the gate", prKey(e), e.ExecutionID)
	default:
		ev.Name = notify.ApplyFailed
		ev.Summary = fmt.Sprintf("%s: apply %s ended %s", prKey(e), e.ExecutionID, e.Status)
	}
	ev.Data = d
	return s.notify(tx, ev, now)
}

// notifyDrift reports the stacks whose drift this drift execution changed, one event per way.
func (s *Service) notifyDrift(tx store.Tx, e *store.Execution, ev notify.Event, now time.Time) error {
	ot, ok := tx.(store.OutboxTx)
	if !ok {
		return nil
	}
	changes, err := ot.DriftChanges(e.Repo, e.Environment, e.ExecutionID)
	if err != nil {
		return err
	}
	var detected, resolved []string
	for stack, drifted := range changes {
		if drifted {
			detected = append(detected, stack)
		} else {
			resolved = append(resolved, stack)
		}
	}
	for _, c := range []struct {
		name, verb string
		stacks     []string
	}{{notify.DriftDetected, "drifted", detected}, {notify.DriftResolved, "no longer drift", resolved}} {
		if len(c.stacks) == 0 {
			continue
		}
		sort.Strings(c.stacks)
		d := notify.DriftData{Stacks: c.stacks, Count: len(c.stacks)}
		if len(d.Stacks) > notify.MaxDriftStacks {
			d.Stacks, d.Truncated = d.Stacks[:notify.MaxDriftStacks], true
		}
		x := ev
		x.Name, x.Data = c.name, d
		x.Summary = fmt.Sprintf("%s %s: %d stack(s) %s", e.Repo, e.Environment, len(c.stacks), c.verb)
		if err := s.notify(tx, x, now); err != nil {
			return err
		}
	}
	return nil
}

// notifyApproved reports a grant that approved gate of plan.
func (s *Service) notifyApproved(tx store.Tx, plan *store.Execution, gate *api.Gate, by, reason string, now time.Time) error {
	ev := notify.Event{Name: notify.GateApproved, Repo: plan.Repo, Environment: plan.Environment, PR: plan.PR, ExecutionID: plan.ExecutionID,
		Summary: fmt.Sprintf("%s: %s on %s approved by %s", prKey(plan), gate.Class, gate.Target, by),
		Data: notify.GateApprovedData{Gate: notify.Gate{Class: string(gate.Class), Target: gate.Target, Stacks: gate.Stacks}, By: by,
			Plan: plan.ExecutionID, Reason: clip(reason, 2000)}}
	return s.notify(tx, ev, now)
}

// notifyStale reports an execution the sweeper failed for its silence.
func (s *Service) notifyStale(tx store.Tx, e *store.Execution, silence time.Duration, now time.Time) error {
	ev := notify.Event{Name: notify.ExecutionStale, Repo: e.Repo, Environment: e.Environment, PR: e.PR, ExecutionID: e.ExecutionID,
		Summary: fmt.Sprintf("%s: %s execution %s stopped reporting", prKey(e), e.Op, e.ExecutionID),
		Data:    notify.StaleData{Op: string(e.Op), Error: StaleError, Silence: silence.String()}}
	return s.notify(tx, ev, now)
}

// MaxNotificationsLimit bounds a page of deliveries.
const MaxNotificationsLimit = 500

// Notifications lists deliveries, newest first (admins only).
func (s *Service) Notifications(ctx context.Context, caller Caller, f store.DeliveryFilter) ([]store.Delivery, error) {
	if !caller.Admin {
		return nil, fmt.Errorf("%w: listing notifications is an admin action", store.ErrDenied)
	}
	if f.Status != "" && f.Status != store.DeliveryPending && f.Status != store.DeliveryDelivered && f.Status != store.DeliveryFailed {
		return nil, invalid("status %q is not pending, delivered or failed", f.Status)
	}
	if f.Before < 0 {
		return nil, invalid("before %d is negative", f.Before)
	}
	if f.Limit <= 0 || f.Limit > MaxNotificationsLimit {
		f.Limit = 50
	}
	ob, err := s.outbox()
	if err != nil {
		return nil, err
	}
	return ob.Deliveries(ctx, f)
}

// Redeliver sends a delivery again, with its delivery id (admins only); audited.
func (s *Service) Redeliver(ctx context.Context, caller Caller, id int64) error {
	if !caller.Admin {
		return fmt.Errorf("%w: redelivering a notification is an admin action", store.ErrDenied)
	}
	ob, err := s.outbox()
	if err != nil {
		return err
	}
	if err := ob.Redeliver(ctx, id, s.Now()); err != nil {
		return err
	}
	now := s.Now()
	return s.Store.Write(ctx, func(tx store.Tx) error {
		return audit(tx, now, caller, "", "notifications.redeliver", fmt.Sprint(id), "", "pending", "")
	})
}

func (s *Service) outbox() (store.Outbox, error) {
	ob, ok := s.Store.(store.Outbox)
	if !ok {
		return nil, fmt.Errorf("%w: the store keeps no notification outbox", store.ErrUnavailable)
	}
	return ob, nil
}
