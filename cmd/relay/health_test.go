package main

// Delivery health (api/README.md › Delivery health): the live figures of a
// project, read as JSON by its owner and on the dashboard's project page,
// match what the test did: sockets open, emits accepted, deliveries, 429s of
// each budget, slow consumers closed, and a fan-out latency measured.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// healthFigures is one window of GET /api/projects/{id}/health.
type healthFigures struct {
	Emits                 int64    `json:"emits"`
	EmitsHTTP             int64    `json:"emitsHttp"`
	EmitsClient           int64    `json:"emitsClient"`
	Deliveries            int64    `json:"deliveries"`
	Dropped               int64    `json:"dropped"`
	SlowClosed            int64    `json:"slowConsumersClosed"`
	ChannelRateLimited    int64    `json:"channelRateLimited"`
	ProjectRateLimited    int64    `json:"projectRateLimited"`
	ClientEmitRateLimited int64    `json:"clientEmitRateLimited"`
	LatencySamples        int64    `json:"latencySamples"`
	P50                   *float64 `json:"latencyP50Ms"`
	P99                   *float64 `json:"latencyP99Ms"`
}

type healthReply struct {
	ProjectID   string        `json:"projectId"`
	At          string        `json:"at"`
	Connections int           `json:"connections"`
	LastMinute  healthFigures `json:"lastMinute"`
	LastHour    healthFigures `json:"lastHour"`
}

func (c *client) health(projectID string) healthReply {
	c.t.Helper()
	r := c.do("GET", "/api/projects/"+projectID+"/health", "")
	if r.status != http.StatusOK {
		c.t.Fatalf("health: %d %s", r.status, r.raw)
	}
	var h healthReply
	if err := json.Unmarshal([]byte(r.raw), &h); err != nil {
		c.t.Fatalf("health body %s: %v", r.raw, err)
	}
	return h
}

func TestDeliveryHealth(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{
			"EMIT_RATE_LIMIT_PER_MINUTE":    "5",
			"PROJECT_RATE_LIMIT_PER_MINUTE": "8",
		})
		owner := ts.signup("alice@example.com")
		p := owner.createProject("health")

		// Nothing yet: zeros, no latency.
		h := owner.health(p.id)
		if h.ProjectID != p.id || h.Connections != 0 || h.LastMinute != (healthFigures{}) || h.LastHour != (healthFigures{}) {
			t.Fatalf("fresh project's health: %+v", h)
		}
		if _, err := time.Parse(time.RFC3339, h.At); err != nil {
			t.Fatalf("at %q: %v", h.At, err)
		}

		subs := []*wsClient{
			subscribed(t, ts, p.publicKey, "room"),
			subscribed(t, ts, p.publicKey, "room"),
			subscribed(t, ts, p.publicKey, "room"),
		}
		// Five emits fill the channel budget; each subscriber reads them all.
		for i := range 5 {
			r := owner.emit(p.secretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, i))
			if r.status != 200 || num(r.json, "delivered") != 3 {
				t.Fatalf("emit %d: %d %s", i, r.status, r.raw)
			}
			for _, s := range subs {
				s.expect(fmt.Sprintf(`{"channel":"room","payload":%d,"seq":%d}`, i, int64(num(r.json, "seq"))))
			}
		}
		if r := owner.emit(p.secretKey, `{"channel":"room","payload":5}`); r.status != 429 || r.json["error"] != "channel_rate_limited" {
			t.Fatalf("sixth emit to room: %d %s", r.status, r.raw)
		}
		// The refused emit gave its project unit back: three more fill the
		// project's 8, on a channel nobody listens to; the ninth is refused.
		for i := range 3 {
			if r := owner.emit(p.secretKey, fmt.Sprintf(`{"channel":"empty","payload":%d}`, i)); r.status != 200 {
				t.Fatalf("emit to empty %d: %d %s", i, r.status, r.raw)
			}
		}
		if r := owner.emit(p.secretKey, `{"channel":"empty","payload":3}`); r.status != 429 || r.json["error"] != "project_rate_limited" {
			t.Fatalf("ninth emit: %d %s", r.status, r.raw)
		}

		want := healthFigures{Emits: 8, EmitsHTTP: 8, Deliveries: 15, ChannelRateLimited: 1, ProjectRateLimited: 1}
		var got healthReply
		// The last write's report follows the client's read by a moment.
		relaytest.Within(5*time.Second, func() bool {
			got = owner.health(p.id)
			return got.LastMinute.LatencySamples >= 3
		})
		if got.Connections != 3 {
			t.Fatalf("connections %d, want 3", got.Connections)
		}
		for name, w := range map[string]healthFigures{"lastMinute": got.LastMinute, "lastHour": got.LastHour} {
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
		page := owner.do("GET", "/projects/"+p.id, "")
		for id, v := range map[string]string{
			"health-connections": "3", "health-minute-emits": "8", "health-hour-deliveries": "15",
			"health-minute-channel-429": "1", "health-hour-project-429": "1", "health-minute-dropped": "0",
		} {
			if !strings.Contains(page.raw, `id="`+id+`">`+v+`<`) {
				t.Errorf("project page: want %s = %s in\n%s", id, v, page.raw)
			}
		}

		// Closing sockets lowers the count.
		subs[0].conn.Close()
		relaytest.Eventually(t, 5*time.Second, func() bool { return owner.health(p.id).Connections == 2 }, "connections back to 2")

		// Only the owner reads it.
		ts.signup("bob@example.com").do("GET", "/api/projects/"+p.id+"/health", "").
			expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		ts.client().do("GET", "/api/projects/"+p.id+"/health", "").
			expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	})
}

