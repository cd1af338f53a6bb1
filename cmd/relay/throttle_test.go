package main

// Brute-force limits on login and signup (cmd/relay/OPERATING.md › Abuse limits): attempts
// are counted before the password hash, per address (an IPv6 address by its
// /64), per email from an address and per email (proxy_test.go has the
// rules that keep an email's owner from being locked out); the argon2 hashes
// running at once are capped; and the bounded maps of counters cannot be
// flooded into forgetting one. A refusal is always
// 429 {"error":"too_many_attempts"} with Retry-After.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// serveFrom sends a JSON request through the server's handler as if from
// remoteAddr: any address, IPv6 ones included, which loopback sockets cannot
// give.
func (ts *testServer) serveFrom(remoteAddr, method, path, body string) response {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = remoteAddr
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	ts.app.api.ServeHTTP(rec, req)
	r := response{Status: rec.Code, Header: rec.Header(), Raw: rec.Body.String()}
	json.Unmarshal(rec.Body.Bytes(), &r.JSON)
	return r
}

// expectThrottled checks the answer of every brute-force refusal.
func expectThrottled(r response, t *testing.T) {
	t.Helper()
	r.Expect(t, http.StatusTooManyRequests, `{"error":"too_many_attempts"}`)
	if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q, want 1 to 60 seconds", r.Header.Get("Retry-After"))
	}
}

// parallelLogins sends n logins at once, each on a connection of its own,
// and returns their answers.
func parallelLogins(t *testing.T, ts *testServer, n int, email, password string) (statuses []int, bodies []string) {
	t.Helper()
	c := &client{T: t, Server: ts.Server, HTTP: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}}
	defer c.HTTP.CloseIdleConnections()
	for _, r := range c.Parallel(t, n, "POST", "/api/auth/login", fmt.Sprintf(`{"email":%q,"password":%q}`, email, password)) {
		if r.Status == http.StatusTooManyRequests && r.Header.Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After: %s", r.Raw)
		}
		statuses, bodies = append(statuses, r.Status), append(bodies, r.Raw)
	}
	return statuses, bodies
}

