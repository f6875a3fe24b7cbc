package service

import (
	"context"
	"fmt"
	"sync"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Who may write an execution's events: the principal that announced it (Init), or an admin.
// Every runner event (phases, updates, log chunks, finalize) is checked, so that one runner's
// token cannot overwrite the statuses, classes or plan hashes, which approvals and the gate
// bind to, of an execution another principal announced.

// maxOwners bounds the owners cache; it is emptied when full.
const maxOwners = 4096

// owners caches each execution's announcing principal. The principal is written once, in the
// transaction that creates the execution, and executions are never deleted, so a cached
// owner never goes stale, on this replica or on any other.
type owners struct {
	mu sync.Mutex
	m  map[string]string
}

func (o *owners) get(id string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p, ok := o.m[id]
	return p, ok
}

func (o *owners) put(id, principal string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil || len(o.m) >= maxOwners {
		o.m = make(map[string]string)
	}
	o.m[id] = principal
}

// checkOwner returns nil when caller may write events of execution id: an admin always (the
// store still answers ErrNotFound for an unknown execution), anyone else only when it announced
// the execution. An execution without a recorded principal is an admin's alone. An unknown
// execution is ErrNotFound.
func (s *Service) checkOwner(ctx context.Context, caller Caller, id string) error {
	if caller.Admin {
		return nil
	}
	owner, ok := s.owners.get(id)
	if !ok {
		err := s.Store.Read(ctx, func(tx store.Tx) (err error) {
			owner, err = tx.ExecutionPrincipal(id)
			return err
		})
		if err != nil {
			return err
		}
		s.owners.put(id, owner)
	}
	if owner == "" || owner != caller.Name {
		return fmt.Errorf("%w: execution %s was not announced by %s; only its runner (or an admin) sends its events", store.ErrDenied, id, caller.Name)
	}
	return nil
}
