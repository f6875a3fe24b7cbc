package throttle

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"
)

// clock is a settable clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }
func fails(t *Throttle, key string, n int) {
	for range n {
		t.Fail(key)
	}
}

// TestBurstThenWindow: a key is refused for the window once its failures reach the burst, and
// only then; other keys are not; it is let in again when the window has passed.
func TestBurstThenWindow(t *testing.T) {
	c := newClock()
	th := New(10, time.Minute, 100, c.now)
	for i := range 9 {
		if wait := th.Fail("a"); wait != 0 {
			t.Fatalf("failure %d: refused for %s, want not yet", i+1, wait)
		}
	}
	if wait := th.Wait("a"); wait != 0 {
		t.Fatalf("after 9 failures: refused for %s", wait)
	}
	if wait := th.Fail("a"); wait != time.Minute {
		t.Fatalf("10th failure: refused for %s, want the window", wait)
	}
	if wait := th.Wait("b"); wait != 0 {
		t.Fatalf("another key refused for %s", wait)
	}
	c.add(59 * time.Second)
	if wait := th.Wait("a"); wait != time.Second {
		t.Fatalf("59s on: refused for %s, want 1s more", wait)
	}
	c.add(time.Second)
	if wait := th.Wait("a"); wait != 0 {
		t.Fatalf("after the window: refused for %s", wait)
	}
	// The bucket drained with the window: one failure does not refuse the key again.
	if wait := th.Fail("a"); wait != 0 {
		t.Fatalf("first failure after the window: refused for %s", wait)
	}
}

// TestFailuresDrain: failures spread out at the drain rate never refuse a key; the same number
// at once does.
func TestFailuresDrain(t *testing.T) {
	c := newClock()
	th := New(10, time.Minute, 100, c.now)
	for i := range 100 {
		if wait := th.Fail("slow"); wait != 0 {
			t.Fatalf("failure %d, one every 6s: refused for %s", i+1, wait)
		}
		c.add(6 * time.Second)
	}
	fails(th, "fast", 10)
	if th.Wait("fast") == 0 {
		t.Fatal("10 failures at once are not refused")
	}
	for i := range 10 {
		c.add(time.Millisecond)
		if wait := th.Fail("quick"); (wait > 0) != (i == 9) {
			t.Fatalf("failure %d, one every millisecond: refused for %s", i+1, wait)
		}
	}
}

// TestBoundedKeys: the throttle tracks at most maxKeys keys; a flood of new keys forgets the
// keys that are not refused before those that are.
func TestBoundedKeys(t *testing.T) {
	c := newClock()
	th := New(3, time.Minute, 50, c.now)
	fails(th, "refused", 3)
	for i := range 10_000 {
		th.Fail(fmt.Sprint("k", i))
		if n := th.Len(); n > 50 {
			t.Fatalf("%d keys tracked, want at most 50", n)
		}
	}
	if th.Wait("refused") == 0 {
		t.Fatal("a flood of other keys made the throttle forget a refused key")
	}
	// Once every key it looks at is refused, the oldest goes.
	full := New(1, time.Minute, 4, c.now)
	for i := range 5 {
		full.Fail(fmt.Sprint("r", i))
	}
	if full.Len() != 4 || full.Wait("r0") != 0 || full.Wait("r4") == 0 {
		t.Fatalf("full of refused keys: %d keys, r0 refused %s, r4 %s", full.Len(), full.Wait("r0"), full.Wait("r4"))
	}
}

// TestAddr keys a request by its connection's IP, an IPv6 address by its /64, and never by a
// header.
func TestAddr(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.7:5555":                 "192.0.2.7",
		"[::ffff:192.0.2.7]:5555":        "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1%eth0]:80": "2001:db8:1:2::/64",
		"not-an-address":                 "not-an-address",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", "203.0.113.9")
		r.Header.Set("X-Real-IP", "203.0.113.9")
		if got := Addr(r); got != want {
			t.Errorf("Addr(%q) = %q, want %q", remote, got, want)
		}
	}
}

// TestAuth: an address and a principal are throttled apart; a failure with a principal counts
// for both.
func TestAuth(t *testing.T) {
	c := newClock()
	a := NewAuth(2, time.Minute, 100, c.now)
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	other := httptest.NewRequest("GET", "/", nil)
	other.RemoteAddr = "192.0.2.2:1"
	if err := a.Fail(r, "mallory"); err != nil {
		t.Fatalf("first failure: %v", err)
	}
	if err := a.Fail(other, "mallory"); !errors.Is(err, ErrThrottled) || err.(*Error).What != "this principal" {
		t.Fatalf("second failure of the principal from another address: %v, want the principal throttled", err)
	}
	if err := a.CheckAddr(other); err != nil {
		t.Fatalf("an address with one failure: %v", err)
	}
	if err := a.CheckPrincipal("alice"); err != nil {
		t.Fatalf("another principal: %v", err)
	}
	if err := a.Fail(r, ""); !errors.Is(err, ErrThrottled) || a.CheckAddr(r) == nil {
		t.Fatalf("second failure of the address: %v, want it throttled", err)
	}
	if got := RetryAfter(1500 * time.Millisecond); got != "2" {
		t.Fatalf("RetryAfter(1.5s) = %s, want 2", got)
	}
}
