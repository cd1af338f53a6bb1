//go:build cluster

package main

// A presence subscribe refused by MAX_PRESENCE_MEMBERS_PER_CHANNEL in a
// cluster, where the channel grain decides it on another node: the
// connection's earlier subscription stays as it was (on the grain, the relay
// and the connection alike), the refused subscribe gets no replay, and a
// client emit sent right behind it is refused by rule 4. Run with
// `make test-cluster` (or -run '^TestClusterPresenceRefusals').

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

func TestClusterPresenceRefusals(t *testing.T) {
	cl := startCluster(t, 10*time.Second, []string{"A", "B"}, "MAX_PRESENCE_MEMBERS_PER_CHANNEL=1")
	tsA, tsB := cl.nodes[0].on(t), cl.nodes[1].on(t)
	owner := tsA.signup("alice@example.com")
	p := owner.createProject("refusals")
	// The one member, on A; the refused ones subscribe through B.
	presenceSub(t, tsA, p.publicKey, "room", "first").expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	if r := owner.emit(p.secretKey, `{"channel":"room","payload":"before"}`); r.status != http.StatusOK {
		t.Fatalf("emit: %d %s", r.status, r.raw)
	}

	t.Run("refused subscribe gets no replay", func(t *testing.T) {
		c := tsB.dialWS(p.publicKey)
		c.send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"y","since":0}`)
		c.expect(`{"error":"too_many_presence_members","channel":"room"}`)
		c.expectSilence(300 * time.Millisecond)
	})

	t.Run("refused re-subscribe keeps the earlier subscription", func(t *testing.T) {
		c := tsB.dialWS(p.publicKey)
		c.send(`{"action":"subscribe","channel":"room"}`)
		c.expect(`{"action":"subscribe","channel":"room","ok":true}`)
		c.send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"second"}`)
		c.expect(`{"error":"too_many_presence_members","channel":"room"}`)
		r := owner.emit(p.secretKey, `{"channel":"room","payload":1}`)
		if r.status != http.StatusOK || num(r.json, "subscriberCount") != 2 {
			t.Fatalf("emit while subscribed: %d %s, want 2 subscribers", r.status, r.raw)
		}
		c.expect(fmt.Sprintf(`{"channel":"room","payload":1,"seq":%d}`, int64(num(r.json, "seq"))))
		c.send(`{"action":"unsubscribe","channel":"room"}`)
		c.expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		// The grain hears of the leave from B, the emits come from A: it
		// may count the subscription a moment longer (the relay on B no
		// longer delivers to it). Refused, it stayed for ever.
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r := owner.emit(p.secretKey, `{"channel":"room","payload":2}`)
			return r.status == http.StatusOK && num(r.json, "subscriberCount") == 1
		}, "the unsubscribe reached the grain")
		c.expectSilence(300 * time.Millisecond)
	})

	t.Run("client emit behind a refused presence subscribe", func(t *testing.T) {
		secret := owner.do("PATCH", "/api/projects/"+p.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
		tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.id, Channel: "room",
			ClientID: "bob", Types: []string{"t"}, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		listener := tsA.dialWS(p.publicKey)
		listener.send(`{"action":"subscribe","channel":"room"}`)
		listener.expect(`{"action":"subscribe","channel":"room","ok":true}`)
		for range 5 {
			bob := tsB.dialWS(p.publicKey)
			bob.send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"bob"}`)
			bob.send(emitFrame2("room", tok))
			bob.expect(`{"error":"too_many_presence_members","channel":"room"}`)
			bob.expect(`{"error":"emit_identity_mismatch","channel":"room"}`)
			listener.expectSilence(100 * time.Millisecond)
			bob.conn.Close()
		}
	})
}
