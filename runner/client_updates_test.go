package runner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// someUpdates returns n updates of execution exec-1, stack s<i> with seq i+1, each carrying
// an error message of errBytes bytes.
func someUpdates(n, errBytes int) []events.Update {
	out := make([]events.Update, n)
	for i := range out {
		out[i] = events.Update{ExecutionID: "exec-1", Stack: fmt.Sprintf("s%d", i), Seq: int64(i + 1), Status: events.StackFailed,
			Class: events.ClassUnclassified, Error: strings.Repeat("e", errBytes)}
	}
	return out
}

// Updates sends its updates in order, in requests of at most MaxUpdateBatch updates and
// MaxUpdateBatchBytes bytes (an update larger than that goes alone).
func TestClientUpdatesBatchesWithinBounds(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		updates  []events.Update
		requests int
	}{
		{"one", someUpdates(1, 0), 1},
		{"by count", someUpdates(2*MaxUpdateBatch+1, 0), 3},
		// Three 400 KB updates do not fit in 1 MiB, two do.
		{"by size", someUpdates(5, 400<<10), 3},
		{"larger than a batch", someUpdates(1, MaxUpdateBatchBytes+1), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, cl := memClient(t)
			if err := cl.Updates(ctx, c.updates); err != nil {
				t.Fatal(err)
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.updateBatches != c.requests || m.requests["/events/update"] != 0 {
				t.Errorf("%d Updates and %d Update requests, want %d and none", m.updateBatches, m.requests["/events/update"], c.requests)
			}
			if !reflect.DeepEqual(m.updates, c.updates) {
				t.Errorf("the server got %d updates, not the %d sent in order", len(m.updates), len(c.updates))
			}
		})
	}
	m, cl := memClient(t)
	if err := cl.Updates(ctx, nil); err != nil || len(m.requests) != 0 {
		t.Fatalf("no updates: %v, requests %v", err, m.requests)
	}
}

// Against a server without Updates (an older tfstackplan answers a runner 403 and an admin
// 404 for an unknown path; a proxy may say 405) every update still arrives, one a request,
// and the client does not ask for Updates again.
func TestClientUpdatesFallsBackOnAnOlderServer(t *testing.T) {
	ctx := context.Background()
	for _, status := range []int{http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			m, cl := memClient(t)
			m.refuseUpdates = status
			first, second := someUpdates(3, 0), someUpdates(2, 0)
			for _, batch := range [][]events.Update{first, second} {
				if err := cl.Updates(ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if got, want := m.updates, append(first, second...); !reflect.DeepEqual(got, want) {
				t.Errorf("the server got %+v, want %+v", got, want)
			}
			if m.requests["/events/updates"] != 1 || m.requests["/events/update"] != 5 {
				t.Errorf("requests %v, want one Updates and five Update", m.requests)
			}
		})
	}
}

// A batch the server refuses as invalid is sent again one update a request: only the invalid
// update is lost (as when each went alone), its error is returned, and later batches are
// batched again.
func TestClientUpdatesResendsARefusedBatchOneByOne(t *testing.T) {
	ctx := context.Background()
	m, cl := memClient(t)
	batch := someUpdates(3, 0)
	batch[1].Stack = ""
	err := cl.Updates(ctx, batch)
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Op != "Update" {
		t.Fatalf("err = %v, want the invalid update's 400", err)
	}
	if err := cl.Updates(ctx, someUpdates(2, 0)); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var stacks []string
	for _, u := range m.updates {
		stacks = append(stacks, u.Stack)
	}
	if want := []string{"s0", "s2", "s0", "s1"}; !reflect.DeepEqual(stacks, want) {
		t.Errorf("stored %v, want %v", stacks, want)
	}
	if m.requests["/events/updates"] != 2 || m.requests["/events/update"] != 3 {
		t.Errorf("requests %v, want two Updates and three Update", m.requests)
	}
}

// A cancel in the answer to a batch is returned as the run's stop signal.
func TestClientUpdatesReportsCancel(t *testing.T) {
	m, cl := memClient(t)
	m.cancels["exec-1"] = "wrong branch"
	err := cl.Updates(context.Background(), someUpdates(2, 0))
	var ce *CancelledError
	if !errors.As(err, &ce) || ce.Reason != "wrong branch" {
		t.Fatalf("err = %v, want the cancel", err)
	}
}

// somePhases returns n phase events of execution exec-1 with seqs 1..n.
func somePhases(n int) []events.PhaseEvent {
	out := make([]events.PhaseEvent, n)
	for i := range out {
		out[i] = events.PhaseEvent{ExecutionID: "exec-1", Stack: fmt.Sprintf("s%d", i), Phase: "plan", Seq: int64(i + 1)}
	}
	return out
}

// Phases batches as Updates does: in order, at most MaxPhaseBatch a request, and against a
// server without the operation (403, 404, 405) one Phase a request from then on.
func TestClientPhasesBatchesAndFallsBack(t *testing.T) {
	ctx := context.Background()
	m, cl := memClient(t)
	sent := somePhases(2*MaxPhaseBatch + 1)
	if err := cl.Phases(ctx, sent); err != nil {
		t.Fatal(err)
	}
	if m.phaseBatches != 3 || m.requests["/events/phase"] != 0 || !reflect.DeepEqual(m.phases, sent) {
		t.Errorf("%d Phases and %d Phase requests carrying %d events, want 3, none and the %d sent in order",
			m.phaseBatches, m.requests["/events/phase"], len(m.phases), len(sent))
	}
	for _, status := range []int{http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			m, cl := memClient(t)
			m.refusePhases = status
			first, second := somePhases(3), somePhases(2)
			for _, batch := range [][]events.PhaseEvent{first, second} {
				if err := cl.Phases(ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if got, want := m.phases, append(first, second...); !reflect.DeepEqual(got, want) {
				t.Errorf("the server got %+v, want %+v", got, want)
			}
			if m.requests["/events/phases"] != 1 || m.requests["/events/phase"] != 5 {
				t.Errorf("requests %v: want one Phases, then five Phase", m.requests)
			}
		})
	}
}
