//go:build cluster

package cluster

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
	t.Parallel() // checks what happens, not how fast: see doc.go
	cl := startCluster(t, 10*time.Second, []string{"A", "B"}, "MAX_PRESENCE_MEMBERS_PER_CHANNEL=1")
	tsA, tsB := cl.nodes[0].on(t), cl.nodes[1].on(t)
	owner := tsA.Signup("alice@example.com")
	p := owner.CreateProject("refusals")
	// The one member, on A; the refused ones subscribe through B.
	tsA.PresenceSub(t, p.PublicKey, "room", "first").Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	if r := owner.Emit(p.SecretKey, `{"channel":"room","payload":"before"}`); r.Status != http.StatusOK {
		t.Fatalf("emit: %d %s", r.Status, r.Raw)
	}

	t.Run("refused subscribe gets no replay", func(t *testing.T) {
		c := tsB.DialWS(p.PublicKey)
		c.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"y","since":0}`)
		c.Expect(`{"error":"too_many_presence_members","channel":"room"}`)
		c.ExpectSilence(300 * time.Millisecond)
	})

	t.Run("refused re-subscribe keeps the earlier subscription", func(t *testing.T) {
		c := tsB.DialWS(p.PublicKey)
		c.Send(`{"action":"subscribe","channel":"room"}`)
		c.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
		c.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"second"}`)
		c.Expect(`{"error":"too_many_presence_members","channel":"room"}`)
		r := owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`)
		if r.Status != http.StatusOK || relaytest.Num(r.JSON, "subscriberCount") != 2 {
			t.Fatalf("emit while subscribed: %d %s, want 2 subscribers", r.Status, r.Raw)
		}
		c.Expect(fmt.Sprintf(`{"channel":"room","payload":1,"seq":%d}`, int64(relaytest.Num(r.JSON, "seq"))))
		c.Send(`{"action":"unsubscribe","channel":"room"}`)
		c.Expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		// The grain hears of the leave from B, the emits come from A: it
		// may count the subscription a moment longer (the relay on B no
		// longer delivers to it). Refused, it stayed for ever.
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r := owner.Emit(p.SecretKey, `{"channel":"room","payload":2}`)
			return r.Status == http.StatusOK && relaytest.Num(r.JSON, "subscriberCount") == 1
		}, "the unsubscribe reached the grain")
		c.ExpectSilence(300 * time.Millisecond)
	})

	t.Run("client emit behind a refused presence subscribe", func(t *testing.T) {
		secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room",
			ClientID: "bob", Types: []string{"t"}, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		listener := tsA.DialWS(p.PublicKey)
		listener.Send(`{"action":"subscribe","channel":"room"}`)
		listener.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
		for range 5 {
			bob := tsB.DialWS(p.PublicKey)
			bob.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"bob"}`)
			bob.Send(relaytest.EmitFrame("room", "t", "1", tok))
			bob.Expect(`{"error":"too_many_presence_members","channel":"room"}`)
			bob.Expect(`{"error":"emit_identity_mismatch","channel":"room"}`)
			listener.ExpectSilence(100 * time.Millisecond)
			bob.Conn.Close()
		}
	})
}
