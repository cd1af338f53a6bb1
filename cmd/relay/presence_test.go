package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestPresence(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")

		plain := ts.Subscribed(t, p.PublicKey, "room")
		ann := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		ann.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		bob := ts.PresenceSub(t, p.PublicKey, "room", "bob")
		bob.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann"]}`)
		ann.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"bob"}`)
		cat := ts.PresenceSub(t, p.PublicKey, "room", "cat")
		cat.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann","bob"]}`)
		ann.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"cat"}`)
		bob.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"cat"}`)

		// Leave on unsubscribe, on a clean close, and on an abrupt drop.
		cat.Send(`{"action":"unsubscribe","channel":"room"}`)
		cat.Expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		ann.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"cat"}`)
		bob.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"cat"}`)
		cat.ExpectSilence(100 * time.Millisecond)

		bob.SendRaw(relaytest.ClientFrame(0x8, true, []byte{0x03, 0xe8})) // close 1000
		bob.ExpectClose(1000, 5*time.Second)
		ann.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"bob"}`)

		dan := ts.PresenceSub(t, p.PublicKey, "room", "dan")
		dan.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann"]}`)
		ann.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"dan"}`)
		dan.Conn.UnderlyingConn().Close()
		ann.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"dan"}`)

		// Presence never reached the plain subscriber, and never used the budgets.
		plain.ExpectSilence(100 * time.Millisecond)
		r := owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`)
		relaytest.Budget(t, ts.Now(), r, "rate_limit", 600, 599)
		relaytest.Budget(t, ts.Now(), r, "project_rate_limit", 6000, 5999)
	})
}

func TestPresenceSameClientOnTwoConnections(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	p := ts.Signup("alice@example.com").CreateProject("demo")
	watcher := ts.PresenceSub(t, p.PublicKey, "doc", "w")
	watcher.Expect(`{"type":"presence","channel":"doc","event":"sync","members":[]}`)
	tab1 := ts.PresenceSub(t, p.PublicKey, "doc", "eve")
	tab1.Expect(`{"type":"presence","channel":"doc","event":"sync","members":["w"]}`)
	watcher.Expect(`{"type":"presence","channel":"doc","event":"join","clientId":"eve"}`)
	tab2 := ts.PresenceSub(t, p.PublicKey, "doc", "eve")
	tab2.Expect(`{"type":"presence","channel":"doc","event":"sync","members":["eve","w"]}`)
	watcher.ExpectSilence(100 * time.Millisecond) // eve was already present
	tab1.Conn.Close()
	watcher.ExpectSilence(200 * time.Millisecond) // eve is still present on tab2
	tab2.Conn.Close()
	watcher.Expect(`{"type":"presence","channel":"doc","event":"leave","clientId":"eve"}`)
}

func TestReplay(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		clock := newClock()
		ts := startServerAt(t, url, map[string]string{"REPLAY_BUFFER_TTL_SECONDS": "2"}, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		var seqs []int64
		for i := range 3 {
			r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"feed","payload":%d}`, i))
			seqs = append(seqs, int64(relaytest.Num(r.JSON, "seq")))
		}
		// since the first: the two after it, flagged, in order, before the ack.
		c := ts.DialWS(p.PublicKey)
		c.Send(fmt.Sprintf(`{"action":"subscribe","channel":"feed","since":%d}`, seqs[0]))
		c.Expect(fmt.Sprintf(`{"channel":"feed","payload":1,"seq":%d,"replay":true}`, seqs[1]))
		c.Expect(fmt.Sprintf(`{"channel":"feed","payload":2,"seq":%d,"replay":true}`, seqs[2]))
		c.Expect(`{"action":"subscribe","channel":"feed","ok":true}`)

		// since the latest: nothing to replay, no gap.
		c2 := ts.DialWS(p.PublicKey)
		c2.Send(fmt.Sprintf(`{"action":"subscribe","channel":"feed","since":%d}`, seqs[2]))
		c2.Expect(`{"action":"subscribe","channel":"feed","ok":true}`)

		// since older than anything this channel ever buffered: a gap, then all of it.
		c3 := ts.DialWS(p.PublicKey)
		c3.Send(`{"action":"subscribe","channel":"feed","since":5}`)
		c3.Expect(`{"type":"replay_gap","channel":"feed","since":5}`)
		for i, s := range seqs {
			c3.Expect(fmt.Sprintf(`{"channel":"feed","payload":%d,"seq":%d,"replay":true}`, i, s))
		}
		c3.Expect(`{"action":"subscribe","channel":"feed","ok":true}`)

		// After the TTL the messages are gone: a gap and nothing else.
		clock.Advance(2500 * time.Millisecond)
		r := owner.Emit(p.SecretKey, `{"channel":"feed","payload":"new"}`)
		c4 := ts.DialWS(p.PublicKey)
		c4.Send(fmt.Sprintf(`{"action":"subscribe","channel":"feed","since":%d}`, seqs[0]))
		c4.Expect(fmt.Sprintf(`{"type":"replay_gap","channel":"feed","since":%d}`, seqs[0]))
		c4.Expect(fmt.Sprintf(`{"channel":"feed","payload":"new","seq":%d,"replay":true}`, int64(relaytest.Num(r.JSON, "seq"))))
		c4.Expect(`{"action":"subscribe","channel":"feed","ok":true}`)

		// Everything after since expired and nothing newer: the gap alone.
		r = owner.Emit(p.SecretKey, `{"channel":"quiet","payload":1}`)
		clock.Advance(2500 * time.Millisecond)
		c5 := ts.DialWS(p.PublicKey)
		c5.Send(fmt.Sprintf(`{"action":"subscribe","channel":"quiet","since":%d}`, int64(relaytest.Num(r.JSON, "seq"))-1))
		c5.Expect(fmt.Sprintf(`{"type":"replay_gap","channel":"quiet","since":%d}`, int64(relaytest.Num(r.JSON, "seq"))-1))
		c5.Expect(`{"action":"subscribe","channel":"quiet","ok":true}`)
	})
}

