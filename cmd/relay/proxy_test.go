package main

// Login and signup limits that an attacker cannot turn against everyone else
// (cmd/relay/OPERATING.md › Abuse limits): behind a trusted proxy each client has its own
// address (TRUSTED_PROXIES, X-Forwarded-For), X-Forwarded-For from anyone
// else is ignored, failures for an email from other addresses delay but never
// lock out its owner, and signups refused before the password hash do not
// use up the signup budget.

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// viaProxy sends a login or signup as a proxy at the client's address does,
// with X-Forwarded-For set to xff ("" sends none).
func viaProxy(c *client, xff, path, body string) response {
	c.T.Helper()
	h := map[string]string{}
	if xff != "" {
		h["X-Forwarded-For"] = xff
	}
	return c.Send("POST", path, body, "application/json", h)
}

func loginBody(email, password string) string {
	return fmt.Sprintf(`{"email":%q,"password":%q}`, email, password)
}

// expectLoggedIn checks a successful login of email.
func expectLoggedIn(r response, t *testing.T, email string) {
	t.Helper()
	if r.Status != http.StatusOK || r.Str("email") != email || r.Header.Get("Set-Cookie") == "" {
		t.Fatalf("login of %s: %d %s", email, r.Status, r.Raw)
	}
}

// TestTrustedProxyLoginFlood: every client arrives from one proxy address.
// With TRUSTED_PROXIES naming it, 40 wrong logins for random emails, each
// from a different client behind it, do not stop anyone else's login; one
// client is still held to its own per-address budget, whatever it writes
// into X-Forwarded-For itself; the window follows the server's clock.
func TestTrustedProxyLoginFlood(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		t.Parallel() // each store beside the other: the test is not, see harness_test.go
		clock := newClock()
		ts := startServerAt(t, dbURL, map[string]string{
			"TRUSTED_PROXIES": "127.0.0.1/32", "LOGIN_ATTEMPTS_PER_MINUTE": "10",
		}, clock.Now)
		ts.Signup("alice@example.com")
		proxy := ts.ClientFrom("127.0.0.1")

		for i := range 40 {
			viaProxy(proxy, fmt.Sprintf("198.51.100.%d", i+1), "/api/auth/login", loginBody(fmt.Sprintf("nobody%d@example.com", i), "wrong password")).
				Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		}
		expectLoggedIn(viaProxy(proxy, "203.0.113.7", "/api/auth/login", loginBody("alice@example.com", "correct horse")), t, "alice@example.com")

		// One client behind the proxy: 3 × 10 failures, then refused. What it
		// writes into X-Forwarded-For itself (left of what the proxy appends)
		// changes nothing.
		const perAddr = 30
		for i := range perAddr {
			viaProxy(proxy, fmt.Sprintf("6.6.6.%d, 198.51.100.200", i), "/api/auth/login", loginBody(fmt.Sprintf("guess%d@example.com", i), "wrong password")).
				Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		}
		expectThrottled(viaProxy(proxy, "7.7.7.7, 198.51.100.200", "/api/auth/login", loginBody("guess-more@example.com", "wrong password")), t)
		expectThrottled(viaProxy(proxy, "198.51.100.200", "/api/auth/login", loginBody("alice@example.com", "correct horse")), t)
		// Everyone else behind the proxy is unaffected.
		expectLoggedIn(viaProxy(proxy, "203.0.113.8", "/api/auth/login", loginBody("alice@example.com", "correct horse")), t, "alice@example.com")
		// The window ends a minute after it began, on the server's clock.
		clock.Advance(61 * time.Second)
		expectLoggedIn(viaProxy(proxy, "198.51.100.200", "/api/auth/login", loginBody("alice@example.com", "correct horse")), t, "alice@example.com")
	})
}

// TestForwardedForIgnoredFromUntrustedPeers: X-Forwarded-For is read only
// from a trusted proxy. Without TRUSTED_PROXIES, or from a peer not in it, a
// client that sends a different X-Forwarded-For on every attempt is still
// one address, held to one budget; and claiming someone else's address
// charges that address nothing.
func TestForwardedForIgnoredFromUntrustedPeers(t *testing.T) {
	const perAddr = 30 // 3 × LOGIN_ATTEMPTS_PER_MINUTE
	flood := func(t *testing.T, attacker *client, xff func(i int) string) {
		t.Helper()
		for i := range perAddr {
			viaProxy(attacker, xff(i), "/api/auth/login", loginBody(fmt.Sprintf("guess%d@example.com", i), "wrong password")).
				Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		}
		expectThrottled(viaProxy(attacker, xff(perAddr), "/api/auth/login", loginBody("guess-more@example.com", "wrong password")), t)
	}
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		t.Parallel() // each store beside the other: the test is not, see harness_test.go
		t.Run("no trusted proxies", func(t *testing.T) {
			ts := startServerAt(t, dbURL, map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "10"}, newClock().Now)
			ts.Signup("alice@example.com")
			flood(t, ts.ClientFrom("127.0.0.1"), func(i int) string { return fmt.Sprintf("198.51.100.%d", i+1) })
			expectLoggedIn(viaProxy(ts.ClientFrom("127.0.0.2"), "198.51.100.1", "/api/auth/login", loginBody("alice@example.com", "correct horse")),
				t, "alice@example.com")
		})
		t.Run("peer not trusted", func(t *testing.T) {
			ts := startServerAt(t, dbURL, map[string]string{
				"TRUSTED_PROXIES": "127.0.0.1/32", "LOGIN_ATTEMPTS_PER_MINUTE": "10",
			}, newClock().Now)
			ts.Signup("bob@example.com")
			// The attacker, not the proxy, claims to be the victim's
			// address, and to come through the proxy.
			flood(t, ts.ClientFrom("127.0.0.3"), func(i int) string { return "203.0.113.7, 127.0.0.1" })
			expectLoggedIn(viaProxy(ts.ClientFrom("127.0.0.1"), "203.0.113.7", "/api/auth/login", loginBody("bob@example.com", "correct horse")),
				t, "bob@example.com")
		})
	})
}

