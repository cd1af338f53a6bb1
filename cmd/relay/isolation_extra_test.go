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
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		aliceC, bobC := ts.signup("alice@example.com"), ts.signup("bob@example.com")
		a, b := aliceC.createProject("a"), bobC.createProject("b")
		secretA := aliceC.do("PATCH", "/api/projects/"+a.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
		secretB := bobC.do("PATCH", "/api/projects/"+b.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
		if secretA == "" || secretB == "" {
			t.Fatal("no client-emit secrets")
		}
		// Same channel, same clientId, same jti in both projects.
		tokA := isoMint(t, secretA, a.id, "room", "x", "same-jti")
		tokB := isoMint(t, secretB, b.id, "room", "x", "same-jti")
		onlyA := isoMint(t, secretA, a.id, "room", "x", "only-in-a")

		subA := presenceSub(t, ts, a.publicKey, "room", "x")
		subA.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		subB := presenceSub(t, ts, b.publicKey, "room", "x")
		subB.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		for _, c := range []struct {
			sub *wsClient
			tok string
		}{{subA, tokA}, {subB, tokB}, {subA, onlyA}} {
			c.sub.send(emitFrame2("room", c.tok))
			c.sub.expectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
		}

		// B revokes "same-jti" (its own token has it) and "only-in-a" (a
		// jti only A ever issued), on the endpoint and through the helper.
		bobC.revoke(b.secretKey, `{"jti":"same-jti"}`).expect(t, 200, `{"ok":true}`)
		if err := backend.RevokeClientEmitToken(context.Background(), backend.RevokeOptions{EmitURL: ts.base + "/emit", SecretKey: b.secretKey, JTI: "only-in-a"}); err != nil {
			t.Fatal(err)
		}
		subB.send(emitFrame2("room", tokB))
		subB.expect(`{"error":"emit_token_revoked","channel":"room"}`) // the revoke did happen, in B
		for _, tok := range []string{tokA, onlyA} {
			subA.send(emitFrame2("room", tok))
			subA.expectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
		}
		if rows, err := ts.app.store.Revocations(context.Background(), a.id, time.Now()); err != nil || len(rows) != 0 {
			t.Fatalf("revocations stored for A: %+v %v", rows, err)
		}
		if rows, err := ts.app.store.Revocations(context.Background(), b.id, time.Now()); err != nil || len(rows) != 2 {
			t.Fatalf("revocations stored for B: %+v %v, want 2", rows, err)
		}

		// After a restart on the same database: still B's only.
		ts.stop()
		ts2 := startServer(t, url, nil)
		subA2 := presenceSub(t, ts2, a.publicKey, "room", "x")
		subA2.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		subB2 := presenceSub(t, ts2, b.publicKey, "room", "x")
		subB2.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		subB2.send(emitFrame2("room", tokB))
		subB2.expect(`{"error":"emit_token_revoked","channel":"room"}`)
		for _, tok := range []string{tokA, onlyA} {
			subA2.send(emitFrame2("room", tok))
			subA2.expectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
		}
	})
}

// TestIsolationWebhooks: each project's connects and disconnects reach its
// own webhook, signed with its own secret, and never the other's.
func TestIsolationWebhooks(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		aliceC, bobC := ts.signup("alice@example.com"), ts.signup("bob@example.com")
		a, b := aliceC.createProject("a"), bobC.createProject("b")
		recA, recB := newReceiver(t, "whsec-a", 0), newReceiver(t, "whsec-b", 0)
		setWebhook(t, ts, a.id, recA.srv.URL+"/hook", "whsec-a")
		setWebhook(t, ts, b.id, recB.srv.URL+"/hook", "whsec-b")
		silent := func(r *receiver, who string) {
			t.Helper()
			select {
			case ev := <-r.events:
				t.Fatalf("%s's webhook received %v", who, ev)
			case bad := <-r.bad:
				t.Fatalf("%s's webhook: %s", who, bad)
			default:
			}
		}

		// A's traffic: two connections, each connect and disconnect at A.
		for range 2 {
			c := ts.dialWS(a.publicKey)
			id := checkEvent(t, recA.next(t), "connect", a.id)
			c.conn.Close()
			if got := checkEvent(t, recA.next(t), "disconnect", a.id); got != id {
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
		c := ts.dialWS(b.publicKey)
		id := checkEvent(t, recB.next(t), "connect", b.id)
		c.conn.Close()
		if got := checkEvent(t, recB.next(t), "disconnect", b.id); got != id {
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
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		aliceC, bobC := ts.signup("alice@example.com"), ts.signup("bob@example.com")
		a, b := aliceC.createProject("a"), bobC.createProject("b")

		watchB := presenceSub(t, ts, b.publicKey, "room", "watcher")
		watchB.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		plainB := subscribed(t, ts, b.publicKey, "room")
		watchA := presenceSub(t, ts, a.publicKey, "room", "watcher")
		watchA.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`) // B's watcher is not here

		ann := presenceSub(t, ts, a.publicKey, "room", "ann")
		ann.expect(`{"type":"presence","channel":"room","event":"sync","members":["watcher"]}`)
		watchA.expect(`{"type":"presence","channel":"room","event":"join","clientId":"ann"}`)
		bob := presenceSub(t, ts, a.publicKey, "room", "bob")
		bob.expect(`{"type":"presence","channel":"room","event":"sync","members":["ann","watcher"]}`)
		watchA.expect(`{"type":"presence","channel":"room","event":"join","clientId":"bob"}`)
		ann.expect(`{"type":"presence","channel":"room","event":"join","clientId":"bob"}`)
		ann.send(`{"action":"unsubscribe","channel":"room"}`)
		ann.expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		watchA.expect(`{"type":"presence","channel":"room","event":"leave","clientId":"ann"}`)
		bob.expect(`{"type":"presence","channel":"room","event":"leave","clientId":"ann"}`)
		bob.conn.UnderlyingConn().Close() // an abrupt drop
		watchA.expect(`{"type":"presence","channel":"room","event":"leave","clientId":"bob"}`)

		// None of that reached B.
		watchB.expectSilence(200 * time.Millisecond)
		plainB.expectSilence(50 * time.Millisecond)

		// B's own presence works, under a clientId A also used, and stays in B.
		annB := presenceSub(t, ts, b.publicKey, "room", "ann")
		annB.expect(`{"type":"presence","channel":"room","event":"sync","members":["watcher"]}`)
		watchB.expect(`{"type":"presence","channel":"room","event":"join","clientId":"ann"}`)
		annB.conn.Close()
		watchB.expect(`{"type":"presence","channel":"room","event":"leave","clientId":"ann"}`)
		watchA.expectSilence(200 * time.Millisecond)
		plainB.expectSilence(50 * time.Millisecond)
	})
}