// resign signs the claims of tok again, with alg and key.
func resign(t *testing.T, tok string, alg jwa.SignatureAlgorithm, key any) string {
	t.Helper()
	claims, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
	if err != nil {
		t.Fatal(err)
	}
	b, err := jws.Sign(claims, jws.WithKey(alg, key))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// hmacWithHeader builds header.claims.HMAC-SHA256(secret) by hand: the
// algorithm-confusion forgery, where the header names another algorithm.
func hmacWithHeader(tok, header, secret string) string {
	input := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + strings.Split(tok, ".")[1]
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(input))
	return input + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// tamper flips one character of a token's signature.
func tamper(tok string) string {
	b := []byte(tok)
	i := len(b) - 5
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// tamperClaims re-signs nothing: it swaps the claims of a valid token for
// others (clientId changed) and keeps the old signature.
func tamperClaims(s *relaytest.ClientEmitSetup) string {
	a := strings.Split(s.TokenFor("ann"), ".")
	b := strings.Split(s.TokenFor("mallory"), ".")
	return a[0] + "." + b[1] + "." + a[2]
}

// newClientEmitSetup is relaytest.NewClientEmitSetup on a server started here.
func newClientEmitSetup(t *testing.T, url string, env map[string]string) *relaytest.ClientEmitSetup {
	return relaytest.NewClientEmitSetup(t, startServer(t, url, env).Server)
}

// emitFrame is a client emit on channel chat.
func emitFrame(token, typ, payload string) string {
	return relaytest.EmitFrame("chat", typ, payload, token)
}

func TestClientEmitRules(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		s := newClientEmitSetup(t, url, nil)
		ann := s.Ann

		// 1. no secret yet
		ann.Send(emitFrame("x", "msg", "1"))
		ann.Expect(`{"error":"client_emit_not_configured","channel":"chat"}`)
		s.Enable(t)
		// 2. token and type
		ann.Send(`{"action":"emit","channel":"chat","type":"msg","payload":1}`)
		ann.Expect(`{"error":"token_and_type_required","channel":"chat"}`)
		ann.Send(`{"action":"emit","channel":"chat","payload":1,"token":"` + s.Token(t, nil) + `"}`)
		ann.Expect(`{"error":"token_and_type_required","channel":"chat"}`)
		// 3. signature, expiry, project, channel, type allowlist
		bad := map[string]string{
			"garbage":      "not.a.token",
			"wrong secret": s.Token(t, func(o *backend.TokenOptions) { o.Secret = strings.Repeat("k", 43) }),
			"expired":      s.Token(t, func(o *backend.TokenOptions) { o.Now = time.Now().Add(-2 * time.Minute) }),
			"over max ttl": s.Token(t, func(o *backend.TokenOptions) { o.Now = time.Now().Add(-11 * time.Minute); o.TTL = time.Hour }),
			"project":      s.Token(t, func(o *backend.TokenOptions) { o.ProjectID = "00000000-0000-0000-0000-000000000000" }),
			"channel":      s.Token(t, func(o *backend.TokenOptions) { o.Channel = "other" }),
			"type":         s.Token(t, func(o *backend.TokenOptions) { o.Types = []string{"cursor"} }),
			"alg none":     "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + strings.Split(s.Token(t, nil), ".")[1] + ".",
			// The algorithm is pinned to HS256 (proto/PROTOCOL.md › Client-emit tokens): the same
			// claims under another algorithm fail, even with the right secret.
			"hs512 same secret": resign(t, s.Token(t, nil), jwa.HS512, []byte(s.Secret)),
			"rs256 signed":      resign(t, s.Token(t, nil), jwa.RS256, rsaKey(t)),
			// Algorithm confusion: an HS256 signature with the right secret
			// under a header that names another algorithm.
			"header rs256, hmac": hmacWithHeader(s.Token(t, nil), `{"alg":"RS256","typ":"JWT"}`, s.Secret),
			"header none, hmac":  hmacWithHeader(s.Token(t, nil), `{"alg":"none","typ":"JWT"}`, s.Secret),
			"header hs512, hmac": hmacWithHeader(s.Token(t, nil), `{"alg":"HS512","typ":"JWT"}`, s.Secret),
			"tampered":           tamper(s.Token(t, nil)),
			"swapped claims":     tamperClaims(s),
		}
		for name, tok := range bad {
			ann.Send(emitFrame(tok, "msg", "1"))
			if f, _ := ann.Next(5 * time.Second); f.Text != `{"error":"invalid_emit_token","channel":"chat"}` {
				t.Fatalf("%s: got %+v, want exactly the invalid_emit_token body", name, f)
			}
		}
		// 4. identity: the token's clientId must be this connection's presence clientId.
		ann.Send(emitFrame(s.Token(t, func(o *backend.TokenOptions) { o.ClientID = "bob" }), "msg", "1"))
		ann.Expect(`{"error":"emit_identity_mismatch","channel":"chat"}`)
		s.Listener.Send(emitFrame(s.Token(t, nil), "msg", "1")) // subscribed, but without presence
		s.Listener.Expect(`{"error":"emit_identity_mismatch","channel":"chat"}`)

		// 8. success: relayed to the others (not the emitter), the emitter gets the ack.
		ann.Send(emitFrame(s.Token(t, nil), "msg", `{"text": "hello"}`))
		ack := ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
		seq := int64(relaytest.Num(ack, "seq"))
		s.Listener.Expect(fmt.Sprintf(`{"channel":"chat","type":"msg","payload":{"text":"hello"},"seq":%d,"clientId":"ann"}`, seq))
		ann.ExpectSilence(100 * time.Millisecond)
		// It is a message like any other: it takes seq and shows in the replay.
		r := s.Owner.Emit(s.Project.SecretKey, `{"channel":"chat","payload":2}`)
		if int64(relaytest.Num(r.JSON, "seq")) != seq+1 || relaytest.Num(r.JSON, "delivered") != 2 {
			t.Fatalf("emit after client-emit: %s", r.Raw)
		}
		relaytest.Budget(t, s.Server.Now(), r, "rate_limit", 600, 598) // the client-emit used the channel budget too
		s.Ann.Expect(fmt.Sprintf(`{"channel":"chat","payload":2,"seq":%d}`, seq+1))
		late := s.Server.DialWS(s.Project.PublicKey)
		late.Send(fmt.Sprintf(`{"action":"subscribe","channel":"chat","since":%d}`, seq-1))
		late.Expect(fmt.Sprintf(`{"channel":"chat","type":"msg","payload":{"text":"hello"},"seq":%d,"clientId":"ann","replay":true}`, seq))

		// 7. size: serialized {channel,payload} over 128 KiB
		big := `"` + strings.Repeat("x", 131072) + `"`
		ann.Send(emitFrame(s.Token(t, nil), "msg", big))
		ann.Expect(`{"error":"payload_too_large","channel":"chat"}`)

		// Controls for the re-signing helpers of rule 3: with HS256 and the
		// secret their tokens pass, so the refusals above are the algorithm's.
		for _, tok := range []string{
			resign(t, s.Token(t, nil), jwa.HS256, []byte(s.Secret)),
			hmacWithHeader(s.Token(t, nil), `{"alg":"HS256","typ":"JWT"}`, s.Secret),
		} {
			ann.Send(emitFrame(tok, "msg", "1"))
			ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
		}
	})
}

