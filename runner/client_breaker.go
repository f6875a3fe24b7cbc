// The circuit breaker that makes a dead server cost a run seconds, not minutes.

package runner

import (
	"sync"
	"time"
)

// breaker fails calls fast after consecutive transport failures, letting one probe through
// per cool-down; the cool-down doubles after each failed probe.
type breaker struct {
	threshold   int
	cooldown    time.Duration
	maxCooldown time.Duration
	now         func() time.Time

	mu       sync.Mutex
	failures int
	openTill time.Time
	current  time.Duration
	probing  bool
}

// allow reports whether a call may go out now.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < b.threshold {
		return true
	}
	if b.probing || b.now().Before(b.openTill) {
		return false
	}
	b.probing = true
	return true
}

// untilProbe is how long until the breaker lets a call through (0: now, or it is closed).
func (b *breaker) untilProbe() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < b.threshold {
		return 0
	}
	return max(b.openTill.Sub(b.now()), 0)
}

// open reports whether calls are being failed fast now.
func (b *breaker) open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= b.threshold && b.now().Before(b.openTill)
}

// allowWaiting re-checks a call admitted earlier: it fails once the breaker has opened,
// unless that call is the probe itself.
func (b *breaker) allowWaiting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures < b.threshold || b.probing
}

// failure records a transport failure and reports whether the breaker is (now) open.
func (b *breaker) failure() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.failures < b.threshold {
		return false
	}
	switch {
	case b.current == 0:
		b.current = b.cooldown
	case b.probing:
		b.current *= 2
		if b.current > b.maxCooldown {
			b.current = b.maxCooldown
		}
	}
	b.probing = false
	b.openTill = b.now().Add(b.current)
	return true
}

// settle ends a probe that neither failed nor succeeded at the transport level (e.g. the token
// could not be minted): the breaker stays open for another cool-down.
func (b *breaker) settle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.probing {
		b.probing = false
		b.openTill = b.now().Add(b.current)
	}
}

// success closes the breaker.
func (b *breaker) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	b.current = 0
	b.probing = false
}
