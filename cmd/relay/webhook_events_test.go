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

// TestWebhooksChannelStorm: a project whose channels flap as fast as one
// socket can subscribe and unsubscribe, with a receiver that never
// answers, fills only its own bounded queue: the rest is dropped and
// counted, and another project's events still arrive.
func TestWebhooksChannelStorm(t *testing.T) {
	t.Parallel()
	ts := debugServer(t, map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_QUEUE_PER_PROJECT": "50", "WEBHOOK_TIMEOUT_MS": "60000",
	})
	owner := ts.Signup("alice@example.com")
	a, b := owner.CreateProject("storm"), owner.CreateProject("calm")
	hanging, _ := relaytest.HangingReceiver(t)
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
