package api

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// Brute-force protection for login and signup (README › Limits):
//
//   - a throttle counts attempts per key (an address, or an email) in a fixed
//     one-minute window that starts at the key's first attempt. An attempt is
//     counted by take, which checks and counts in one step under the lock, so
//     parallel requests cannot all pass the check before any is counted;
//   - hashSlots caps the argon2 hashes running at once, whoever asks for them,
//     so a flood from many addresses queues briefly and is then refused,
//     instead of exhausting memory (each hash holds argonMemory while it runs).
//
// Every refusal is 429 {"error":"too_many_attempts"} with Retry-After (the
// dashboard shows the same as a page).

// throttleWindow is the length of a key's window.
const throttleWindow = time.Minute

// throttle counts attempts per key. It holds at most maxKeys keys and never
// forgets a key whose window is still open: when it is full of live counters
// it refuses new keys until some expire. Evicting a live counter instead would
// let anyone reset a victim's count by sending attempts under enough fresh
// keys.
type throttle struct {
	limit   int
	maxKeys int
	now     func() time.Time

	mu      sync.Mutex
	entries map[string]attempts // guarded by mu
	swept   time.Time           // last sweep of expired entries
	oldest  time.Time           // no entry started earlier: nothing expires before oldest+window
}

// attempts is one key's count in the window that began at start.
type attempts struct {
	n     int
	start time.Time
}

func (a attempts) expired(now time.Time) bool {
	return now.Sub(a.start) >= throttleWindow || now.Before(a.start)
}

// maxThrottleKeys bounds each throttle's map: 100 000 keys is a few MiB.
const maxThrottleKeys = 100_000

// throttleMaxKeysForTest replaces maxThrottleKeys when not zero.
var throttleMaxKeysForTest atomic.Int64

// sweepEvery spaces the sweeps of a full map, so that a flood of new keys
// against a full map costs each request O(1), not a walk of the whole map.
const sweepEvery = time.Second

func newThrottle(limit int, now func() time.Time) *throttle {
	maxKeys := maxThrottleKeys
	if n := throttleMaxKeysForTest.Load(); n > 0 {
		maxKeys = int(n)
	}
	return &throttle{limit: limit, maxKeys: maxKeys, now: now, entries: map[string]attempts{}}
}

