package relaytest

import (
	"sync"
	"time"
)

// Clock is a test clock for the server's windows (budgets, throttles,
// replay TTL, token times): it stands still until the test sets or advances
// it. Safe for concurrent use; pass its Now as the server's clock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock is a clock standing at now.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now is the time the clock stands at.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to now, forward or back.
func (c *Clock) Set(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}

// Advance moves the clock d forward and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