// TestLoginCountsBeforeTheHash: guesses sent in parallel cannot all pass the
// check before any is counted; exactly the budget of failures is admitted in
// a window, however the attempts are spread.
func TestLoginCountsBeforeTheHash(t *testing.T) {
	const limit, n = 5, 12 // the address cap (15) stays out of the way
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": strconv.Itoa(limit)})
	ts.Signup("alice@example.com")

	statuses, bodies := parallelLogins(t, ts, n, "alice@example.com", "wrong password")
	failed := 0
	for i, s := range statuses {
		switch {
		case s == http.StatusUnauthorized && strings.Contains(bodies[i], `"invalid_credentials"`):
			failed++
		case s == http.StatusTooManyRequests && strings.Contains(bodies[i], `"too_many_attempts"`):
		default:
			t.Fatalf("login %d: %d %s", i, s, bodies[i])
		}
	}
	if failed < 1 || failed > limit {
		t.Fatalf("%d of %d parallel wrong passwords were checked, want 1 to %d", failed, n, limit)
	}
	// An attempt refused only because no hash slot came free in time is given
	// back; whatever happened, the window admits exactly `limit` failures.
	c := ts.Client()
	for failed < limit {
		c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong password"}`).
			Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		failed++
	}
	expectThrottled(c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong password"}`), t)
	expectThrottled(c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`), t)
}

// TestLoginHashCap: with every argon2 slot taken (a flood of logins in
// progress), further logins and signups, through either surface, wait
// briefly and are then refused with the throttle answer, without a session;
// once slots are free they work again.
func TestLoginHashCap(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	ts.Signup("alice@example.com")

	release := api.HoldPasswordHashesForTest()
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	// Eight logins at once, and a login, a signup and a dashboard login
	// beside them: each waits for a slot for at most hashWait (2 s), at
	// the same time.
	c := ts.Client()
	d := ts.Dash(t)
	dashForm := url.Values{"email": {"alice@example.com"}, "password": {"correct horse"}, "csrf": {d.Get("/login").CSRF(t)}}
	var (
		wg                sync.WaitGroup
		login, signup     response
		dash              relaytest.Page
		loginErr, signErr error
		dashErr           error
	)
	wg.Add(3)
	go func() {
		defer wg.Done()
		login, loginErr = c.Try("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`, "application/json", nil)
	}()
	go func() {
		defer wg.Done()
		signup, signErr = c.Try("POST", "/api/auth/signup", `{"email":"bob@example.com","password":"correct horse"}`, "application/json", nil)
	}()
	go func() { defer wg.Done(); dash, dashErr = d.TryPost("/login", dashForm) }()
	began := time.Now()
	statuses, bodies := parallelLogins(t, ts, 8, "alice@example.com", "correct horse")
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusTooManyRequests || !strings.Contains(bodies[i], `"too_many_attempts"`) {
			t.Fatalf("login %d with every hash slot taken: %d %s", i, s, bodies[i])
		}
	}
	// Each waited for a slot at most hashWait (2 s); 20 s is slack for a
	// loaded machine, far below anything a flood could hold a request for.
	if d := time.Since(began); d > 20*time.Second {
		t.Fatalf("refusals took %v", d)
	}
	if err := errors.Join(loginErr, signErr, dashErr); err != nil {
		t.Fatal(err)
	}
	expectThrottled(login, t)
	if login.Header.Get("Set-Cookie") != "" {
		t.Fatal("a refused login set a cookie")
	}
	expectThrottled(signup, t)
	dash.ExpectError(t, http.StatusTooManyRequests, "Too many attempts")

	release()
	released = true
	c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`).
		Expect(t, http.StatusOK, fmt.Sprintf(`{"id":%q,"email":"alice@example.com"}`, mustUserID(t, ts, "alice@example.com")))
	ts.Signup("bob@example.com")
}

// TestLoginPerAddressCap: an address gets three times the per-email budget
// whatever emails it tries; another address has its own; an IPv6 client is
// one address per /64, and an IPv4-mapped IPv6 address is its IPv4 address.
func TestLoginPerAddressCap(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "1"})
	const perAddr = 3
	login := func(i int) string {
		return fmt.Sprintf(`{"email":"user%d@example.com","password":"wrong password"}`, i)
	}
	next := 0
	fresh := func() string { next++; return login(next) } // a new email each time: only the address counts

	c := ts.Client() // 127.0.0.1
	for range perAddr {
		c.Do("POST", "/api/auth/login", fresh()).Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
	}
	expectThrottled(c.Do("POST", "/api/auth/login", fresh()), t)
	ts.ClientFrom("127.0.0.2").Do("POST", "/api/auth/login", fresh()).
		Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)

	// One /64, three hosts in it: one budget.
	for i := range perAddr {
		ts.serveFrom(fmt.Sprintf("[2001:db8:1:2::%x]:40000", i+1), "POST", "/api/auth/login", fresh()).
			Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
	}
	expectThrottled(ts.serveFrom("[2001:db8:1:2:ffff:ffff:ffff:ffff]:40000", "POST", "/api/auth/login", fresh()), t)
	ts.serveFrom("[2001:db8:1:3::1]:40000", "POST", "/api/auth/login", fresh()).
		Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)

	// ::ffff:10.9.9.9 is 10.9.9.9.
	for range perAddr {
		ts.serveFrom("10.9.9.9:40000", "POST", "/api/auth/login", fresh()).
			Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
	}
	expectThrottled(ts.serveFrom("[::ffff:10.9.9.9]:40000", "POST", "/api/auth/login", fresh()), t)
}

// TestSignupThrottledPerEmail: signups for one email that reach the password
// hash are capped whichever addresses they come from (case and blanks do not
// make a new email), and through the dashboard too; another email from the
// same address still passes. Signups refused before the hash (an email not
// on the allowlist) do not count.
func TestSignupThrottledPerEmail(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"SIGNUP_ATTEMPTS_PER_MINUTE": "2"})
	signup := func(email string) string {
		return fmt.Sprintf(`{"email":%q,"password":"correct horse"}`, email)
	}
	for i := range 5 {
		ts.serveFrom(fmt.Sprintf("10.0.0.%d:1234", i+1), "POST", "/api/auth/signup", signup("mallory@example.com")).
			Expect(t, http.StatusForbidden, `{"error":"email_not_allowed"}`)
	}
	if r := ts.serveFrom("10.0.0.1:1234", "POST", "/api/auth/signup", signup("alice@example.com")); r.Status != http.StatusCreated {
		t.Fatalf("first signup: %d %s", r.Status, r.Raw)
	}
	ts.serveFrom("10.0.0.2:1234", "POST", "/api/auth/signup", signup(" ALICE@Example.com ")).
		Expect(t, http.StatusConflict, `{"error":"email_already_registered"}`)
	expectThrottled(ts.serveFrom("10.0.0.3:1234", "POST", "/api/auth/signup", signup("alice@example.com")), t)
	r := ts.serveFrom("10.0.0.3:1234", "POST", "/api/auth/signup", signup("bob@example.com"))
	if r.Status != http.StatusCreated {
		t.Fatalf("another email from an address under its cap: %d %s", r.Status, r.Raw)
	}
	d := ts.Dash(t)
	d.Submit("/signup", "/signup", url.Values{"email": {"alice@example.com"}, "password": {"correct horse"}}).
		ExpectError(t, http.StatusTooManyRequests, "Too many attempts")
}

// TestThrottleMapBoundKeepsCounters: the counters live in bounded maps. When
// a flood of fresh emails fills them, no live counter is dropped, so the
// flood cannot reset the count of the email it is guessing from an address;
// a fresh email that finds the per-email map full is not refused but waits
// the longest login delay.
func TestThrottleMapBoundKeepsCounters(t *testing.T) {
	const bound = 8
	restore := api.SetThrottleMaxKeysForTest(bound)
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "3"})
	restore() // read when the server was built
	ts.Signup("alice@example.com")

	c := ts.Client()
	for range 3 {
		c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong password"}`).
			Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
	}
	expectThrottled(c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong password"}`), t)

	// alice holds one key of each map; 7 fresh emails (from an address with
	// a budget of 9) fill them, the 8th finds them full.
	for i := range bound {
		began := time.Now()
		r := ts.serveFrom("10.0.0.1:1234", "POST", "/api/auth/login", fmt.Sprintf(`{"email":"flood%d@example.com","password":"x"}`, i))
		r.Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		if took := time.Since(began); i == bound-1 && took < 3*time.Second {
			t.Fatalf("a fresh email past the full map was answered after %v, want the longest delay (4 s)", took)
		}
	}
	expectThrottled(c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`), t)
	// Counters already in the maps go on counting while they are full.
	ts.serveFrom("10.0.0.2:1234", "POST", "/api/auth/login", `{"email":"flood0@example.com","password":"x"}`).
		Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
	ts.serveFrom("10.0.0.1:1234", "POST", "/api/auth/login", `{"email":"flood0@example.com","password":"x"}`).
		Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`) // the address's 9th
	expectThrottled(ts.serveFrom("10.0.0.1:1234", "POST", "/api/auth/login", `{"email":"flood1@example.com","password":"x"}`), t)
}
