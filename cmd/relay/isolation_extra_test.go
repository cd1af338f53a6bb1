package main

import (
	"context"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// Tenant isolation beyond TestTenantIsolation: revocation by jti, webhooks
// and presence events never cross from one project to another.

// isoMint mints a client-emit token of type "t" on channel for clientId.
func isoMint(t *testing.T, secret, projectID, channel, clientID, jti string) string {
	t.Helper()
	tok, err := backend.MintClientEmitToken(backend.TokenOptions{
		Secret: secret, ProjectID: projectID, Channel: channel, ClientID: clientID, Types: []string{"t"}, TTL: time.Minute, JTI: jti,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestIsolationRevokeByJTI: B's secret key revoking a jti revokes B's token
// with that jti and never A's, also across a restart (revocations persist).
func TestIsolationRevokeByJTI(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		aliceC, bobC := ts.Signup("alice@example.com"), ts.Signup("bob@example.com")
		a, b := aliceC.CreateProject("a"), bobC.CreateProject("b")
		secretA := aliceC.Do("PATCH", "/api/projects/"+a.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		secretB := bobC.Do("PATCH", "/api/projects/"+b.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		if secretA == "" || secretB == "" {
			t.Fatal("no client-emit secrets")
		}
		// Same channel, same clientId, same jti in both projects.
		tokA := isoMint(t, secretA, a.ID, "room", "x", "same-jti")
		tokB := isoMint(t, secretB, b.ID, "room", "x", "same-jti")
		onlyA := isoMint(t, secretA, a.ID, "room", "x", "only-in-a")

		subA := ts.PresenceSub(t, a.PublicKey, "room", "x")
		subA.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		subB := ts.PresenceSub(t, b.PublicKey, "room", "x")
		subB.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		for _, c := range []struct {
			sub *wsClient
			tok string
		}{{subA, tokA}, {subB, tokB}, {subA, onlyA}} {
			c.sub.Send(relaytest.EmitFrame("room", "t", "1", c.tok))
			c.sub.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
		}

		// B revokes "same-jti" (its own token has it) and "only-in-a" (a
		// jti only A ever issued), on the endpoint and through the helper.
		bobC.Revoke(b.SecretKey, `{"jti":"same-jti"}`).Expect(t, 200, `{"ok":true}`)
		if err := backend.RevokeClientEmitToken(context.Background(), backend.RevokeOptions{EmitURL: ts.Base + "/emit", SecretKey: b.SecretKey, JTI: "only-in-a"}); err != nil {
			t.Fatal(err)
		}
		subB.Send(relaytest.EmitFrame("room", "t", "1", tokB))
		subB.Expect(`{"error":"emit_token_revoked","channel":"room"}`) // the revoke did happen, in B
		for _, tok := range []string{tokA, onlyA} {
			subA.Send(relaytest.EmitFrame("room", "t", "1", tok))
			subA.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
		}
		if rows, err := ts.app.store.Revocations(context.Background(), a.ID, time.Now()); err != nil || len(rows) != 0 {
			t.Fatalf("revocations stored for A: %+v %v", rows, err)
		}
		if rows, err := ts.app.store.Revocations(context.Background(), b.ID, time.Now()); err != nil || len(rows) != 2 {
			t.Fatalf("revocations stored for B: %+v %v, want 2", rows, err)
		}

		// After a restart on the same database: still B's only.
		ts.Stop()
		ts2 := startServer(t, url, nil)
		subA2 := ts2.PresenceSub(t, a.PublicKey, "room", "x")
		subA2.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		subB2 := ts2.PresenceSub(t, b.PublicKey, "room", "x")
		subB2.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		subB2.Send(relaytest.EmitFrame("room", "t", "1", tokB))
		subB2.Expect(`{"error":"emit_token_revoked","channel":"room"}`)
		for _, tok := range []string{tokA, onlyA} {
			subA2.Send(relaytest.EmitFrame("room", "t", "1", tok))
			subA2.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
		}
	})
}

// TestIsolationWebhooks: each project's connects and disconnects reach its
// own webhook, signed with its own secret, and never the other's.
func TestIsolationWebhooks(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		aliceC, bobC := ts.Signup("alice@example.com"), ts.Signup("bob@example.com")
		a, b := aliceC.CreateProject("a"), bobC.CreateProject("b")
		recA, recB := relaytest.NewReceiver(t, "whsec-a", 0), relaytest.NewReceiver(t, "whsec-b", 0)
		setWebhook(t, ts, a.ID, recA.URL+"/hook", "whsec-a")
		setWebhook(t, ts, b.ID, recB.URL+"/hook", "whsec-b")
		silent := func(r *relaytest.Receiver, who string) {
			t.Helper()
			select {
			case ev := <-r.Events:
				t.Fatalf("%s's webhook received %v", who, ev)
			case bad := <-r.Bad:
				t.Fatalf("%s's webhook: %s", who, bad)
			default:
			}
		}

		// A's traffic: two connections, each connect and disconnect at A.
		for range 2 {
			c := ts.DialWS(a.PublicKey)
			id := relaytest.CheckEvent(t, recA.Next(t), "connect", a.ID)
			c.Conn.Close()
			if got := relaytest.CheckEvent(t, recA.Next(t), "disconnect", a.ID); got != id {
				t.Fatalf("disconnect of %s, want %s", got, id)
			}
		}
		// Every delivery is over (the sender has counted all four), and B's
		// receiver has nothing.
		relaytest.Eventually(t, 5*time.Second, func() bool { s := ts.app.webhooks.Stats(); return s.Sent+s.Failed+s.Dropped+s.Refused == 4 }, "four webhook deliveries settled")
		if s := ts.app.webhooks.Stats(); s.Sent != 4 {
			t.Fatalf("webhook stats %+v, want 4 sent", s)
		}
		silent(recB, "B")

		// B's traffic reaches B only.
		c := ts.DialWS(b.PublicKey)
		id := relaytest.CheckEvent(t, recB.Next(t), "connect", b.ID)
		c.Conn.Close()
		if got := relaytest.CheckEvent(t, recB.Next(t), "disconnect", b.ID); got != id {
			t.Fatalf("disconnect of %s, want %s", got, id)
		}
		relaytest.Eventually(t, 5*time.Second, func() bool { return ts.app.webhooks.Stats().Sent == 6 }, "six webhooks sent")
		silent(recA, "A")
		silent(recB, "B")
	})
}

// TestIsolationPresence: presence subscribers of B on a channel named like
// A's see none of A's joins and leaves (unsubscribe or drop), and A's see
// none of B's.
func TestIsolationPresence(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		aliceC, bobC := ts.Signup("alice@example.com"), ts.Signup("bob@example.com")
		a, b := aliceC.CreateProject("a"), bobC.CreateProject("b")

		watchB := ts.PresenceSub(t, b.PublicKey, "room", "watcher")
		watchB.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		plainB := ts.Subscribed(t, b.PublicKey, "room")
		watchA := ts.PresenceSub(t, a.PublicKey, "room", "watcher")
		watchA.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`) // B's watcher is not here

		ann := ts.PresenceSub(t, a.PublicKey, "room", "ann")
		ann.Expect(`{"type":"presence","channel":"room","event":"sync","members":["watcher"]}`)
		watchA.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"ann"}`)
		bob := ts.PresenceSub(t, a.PublicKey, "room", "bob")
		bob.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann","watcher"]}`)
		watchA.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"bob"}`)
		ann.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"bob"}`)
		ann.Send(`{"action":"unsubscribe","channel":"room"}`)
		ann.Expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		watchA.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"ann"}`)
		bob.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"ann"}`)
		bob.Conn.UnderlyingConn().Close() // an abrupt drop
		watchA.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"bob"}`)

		// None of that reached B.
		watchB.ExpectSilence(200 * time.Millisecond)
		plainB.ExpectSilence(50 * time.Millisecond)

		// B's own presence works, under a clientId A also used, and stays in B.
		annB := ts.PresenceSub(t, b.PublicKey, "room", "ann")
		annB.Expect(`{"type":"presence","channel":"room","event":"sync","members":["watcher"]}`)
		watchB.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"ann"}`)
		annB.Conn.Close()
		watchB.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"ann"}`)
		watchA.ExpectSilence(200 * time.Millisecond)
		plainB.ExpectSilence(50 * time.Millisecond)
	})
}
