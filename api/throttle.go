package api

import (
	"context"
	"errors"
	"fmt"
	"math"
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

// Brute-force protection for login and signup (cmd/relay/OPERATING.md › Abuse limits):
//
//   - a throttle counts attempts per key (an address, an email, an email
//     from an address) in a fixed one-minute window that starts at the key's
//     first attempt. An attempt is counted by take (or count), which checks
//     and counts in one step under the lock, so parallel requests cannot all
//     pass the check before any is counted;
//   - a login is refused (429) past the budget of its address or of its email
//     from that address, but never for its email alone: past the email's
//     budget each attempt for it waits a growing, bounded delay instead, so
//     guesses from many addresses slow down while the owner, from an address
//     that has not failed, still gets in (loginDelay);
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
	// failOpen: when the map is full of live counters, a new key passes
	// untracked instead of being refused. For keys a coarser throttle also
	// bounds (an email from an address, under the address's own cap).
	failOpen bool

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
	_, retry = t.add(key, true)
	return retry == 0, retry
}

// add counts one attempt for key and returns the key's attempts in its
// window, this one included. With refuse, an attempt past the limit is not
// counted and retry says in how many seconds the key may try again; a new
// key that finds the map full of live counters is refused the same way,
// unless the throttle fails open. Without refuse, such a key is not tracked
// and counts as untracked (over any budget).
func (t *throttle) add(key string, refuse bool) (n, retry int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if now.Sub(t.swept) >= throttleWindow {
		t.sweep(now) // at most once a window: expired keys do not linger
	}
	a, found := t.entries[key]
	if found && !a.expired(now) {
		if refuse && a.n >= t.limit {
			return a.n, secondsUntil(now, a.start.Add(throttleWindow))
		}
		a.n++
		t.entries[key] = a
		return a.n, 0
	}
	if !found && t.full(now) {
		switch {
		case !refuse:
			return untracked, 0
		case t.failOpen:
			return 0, 0
		}
		return 0, secondsUntil(now, t.oldest.Add(throttleWindow))
	}
	t.entries[key] = attempts{n: 1, start: now}
	return 1, 0
}

// full reports whether a new key finds no room, after sweeping expired ones
// if the last sweep is old enough. Called with mu held.
func (t *throttle) full(now time.Time) bool {
	if len(t.entries) < t.maxKeys {
		return false
	}
	if now.Sub(t.swept) >= sweepEvery {
		t.sweep(now)
	}
	return len(t.entries) >= t.maxKeys
}

// untracked is what count answers for a key the full map cannot hold: over
// any budget.
const untracked = math.MaxInt32

