package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// hookLog is a webhook endpoint that keeps every request's exact body and
// signature header, for tests that compare bodies byte for byte.
type hookLog struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []hookRequest
}

type hookRequest struct{ body, signature string }

func newHookLog(t *testing.T) *hookLog {
	h := &hookLog{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.bodies = append(h.bodies, hookRequest{string(body), r.Header.Get("X-Service-Signature")})
		h.mu.Unlock()
	}))
	t.Cleanup(h.srv.Close)
	return h
}

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

var (
	hookTimestamp = regexp.MustCompile(`"timestamp":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"`)
	hookID        = regexp.MustCompile(`^\{"id":"([A-Za-z0-9_-]{22})",`) // 16 random bytes, base64url, first
)

// channelEvents takes the requests received so far that are not connect or
// disconnect, checks each signature against secret, each id (first, unique)
// and each timestamp (UTC, milliseconds, within the last minute), and
// returns the bodies with the id replaced by "I" and the timestamp by "T",
// in the order they arrived.
func (h *hookLog) channelEvents(t *testing.T, secret string) []string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	ids := map[string]bool{}
	for _, r := range h.bodies {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(r.body))
		if want := "sha256=" + hex.EncodeToString(mac.Sum(nil)); r.signature != want {
			t.Fatalf("signature %q on %s, want %q", r.signature, r.body, want)
		}
		var ev struct{ Event string }
		if err := json.Unmarshal([]byte(r.body), &ev); err != nil {
			t.Fatalf("not JSON: %s", r.body)
		}
		if ev.Event == "connect" || ev.Event == "disconnect" {
			continue
		}
		m := hookTimestamp.FindStringSubmatch(r.body)
		if m == nil {
			t.Fatalf("no timestamp in %s", r.body)
		}
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err != nil || time.Since(at) > time.Minute || time.Until(at) > time.Second {
			t.Fatalf("timestamp %s: %v", m[1], err)
		}
		id := hookID.FindStringSubmatch(r.body)
		if id == nil || ids[id[1]] {
			t.Fatalf("no id, or a repeated one, in %s", r.body)
		}
		ids[id[1]] = true
		body := hookID.ReplaceAllString(r.body, `{"id":"I",`)
		out = append(out, hookTimestamp.ReplaceAllString(body, `"timestamp":"T"`))
	}
	return out
}

// expectEvents waits until the channel and presence events received since
// the last call are exactly want (in any order: a project has two
// deliveries under way at once, so they may overtake each other).
func (h *hookLog) expectEvents(t *testing.T, secret string, seen *int, want ...string) {
	t.Helper()
	h.expectEventsQuiet(t, secret, seen, 100*time.Millisecond, want...)
}

// expectEventsQuiet is expectEvents with nothing more for quiet once they
// have come.
func (h *hookLog) expectEventsQuiet(t *testing.T, secret string, seen *int, quiet time.Duration, want ...string) {
	t.Helper()
	var got []string
	relaytest.Within(5*time.Second, func() bool {
		got = h.channelEvents(t, secret)[*seen:]
		return len(got) >= len(want)
	})
	// Time by nature: and nothing more within quiet (polled, so that one
	// more ends the wait at once).
	relaytest.Within(quiet, func() bool { return len(h.channelEvents(t, secret)) > *seen+len(want) })
	got = h.channelEvents(t, secret)[*seen:]
	a, b := slices.Clone(got), slices.Clone(want)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	*seen += len(got)
}

func channelHook(kind, projectID, channel string) string {
	return fmt.Sprintf(`{"id":"I","event":%q,"projectId":%q,"channel":%q,"timestamp":"T"}`, kind, projectID, channel)
}

func memberHook(kind, projectID, channel, clientID string) string {
	return fmt.Sprintf(`{"id":"I","event":%q,"projectId":%q,"channel":%q,"clientId":%q,"timestamp":"T"}`, kind, projectID, channel, clientID)
}