// take counts one attempt for key and reports whether it is allowed; when it
// is not, retry is the number of seconds until it may be.
func (t *throttle) take(key string) (ok bool, retry int) {
	if t == nil || t.limit <= 0 {
		return true, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if now.Sub(t.swept) >= throttleWindow {
		t.sweep(now) // at most once a window: expired keys do not linger
	}
	a, found := t.entries[key]
	if found && !a.expired(now) {
		if a.n >= t.limit {
			return false, secondsUntil(now, a.start.Add(throttleWindow))
		}
		a.n++
		t.entries[key] = a
		return true, 0
	}
	if !found && len(t.entries) >= t.maxKeys {
		if now.Sub(t.swept) >= sweepEvery {
			t.sweep(now)
		}
		if len(t.entries) >= t.maxKeys {
			return false, secondsUntil(now, t.oldest.Add(throttleWindow))
		}
	}
	t.entries[key] = attempts{n: 1, start: now}
	return true, 0
}

// refund gives back an attempt that turned out not to test a password (a
// successful login, a store failure, a refusal by the hash cap): the limits
// count failed guesses.
func (t *throttle) refund(key string) {
	if t == nil || t.limit <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if a, ok := t.entries[key]; ok && a.n > 0 && !a.expired(t.now()) {
		a.n--
		t.entries[key] = a
	}
}

// sweep deletes the expired entries and notes the oldest one left. Called
// with mu held.
func (t *throttle) sweep(now time.Time) {
	t.swept = now
	if !t.oldest.IsZero() && now.Sub(t.oldest) < throttleWindow && !now.Before(t.oldest) {
		return // nothing can have expired yet
	}
	oldest := time.Time{}
	for k, a := range t.entries {
		if a.expired(now) {
			delete(t.entries, k)
			continue
		}
		if oldest.IsZero() || a.start.Before(oldest) {
			oldest = a.start
		}
	}
	t.oldest = oldest
}

func secondsUntil(now, then time.Time) int {
	return max(1, int(math.Ceil(then.Sub(now).Seconds())))
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

// addrKey is the throttle key of the peer's address: an IPv4 address as it
// is, an IPv6 address by its /64, since one subscriber usually holds a whole
// /64 and could otherwise try from 2^64 addresses, each with a fresh budget.
func addrKey(r *http.Request) string {
	host := clientIP(r)
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "addr:" + host
	}
	ip = ip.WithZone("").Unmap()
	if ip.Is4() {
		return "ip:" + ip.String()
	}
	p, _ := ip.Prefix(64)
	return "ip:" + p.String()
}

// emailKey is the throttle key of an email: case and blanks do not make a
// new one.
func emailKey(email string) string { return "email:" + strings.ToLower(strings.TrimSpace(email)) }

// writeThrottled answers 429 too_many_attempts with Retry-After.
func writeThrottled(w http.ResponseWriter, retry int) {
	w.Header().Set("Retry-After", strconv.Itoa(retry))
	writeError(w, proto.CodeTooManyAttempts)
}

// hashSlots holds one token per argon2 hash running in this process. It is
// process-wide on purpose: what it protects, memory, is too.
var hashSlots = make(chan struct{}, hashConcurrency())

// hashConcurrency: at least 4, one per core up to 16 (16 × 19 MiB ≈ 300 MiB).
func hashConcurrency() int { return min(max(runtime.GOMAXPROCS(0), 4), 16) }

// hashWait is how long a login or signup waits for a hash slot before it is
// answered 429 (with Retry-After: 1): long enough for a burst of people, short
// enough that a flood holds little.
const hashWait = 2 * time.Second

// acquireHash waits up to hashWait for a hash slot; release gives it back.
func acquireHash(ctx context.Context) (release func(), ok bool) {
	release = func() { <-hashSlots }
	select {
	case hashSlots <- struct{}{}:
		return release, true
	default:
	}
	timer := time.NewTimer(hashWait)
	defer timer.Stop()
	select {
	case hashSlots <- struct{}{}:
		return release, true
	case <-timer.C:
	case <-ctx.Done():
	}
	return nil, false
}

// checkPasswordLimited is checkPassword under the hash cap; ok is false when
// no slot came free in time (nothing was checked).
func checkPasswordLimited(ctx context.Context, encoded, password string) (match, ok bool) {
	release, ok := acquireHash(ctx)
	if !ok {
		return false, false
	}
	defer release()
	return checkPassword(encoded, password), true
}

// hashPasswordLimited is hashPassword under the hash cap; ok is false when no
// slot came free in time.
func hashPasswordLimited(ctx context.Context, password string) (hash string, ok bool, err error) {
	release, ok := acquireHash(ctx)
	if !ok {
		return "", false, nil
	}
	defer release()
	hash, err = hashPassword(password)
	return hash, true, err
}

// HoldPasswordHashesForTest takes every hash slot of the process, as a flood
// of logins in progress would, until release is called.
func HoldPasswordHashesForTest() (release func()) {
	n := cap(hashSlots)
	for range n {
		hashSlots <- struct{}{}
	}
	return func() {
		for range n {
			<-hashSlots
		}
	}
}

// SetThrottleMaxKeysForTest sets the key bound of the throttles built from
// now on (by New), and returns a func that restores the previous bound.
func SetThrottleMaxKeysForTest(n int) (restore func()) {
	old := throttleMaxKeysForTest.Swap(int64(n))
	return func() { throttleMaxKeysForTest.Store(old) }
}

// loginOutcome is what one login attempt came to.
type loginOutcome int

const (
	loginOK          loginOutcome = iota
	loginRefused                  // unknown email or wrong password: invalid_credentials
	loginThrottled                // over a limit, or no password hash slot: 429 after retry seconds
	loginStoreFailed              // the user lookup failed: err says why
)

// login runs one attempt of email and password under the brute-force limits,
// for the JSON route and the dashboard alike. It counts the attempt against
// the address and the email before the password hash (so parallel guesses
// cannot all pass the check) and gives it back when it tested no password or
// the right one: the limits cap failed guesses. An unknown email costs the
// same hash as a wrong password, so timing tells nothing.
func (s *Server) login(r *http.Request, email, password string) (u store.User, out loginOutcome, retry int, err error) {
	addr, ek := addrKey(r), emailKey(email)
	if ok, retry := s.loginPerIP.take(addr); !ok {
		return u, loginThrottled, retry, nil
	}
	if ok, retry := s.loginPerEmail.take(ek); !ok {
		return u, loginThrottled, retry, nil
	}
	refund := func() { s.loginPerIP.refund(addr); s.loginPerEmail.refund(ek) }
	u, err = s.store.UserByEmail(r.Context(), email)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		refund()
		return u, loginStoreFailed, 0, err
	}
	hash := u.PasswordHash
	if err != nil {
		hash = dummyHash
	}
	match, ok := checkPasswordLimited(r.Context(), hash, password)
	if !ok {
		refund()
		return u, loginThrottled, 1, nil
	}
	if !match || err != nil {
		return u, loginRefused, 0, nil
	}
	refund()
	return u, loginOK, 0, nil
}
