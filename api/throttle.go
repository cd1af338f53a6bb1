package api

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relayhq/relay/proto"
)

// throttle counts attempts per key in fixed one-minute windows (brute-force
// protection for login and signup). It holds at most maxKeys keys; past that
// it starts a fresh window for everyone rather than grow.
type throttle struct {
	limit int
	now   func() time.Time

	mu     sync.Mutex
	window time.Time
	counts map[string]int
}

const maxThrottleKeys = 100_000

func newThrottle(limit int, now func() time.Time) *throttle {
	return &throttle{limit: limit, now: now, counts: map[string]int{}}
}

// over reports whether key has used its attempts this minute, and the
// seconds until the window resets.
func (t *throttle) over(key string) (bool, int) {
	if t == nil || t.limit <= 0 {
		return false, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.roll()
	return t.counts[key] >= t.limit, t.retryAfter()
}

// add counts one attempt for key.
func (t *throttle) add(key string) {
	if t == nil || t.limit <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.roll()
	if len(t.counts) >= maxThrottleKeys {
		clear(t.counts)
	}
	t.counts[key]++
}

func (t *throttle) roll() {
	now := t.now()
	if now.Sub(t.window) >= time.Minute || now.Before(t.window) {
		t.window = now.Truncate(time.Minute)
		clear(t.counts)
	}
}

func (t *throttle) retryAfter() int {
	return max(1, int(time.Until(t.window.Add(time.Minute)).Seconds()+0.5))
}

// clientIP is the peer address: X-Forwarded-For is not trusted, since
// anyone can send it.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// writeThrottled answers 429 too_many_attempts with Retry-After.
func writeThrottled(w http.ResponseWriter, retry int) {
	w.Header().Set("Retry-After", strconv.Itoa(retry))
	writeError(w, proto.CodeTooManyAttempts)
}

func emailKey(email string) string { return "email:" + strings.ToLower(strings.TrimSpace(email)) }