func TestClientEmitRateLimitsAndBudgets(t *testing.T) {
	t.Parallel()
	// 6. per-clientId fixed 1-second window, and the channel budget's minute
	// window: the clock stands at the start of a second, inside one minute.
	clock := newClock()
	s := relaytest.NewClientEmitSetup(t, startServerAt(t, storetest.SQLiteURL(t), map[string]string{
		"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": "3", "EMIT_RATE_LIMIT_PER_MINUTE": "5",
	}, clock.Now).Server)
	s.Enable(t)
	tok := s.Token(t, nil)
	for range 3 {
		s.Ann.Send(emitFrame(tok, "msg", "1"))
		s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
	}
	s.Ann.Send(emitFrame(tok, "msg", "1"))
	s.Ann.Expect(`{"error":"client_emit_rate_limited","channel":"chat"}`)
	// Next second: allowed again, until the channel budget (5 a minute) runs out.
	clock.Advance(time.Second)
	for range 2 {
		s.Ann.Send(emitFrame(tok, "msg", "1"))
		s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
	}
	s.Ann.Send(emitFrame(tok, "msg", "1"))
	s.Ann.Expect(`{"error":"channel_rate_limited","channel":"chat"}`)
	for range 5 { // the listener got exactly the five accepted ones
		s.Listener.ExpectExcept(`{"channel":"chat","type":"msg","payload":1,"clientId":"ann"}`, "seq")
	}
	s.Listener.ExpectSilence(100 * time.Millisecond)
}

