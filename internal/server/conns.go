package server

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
)

// Who may hold the server's connections. A connection is unauthenticated until one of its
// requests carries valid credentials. Anyone can open connections, so unauthenticated ones
// are kept on a short leash:
//   - idle, an unauthenticated connection is closed after Config.UnauthIdleTimeout (an
//     authenticated one after Config.IdleTimeout);
//   - one client address holds at most Config.MaxConnsPerAddr unauthenticated connections: a new
//     one past that takes the place of the address's oldest idle one, or is answered as past the
//     cap when none is idle;
//   - when every slot is taken, a new connection takes the place of the oldest idle connection,
//     unauthenticated ones first.
// So idle connections never shut out a caller: capacity is held only by requests in progress,
// whose headers and bodies have deadlines, and whose number per principal is bounded
// (Config.MaxRequestsPerPrincipal).

// connTable tracks the connections being served, for the choices above.
type connTable struct {
	mu      sync.Mutex
	conns   map[*capConn]struct{}
	unauth  map[string]int // unauthenticated connections per client address
	perAddr int
	idleFor time.Duration // how long an unauthenticated connection may stay idle
}

func newConnTable(perAddr int, unauthIdle time.Duration) *connTable {
	return &connTable{conns: map[*capConn]struct{}{}, unauth: map[string]int{}, perAddr: perAddr, idleFor: unauthIdle}
}

// connKey is the client address a connection counts against: its peer's IP, an IPv6
// address's /64 (as the authentication throttle counts them).
func connKey(c net.Conn) string {
	return throttle.AddrKey(c.RemoteAddr().String())
}

// full reports whether key holds as many unauthenticated connections as it may.
func (t *connTable) full(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unauth[key] >= t.perAddr
}

func (t *connTable) add(c *capConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.conns[c] = struct{}{}
	t.unauth[c.key]++
}

func (t *connTable) remove(c *capConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.conns[c]; !ok {
		return
	}
	delete(t.conns, c)
	if !c.authed {
		t.forget(c.key)
	}
}

// forget counts one unauthenticated connection of key less; t.mu is held.
func (t *connTable) forget(key string) {
	if t.unauth[key]--; t.unauth[key] <= 0 {
		delete(t.unauth, key)
	}
}

// authenticated marks c as carrying a principal's requests.
func (t *connTable) authenticated(c *capConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.conns[c]; !ok || c.authed {
		return
	}
	c.authed = true
	t.forget(c.key)
}

// waiting counts the connections that wait for a request's headers.
func (t *connTable) waiting() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for c := range t.conns {
		if !c.idleSince.IsZero() {
			n++
		}
	}
	return n
}

// evict closes the oldest idle connection (of key only, when key is not empty), an
// unauthenticated one before any authenticated one, and reports whether it found one.
func (t *connTable) evict(key string) bool {
	t.mu.Lock()
	var victim *capConn
	for c := range t.conns {
		if c.idleSince.IsZero() || (key != "" && (c.key != key || c.authed)) {
			continue
		}
		if victim == nil || (victim.authed && !c.authed) ||
			(victim.authed == c.authed && c.idleSince.Before(victim.idleSince)) {
			victim = c
		}
	}
	t.mu.Unlock()
	if victim == nil {
		return false
	}
	_ = victim.Close()
	return true
}

// state follows a connection's life (http.Server.ConnState): it may be evicted while it waits
// for a request's headers (new or idle), and an idle unauthenticated one is closed once it has
// been idle for idleFor.
func (t *connTable) state(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*capConn)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch st {
	case http.StateNew:
		// Until its first request's headers are in, a connection holds nothing worth keeping
		// (a caller's own request is the newest, so the oldest such connections go first).
		c.idleSince = time.Now()
	case http.StateIdle:
		c.idleSince = time.Now()
		if !c.authed {
			since := c.idleSince
			time.AfterFunc(t.idleFor, func() {
				t.mu.Lock()
				stale := c.idleSince.Equal(since) && !c.authed
				t.mu.Unlock()
				if stale {
					_ = c.Close()
				}
			})
		}
	case http.StateActive:
		c.idleSince = time.Time{}
	}
}

// connCtxKey carries a request's connection in its context (http.Server.ConnContext).
type connCtxKey struct{}

// withConn is the http.Server's ConnContext.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connCtxKey{}, c)
}

// markAuthenticated notes that r's connection carried a principal's request.
func markAuthenticated(r *http.Request) {
	if c, ok := r.Context().Value(connCtxKey{}).(*capConn); ok && c.table != nil {
		c.table.authenticated(c)
	}
}

// inFlight counts each principal's API requests in progress, by auth.Principal.QuotaKey: a
// repository's GitHub Actions runs together.
type inFlight struct {
	mu  sync.Mutex
	n   map[string]int
	max int
}

// acquire counts one more request of name, or fails when name has max in progress; release
// counts it done.
func (f *inFlight) acquire(name string) (release func(), ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[name] >= f.max {
		return nil, false
	}
	f.n[name]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.n[name]--; f.n[name] <= 0 {
			delete(f.n, name)
		}
	}, true
}
