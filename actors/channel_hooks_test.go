package actors

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// hookRecorder is a WebhookSender that keeps "kind channel clientId" of
// every event it is handed.
type hookRecorder struct {
	mu     sync.Mutex
	events []string
}

func (r *hookRecorder) send(url, secret string, ev WebhookEvent) {
	if ev.Kind == "connect" || ev.Kind == "disconnect" {
		return
	}
	if url != "https://hooks.example.com" || secret != "s" || ev.ProjectID != "p" || ev.At.IsZero() {
		panic(fmt.Sprintf("event %+v to %s", ev, url))
	}
	r.mu.Lock()
	r.events = append(r.events, ev.Kind+" "+ev.Channel+" "+ev.ClientID)
	r.mu.Unlock()
}

func (r *hookRecorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Events of a channel whose project is still loading its settings wait in
// the channel actor, at most maxHeldHooks, and go out once the settings say
// the project wants them; the rest are dropped.
func TestWebhookEventsHeldWhileLoading(t *testing.T) {
	l := newGatedLoader()
	rec := &hookRecorder{}
	sys := newTestSystem(t, Config{Webhooks: rec.send, LoadSettings: func(ctx context.Context, id string) (Settings, error) {
		if _, err := l.load(ctx, id); err != nil {
			return Settings{}, err
		}
		return Settings{WebhookURL: "https://hooks.example.com", WebhookSecret: "s", WebhookChannelEvents: true, WebhookPresenceEvents: true}, nil
	}})
	k := &sink{id: 1}
	sess := openConn(sys, "p", k)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"room","presence":true,"clientId":"ann"}`))
	// 1 + 1 + 2×40 = 82 events on one channel while loading: 64 wait.
	for i := range 40 {
		sess.HandleMessage([]byte(fmt.Sprintf(`{"action":"subscribe","channel":"room","presence":true,"clientId":"c%d"}`, i)))
	}
	waitFor(t, "41 acks", func() bool { return len(k.messages(t)) == 82 }) // ack + sync each
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("sent before the settings loaded: %v", got)
	}
	l.release()
	waitFor(t, "the held events", func() bool { return len(rec.got()) == maxHeldHooks })
	got := rec.got()
	if got[0] != "channel_occupied room " || got[1] != "member_added room ann" || got[2] != "member_removed room ann" || got[3] != "member_added room c0" {
		t.Fatalf("held events in this order: %v", got[:4])
	}
	// Known now: the next event goes out at once.
	sess.HandleMessage([]byte(`{"action":"unsubscribe","channel":"room"}`))
	waitFor(t, "the leave and vacate", func() bool { return len(rec.got()) == maxHeldHooks+2 })
	if got := rec.got()[maxHeldHooks:]; got[0] != "member_removed room c39" || got[1] != "channel_vacated room " {
		t.Fatalf("after the load: %v", got)
	}
}