func TestClientEmitProjectBackstop(t *testing.T) {
	t.Parallel()
	clock := newClock() // one minute window for the backstop
	s := relaytest.NewClientEmitSetup(t, startServerAt(t, storetest.SQLiteURL(t), map[string]string{"PROJECT_RATE_LIMIT_PER_MINUTE": "1"}, clock.Now).Server)
	s.Enable(t)
	if r := s.Owner.Emit(s.Project.SecretKey, `{"channel":"other","payload":1}`); r.Status != 200 {
		t.Fatalf("emit: %s", r.Raw)
	}
	s.Ann.Send(emitFrame(s.Token(t, nil), "msg", "1"))
	s.Ann.Expect(`{"error":"project_rate_limited","channel":"chat"}`)
}

func TestRegeneratedSecretInvalidatesTokensAtOnce(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		s := newClientEmitSetup(t, url, nil)
		s.Enable(t)
		old := s.Token(t, nil)
		s.Ann.Send(emitFrame(old, "msg", "1"))
		s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
		again := s.Owner.Do("PATCH", "/api/projects/"+s.Project.ID+"/client-emit-secret", `{}`)
		if again.Str("clientEmitSecret") != s.Secret {
			t.Fatalf("second call without regenerate changed the secret: %s", again.Raw)
		}
		r := s.Owner.Do("PATCH", "/api/projects/"+s.Project.ID+"/client-emit-secret", `{"regenerate":true}`)
		if r.Str("clientEmitSecret") == s.Secret || r.Status != 200 {
			t.Fatalf("regenerate: %s", r.Raw)
		}
		s.Ann.Send(emitFrame(old, "msg", "1"))
		s.Ann.Expect(`{"error":"invalid_emit_token","channel":"chat"}`)
		s.Secret = r.Str("clientEmitSecret")
		s.Ann.Send(emitFrame(s.Token(t, nil), "msg", "1"))
		s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
	})
}

