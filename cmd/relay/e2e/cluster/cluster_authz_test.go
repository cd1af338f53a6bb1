//go:build cluster

package cluster

// Channel authorization across the nodes of a cluster (proto/PROTOCOL.md ›
// Channel authorization): `make test-cluster`, like cluster_test.go.

import (
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// clusterAuthzBound is how long after A's answer a change made through A
// may take to apply on B.
const clusterAuthzBound = 2 * time.Second

// TestClusterAuthorization: two nodes (real binaries, PostgreSQL, etcd).
// Every change is made through A's API, every effect checked on B, each
// within clusterAuthzBound of A's answer: turning channel authorization on
// (an anonymous socket opened before is refused private- channels, a bad
// token refused at the handshake), a connection token of the secret A
// answered (a grant, presence as its sub, an emit through A, the member
// list on both nodes), a JWKS on loopback (an RS256 token verified on both
// nodes), a secret rotation without overlap (the old secret refused, the
// new one accepted), a disconnect that sticks (4003 on both nodes, 4012
// for a token issued before, at the handshake and on refresh; a token
// issued after gets in) and turning it off (private- channels open again).
func TestClusterAuthorization(t *testing.T) {
	began := time.Now()

	// The project's own keys, served on loopback (the nodes may fetch there).
	js := relaytest.NewJWKS(t)
	jwksURL := js.URL

	cl := startCluster(t, 10*time.Second, []string{"A", "B"}, "WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true")
	tsA, tsB := cl.nodes[0].on(t), cl.nodes[1].on(t)
	owner := tsA.Signup("alice@example.com")
	p := owner.CreateProject("authz")
	viaA, viaB := tsA.Client(), tsB.Client()
	authzPath := "/api/projects/" + p.ID + "/authorization"
	bearer := map[string]string{"Authorization": "Bearer " + p.SecretKey}

	mint := func(secret, sub string, issued time.Time, channels map[string][]string) string {
		t.Helper()
		tok, err := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: secret, UserID: sub, TTL: time.Hour,
			Now: issued, Channels: channels})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	handshake := func(ts *relaytest.Server, token string) relaytest.Response {
		t.Helper()
		return ts.Handshake("/ws?publicKey=" + url.QueryEscape(p.PublicKey) + "&token=" + url.QueryEscape(token))
	}
	// within checks that check holds on B as soon as A has answered the
	// change (the change is applied on every member before the answer); it
	// polls, at most clusterAuthzBound after answered, only to report how
	// late it came if it did not.
	within := func(what string, answered time.Time, check func() error) {
		t.Helper()
		tries := 0
		relaytest.EventuallyNil(t, time.Until(answered.Add(clusterAuthzBound)), func() error {
			tries++
			if err := check(); err != nil {
				return fmt.Errorf("%s (try %d): %w", what, tries, err)
			}
			return nil
		})
		t.Logf("%s: %+.1f ms from A's answer, try %d", what, float64(time.Since(answered).Microseconds())/1000, tries)
		if tries > 1 {
			t.Errorf("%s: held only at try %d, after A's answer", what, tries)
		}
	}
	// subscribeAnswer sends a subscribe and returns the socket's answer.
	subscribeAnswer := func(c *relaytest.WS, msg string) (string, error) {
		c.Send(msg)
		f, ok := c.Next(clusterAuthzBound)
		switch {
		case !ok:
			return "", fmt.Errorf("no answer to %s", msg)
		case f.Closed || f.Err != nil:
			return "", fmt.Errorf("answer to %s: closed %d %q (%v)", msg, f.CloseCode, f.Reason, f.Err)
		}
		return f.Text, nil
	}

	// Off: B lets an anonymous socket into private- channels, and ignores a token.
	anon := tsB.DialWS(p.PublicKey) // opened before the change; follows the setting
	anon.Send(`{"action":"subscribe","channel":"private-before"}`)
	anon.Expect(`{"action":"subscribe","channel":"private-before","ok":true}`)
	if r := handshake(tsB, "junk"); r.Status != http.StatusSwitchingProtocols {
		t.Fatalf("a token on B while off: %d %s, want 101", r.Status, r.Raw)
	}

	// 1. On through A: B refuses the anonymous socket a private- channel, and a bad token.
	on := owner.Do("PATCH", authzPath, `{"authorization":true}`)
	answered := time.Now()
	secret := on.Str("secret")
	if secret == "" {
		t.Fatalf("turning authorization on: %d %s", on.Status, on.Raw)
	}
	on.Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, secret, nil, nil))
	bad := mint("not-the-secret", "u", time.Now(), nil)
	var refused relaytest.Response
	within("on: B refuses a token not of the secret at the handshake", answered, func() error {
		if refused = handshake(tsB, bad); refused.Status != http.StatusUnauthorized {
			return fmt.Errorf("handshake %d %s", refused.Status, refused.Raw)
		}
		return nil
	})
	refused.Expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
	probe := 0
	var last string
	within("on: B refuses the anonymous socket opened before a private- channel", answered, func() error {
		probe++ // a channel per try: a subscribe that got in stays in
		ch := fmt.Sprintf("private-x-%d", probe)
		got, err := subscribeAnswer(anon, `{"action":"subscribe","channel":"`+ch+`"}`)
		if err != nil {
			return err
		}
		if last = got; !sameJSON(got, `{"error":"channel_forbidden","channel":"`+ch+`"}`) {
			return fmt.Errorf("answered %s", got)
		}
		return nil
	})
	if probe != 1 {
		t.Logf("B let %d private- subscribes in after A's answer (the last answer: %s)", probe-1, last)
	}
	handshake(tsB, "junk").Expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
	anon.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-1"}`)
	anon.Expect(`{"error":"token_required","channel":"lobby"}`)
	anon.Send(`{"action":"subscribe","channel":"lobby"}`)
	anon.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)

	// 2. A token of the secret A answered, on B: its grant, presence as its
	// sub; an emit through A reaches it; both nodes list the member.
	u1 := tsB.DialWithToken(p.PublicKey, mint(secret, "user-1", time.Now(), map[string][]string{"private-user-1": {"subscribe", "presence"}}))
	u1.Send(`{"action":"subscribe","channel":"private-user-1","presence":true,"clientId":"user-1"}`)
	u1.Expect(`{"action":"subscribe","channel":"private-user-1","ok":true}`)
	u1.Expect(`{"type":"presence","channel":"private-user-1","event":"sync","members":[]}`)
	u1.Send(`{"action":"subscribe","channel":"private-user-2"}`)
	u1.Expect(`{"error":"channel_forbidden","channel":"private-user-2"}`)
	u1.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-2"}`)
	u1.Expect(`{"error":"client_id_mismatch","channel":"lobby"}`)
	doc, err := backend.MintSubscribeToken(backend.SubscribeTokenOptions{Secret: secret, Channel: "private-doc-9", UserID: "user-1", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	u1.Send(`{"action":"subscribe","channel":"private-doc-9","token":"` + doc + `"}`)
	u1.Expect(`{"action":"subscribe","channel":"private-doc-9","ok":true}`)
	r := viaA.Send("POST", "/emit", `{"channel":"private-user-1","payload":{"n":1}}`, "application/json", bearer)
	if r.Status != http.StatusOK || r.JSON["subscriberCount"] != float64(1) {
		t.Fatalf("emit through A: %d %s, want 200 with subscriberCount 1", r.Status, r.Raw)
	}
	u1.ExpectExcept(`{"channel":"private-user-1","payload":{"n":1}}`, "seq")
	anon.ExpectSilence(100 * time.Millisecond)
	for _, c := range []*relaytest.Client{viaA, viaB} {
		c.BearerGet("/channels/private-user-1/members", p.SecretKey).Expect(t, http.StatusOK, `{"channel":"private-user-1","members":["user-1"]}`)
	}

	// JWKS through A: an RS256 token of the project's own key verified on both nodes.
	r = owner.Do("PATCH", authzPath, `{"jwksUrl":"`+jwksURL+`"}`)
	answered = time.Now()
	r.Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, secret, nil, jwksURL))
	rs := relaytest.SignRS256(t, js.Key, "k1", map[string]any{"sub": "user-9", "exp": time.Now().Add(time.Hour).Unix(),
		"channels": map[string]any{"private-user-9": []any{"subscribe", "presence"}}})
	within("jwksUrl: B verifies an RS256 token of the set at the handshake", answered, func() error {
		if r := handshake(tsB, rs); r.Status != http.StatusSwitchingProtocols {
			return fmt.Errorf("handshake %d %s", r.Status, r.Raw)
		}
		return nil
	})
	u9 := tsB.DialWithToken(p.PublicKey, rs)
	u9.Send(`{"action":"subscribe","channel":"private-user-9","presence":true,"clientId":"user-9"}`)
	u9.Expect(`{"action":"subscribe","channel":"private-user-9","ok":true}`)
	u9.Expect(`{"type":"presence","channel":"private-user-9","event":"sync","members":[]}`)
	u9A := tsA.DialWithToken(p.PublicKey, rs)
	u9A.Send(`{"action":"subscribe","channel":"private-user-9"}`)
	u9A.Expect(`{"action":"subscribe","channel":"private-user-9","ok":true}`)
	u9A.Send(`{"action":"subscribe","channel":"private-user-1"}`)
	u9A.Expect(`{"error":"channel_forbidden","channel":"private-user-1"}`)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := jwt.Sign(relaytest.Must(jwt.NewBuilder().Subject("user-9").Expiration(time.Now().Add(time.Hour)).Build()),
		jwt.WithKey(jwa.RS256, other, jws.WithProtectedHeaders(func() jws.Headers { h := jws.NewHeaders(); _ = h.Set(jws.KeyIDKey, "k1"); return h }())))
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range []*relaytest.Server{tsA, tsB} {
		handshake(ts, string(forged)).Expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
	}
	if n := js.Fetches.Load(); n < 2 {
		t.Fatalf("the JWKS was fetched %d times, want at least once by each node", n)
	} else {
		t.Logf("the JWKS was fetched %d times by the two nodes", n)
	}

	// 3. The secret rotated through A, no overlap: B refuses the old secret
	// at the handshake and takes the new one.
	oldTok := mint(secret, "user-42", time.Now(), nil)
	if r := handshake(tsB, oldTok); r.Status != http.StatusSwitchingProtocols {
		t.Fatalf("a token of the secret on B before the rotation: %d %s", r.Status, r.Raw)
	}
	rot := owner.Do("POST", authzPath+"/rotate-secret", `{"overlapSeconds":0}`)
	answered = time.Now()
	secret2 := rot.Str("secret")
	if secret2 == "" || secret2 == secret {
		t.Fatalf("rotate-secret: %d %s", rot.Status, rot.Raw)
	}
	rot.Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, secret2, nil, jwksURL))
	within("rotated: B refuses a token of the old secret at the handshake", answered, func() error {
		if refused = handshake(tsB, oldTok); refused.Status != http.StatusUnauthorized {
			return fmt.Errorf("handshake %d %s", refused.Status, refused.Raw)
		}
		return nil
	})
	refused.Expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
	grant42 := map[string][]string{"private-user-42": {"subscribe", "presence"}}
	issued := time.Now()
	before := mint(secret2, "user-42", issued, grant42) // of the new secret, issued before the revocation below
	within("rotated: B takes a token of the new secret at the handshake", answered, func() error {
		if r := handshake(tsB, before); r.Status != http.StatusSwitchingProtocols {
			return fmt.Errorf("handshake %d %s", r.Status, r.Raw)
		}
		return nil
	})
	// On B's live connections too: a refresh (checked by the connection,
	// not the handshake) takes a token of the new secret, not the old.
	probeB := tsB.DialWS(p.PublicKey) // anonymous: it may refresh to any sub
	within("rotated: B's connection takes a refresh of the new secret", answered, func() error {
		probeB.Send(`{"action":"refresh","token":"` + mint(secret2, "user-5", time.Now(), nil) + `"}`)
		f, ok := probeB.Next(clusterAuthzBound)
		if !ok || !sameJSON(f.Text, `{"action":"refresh","ok":true}`) {
			return fmt.Errorf("answered %+v", f) // invalid_token changes nothing: try again
		}
		return nil
	})
	probeB.Send(`{"action":"refresh","token":"` + mint(secret, "user-5", time.Now(), nil) + `"}`)
	probeB.Expect(`{"error":"invalid_token"}`)
	if r := handshake(tsB, rs); r.Status != http.StatusSwitchingProtocols { // the JWKS is not the secret
		t.Fatalf("the RS256 token on B after the rotation: %d %s, want 101", r.Status, r.Raw)
	}
	u42 := tsB.DialWithToken(p.PublicKey, before)
	u42.Send(`{"action":"subscribe","channel":"private-user-42","presence":true,"clientId":"user-42"}`)
	u42.Expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
	u42.Expect(`{"type":"presence","channel":"private-user-42","event":"sync","members":[]}`)
	u42A := tsA.DialWithToken(p.PublicKey, before) // and a second socket of the user, on A
	u42A.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-42"}`)
	u42A.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
	u42A.Expect(`{"type":"presence","channel":"lobby","event":"sync","members":[]}`)
	refresher := tsB.DialWS(p.PublicKey) // anonymous: it may refresh to any sub

	// 4. A disconnect that sticks, through A: the user's sockets on B and A
	// close 4003; on B the token issued before is closed 4012 at the
	// handshake and on refresh; one issued after gets in.
	closeB, closeA := closeWatch(u42), closeWatch(u42A)
	r = viaA.Send("POST", "/clients/user-42/disconnect", `{"revokeTokens":true}`, "application/json", bearer)
	answered = time.Now()
	r.Expect(t, http.StatusOK, `{"ok":true,"closed":2}`)
	for _, w := range []struct {
		name string
		ch   <-chan closing
	}{{"B", closeB}, {"A", closeA}} {
		at := closedAt(t, "user-42 on "+w.name, w.ch, 4003)
		t.Logf("close 4003 on %s: %+.1f ms from A's answer", w.name, float64(at.Sub(answered).Microseconds())/1000)
		if at.After(answered.Add(clusterAuthzBound)) {
			t.Errorf("user-42 on %s closed %v after A's answer", w.name, at.Sub(answered))
		}
	}
	if f := tsB.DialWithToken(p.PublicKey, before).ExpectClose(4012, 5*time.Second); f.Reason != "token revoked" {
		t.Fatalf("the token issued before the revocation on B: closed 4012 %q, want \"token revoked\"", f.Reason)
	}
	t.Logf("4012 on B at the handshake: %+.1f ms from A's answer", float64(time.Since(answered).Microseconds())/1000)
	// A refresh with it: closed 4012, with no ok first (the project,
	// which holds the revocations, answers a refresh).
	refresher.Send(`{"action":"refresh","token":"` + before + `"}`)
	f, ok := refresher.Next(5 * time.Second)
	if !ok || !f.Closed || f.CloseCode != 4012 || f.Reason != "token revoked" {
		t.Fatalf("a refresh on B with the token issued before the revocation: got %+v (ok %v), want close 4012 \"token revoked\"", f, ok)
	}
	after := mint(secret2, "user-42", time.Now().Add(time.Second), grant42) // iat in whole seconds, after the revocation's
	back := tsB.DialWithToken(p.PublicKey, after)
	back.Send(`{"action":"subscribe","channel":"private-user-42","presence":true,"clientId":"user-42"}`)
	back.Expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
	back.Expect(`{"type":"presence","channel":"private-user-42","event":"sync","members":[]}`)
	other7 := tsB.DialWithToken(p.PublicKey, mint(secret2, "user-7", issued, nil)) // another user is not covered
	other7.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-7"}`)
	other7.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
	other7.Expect(`{"type":"presence","channel":"lobby","event":"sync","members":[]}`)
	back.ExpectSilence(100 * time.Millisecond)

	// 5. Off through A: B lets the anonymous socket into private- channels again.
	off := owner.Do("PATCH", authzPath, `{"authorization":false}`)
	answered = time.Now()
	off.Expect(t, http.StatusOK, relaytest.AuthorizationBody(false, secret2, nil, jwksURL))
	probe = 0
	within("off: B lets the anonymous socket opened before into a private- channel", answered, func() error {
		probe++
		ch := fmt.Sprintf("private-y-%d", probe)
		got, err := subscribeAnswer(anon, `{"action":"subscribe","channel":"`+ch+`"}`)
		if err != nil {
			return err
		}
		if last = got; !sameJSON(got, `{"action":"subscribe","channel":"`+ch+`","ok":true}`) {
			return fmt.Errorf("answered %s", got)
		}
		return nil
	})
	if probe != 1 {
		t.Logf("B refused %d private- subscribes after A's answer", probe-1)
	}
	anon.Send(`{"action":"subscribe","channel":"private-user-42","presence":true,"clientId":"anyone"}`)
	anon.Expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
	anon.Expect(`{"type":"presence","channel":"private-user-42","event":"sync","members":["user-42"]}`)
	back.Expect(`{"type":"presence","channel":"private-user-42","event":"join","clientId":"anyone"}`)
	if r := handshake(tsB, "junk"); r.Status != http.StatusSwitchingProtocols {
		t.Fatalf("a token on B once off: %d %s, want 101 (ignored)", r.Status, r.Raw)
	}
	t.Logf("cluster authorization tests took %v", time.Since(began).Round(100*time.Millisecond))
}