// TestWebhooksChannelAndPresence: channel_occupied on a channel's first
// subscriber and channel_vacated when its last leaves (unsubscribe, close,
// abrupt drop); member_added and member_removed when a clientId joins and
// leaves the presence roster (once for a clientId on two connections, and
// when a subscriber switches clientId), with exact bodies and signatures.
func TestWebhooksChannelAndPresence(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		p := ts.signup("alice@example.com").createProject("demo")
		h := newHookLog(t)
		setWebhookEvents(t, ts, p.id, h.srv.URL+"/hook", "whsec-ev", true, true)
		seen := 0
		expect := func(want ...string) { t.Helper(); h.expectEvents(t, "whsec-ev", &seen, want...) }
		occupied := func(ch string) string { return channelHook("channel_occupied", p.id, ch) }
		vacated := func(ch string) string { return channelHook("channel_vacated", p.id, ch) }
		added := func(ch, id string) string { return memberHook("member_added", p.id, ch, id) }
		removed := func(ch, id string) string { return memberHook("member_removed", p.id, ch, id) }

		// The first subscriber is a presence member: both events.
		ann := presenceSub(t, ts, p.publicKey, "room", "ann")
		expect(occupied("room"), added("room", "ann"))
		// A plain subscriber: nothing (the channel is occupied already).
		plain := subscribed(t, ts, p.publicKey, "room")
		expect()
		// The same clientId on a second connection: no new member.
		ann2 := presenceSub(t, ts, p.publicKey, "room", "ann")
		ann2.expect(`{"type":"presence","channel":"room","event":"sync","members":["ann"]}`)
		expect()
		ann.conn.Close()
		expect() // ann is still present on ann2
		// Switching clientId on the same subscription: ann leaves, bob joins.
		ann2.send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"bob"}`)
		ann2.expect(`{"action":"subscribe","channel":"room","ok":true}`)
		ann2.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		expect(removed("room", "ann"), added("room", "bob"))
		// Unsubscribe: bob leaves; the plain subscriber keeps the channel occupied.
		ann2.send(`{"action":"unsubscribe","channel":"room"}`)
		ann2.expect(`{"action":"unsubscribe","channel":"room","ok":true}`)
		expect(removed("room", "bob"))
		// The last subscriber drops abruptly: vacated.
		plain.conn.UnderlyingConn().Close()
		expect(vacated("room"))
		// Occupied again; a clean close of a presence member vacates it with the leave.
		cat := presenceSub(t, ts, p.publicKey, "room", "cat")
		expect(occupied("room"), added("room", "cat"))
		other := subscribed(t, ts, p.publicKey, "other")
		expect(occupied("other"))
		cat.sendRaw(clientFrame(0x8, true, []byte{0x03, 0xe8})) // close 1000
		cat.expectClose(1000, 5*time.Second)
		expect(removed("room", "cat"), vacated("room"))
		other.send(`{"action":"unsubscribe","channel":"other"}`)
		other.expect(`{"action":"unsubscribe","channel":"other","ok":true}`)
		expect(vacated("other"))
	})
}

// TestWebhooksEventsOptIn: a project with a webhook but without the new
// events gets connect and disconnect only; each choice sends only its own
// events; turning them on reaches channels that are already running.
func TestWebhooksEventsOptIn(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		p := ts.signup("alice@example.com").createProject("demo")
		h := newHookLog(t)
		setWebhookEvents(t, ts, p.id, h.srv.URL, "s", false, false)
		seen := 0
		expect := func(want ...string) { t.Helper(); h.expectEvents(t, "s", &seen, want...) }

		a := presenceSub(t, ts, p.publicKey, "room", "ann")
		a.conn.Close()
		b := presenceSub(t, ts, p.publicKey, "room", "bob") // the channel actor keeps running
		relaytest.Eventually(t, 5*time.Second, func() bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			return len(h.bodies) >= 3 // connect, disconnect, connect
		}, "the connect and disconnect webhooks")
		expect() // and nothing else

		// Presence only, turned on while the channel runs.
		setWebhookEvents(t, ts, p.id, h.srv.URL, "s", false, true)
		c := presenceSub(t, ts, p.publicKey, "room", "cat")
		expect(memberHook("member_added", p.id, "room", "cat"))
		b.conn.Close()
		c.conn.Close()
		expect(memberHook("member_removed", p.id, "room", "bob"), memberHook("member_removed", p.id, "room", "cat"))

		// Channel events only.
		setWebhookEvents(t, ts, p.id, h.srv.URL, "s", true, false)
		d := presenceSub(t, ts, p.publicKey, "lobby", "dan")
		expect(channelHook("channel_occupied", p.id, "lobby"))
		d.conn.Close()
		expect(channelHook("channel_vacated", p.id, "lobby"))

		// Off again: nothing.
		setWebhookEvents(t, ts, p.id, h.srv.URL, "s", false, false)
		e := presenceSub(t, ts, p.publicKey, "lobby", "eve")
		e.conn.Close()
		// Eve's session is over on the server: her disconnect, the fifth
		// (ann, bob, cat, dan, eve), has come; then nothing else.
		relaytest.Eventually(t, 5*time.Second, func() bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			n := 0
			for _, r := range h.bodies {
				if strings.Contains(r.body, `"event":"disconnect"`) {
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
	owner := ts.signup("alice@example.com")
	a, b := owner.createProject("storm"), owner.createProject("calm")
	hanging, _ := hangingReceiver(t)
	setWebhookEvents(t, ts, a.id, hanging, "sa", true, true)
	h := newHookLog(t)
	setWebhookEvents(t, ts, b.id, h.srv.URL, "sb", true, false)

	c := ts.dialWS(a.publicKey)
	const flaps = 200
	for i := range flaps {
		ch := fmt.Sprintf("c%d", i)
		c.send(`{"action":"subscribe","channel":"` + ch + `","presence":true,"clientId":"x"}`)
		c.send(`{"action":"unsubscribe","channel":"` + ch + `"}`)
	}
	c.send(`{"action":"ping"}`)
	relaytest.EventuallyNil(t, 10*time.Second, func() error {
		for {
			f, ok := c.next(5 * time.Second)
			if !ok {
				return fmt.Errorf("no pong")
			}
			if strings.Contains(f.text, "pong") {
				return nil
			}
		}
	})
	// 1 connect + 4 events per flap: all but 2 in flight and 50 queued are dropped.
	relaytest.Eventually(t, 5*time.Second, func() bool {
		st := ts.app.webhooks.Stats()
		return st.DroppedBy["project_queue_full"] == 1+4*flaps-2-50 && st.Queued == 50 && st.InFlight == 2
	}, "the storm's events beyond its queue dropped")

	s := subscribed(t, ts, b.publicKey, "quiet")
	seen := 0
	h.expectEvents(t, "sb", &seen, channelHook("channel_occupied", b.id, "quiet"))
	s.conn.Close()
	h.expectEvents(t, "sb", &seen, channelHook("channel_vacated", b.id, "quiet"))
	if st := ts.app.webhooks.Stats(); st.Queued != 50 {
		t.Fatalf("queued %d, want the storm's 50", st.Queued)
	}
}