func TestRevokeEndpoint(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		clock := newClock() // tokens are compared with revocations by the second
		s := relaytest.NewClientEmitSetup(t, startServerAt(t, url, nil, clock.Now).Server)
		s.Enable(t)
		c := s.Server.Client()
		c.Revoke("", `{"jti":"x"}`).Expect(t, 401, `{"error":"missing_secret_key"}`)
		c.Revoke("sk_live_nope", `{"jti":"x"}`).Expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.Revoke(s.Project.PublicKey, `{"jti":"x"}`).Expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.Revoke(s.Project.SecretKey, `{"jti":`).Expect(t, 400, `{"error":"invalid_json"}`)
		c.Revoke(s.Project.SecretKey, `{}`).Expect(t, 400, `{"error":"jti_or_client_id_required"}`)
		c.Revoke(s.Project.SecretKey, `{"jti":"","clientId":""}`).Expect(t, 400, `{"error":"jti_or_client_id_required"}`)
		c.Revoke(s.Project.SecretKey, `{"jti":"never-issued"}`).Expect(t, 200, `{"ok":true}`)
		c.Revoke(s.Project.SecretKey, `{"jti":"never-issued"}`).Expect(t, 200, `{"ok":true}`) // idempotent

		// By jti: that token fails, another of the same clientId works.
		one := s.Token(t, func(o *backend.TokenOptions) { o.JTI = "one" })
		two := s.Token(t, func(o *backend.TokenOptions) { o.JTI = "two" })
		err := backend.RevokeClientEmitToken(context.Background(), backend.RevokeOptions{EmitURL: s.Server.Base + "/emit", SecretKey: s.Project.SecretKey, JTI: "one"})
		if err != nil {
			t.Fatal(err)
		}
		s.Ann.Send(emitFrame(one, "msg", "1"))
		s.Ann.Expect(`{"error":"emit_token_revoked","channel":"chat"}`)
		s.Ann.Send(emitFrame(two, "msg", "1"))
		s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")

		// Both in one body: the jti (of ann's token) and every token of the
		// clientId (bob's); ann's other tokens keep working.
		bob := s.Server.PresenceSub(t, s.Project.PublicKey, "chat", "bob")
		bob.Expect(`{"type":"presence","channel":"chat","event":"sync","members":["ann"]}`)
		s.Ann.Expect(`{"type":"presence","channel":"chat","event":"join","clientId":"bob"}`)
		three := s.Token(t, func(o *backend.TokenOptions) { o.JTI = "three" })
		bobOld := s.Token(t, func(o *backend.TokenOptions) { o.ClientID = "bob" })
		c.Revoke(s.Project.SecretKey, `{"jti":"three","clientId":"bob"}`).Expect(t, 200, `{"ok":true}`)
		s.Ann.Send(emitFrame(three, "msg", "1"))
		s.Ann.Expect(`{"error":"emit_token_revoked","channel":"chat"}`)
		bob.Send(emitFrame(bobOld, "msg", "1"))
		bob.Expect(`{"error":"emit_token_revoked","channel":"chat"}`)
		s.Ann.Send(emitFrame(two, "msg", "1"))
		s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
		bob.ExpectExcept(`{"channel":"chat","type":"msg","payload":1,"clientId":"ann"}`, "seq")
		// A token of bob minted in a later second than the revocation works.
		clock.Advance(time.Second)
		bobNew := s.Token(t, func(o *backend.TokenOptions) { o.ClientID = "bob" })
		bob.Send(emitFrame(bobNew, "msg", "1"))
		bob.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
		s.Ann.ExpectExcept(`{"channel":"chat","type":"msg","payload":1,"clientId":"bob"}`, "seq")

		// By clientId: every token issued up to now fails; one minted in a later second works.
		c.Revoke(s.Project.SecretKey, `{"clientId":"ann"}`).Expect(t, 200, `{"ok":true}`)
		s.Ann.Send(emitFrame(two, "msg", "1"))
		s.Ann.Expect(`{"error":"emit_token_revoked","channel":"chat"}`)
		clock.Advance(time.Second)
		fresh := s.Token(t, nil)
		s.Ann.Send(emitFrame(fresh, "msg", "1"))
		s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")

		// Revocations survive a restart: the server stops, and a second one
		// starts on the same database.
		s.Server.Stop()
		ts2 := startServerAt(t, url, nil, clock.Now)
		ann2 := ts2.PresenceSub(t, s.Project.PublicKey, "chat", "ann")
		ann2.Expect(`{"type":"presence","channel":"chat","event":"sync","members":[]}`)
		for _, tok := range []string{one, two, three} {
			ann2.Send(emitFrame(tok, "msg", "1"))
			ann2.Expect(`{"error":"emit_token_revoked","channel":"chat"}`)
		}
		ann2.Send(emitFrame(fresh, "msg", "1"))
		ann2.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
		bob2 := ts2.PresenceSub(t, s.Project.PublicKey, "chat", "bob")
		bob2.Expect(`{"type":"presence","channel":"chat","event":"sync","members":["ann"]}`)
		bob2.Send(emitFrame(bobOld, "msg", "1"))
		bob2.Expect(`{"error":"emit_token_revoked","channel":"chat"}`)
		bob2.Send(emitFrame(bobNew, "msg", "1"))
		bob2.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
	})
}

