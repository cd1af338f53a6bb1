package webhooks

// Channel and presence events (api/README.md › Webhooks and usage), opted in
// through the settings API, with exact bodies and signatures.

import (
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestWebhooksChannelAndPresence: channel_occupied on a channel's first
// subscriber and channel_vacated when its last leaves (unsubscribe, close,
// abrupt drop); member_added and member_removed when a clientId joins and
// leaves the presence roster (once for a clientId on two connections, and
// when a subscriber switches clientId), with exact bodies and signatures.
func TestWebhooksChannelAndPresence(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := relaytest.Start(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		h := relaytest.NewHookLog(t)
		secret := owner.SetWebhookEvents(t, p.ID, h.URL+"/hook", true, true)
		seen := 0
		expect := func(want ...string) { t.Helper(); h.ExpectEvents(t, secret, &seen, want...) }
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
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := relaytest.Start(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		h := relaytest.NewHookLog(t)
		secret := owner.SetWebhookEvents(t, p.ID, h.URL, false, false)
		seen := 0
		expect := func(want ...string) { t.Helper(); h.ExpectEvents(t, secret, &seen, want...) }

		a := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		a.Conn.Close()
		b := ts.PresenceSub(t, p.PublicKey, "room", "bob") // the channel actor keeps running
		relaytest.Eventually(t, 5*time.Second, func() bool {
			return len(h.Bodies()) >= 3 // connect, disconnect, connect
		}, "the connect and disconnect webhooks")
		expect() // and nothing else

		// Presence only, turned on while the channel runs.
		owner.SetWebhookEvents(t, p.ID, h.URL, false, true)
		c := ts.PresenceSub(t, p.PublicKey, "room", "cat")
		expect(relaytest.MemberHook("member_added", p.ID, "room", "cat"))
		b.Conn.Close()
		c.Conn.Close()
		expect(relaytest.MemberHook("member_removed", p.ID, "room", "bob"), relaytest.MemberHook("member_removed", p.ID, "room", "cat"))

		// Channel events only.
		owner.SetWebhookEvents(t, p.ID, h.URL, true, false)
		d := ts.PresenceSub(t, p.PublicKey, "lobby", "dan")
		expect(relaytest.ChannelHook("channel_occupied", p.ID, "lobby"))
		d.Conn.Close()
		expect(relaytest.ChannelHook("channel_vacated", p.ID, "lobby"))

		// Off again: nothing.
		owner.SetWebhookEvents(t, p.ID, h.URL, false, false)
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