// TestLoginNotLockedOutFromOtherAddresses: failed logins for an email from
// other addresses never stop its owner's correct password from an address
// that has not failed, window after window; they only delay it (at most 4 s).
// An address that keeps failing for the email is refused on its own.
func TestLoginNotLockedOutFromOtherAddresses(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "10"}, clock.Now)
		ts.Signup("alice@example.com")
		var attackers []*client
		for i := range 4 {
			attackers = append(attackers, ts.ClientFrom(fmt.Sprintf("127.0.0.%d", i+2)))
		}
		owner := ts.ClientFrom("127.0.0.1")
		for round := range 2 {
			for i := range 12 {
				attackers[i%len(attackers)].Do("POST", "/api/auth/login", loginBody("alice@example.com", "wrong password")).
					Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
			}
			began := time.Now()
			expectLoggedIn(owner.Do("POST", "/api/auth/login", loginBody("ALICE@example.com", "correct horse")), t, "alice@example.com")
			if took := time.Since(began); took > 10*time.Second {
				t.Fatalf("round %d: the owner's login took %v, want at most the 4 s delay (plus slack)", round, took)
			}
			clock.Advance(61 * time.Second)
		}

		// One address: 10 failures for alice, then refused, even with the
		// right password; the owner elsewhere still gets in.
		persistent := ts.ClientFrom("127.0.0.9")
		for range 10 {
			persistent.Do("POST", "/api/auth/login", loginBody("alice@example.com", "wrong password")).
				Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		}
		expectThrottled(persistent.Do("POST", "/api/auth/login", loginBody("alice@example.com", "correct horse")), t)
		expectLoggedIn(owner.Do("POST", "/api/auth/login", loginBody("alice@example.com", "correct horse")), t, "alice@example.com")
		// The dashboard shares the rule.
		d := ts.Dash(t)
		d.Submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {"correct horse"}}).ExpectRedirect(t, "/")
	})
}

// TestInvalidSignupsDoNotCloseSignup: everyone arrives from one address (no
// TRUSTED_PROXIES). Signups refused before the password hash (empty, missing
// fields, a short password, an email not allowed) do not use up
// SIGNUP_ATTEMPTS_PER_MINUTE; past five times that they are answered 429
// themselves, and a valid signup still goes through.
func TestInvalidSignupsDoNotCloseSignup(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, map[string]string{"SIGNUP_ATTEMPTS_PER_MINUTE": "20"}, clock.Now)
		c := ts.Client()
		invalid := []struct {
			body   string
			status int
			want   string
		}{
			{"", 400, `{"error":"email_and_password_required"}`},
			{`{}`, 400, `{"error":"email_and_password_required"}`},
			{`{"email":"alice@example.com"}`, 400, `{"error":"email_and_password_required"}`},
			{`{"email":"alice@example.com","password":"short"}`, 400, `{"error":"password_too_short"}`},
			{`{"email":"mallory@example.com","password":"correct horse"}`, 403, `{"error":"email_not_allowed"}`},
		}
		for range 20 { // the attacker's 20 empty signups: signup stays open
			c.Do("POST", "/api/auth/signup", "").Expect(t, http.StatusBadRequest, `{"error":"email_and_password_required"}`)
		}
		ts.Signup("alice@example.com")
		const budget = 5 * 20
		for i := 20; i < budget; i++ {
			tc := invalid[i%len(invalid)]
			c.Do("POST", "/api/auth/signup", tc.body).Expect(t, tc.status, tc.want)
		}
		expectThrottled(c.Do("POST", "/api/auth/signup", ""), t)
		ts.Signup("bob@example.com")
		clock.Advance(61 * time.Second)
		c.Do("POST", "/api/auth/signup", "").Expect(t, http.StatusBadRequest, `{"error":"email_and_password_required"}`)
	})
}

// TestClientAddressInConnectionLogs: the connection log names the client
// behind a trusted proxy, and the peer itself when it is not trusted,
// whatever X-Forwarded-For it sent.
func TestClientAddressInConnectionLogs(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	p := ts.Signup("alice@example.com").CreateProject("demo")
	dial := func(from, xff string) {
		t.Helper()
		d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, NetDial: func(network, addr string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).Dial(network, addr)
		}}
		conn, _, err := d.Dial(ts.WSURL(p.PublicKey), http.Header{"X-Forwarded-For": {xff}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
	}
	dial("127.0.0.1", "203.0.113.7")
	dial("127.0.0.2", "203.0.113.66")
	waitLog := func(want string) {
		t.Helper()
		relaytest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(ts.Logs.String(), want) }, "a log line with %q:\n%s", want, ts.Logs)
	}
	waitLog("msg=\"connection opened\"")
	waitLog("addr=203.0.113.7")
	waitLog("addr=127.0.0.2")
	if strings.Contains(ts.Logs.String(), "203.0.113.66") {
		t.Fatalf("an untrusted peer's X-Forwarded-For was logged as its address:\n%s", ts.Logs)
	}
}