// TestClientEmitAnswersInOrder: a burst of emits on one connection, past the
// per-clientId cap and with some refused earlier (rule 3), gets its answers in
// the order of the emits, so that a client pairing them first in, first out
// pairs each with its own emit. The listener tells which emit each accepted
// seq belongs to (the payload is the emit's index).
func TestClientEmitAnswersInOrder(t *testing.T) {
	t.Parallel()
	s := newClientEmitSetup(t, storetest.SQLiteURL(t), map[string]string{"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": "5"})
	s.Enable(t)
	tok := s.Token(t, nil)
	const n = 60
	for i := range n {
		typ := "msg"
		if i%4 == 3 {
			typ = "cursor" // not in the token's types
		}
		s.Ann.Send(emitFrame(tok, typ, fmt.Sprint(i)))
	}
	accepted := map[int64]int{} // seq → index of the emit it answered
	var order []int64
	for i := range n {
		f, ok := s.Ann.Next(5 * time.Second)
		if !ok || f.Text == "" {
			t.Fatalf("answer %d: %+v", i, f)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(f.Text), &m); err != nil {
			t.Fatalf("answer %d: %q", i, f.Text)
		}
		want := `{"error":"client_emit_rate_limited","channel":"chat"}`
		if i%4 == 3 {
			want = `{"error":"invalid_emit_token","channel":"chat"}`
		}
		switch {
		case m["action"] == "emit" && i%4 != 3:
			seq := int64(relaytest.Num(m, "seq"))
			accepted[seq] = i
			order = append(order, seq)
		case f.Text != want:
			t.Fatalf("answer %d is %s, want %s or an emit ack", i, f.Text, want)
		}
	}
	if len(accepted) < 5 {
		t.Fatalf("%d emits accepted, want at least the cap, 5", len(accepted))
	}
	for range accepted {
		m := s.Listener.ExpectExcept(`{"channel":"chat","type":"msg","clientId":"ann"}`, "seq", "payload")
		seq, payload := int64(relaytest.Num(m, "seq")), int(relaytest.Num(m, "payload"))
		if i, ok := accepted[seq]; !ok || i != payload {
			t.Fatalf("seq %d carried emit %d, but its ack came as answer %d (acked seqs in order: %v)", seq, payload, i, order)
		}
	}
	s.Listener.ExpectSilence(100 * time.Millisecond)
}
