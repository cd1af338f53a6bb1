package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// setWebhookEvents stores a project's webhook and its event choice (the
// dashboard's job) and tells the running project actor, as the dashboard does.
func setWebhookEvents(t *testing.T, ts *testServer, projectID, url, secret string, channel, presence bool) {
	t.Helper()
	if err := ts.app.store.SaveSettings(context.Background(), store.Settings{ProjectID: projectID, WebhookURL: url, WebhookSecret: secret,
		WebhookChannelEvents: channel, WebhookPresenceEvents: presence}); err != nil {
		t.Fatal(err)
	}
	ts.app.actors.SettingsChanged(projectID)
	var want []string
	if url != "" && channel {
		want = append(want, "channel")
	}
	if url != "" && presence {
		want = append(want, "presence")
	}
	// The project actor reloads its settings beside its work: wait until it
	// has (if it runs), as /debug/actors shows.
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		in, err := ts.app.actors.Inspect(context.Background(), projectID, "", 0, 0)
		if err != nil || len(in.Projects) == 0 {
			return err
		}
		if got := in.Projects[0].WebhookEvents; !slices.Equal(got, want) && len(got)+len(want) > 0 {
			return fmt.Errorf("webhook events %v, want %v", got, want)
		}
		return nil
	})
}

// TestWebhooksChannelAndPresence: channel_occupied on a channel's first
// subscriber and channel_vacated when its last leaves (unsubscribe, close,
// abrupt drop); member_added and member_removed when a clientId joins and
// leaves the presence roster (once for a clientId on two connections, and
// when a subscriber switches clientId), with exact bodies and signatures.
func TestWebhooksChannelAndPresence(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		p := ts.Signup("alice@example.com").CreateProject("demo")
		h := relaytest.NewHookLog(t)
		setWebhookEvents(t, ts, p.ID, h.URL+"/hook", "whsec-ev", true, true)
		seen := 0
		expect := func(want ...string) { t.Helper(); h.ExpectEvents(t, "whsec-ev", &seen, want...) }
		occupied := func(ch string) string { return relaytest.ChannelHook("channel_occupied", p.ID, ch) }
		vacated := func(ch string) string { return relaytest.ChannelHook("channel_vacated", p.ID, ch) }
		added := func(ch, id string) string { return relaytest.MemberHook("member_added", p.ID, ch, id) }
		removed := func(ch, id string) string { return relaytest.MemberHook("member_removed", p.ID, ch, id) }

		// The first subscriber is a presence member: both events.
		ann := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		expect(occupied("room"), added("room", "ann"))
		// A plain subscriber: nothing (the channel is occupied already).
		plain := ts.Subscribed(t, p.PublicKey, "room")
		expect()
		// The same clientId on a second connection: no new member.
		ann2 := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		ann2.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann"]}`)
		expect()
		ann.Conn.Close()
		expect() // ann is still present on ann2
		// Switching clientId on the same subscription: ann leaves, bob joins.
		ann2.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"bob"}`)
		ann2.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
		ann2.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		expect(removed("room", "ann"), added("room", "bob"))
		// Unsubscribe: bob leaves; the plain subscriber keeps the channel occupied.
		ann2.Send(`{"action":"unsubscribe","channel":"room"}`)
		ann2.Expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		expect(removed("room", "bob"))
		// The last subscriber drops abruptly: vacated.
		plain.Conn.UnderlyingConn().Close()
		expect(vacated("room"))
		// Occupied again; a clean close of a presence member vacates it with the leave.
		cat := ts.PresenceSub(t, p.PublicKey, "room", "cat")
		expect(occupied("room"), added("room", "cat"))
		other := ts.Subscribed(t, p.PublicKey, "other")
		expect(occupied("other"))
		cat.SendRaw(relaytest.ClientFrame(0x8, true, []byte{0x03, 0xe8})) // close 1000
		cat.ExpectClose(1000, 5*time.Second)
		expect(removed("room", "cat"), vacated("room"))
		other.Send(`{"action":"unsubscribe","channel":"other"}`)
		other.Expect(`{"action":"unsubscribe","channel":"other","ok":true}`)
		expect(vacated("other"))
	})
}

// TestWebhooksEventsOptIn: a project with a webhook but without the new
// events gets connect and disconnect only; each choice sends only its own
// events; turning them on reaches channels that are already running.
func TestWebhooksEventsOptIn(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		p := ts.Signup("alice@example.com").CreateProject("demo")
		h := relaytest.NewHookLog(t)
		setWebhookEvents(t, ts, p.ID, h.URL, "s", false, false)
		seen := 0
		expect := func(want ...string) { t.Helper(); h.ExpectEvents(t, "s", &seen, want...) }

		a := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		a.Conn.Close()
		b := ts.PresenceSub(t, p.PublicKey, "room", "bob") // the channel actor keeps running
		relaytest.Eventually(t, 5*time.Second, func() bool {
			return len(h.Bodies()) >= 3 // connect, disconnect, connect
		}, "the connect and disconnect webhooks")
		expect() // and nothing else

		// Presence only, turned on while the channel runs.
		setWebhookEvents(t, ts, p.ID, h.URL, "s", false, true)
		c := ts.PresenceSub(t, p.PublicKey, "room", "cat")
		expect(relaytest.MemberHook("member_added", p.ID, "room", "cat"))
		b.Conn.Close()
		c.Conn.Close()
		expect(relaytest.MemberHook("member_removed", p.ID, "room", "bob"), relaytest.MemberHook("member_removed", p.ID, "room", "cat"))

		// Channel events only.
		setWebhookEvents(t, ts, p.ID, h.URL, "s", true, false)
		d := ts.PresenceSub(t, p.PublicKey, "lobby", "dan")
		expect(relaytest.ChannelHook("channel_occupied", p.ID, "lobby"))
		d.Conn.Close()
		expect(relaytest.ChannelHook("channel_vacated", p.ID, "lobby"))

		// Off again: nothing.
		setWebhookEvents(t, ts, p.ID, h.URL, "s", false, false)
		e := ts.PresenceSub(t, p.PublicKey, "lobby", "eve")
		e.Conn.Close()
		// Eve's session is over on the server: her disconnect, the fifth
		// (ann, bob, cat, dan, eve), has come; then nothing else.
		relaytest.Eventually(t, 5*time.Second, func() bool {
			n := 0
			for _, body := range h.Bodies() {
				if strings.Contains(body, `"event":"disconnect"`) {
					n++
				}
			}
			return n >= 5
		}, "eve's disconnect webhook")
		expect()
	})
}

// TestWebhooksChannelStorm: a project whose channels flap as fast as one
// socket can subscribe and unsubscribe, with a receiver that never
// answers, fills only its own bounded queue: the rest is dropped and
// counted, and another project's events still arrive.
func TestWebhooksChannelStorm(t *testing.T) {
	ts := debugServer(t, map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_QUEUE_PER_PROJECT": "50", "WEBHOOK_TIMEOUT_MS": "60000",
	})
	owner := ts.Signup("alice@example.com")
	a, b := owner.CreateProject("storm"), owner.CreateProject("calm")
	hanging, _ := hangingReceiver(t)
	setWebhookEvents(t, ts, a.ID, hanging, "sa", true, true)
	h := relaytest.NewHookLog(t)
	setWebhookEvents(t, ts, b.ID, h.URL, "sb", true, false)

	c := ts.DialWS(a.PublicKey)
	const flaps = 200
	for i := range flaps {
		ch := fmt.Sprintf("c%d", i)
		c.Send(`{"action":"subscribe","channel":"` + ch + `","presence":true,"clientId":"x"}`)
		c.Send(`{"action":"unsubscribe","channel":"` + ch + `"}`)
	}
	c.Send(`{"action":"ping"}`)
	relaytest.EventuallyNil(t, 10*time.Second, func() error {
		for {
			f, ok := c.Next(5 * time.Second)
			if !ok {
				return fmt.Errorf("no pong")
			}
			if strings.Contains(f.Text, "pong") {
				return nil
			}
		}
	})
	// 1 connect + 4 events per flap: all but 2 in flight and 50 queued are dropped.
	relaytest.Eventually(t, 5*time.Second, func() bool {
		st := ts.app.webhooks.Stats()
		return st.DroppedBy["project_queue_full"] == 1+4*flaps-2-50 && st.Queued == 50 && st.InFlight == 2
	}, "the storm's events beyond its queue dropped")

	s := ts.Subscribed(t, b.PublicKey, "quiet")
	seen := 0
	h.ExpectEvents(t, "sb", &seen, relaytest.ChannelHook("channel_occupied", b.ID, "quiet"))
	s.Conn.Close()
	h.ExpectEvents(t, "sb", &seen, relaytest.ChannelHook("channel_vacated", b.ID, "quiet"))
	if st := ts.app.webhooks.Stats(); st.Queued != 50 {
		t.Fatalf("queued %d, want the storm's 50", st.Queued)
	}
}