// count counts one attempt for key and returns how many the key has had in
// its window, this one included. It never refuses: it is for budgets that
// slow down rather than lock out. A new key that finds the map full of live
// counters is not tracked and counts as untracked (over any budget).
func (t *throttle) count(key string) int {
	if t == nil || t.limit <= 0 {
		return 0
	}
	n, _ := t.add(key, false)
	return n
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

// addrKey is the throttle key of a client address (Server.clientAddr): an
// IPv4 address as it is, an IPv6 address by its /64, since one subscriber
// usually holds a whole /64 and could otherwise try from 2^64 addresses, each
// with a fresh budget.
func addrKey(ip netip.Addr) string {
	if !ip.IsValid() {
		return "addr:?"
	}
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

// Past an email's budget of failed logins (LOGIN_ATTEMPTS_PER_MINUTE), each
// further attempt for it waits loginDelayBase, doubling with every attempt
// over, up to loginDelayMax: guesses spread over many addresses slow down,
// and the owner's correct password, from an address that has not failed,
// still logs in after at most loginDelayMax. The wait comes before the hash
// and holds no hash slot.
const (
	loginDelayBase = 250 * time.Millisecond
	loginDelayMax  = 4 * time.Second
)

// loginDelay is the wait of the n-th attempt in a window for an email whose
// budget is limit.
func loginDelay(n, limit int) time.Duration {
	over := n - limit
	if limit <= 0 || over <= 0 {
		return 0
	}
	if over > 8 { // 250 ms << 4 is already past the cap
		return loginDelayMax
	}
	return min(loginDelayBase<<(over-1), loginDelayMax)
}

// login runs one attempt of email and password under the brute-force limits,
// for the JSON route and the dashboard alike. It counts the attempt before
// the password hash (so parallel guesses cannot all pass the check) against
// the client address (3× LOGIN_ATTEMPTS_PER_MINUTE, refused past it), the
// email from that address (LOGIN_ATTEMPTS_PER_MINUTE, refused past it) and
// the email from anywhere (LOGIN_ATTEMPTS_PER_MINUTE, delayed past it, never
// refused: failures elsewhere cannot lock the owner out). It gives the
// attempt back when it tested no password or the right one: the limits count
// failed guesses. An unknown email costs the same hash as a wrong password,
// so timing tells nothing.
func (s *Server) login(r *http.Request, email, password string) (u store.User, out loginOutcome, retry int, err error) {
	addr, ek := addrKey(s.clientAddr(r)), emailKey(email)
	pair := ek + "|" + addr
	if ok, retry := s.loginPerIP.take(addr); !ok {
		return u, loginThrottled, retry, nil
	}
	if ok, retry := s.loginPerPair.take(pair); !ok {
		s.loginPerIP.refund(addr)
		return u, loginThrottled, retry, nil
	}
	n := s.loginPerEmail.count(ek)
	refund := func() { s.loginPerIP.refund(addr); s.loginPerPair.refund(pair); s.loginPerEmail.refund(ek) }
	if d := loginDelay(n, s.loginPerEmail.limit); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the client gave up: nothing was tested
			t.Stop()
			refund()
			return u, loginThrottled, 1, nil
		}
	}
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

// signupOutcome is what one signup came to.
type signupOutcome int

const (
	signupOK        signupOutcome = iota
	signupInvalid                 // answer code (400, 403 or 409)
	signupThrottled               // 429 after retry seconds
	signupFailed                  // our own fault: err says why
)

// signup runs one signup under the brute-force limits, for the JSON route
// and the dashboard alike: the checks that cost no hash (admitSignup), the
// password hash under the hash cap (the attempt given back when no slot came
// free: it tested nothing), then the account.
func (s *Server) signup(r *http.Request, email, password string) (u store.User, out signupOutcome, code proto.Code, retry int, err error) {
	code, retry, refund := s.admitSignup(r, email, password)
	switch {
	case retry > 0:
		return u, signupThrottled, "", retry, nil
	case code != "":
		return u, signupInvalid, code, 0, nil
	}
	hash, ok, err := hashPasswordLimited(r.Context(), password)
	if !ok {
		refund()
		return u, signupThrottled, "", 1, nil
	}
	if err != nil {
		return u, signupFailed, "", 0, fmt.Errorf("hash password: %w", err)
	}
	u, err = createAccount(r.Context(), s.store, email, hash)
	var refused *proto.Error
	switch {
	case errors.As(err, &refused):
		return u, signupInvalid, refused.Code, 0, nil
	case err != nil:
		return u, signupFailed, "", 0, err
	}
	return u, signupOK, "", 0, nil
}

// admitSignup runs the checks of a signup that cost no hash (fields,
// password length, allowlist) and then the brute-force limits. It refuses
// with code, or with retry > 0 (seconds) when over a limit; otherwise the
// signup goes on to the hash, and refund gives the attempt back if none
// runs. Only a signup that will hash counts against
// SIGNUP_ATTEMPTS_PER_MINUTE (per address and per email), so requests that
// fail those checks (an empty body, say) cannot use up the budget of everyone
// behind one address. They have a budget of their own, five times as large
// per address, past which they are answered 429 instead of their error:
// probing the allowlist stays slow, and valid signups are not affected.
func (s *Server) admitSignup(r *http.Request, email, password string) (code proto.Code, retry int, refund func()) {
	addr := addrKey(s.clientAddr(r))
	code = newCredentialsRefusal(email, password)
	if code == "" && !s.signupAllowed(email) {
		code = proto.CodeEmailNotAllowed
	}
	if code != "" {
		if ok, retry := s.signupInvalid.take(addr); !ok {
			return "", retry, nil
		}
		return code, 0, nil
	}
	ek := emailKey(email)
	if ok, retry := s.signupPerIP.take(addr); !ok {
		return "", retry, nil
	}
	if ok, retry := s.signupPerIP.take(ek); !ok {
		s.signupPerIP.refund(addr)
		return "", retry, nil
	}
	return "", 0, func() { s.signupPerIP.refund(addr); s.signupPerIP.refund(ek) }
}

// signupAllowed reports whether email is in ALLOWED_SIGNUP_EMAILS.
func (s *Server) signupAllowed(email string) bool {
	email = strings.ToLower(email)
	for _, a := range s.allowedEmails {
		if a == email {
			return true
		}
	}
	return false
}
