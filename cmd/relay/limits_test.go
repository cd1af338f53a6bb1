package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestSubscriptionCapPerConnection(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_SUBSCRIPTIONS_PER_CONNECTION": "3"})
	p := ts.signup("alice@example.com").createProject("demo")
	c := ts.dialWS(p.publicKey)
	for _, ch := range []string{"a", "b", "c", "a"} { // a repeated subscribe takes no new slot
		c.send(`{"action":"subscribe","channel":"` + ch + `"}`)
		c.expect(`{"action":"subscribe","channel":"` + ch + `","ok":true}`)
	}
	c.send(`{"action":"subscribe","channel":"d"}`)
	c.expect(`{"error":"too_many_subscriptions","channel":"d"}`)
	c.send(`{"action":"unsubscribe","channel":"a"}`)
	c.expect(`{"action":"unsubscribe","channel":"a","ok":true}`)
	c.send(`{"action":"subscribe","channel":"d"}`)
	c.expect(`{"action":"subscribe","channel":"d","ok":true}`)
}

func TestConnectionCapPerProject(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_CONNECTIONS_PER_PROJECT": "2"})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	other := owner.createProject("other")
	first := ts.dialWS(p.publicKey)
	ts.dialWS(p.publicKey)
	ts.handshake("/ws?publicKey="+p.publicKey).expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`)
	// The cap is checked before the upgrade: a plain request gets it too.
	ts.client().do("GET", "/ws?publicKey="+p.publicKey, "").expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`)
	ts.dialWS(other.publicKey) // another project has its own cap
	first.conn.Close()
	relaytest.Eventually(t, 5*time.Second, func() bool { _, status, _ := ts.tryDialWS(p.publicKey); return status == http.StatusSwitchingProtocols }, "a connection slot free again")
}

func TestLoginAndSignupThrottled(t *testing.T) {
	clock := newClock() // one fixed window for the whole test
	ts := startServerAt(t, storetest.SQLiteURL(t), map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "3", "SIGNUP_ATTEMPTS_PER_MINUTE": "2"}, clock.Now)
	ts.signup("alice@example.com")
	c := ts.client()
	for range 3 {
		c.do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong password"}`).expect(t, 401, `{"error":"invalid_credentials"}`)
	}
	r := c.do("POST", "/api/auth/login", `{"email":"ALICE@example.com","password":"correct horse"}`)
	r.expect(t, 429, `{"error":"too_many_attempts"}`)
	if r.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	// Another account from the same address is still allowed (the address cap is 9).
	c.do("POST", "/api/auth/login", `{"email":"bob@example.com","password":"whatever1"}`).expect(t, 401, `{"error":"invalid_credentials"}`)

	ts.signup("bob@example.com") // the second signup from this address
	c.do("POST", "/api/auth/signup", `{"email":"carol@example.com","password":"correct horse"}`).expect(t, 429, `{"error":"too_many_attempts"}`)
}
