//go:build cluster

package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// TestClusterHealth: a project's delivery health read through one node sums
// every member's: its sockets, the emits each edge accepted, the deliveries
// each node made, the 429 the channel grain answered another edge, and a
// latency for the writes on each.
func TestClusterHealth(t *testing.T) {
	t.Parallel() // checks what happens, not how fast: see doc.go
	cl := startCluster(t, 10*time.Second, []string{"A", "B", "C"}, "EMIT_RATE_LIMIT_PER_MINUTE=5")
	a, b, c := cl.nodes[0], cl.nodes[1], cl.nodes[2]
	owner := a.on(t).Signup("alice@example.com")
	p := owner.CreateProject("health")

	subs := []*relaytest.WS{
		a.on(t).Subscribed(t, p.PublicKey, "room"),
		b.on(t).Subscribed(t, p.PublicKey, "room"),
		b.on(t).Subscribed(t, p.PublicKey, "room"),
		c.on(t).Subscribed(t, p.PublicKey, "room"),
	}
	for i := range 5 {
		via := a
		if i >= 3 {
			via = c
		}
		e := expectEmitted(t, via.on(t).Client().Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, i)), "room")
		if e.delivered != 4 {
			t.Fatalf("emit %d through %s delivered %d, want 4", i, via.name, e.delivered)
		}
		for _, s := range subs {
			s.Expect(fmt.Sprintf(`{"channel":"room","payload":%d,"seq":%d}`, i, e.seq))
		}
	}
	// The channel's budget of 5 is spent: a sixth, through B, is refused by
	// the grain and counted by B.
	if r := b.on(t).Client().Emit(p.SecretKey, `{"channel":"room","payload":5}`); r.Status != 429 || r.JSON["error"] != "channel_rate_limited" {
		t.Fatalf("sixth emit through B: %d %s", r.Status, r.Raw)
	}
	var h relaytest.HealthReply
	relaytest.Eventually(t, 5*time.Second, func() bool {
		h = owner.Health(p.ID)
		return h.LastMinute.LatencySamples >= 4
	}, "a latency sample from each socket")
	for name, w := range map[string]relaytest.HealthFigures{"lastMinute": h.LastMinute, "lastHour": h.LastHour} {
		if w.Emits != 5 || w.EmitsHTTP != 5 || w.Deliveries != 20 || w.Dropped != 0 || w.ChannelRateLimited != 1 ||
			w.ProjectRateLimited != 0 || w.P99 == nil || *w.P99 > 5000 {
			t.Errorf("%s through A: %+v", name, w)
		}
	}
	if h.Connections != 4 {
		t.Errorf("connections %d, want 4", h.Connections)
	}
}
