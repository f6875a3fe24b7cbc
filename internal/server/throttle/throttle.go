// Package throttle refuses, for a while, the clients and principals whose authentication failed
// too often: failures fill a bucket per key that drains at Burst per Window; a key whose bucket
// reaches Burst is refused until Window has passed. It keeps at most MaxKeys keys, forgetting
// the one that failed longest ago, and runs nothing in the background.
package throttle

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Defaults of New's parameters.
const (
	DefaultBurst   = 10
	DefaultWindow  = 5 * time.Minute
	DefaultMaxKeys = 10_000
)

// ErrThrottled marks a request refused because its client or principal failed too often.
var ErrThrottled = errors.New("too many failed authentications")

// Error is ErrThrottled with what was throttled and for how long.
type Error struct {
	// What names the throttled key for the client: "this address", "this principal".
	What string
	// Wait is how long the key is still refused.
	Wait time.Duration
}

// Error says what is throttled and when to retry.
func (e *Error) Error() string {
	return fmt.Sprintf("%v from %s; retry in %s", ErrThrottled, e.What, e.Wait.Round(time.Second))
}

// Is matches ErrThrottled.
func (e *Error) Is(target error) bool { return target == ErrThrottled }

// RetryAfter is the Retry-After header value of a wait: whole seconds, rounded up.
func RetryAfter(wait time.Duration) string {
	return strconv.FormatInt(int64(math.Ceil(wait.Seconds())), 10)
}

// Throttle counts failures per key. Its methods are safe for concurrent use.
type Throttle struct {
	burst   float64
	window  time.Duration
	maxKeys int
	now     func() time.Time

	mu   sync.Mutex
	keys map[string]*list.Element // of *entry
	lru  list.List                // front: the latest failure
}

type entry struct {
	key   string
	level float64   // failures not yet drained
	at    time.Time // when level was last computed
	until time.Time // refused until
}

// New returns a Throttle refusing a key for window once burst failures fill its bucket (0 or
// less: the defaults), tracking at most maxKeys keys, on the clock now (nil: time.Now).
func New(burst int, window time.Duration, maxKeys int, now func() time.Time) *Throttle {
	if burst <= 0 {
		burst = DefaultBurst
	}
	if window <= 0 {
		window = DefaultWindow
	}
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	if now == nil {
		now = time.Now
	}
	return &Throttle{burst: float64(burst), window: window, maxKeys: maxKeys, now: now, keys: map[string]*list.Element{}}
}

// Wait returns how long key is still refused: 0 when it is not. It tracks nothing new.
func (t *Throttle) Wait(key string) time.Duration {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.keys[key]
	if !ok {
		return 0
	}
	return max(0, el.Value.(*entry).until.Sub(t.now()))
}

// Fail counts a failure of key and returns how long the key is now refused (0: not yet).
func (t *Throttle) Fail(key string) time.Duration {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	el, ok := t.keys[key]
	if !ok {
		t.makeRoom(now)
		el = t.lru.PushFront(&entry{key: key, at: now})
		t.keys[key] = el
	}
	t.lru.MoveToFront(el)
	e := el.Value.(*entry)
	e.level = t.drained(e, now) + 1
	e.at = now
	// The burst-th failure refuses the key when it comes before one failure has drained: the
	// bucket drains all the time, so it never holds a whole burst.
	if e.level > t.burst-1 {
		e.until = now.Add(t.window)
	}
	return max(0, e.until.Sub(now))
}

// drained is e's level at now.
func (t *Throttle) drained(e *entry, now time.Time) float64 {
	gone := now.Sub(e.at).Seconds() / t.window.Seconds() * t.burst
	return max(0, e.level-gone)
}

// oldest is how many of the longest-failed keys makeRoom looks at for one it may forget.
const oldest = 8

// makeRoom forgets one key when the throttle is full: the longest-failed one that is not
// refused among the oldest few, else the longest-failed one. A flood of new keys thus forgets
// refused keys last, and only once everything it looked at is refused too.
func (t *Throttle) makeRoom(now time.Time) {
	if len(t.keys) < t.maxKeys {
		return
	}
	victim := t.lru.Back()
	for el, i := victim, 0; el != nil && i < oldest; el, i = el.Prev(), i+1 {
		if !now.Before(el.Value.(*entry).until) {
			victim = el
			break
		}
	}
	delete(t.keys, victim.Value.(*entry).key)
	t.lru.Remove(victim)
}

// Len returns how many keys the throttle tracks.
func (t *Throttle) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.keys)
}

// Addr is the throttle key of a request's client: the IP of the connection's peer (never a
// header a client can set), an IPv6 address's /64, where one client usually holds them all.
func Addr(r *http.Request) string { return AddrKey(r.RemoteAddr) }

// AddrKey is Addr of a peer's address (host:port).
func AddrKey(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// Auth throttles failed authentications per client address and per principal.
type Auth struct {
	Addrs, Principals *Throttle
}

// NewAuth returns an Auth whose two throttles take New's parameters.
func NewAuth(burst int, window time.Duration, maxKeys int, now func() time.Time) *Auth {
	return &Auth{Addrs: New(burst, window, maxKeys, now), Principals: New(burst, window, maxKeys, now)}
}

// CheckAddr returns an *Error when the client of r is refused.
func (a *Auth) CheckAddr(r *http.Request) error {
	if a == nil {
		return nil
	}
	if wait := a.Addrs.Wait(Addr(r)); wait > 0 {
		return &Error{What: "this address", Wait: wait}
	}
	return nil
}

// CheckPrincipal returns an *Error when principal is refused.
func (a *Auth) CheckPrincipal(principal string) error {
	if a == nil {
		return nil
	}
	if wait := a.Principals.Wait(principal); wait > 0 {
		return &Error{What: "this principal", Wait: wait}
	}
	return nil
}

// Fail counts a failed authentication of r's client and, when principal is not empty, of the
// principal; it returns an *Error when either is now refused.
func (a *Auth) Fail(r *http.Request, principal string) error {
	if a == nil {
		return nil
	}
	if wait := a.Addrs.Fail(Addr(r)); wait > 0 {
		if principal != "" {
			a.Principals.Fail(principal)
		}
		return &Error{What: "this address", Wait: wait}
	}
	if principal != "" {
		if wait := a.Principals.Fail(principal); wait > 0 {
			return &Error{What: "this principal", Wait: wait}
		}
	}
	return nil
}
