package main

// Delivery health (api/README.md › Delivery health): the live figures of a
// project, read as JSON by its owner and on the dashboard's project page,
// match what the test did: sockets open, emits accepted, deliveries, 429s of
// each budget, slow consumers closed, and a fan-out latency measured.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestDeliveryHealth(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{
			"EMIT_RATE_LIMIT_PER_MINUTE":    "5",
			"PROJECT_RATE_LIMIT_PER_MINUTE": "8",
		})
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("health")

		// Nothing yet: zeros, no latency.
		h := owner.Health(p.ID)
		if h.ProjectID != p.ID || h.Connections != 0 || h.LastMinute != (relaytest.HealthFigures{}) || h.LastHour != (relaytest.HealthFigures{}) {
			t.Fatalf("fresh project's health: %+v", h)
		}
		if _, err := time.Parse(time.RFC3339, h.At); err != nil {
			t.Fatalf("at %q: %v", h.At, err)
		}

		subs := []*wsClient{
			ts.Subscribed(t, p.PublicKey, "room"),
			ts.Subscribed(t, p.PublicKey, "room"),
			ts.Subscribed(t, p.PublicKey, "room"),
		}
		// Five emits fill the channel budget; each subscriber reads them all.
		for i := range 5 {
			r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, i))
			if r.Status != 200 || relaytest.Num(r.JSON, "delivered") != 3 {
				t.Fatalf("emit %d: %d %s", i, r.Status, r.Raw)
			}
			for _, s := range subs {
				s.Expect(fmt.Sprintf(`{"channel":"room","payload":%d,"seq":%d}`, i, int64(relaytest.Num(r.JSON, "seq"))))
			}
		}
		if r := owner.Emit(p.SecretKey, `{"channel":"room","payload":5}`); r.Status != 429 || r.JSON["error"] != "channel_rate_limited" {
			t.Fatalf("sixth emit to room: %d %s", r.Status, r.Raw)
		}
		// The refused emit gave its project unit back: three more fill the
		// project's 8, on a channel nobody listens to; the ninth is refused.
		for i := range 3 {
			if r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"empty","payload":%d}`, i)); r.Status != 200 {
				t.Fatalf("emit to empty %d: %d %s", i, r.Status, r.Raw)
			}
		}
		if r := owner.Emit(p.SecretKey, `{"channel":"empty","payload":3}`); r.Status != 429 || r.JSON["error"] != "project_rate_limited" {
			t.Fatalf("ninth emit: %d %s", r.Status, r.Raw)
		}

		want := relaytest.HealthFigures{Emits: 8, EmitsHTTP: 8, Deliveries: 15, ChannelRateLimited: 1, ProjectRateLimited: 1}
		var got relaytest.HealthReply
		// The last write's report follows the client's read by a moment.
		relaytest.Within(5*time.Second, func() bool {
			got = owner.Health(p.ID)
			return got.LastMinute.LatencySamples >= 3
		})
		if got.Connections != 3 {
			t.Fatalf("connections %d, want 3", got.Connections)
		}
		for name, w := range map[string]relaytest.HealthFigures{"lastMinute": got.LastMinute, "lastHour": got.LastHour} {
			samples, p50, p99 := w.LatencySamples, w.P50, w.P99
			w.LatencySamples, w.P50, w.P99 = 0, nil, nil
			if w != want {
				t.Errorf("%s: %+v, want %+v", name, w, want)
			}
			// One write per socket at least (3), at most one per delivery (15).
			if samples < 3 || samples > 15 || p50 == nil || p99 == nil || *p50 > *p99 || *p99 <= 0 || *p99 > 5000 {
				t.Errorf("%s latency: %d samples, p50 %v, p99 %v", name, samples, p50, p99)
			}
		}

		// The dashboard's project page shows the same figures.
		page := owner.Do("GET", "/projects/"+p.ID, "")
		for id, v := range map[string]string{
			"health-connections": "3", "health-minute-emits": "8", "health-hour-deliveries": "15",
			"health-minute-channel-429": "1", "health-hour-project-429": "1", "health-minute-dropped": "0",
		} {
			if !strings.Contains(page.Raw, `id="`+id+`">`+v+`<`) {
				t.Errorf("project page: want %s = %s in\n%s", id, v, page.Raw)
			}
		}

		// Closing sockets lowers the count.
		subs[0].Conn.Close()
		relaytest.Eventually(t, 5*time.Second, func() bool { return owner.Health(p.ID).Connections == 2 }, "connections back to 2")

		// Only the owner reads it.
		ts.Signup("bob@example.com").Do("GET", "/api/projects/"+p.ID+"/health", "").
			Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		ts.Client().Do("GET", "/api/projects/"+p.ID+"/health", "").
			Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	})
}

// TestDeliveryHealthSlowConsumer: a subscriber that never reads is closed as
// a slow consumer, and its project's figures say so.
func TestDeliveryHealthSlowConsumer(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000",
		"MAX_QUEUED_BYTES_PER_CONNECTION": "262144",
	})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("slow")
	slow, _, err := ts.DialWSWith(p.PublicKey, false)
	if err != nil {
		t.Fatal(err)
	}
	slow.Send(`{"action":"subscribe","channel":"firehose"}`)
	relaytest.Eventually(t, 5*time.Second, func() bool {
		return relaytest.Num(owner.BearerGet("/channels/firehose", p.SecretKey).JSON, "subscriberCount") == 1
	}, "the slow subscription")
	payload := `"` + strings.Repeat("p", 100<<10) + `"`
	emitted := 0
	for ; emitted < 400 && ts.app.transport.Stats().SlowConsumers == 0; emitted++ {
		if r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":`+payload+`}`); r.Status != 200 {
			t.Fatalf("emit %d: %d %s", emitted, r.Status, r.Raw)
		}
	}
	if ts.app.transport.Stats().SlowConsumers != 1 {
		t.Fatalf("no slow consumer after %d emits of 100 KiB", emitted)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return owner.Health(p.ID).LastMinute.SlowClosed == 1 }, "the slow close counted")
	h := owner.Health(p.ID)
	if h.LastMinute.Emits != int64(emitted) || h.LastHour.SlowClosed != 1 || h.Connections != 0 ||
		h.LastMinute.Deliveries+h.LastMinute.Dropped > int64(emitted) || h.LastMinute.Dropped > 1 {
		t.Fatalf("after %d emits and one slow close: %+v", emitted, h)
	}
}

