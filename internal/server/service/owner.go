package service

import (
	"context"
	"fmt"
	"sync"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Who may write an execution's events: the principal that announced it (Init), or an admin of
// its repository. Every runner event (phases, updates, log chunks, finalize) is checked, so that
// one runner's token cannot overwrite the statuses, classes or plan hashes, which approvals and
// the gate bind to, of an execution another principal announced. Who may read it: a principal
// that may read its repository.

// maxOwners bounds the owners cache; it is emptied when full.
const maxOwners = 4096

// owner is who announced an execution, and in which repository.
type owner struct{ principal, repo string }

// owners caches each execution's announcing principal and repository. Both are written once,
// in the transaction that creates the execution, and the id of an execution retention deletes
// is never announced again (store.Tx.CreateExecution), so a cached entry never names the owner
// of another execution, on this replica or on any other: at worst it names one of an execution
// gone, whose events find nothing to write.
type owners struct {
	mu sync.Mutex
	m  map[string]owner
	// reading holds the reads under way, each closed when its execution's entry is cached (or
	// the read failed): concurrent misses of one execution wait for one read of it. The first
	// events of a run arrive together, and each would otherwise take a connection (a new one,
	// after a start) for the same row.
	reading map[string]chan struct{}
}

// startRead returns nil when the caller is to read execution id (and call endRead), or a
// channel closed when another caller's read of it ends.
func (o *owners) startRead(id string) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ch, ok := o.reading[id]; ok {
		return ch
	}
	if o.reading == nil {
		o.reading = map[string]chan struct{}{}
	}
	o.reading[id] = make(chan struct{})
	return nil
}

func (o *owners) endRead(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.reading[id])
	delete(o.reading, id)
}

func (o *owners) get(id string) (owner, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p, ok := o.m[id]
	return p, ok
}

func (o *owners) put(id string, w owner) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil || len(o.m) >= maxOwners {
		o.m = make(map[string]owner)
	}
	o.m[id] = w
}

// ownerOf returns who announced execution id and in which repository, from the cache or, through
// tx (nil: a read transaction of its own), from the store. An unknown execution is ErrNotFound.
func (s *Service) ownerOf(ctx context.Context, tx store.Tx, id string) (owner, error) {
	if w, ok := s.owners.get(id); ok {
		return w, nil
	}
	var w owner
	read := func(tx store.Tx) (err error) {
		w.principal, w.repo, err = tx.ExecutionPrincipal(id)
		return err
	}
	if tx != nil {
		if err := read(tx); err != nil {
			return owner{}, err
		}
		s.owners.put(id, w)
		return w, nil
	}
	if wait := s.owners.startRead(id); wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return owner{}, ctx.Err()
		}
		if w, ok := s.owners.get(id); ok {
			return w, nil
		}
		// The other read failed (or the cache was emptied meanwhile): read it here.
	} else {
		defer s.owners.endRead(id)
	}
	if err := s.Store.Read(ctx, read); err != nil {
		return owner{}, err
	}
	s.owners.put(id, w)
	return w, nil
}

// checkOwner returns nil when caller may write events of execution id: an admin of its
// repository always, anyone else only when it announced the execution. An execution without a
// recorded principal is an admin's alone. An unknown execution, or one of a repository the caller
// may not act in, is ErrNotFound.
func (s *Service) checkOwner(ctx context.Context, caller Caller, id string) error {
	w, err := s.ownerOf(ctx, nil, id)
	if err != nil {
		return err
	}
	if !caller.allows(w.repo) {
		return fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	if caller.Admin {
		return nil
	}
	if w.principal == "" || w.principal != caller.Name {
		return fmt.Errorf("%w: execution %s was not announced by %s; only its runner (or an admin) sends its events", store.ErrDenied, id, caller.Name)
	}
	return nil
}

// checkReader returns ErrNotFound unless execution id exists and caller may read its repository.
func (s *Service) checkReader(tx store.Tx, caller Caller, id string) error {
	w, err := s.ownerOf(context.Background(), tx, id)
	if err != nil {
		return err
	}
	if !caller.allows(w.repo) {
		return fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	return nil
}

// MayRead returns nil when execution id exists and caller may read it (ErrNotFound otherwise),
// without reading its stacks: what a live page checks before it streams.
func (s *Service) MayRead(ctx context.Context, caller Caller, id string) error {
	return s.Store.Read(ctx, func(tx store.Tx) error { return s.checkReader(tx, caller, id) })
}
