package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestSubscriptionCapPerConnection(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_SUBSCRIPTIONS_PER_CONNECTION": "3"})
	p := ts.Signup("alice@example.com").CreateProject("demo")
	c := ts.DialWS(p.PublicKey)
	for _, ch := range []string{"a", "b", "c", "a"} { // a repeated subscribe takes no new slot
		c.Send(`{"action":"subscribe","channel":"` + ch + `"}`)
		c.Expect(`{"action":"subscribe","channel":"` + ch + `","ok":true}`)
	}
	c.Send(`{"action":"subscribe","channel":"d"}`)
	c.Expect(`{"error":"too_many_subscriptions","channel":"d"}`)
	c.Send(`{"action":"unsubscribe","channel":"a"}`)
	c.Expect(`{"action":"unsubscribe","channel":"a","ok":true}`)
	c.Send(`{"action":"subscribe","channel":"d"}`)
	c.Expect(`{"action":"subscribe","channel":"d","ok":true}`)
}

func TestConnectionCapPerProject(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_CONNECTIONS_PER_PROJECT": "2"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	other := owner.CreateProject("other")
	first := ts.DialWS(p.PublicKey)
	ts.DialWS(p.PublicKey)
	ts.Handshake("/ws?publicKey="+p.PublicKey).Expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`)
	// The cap is checked before the upgrade: a plain request gets it too.
	ts.Client().Do("GET", "/ws?publicKey="+p.PublicKey, "").Expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`)
	ts.DialWS(other.PublicKey) // another project has its own cap
	first.Conn.Close()
	relaytest.Eventually(t, 5*time.Second, func() bool { _, status, _ := ts.TryDialWS(p.PublicKey); return status == http.StatusSwitchingProtocols }, "a connection slot free again")
}

func TestLoginAndSignupThrottled(t *testing.T) {
	t.Parallel()
	clock := newClock() // one fixed window for the whole test
	ts := startServerAt(t, storetest.SQLiteURL(t), map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "3", "SIGNUP_ATTEMPTS_PER_MINUTE": "2"}, clock.Now)
	ts.Signup("alice@example.com")
	c := ts.Client()
	for range 3 {
		c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong password"}`).Expect(t, 401, `{"error":"invalid_credentials"}`)
	}
	r := c.Do("POST", "/api/auth/login", `{"email":"ALICE@example.com","password":"correct horse"}`)
	r.Expect(t, 429, `{"error":"too_many_attempts"}`)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	// Another account from the same address is still allowed (the address cap is 9).
	c.Do("POST", "/api/auth/login", `{"email":"bob@example.com","password":"whatever1"}`).Expect(t, 401, `{"error":"invalid_credentials"}`)

	ts.Signup("bob@example.com") // the second signup from this address
	c.Do("POST", "/api/auth/signup", `{"email":"carol@example.com","password":"correct horse"}`).Expect(t, 429, `{"error":"too_many_attempts"}`)
}