// TestDeliveryHealthSlowConsumer: a subscriber that never reads is closed as
// a slow consumer, and its project's figures say so.
func TestDeliveryHealthSlowConsumer(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000",
		"MAX_QUEUED_BYTES_PER_CONNECTION": "262144",
	})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("slow")
	slow, _, err := ts.dialWSWith(p.publicKey, false)
	if err != nil {
		t.Fatal(err)
	}
	slow.send(`{"action":"subscribe","channel":"firehose"}`)
	relaytest.Eventually(t, 5*time.Second, func() bool {
		return num(owner.bearerGet("/channels/firehose", p.secretKey).json, "subscriberCount") == 1
	}, "the slow subscription")
	payload := `"` + strings.Repeat("p", 100<<10) + `"`
	emitted := 0
	for ; emitted < 400 && ts.app.transport.Stats().SlowConsumers == 0; emitted++ {
		if r := owner.emit(p.secretKey, `{"channel":"firehose","payload":`+payload+`}`); r.status != 200 {
			t.Fatalf("emit %d: %d %s", emitted, r.status, r.raw)
		}
	}
	if ts.app.transport.Stats().SlowConsumers != 1 {
		t.Fatalf("no slow consumer after %d emits of 100 KiB", emitted)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return owner.health(p.id).LastMinute.SlowClosed == 1 }, "the slow close counted")
	h := owner.health(p.id)
	if h.LastMinute.Emits != int64(emitted) || h.LastHour.SlowClosed != 1 || h.Connections != 0 ||
		h.LastMinute.Deliveries+h.LastMinute.Dropped > int64(emitted) || h.LastMinute.Dropped > 1 {
		t.Fatalf("after %d emits and one slow close: %+v", emitted, h)
	}
}

// TestDeliveryHealthClientEmit: a client emit counts as a client emit and
// its fan-out (the emitter skipped), and the per-clientId window's refusal
// counts as client_emit_rate_limited, apart from HTTP emits.
func TestDeliveryHealthClientEmit(t *testing.T) {
	clock := newClock() // the clientId window does not roll over between the two emits
	s := clientEmitSetupOn(t, startServerAt(t, storetest.SQLiteURL(t), map[string]string{
		"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": "1",
	}, clock.Now))
	s.enable(t)
	tok := s.token(t, nil)
	s.ann.send(emitFrame(tok, "msg", "1"))
	ack := s.ann.expectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
	s.listener.expect(fmt.Sprintf(`{"channel":"chat","type":"msg","payload":1,"seq":%d,"clientId":"ann"}`, int64(num(ack, "seq"))))
	s.ann.send(emitFrame(tok, "msg", "2"))
	s.ann.expect(`{"error":"client_emit_rate_limited","channel":"chat"}`)

	h := s.owner.health(s.p.id)
	want := healthFigures{Emits: 1, EmitsClient: 1, Deliveries: 1, ClientEmitRateLimited: 1}
	for name, w := range map[string]healthFigures{"lastMinute": h.LastMinute, "lastHour": h.LastHour} {
		w.LatencySamples, w.P50, w.P99 = 0, nil, nil // written on the wall clock, not the test's
		if w != want {
			t.Errorf("%s: %+v, want %+v", name, w, want)
		}
	}
	if h.Connections != 2 {
		t.Errorf("connections %d, want 2", h.Connections)
	}
}
