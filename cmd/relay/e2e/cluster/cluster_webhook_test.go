//go:build cluster

package cluster

// Channel and presence webhooks in a cluster, black-box: the channel's grain
// decides them for the whole cluster and its node sends them, so each
// transition is sent once however many nodes hold subscribers. Run with
// `make test-cluster` (or -run '^TestClusterWebhooks'); like TestCluster it
// starts its own etcd, PostgreSQL and relay processes on loopback and ends
// only the processes it started, by their pids.

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

func TestClusterWebhooksOncePerTransition(t *testing.T) {
	t.Parallel() // checks what happens, not how fast: see doc.go
	cl := startCluster(t, 10*time.Second, []string{"A", "B", "C"}, "WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true")
	a, b, c := cl.nodes[0], cl.nodes[1], cl.nodes[2]
	h := relaytest.NewHookLog(t)

	// The owner sets it all up in the dashboard, through A: the change
	// reaches B and C as a control-plane change.
	dash := a.on(t).Dash(t)
	dash.Signup("alice@example.com")
	dp := dash.Create("hooks")
	page := "/projects/" + dp.ID
	dash.Submit(page, page+"/webhook", url.Values{"url": {h.URL + "/hook"}}).ExpectRedirect(t, page+"?done=webhook-saved")
	dash.Submit(page, page+"/webhook/events", url.Values{"channel": {"on"}, "presence": {"on"}}).ExpectRedirect(t, page+"?done=webhook-events")
	secret := dash.Get(page).ByID("webhook-secret")
	if secret == "" {
		t.Fatal("no webhook secret on the project page")
	}
	p := relaytest.Project{ID: dp.ID, PublicKey: dp.PublicKey, SecretKey: dp.SecretKey}
	seen := 0
	expect := func(t *testing.T, want ...string) {
		t.Helper()
		// A duplicate from another node would come about as fast: 300 ms
		// of nothing more once they have come (it was 200 ms before the
		// wait, then ExpectEvents' 100 ms).
		h.ExpectEventsQuiet(t, secret, &seen, 300*time.Millisecond, want...)
	}
	occupied := func(ch string) string { return relaytest.ChannelHook("channel_occupied", p.ID, ch) }
	vacated := func(ch string) string { return relaytest.ChannelHook("channel_vacated", p.ID, ch) }
	added := func(ch, id string) string { return relaytest.MemberHook("member_added", p.ID, ch, id) }
	removed := func(ch, id string) string { return relaytest.MemberHook("member_removed", p.ID, ch, id) }

	t.Run("members on three nodes", func(t *testing.T) {
		const ch = "room"
		u1, u2, u3 := presenceTrio(t, p.PublicKey, ch, a.on(t), b.on(t), c.on(t))
		expect(t, occupied(ch), added(ch, "u1"), added(ch, "u2"), added(ch, "u3"))
		// A second connection of u1's clientId on C, and a plain subscriber on B: nothing.
		u1c := c.on(t).PresenceSub(t, p.PublicKey, ch, "u1")
		u1c.Expect(syncFrame(ch, "u1", "u2", "u3"))
		plain := b.on(t).Subscribed(t, p.PublicKey, ch)
		expect(t)
		// u1 leaves A: still present on C. u2 drops on B: removed.
		u1.Conn.Close()
		u2.Conn.UnderlyingConn().Close()
		expect(t, removed(ch, "u2"))
		u1c.Expect(presenceFrame(ch, "leave", "u2"))
		u1c.Send(`{"action":"unsubscribe","channel":"room"}`)
		u1c.Expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		u3.Conn.Close()
		expect(t, removed(ch, "u1"), removed(ch, "u3"))
		// The last subscriber, on B, goes: vacated once.
		plain.Conn.Close()
		expect(t, vacated(ch))
		// Occupied again from C alone, vacated again.
		again := c.on(t).Subscribed(t, p.PublicKey, ch)
		expect(t, occupied(ch))
		again.Conn.Close()
		expect(t, vacated(ch))
	})

	t.Run("a change in the dashboard reaches the grain's node", func(t *testing.T) {
		ch := channelHostedBy(t, c, a.on(t).Client(), p, "change")
		dash.Submit(page, page+"/webhook/events", url.Values{"channel": {"on"}}).ExpectRedirect(t, page+"?done=webhook-events")
		webhookEventsOn(t, p.ID, []string{"channel"}, c)
		u := a.on(t).PresenceSub(t, p.PublicKey, ch, "quiet")
		expect(t, occupied(ch)) // and no member_added
		u.Conn.Close()
		expect(t, vacated(ch))
		dash.Submit(page, page+"/webhook/events", url.Values{"channel": {"on"}, "presence": {"on"}}).ExpectRedirect(t, page+"?done=webhook-events")
		webhookEventsOn(t, p.ID, []string{"channel", "presence"}, a, b, c)
	})

	t.Run("a node killed: its members are removed by the grain's node", func(t *testing.T) {
		// A channel whose grain is on A, with members on B and C; C dies.
		ch := channelHostedBy(t, a, a.on(t).Client(), p, "killed")
		onB := b.on(t).PresenceSub(t, p.PublicKey, ch, "b1")
		onB.Expect(syncFrame(ch))
		onC := c.on(t).PresenceSub(t, p.PublicKey, ch, "c1")
		onC.Expect(syncFrame(ch, "b1"))
		onB.Expect(presenceFrame(ch, "join", "c1"))
		expect(t, occupied(ch), added(ch, "b1"), added(ch, "c1"))
		if err := c.proc.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		onB.Expect(presenceFrame(ch, "leave", "c1"))
		expect(t, removed(ch, "c1"))
		onB.Conn.Close()
		expect(t, removed(ch, "b1"), vacated(ch))
	})
}

// webhookEventsOn waits until the project actor of project id on each node
// has loaded the webhook events want, as its /debug/actors shows.
func webhookEventsOn(t *testing.T, id string, want []string, nodes ...*clusterNode) {
	t.Helper()
	for _, n := range nodes {
		relaytest.EventuallyNil(t, 5*time.Second, func() error {
			r, err := relaytest.Do(nil, "GET", n.proc.Debug+"/debug/actors?project="+id, "", nil)
			if err != nil {
				return err
			}
			var v struct {
				Projects []struct {
					WebhookEvents []string `json:"webhookEvents"`
				} `json:"projects"`
			}
			if err := json.Unmarshal([]byte(r.Raw), &v); err != nil {
				return err
			}
			if len(v.Projects) != 1 || !slices.Equal(v.Projects[0].WebhookEvents, want) {
				return fmt.Errorf("%s: /debug/actors %s, want webhookEvents %v", n.name, r.Raw, want)
			}
			return nil
		})
	}
}
