package service

import "sync"

// Hub fans "execution changed" signals out to live pages. Signals coalesce: a subscriber that is
// busy gets one pending signal, never a backlog.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// AllExecutions subscribes to every execution.
const AllExecutions = "*"

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{subs: map[string]map[chan struct{}]struct{}{}} }

// Subscribe returns a channel signalled when execID (or any execution, for AllExecutions)
// changes, and a function that ends the subscription.
func (h *Hub) Subscribe(execID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[execID] == nil {
		h.subs[execID] = map[chan struct{}]struct{}{}
	}
	h.subs[execID][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[execID], ch)
		if len(h.subs[execID]) == 0 {
			delete(h.subs, execID)
		}
		h.mu.Unlock()
	}
}

// Publish signals the subscribers of execID and of every execution.
func (h *Hub) Publish(execID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, key := range []string{execID, AllExecutions} {
		for ch := range h.subs[key] {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}