// TestDeliveryHealthClientEmit: a client emit counts as a client emit and
// its fan-out (the emitter skipped), and the per-clientId window's refusal
// counts as client_emit_rate_limited, apart from HTTP emits.
func TestDeliveryHealthClientEmit(t *testing.T) {
	t.Parallel()
	clock := newClock() // the clientId window does not roll over between the two emits
	s := relaytest.NewClientEmitSetup(t, startServerAt(t, storetest.SQLiteURL(t), map[string]string{
		"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": "1",
	}, clock.Now).Server)
	s.Enable(t)
	tok := s.Token(t, nil)
	s.Ann.Send(emitFrame(tok, "msg", "1"))
	ack := s.Ann.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
	s.Listener.Expect(fmt.Sprintf(`{"channel":"chat","type":"msg","payload":1,"seq":%d,"clientId":"ann"}`, int64(relaytest.Num(ack, "seq"))))
	s.Ann.Send(emitFrame(tok, "msg", "2"))
	s.Ann.Expect(`{"error":"client_emit_rate_limited","channel":"chat"}`)

	h := s.Owner.Health(s.Project.ID)
	want := relaytest.HealthFigures{Emits: 1, EmitsClient: 1, Deliveries: 1, ClientEmitRateLimited: 1}
	for name, w := range map[string]relaytest.HealthFigures{"lastMinute": h.LastMinute, "lastHour": h.LastHour} {
		w.LatencySamples, w.P50, w.P99 = 0, nil, nil // written on the wall clock, not the test's
		if w != want {
			t.Errorf("%s: %+v, want %+v", name, w, want)
		}
	}
	if h.Connections != 2 {
		t.Errorf("connections %d, want 2", h.Connections)
	}
}
