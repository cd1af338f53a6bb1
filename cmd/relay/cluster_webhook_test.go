//go:build cluster

package main

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
	cl := startCluster(t, 10*time.Second, []string{"A", "B", "C"}, "WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true")
	a, b, c := cl.nodes[0], cl.nodes[1], cl.nodes[2]
	h := newHookLog(t)

	// The owner sets it all up in the dashboard, through A: the change
	// reaches B and C as a control-plane change.
	dash := a.on(t).dash(t)
	dash.signup("alice@example.com")
	dp := dash.create("hooks")
	page := "/projects/" + dp.id
	dash.submit(page, page+"/webhook", url.Values{"url": {h.srv.URL + "/hook"}}).expectRedirect(t, page+"?done=webhook-saved")
	dash.submit(page, page+"/webhook/events", url.Values{"channel": {"on"}, "presence": {"on"}}).expectRedirect(t, page+"?done=webhook-events")
	secret := dash.get(page).byID("webhook-secret")
	if secret == "" {
		t.Fatal("no webhook secret on the project page")
	}
	p := project{id: dp.id, publicKey: dp.publicKey, secretKey: dp.secretKey}
	seen := 0
	expect := func(t *testing.T, want ...string) {
		t.Helper()
		// A duplicate from another node would come about as fast: 300 ms
		// of nothing more once they have come (it was 200 ms before the
		// wait, then expectEvents' 100 ms).
		h.expectEventsQuiet(t, secret, &seen, 300*time.Millisecond, want...)
	}
	occupied := func(ch string) string { return channelHook("channel_occupied", p.id, ch) }
	vacated := func(ch string) string { return channelHook("channel_vacated", p.id, ch) }
	added := func(ch, id string) string { return memberHook("member_added", p.id, ch, id) }
	removed := func(ch, id string) string { return memberHook("member_removed", p.id, ch, id) }

	t.Run("members on three nodes", func(t *testing.T) {
		const ch = "room"
		u1, u2, u3 := presenceTrio(t, p.publicKey, ch, a.on(t), b.on(t), c.on(t))
		expect(t, occupied(ch), added(ch, "u1"), added(ch, "u2"), added(ch, "u3"))
		// A second connection of u1's clientId on C, and a plain subscriber on B: nothing.
		u1c := presenceSub(t, c.on(t), p.publicKey, ch, "u1")
		u1c.expect(syncFrame(ch, "u1", "u2", "u3"))
		plain := subscribed(t, b.on(t), p.publicKey, ch)
		expect(t)
		// u1 leaves A: still present on C. u2 drops on B: removed.
		u1.conn.Close()
		u2.conn.UnderlyingConn().Close()
		expect(t, removed(ch, "u2"))
		u1c.expect(presenceFrame(ch, "leave", "u2"))
		u1c.send(`{"action":"unsubscribe","channel":"room"}`)
		u1c.expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		u3.conn.Close()
		expect(t, removed(ch, "u1"), removed(ch, "u3"))
		// The last subscriber, on B, goes: vacated once.
		plain.conn.Close()
		expect(t, vacated(ch))
		// Occupied again from C alone, vacated again.
		again := subscribed(t, c.on(t), p.publicKey, ch)
		expect(t, occupied(ch))
		again.conn.Close()
		expect(t, vacated(ch))
	})

	t.Run("a change in the dashboard reaches the grain's node", func(t *testing.T) {
		ch := channelHostedBy(t, c, a.on(t).client(), p, "change")
		dash.submit(page, page+"/webhook/events", url.Values{"channel": {"on"}}).expectRedirect(t, page+"?done=webhook-events")
		webhookEventsOn(t, p.id, []string{"channel"}, c)
		u := presenceSub(t, a.on(t), p.publicKey, ch, "quiet")
		expect(t, occupied(ch)) // and no member_added
		u.conn.Close()
		expect(t, vacated(ch))
		dash.submit(page, page+"/webhook/events", url.Values{"channel": {"on"}, "presence": {"on"}}).expectRedirect(t, page+"?done=webhook-events")
		webhookEventsOn(t, p.id, []string{"channel", "presence"}, a, b, c)
	})

	t.Run("a node killed: its members are removed by the grain's node", func(t *testing.T) {
		// A channel whose grain is on A, with members on B and C; C dies.
		ch := channelHostedBy(t, a, a.on(t).client(), p, "killed")
		onB := presenceSub(t, b.on(t), p.publicKey, ch, "b1")
		onB.expect(syncFrame(ch))
		onC := presenceSub(t, c.on(t), p.publicKey, ch, "c1")
		onC.expect(syncFrame(ch, "b1"))
		onB.expect(presenceFrame(ch, "join", "c1"))
		expect(t, occupied(ch), added(ch, "b1"), added(ch, "c1"))
		if err := c.proc.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		onB.expect(presenceFrame(ch, "leave", "c1"))
		expect(t, removed(ch, "c1"))
		onB.conn.Close()
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
