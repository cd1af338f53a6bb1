package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// The /metrics counters that TestOperatorEndpointsDuringTraffic does not
// check, each against what its test did, on a server of its own.

// mtSample is one expected sample of /metrics.
type mtSample struct {
	name, labels string
	want         float64
}

// mtWaitMetrics polls /metrics until every sample has its value (counters
// some actors add to just after they answer), and fails with every mismatch
// when they do not within 5 s.
func mtWaitMetrics(t *testing.T, ts *testServer, samples ...mtSample) {
	t.Helper()
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		m := ts.Metrics(t)
		var bad []string
		for _, s := range samples {
			if got := m.Get(t, s.name, s.labels); got != s.want {
				bad = append(bad, fmt.Sprintf("%s{%s} = %v, want %v", s.name, s.labels, got, s.want))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("/metrics:\n%s", strings.Join(bad, "\n"))
		}
		return nil
	})
}

// TestMetricsSlowConsumerAndDrops: a subscriber that never reads is closed as
// a slow consumer; relay_delivery_drops_total is exactly the sum of
// subscriberCount - delivered over the emits, relay_deliveries_total the sum
// of delivered.
func TestMetricsSlowConsumerAndDrops(t *testing.T) {
	t.Parallel()
	ts := debugServer(t, map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	slow := lcDialSmallBuffer(t, ts, p.PublicKey)
	slow.Send(`{"action":"subscribe","channel":"firehose"}`)

	var mu sync.Mutex
	var emitted, delivered, dropped int
	emit := func(c *client, payload string) (response, bool) {
		r := c.EmitNoFail(p.SecretKey, `{"channel":"firehose","payload":`+payload+`}`)
		if r.Status != 200 {
			return r, false
		}
		mu.Lock()
		defer mu.Unlock()
		emitted++
		delivered += int(relaytest.Num(r.JSON, "delivered"))
		dropped += int(relaytest.Num(r.JSON, "subscriberCount") - relaytest.Num(r.JSON, "delivered"))
		return r, true
	}
	// The unread subscription is in once the channel counts it.
	relaytest.Eventually(t, 5*time.Second, func() bool {
		r, ok := emit(owner, "0")
		if !ok {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		return relaytest.Num(r.JSON, "subscriberCount") == 1
	}, "the unread subscription counted")
	// Messages of 120 KiB from four emitters at once, so that the write
	// queue (MAX_QUEUED_BYTES_PER_CONNECTION, 2 MiB) overflows well within
	// the 10 s write timeout even on a busy machine.
	var wg sync.WaitGroup
	var failed atomic.Value
	var sent atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ts.Client()
			for ts.app.transport.Stats().SlowConsumers == 0 && sent.Add(1) <= 1000 {
				if r, ok := emit(c, lcBigPayload); !ok {
					failed.Store(fmt.Sprintf("emit: %d %s", r.Status, r.Raw))
					return
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f != nil {
		t.Fatal(f)
	}
	if ts.app.transport.Stats().SlowConsumers == 0 {
		t.Fatal("no slow consumer after 1000 messages of 120 KiB")
	}
	// Until the channel has let go of it; every emit is still tallied.
	relaytest.Eventually(t, 5*time.Second, func() bool {
		r, ok := emit(owner, "1")
		if !ok {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		return relaytest.Num(r.JSON, "subscriberCount") == 0
	}, "the slow consumer unsubscribed")
	// A queue overflow is a drop in the very emit that found it; a write
	// timeout (abrupt) closes the peer on its own, so no emit need see it.
	overflow := strings.Contains(ts.Logs.String(), "cause=slow_consumer code=1013 reason=\"slow consumer\" abrupt=false")
	t.Logf("%d emits, %d delivered, %d dropped; closed by queue overflow: %v", emitted, delivered, dropped, overflow)
	if overflow && dropped < 1 {
		t.Fatalf("the queue overflowed but no emit reported a drop (%d emits, %d delivered)", emitted, delivered)
	}
	mtWaitMetrics(t, ts,
		mtSample{"relay_connections_closed_total", `cause="slow_consumer"`, 1},
		mtSample{"relay_connections_closed_total", `cause="peer_gone"`, 0},
		mtSample{"relay_connections_opened_total", "", 1},
		mtSample{"relay_connections_open", "", 0},
		mtSample{"relay_messages_emitted_total", `path="http"`, float64(emitted)},
		mtSample{"relay_deliveries_total", "", float64(delivered)},
		mtSample{"relay_delivery_drops_total", "", float64(dropped)},
	)
}

// TestMetricsWebhookOutcomes: relay_webhooks_total counts sent (a 2xx
// receiver), failed (a receiver answering 500, retries off) and refused (a
// private target without WEBHOOK_ALLOW_PRIVATE_ADDRESSES), one per connect
// and disconnect.
func TestMetricsWebhookOutcomes(t *testing.T) {
	t.Parallel()
	ts := debugServer(t, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_RETRY_MAX_ATTEMPTS": "1"})
	owner := ts.Signup("alice@example.com")
	good, bad := owner.CreateProject("good"), owner.CreateProject("bad")
	rec := relaytest.NewReceiver(t, "whsec-good", 0)
	setWebhook(t, ts, good.ID, rec.URL+"/hook", "whsec-good")
	var failing atomic.Int64
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		failing.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(broken.Close)
	setWebhook(t, ts, bad.ID, broken.URL+"/hook", "whsec-bad")

	c := ts.DialWS(good.PublicKey)
	id := relaytest.CheckEvent(t, rec.Next(t), "connect", good.ID)
	c.Conn.Close()
	if got := relaytest.CheckEvent(t, rec.Next(t), "disconnect", good.ID); got != id {
		t.Fatalf("disconnect of %s, want %s", got, id)
	}
	c2 := ts.DialWS(bad.PublicKey)
	relaytest.Eventually(t, 5*time.Second, func() bool { return failing.Load() == 1 }, "first failing delivery")
	c2.Conn.Close()
	relaytest.Eventually(t, 5*time.Second, func() bool { return failing.Load() == 2 }, "second failing delivery")
	mtWaitMetrics(t, ts,
		mtSample{"relay_webhooks_total", `outcome="sent"`, 2},
		mtSample{"relay_webhooks_total", `outcome="failed"`, 2},
		mtSample{"relay_webhooks_total", `outcome="dropped"`, 0},
		mtSample{"relay_webhooks_total", `outcome="refused"`, 0},
	)

	// The default configuration refuses a loopback target before connecting.
	ts2 := debugServer(t, nil)
	p2 := ts2.Signup("alice@example.com").CreateProject("demo")
	rec2 := relaytest.NewReceiver(t, "s", 0)
	setWebhook(t, ts2, p2.ID, rec2.URL, "s")
	c3 := ts2.DialWS(p2.PublicKey)
	mtWaitMetrics(t, ts2, mtSample{"relay_webhooks_total", `outcome="refused"`, 1})
	c3.Conn.Close()
	mtWaitMetrics(t, ts2,
		mtSample{"relay_webhooks_total", `outcome="refused"`, 2},
		mtSample{"relay_webhooks_total", `outcome="sent"`, 0},
		mtSample{"relay_webhooks_total", `outcome="failed"`, 0},
	)
	select {
	case ev := <-rec2.Events:
		t.Fatalf("a refused target received %v", ev)
	default:
	}
}

// TestMetricsProjectRateLimited: with a project backstop of 2 a minute,
// emits on distinct channels run into project_rate_limited, counted as
// kind="project" and nothing else.
func TestMetricsProjectRateLimited(t *testing.T) {
	t.Parallel()
	clock := newClock() // the fixed window stays whole
	ts := debugServerAt(t, map[string]string{"PROJECT_RATE_LIMIT_PER_MINUTE": "2"}, clock.Now)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	var ok, limited int
	for i := 0; limited < 2; i++ {
		if i == 10 {
			t.Fatalf("after %d emits only %d were refused", i, limited)
		}
		r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"c%d","payload":1}`, i))
		switch {
		case r.Status == 200:
			ok++
		case r.Status == 429 && r.JSON["error"] == "project_rate_limited":
			limited++
			relaytest.Budget(t, clock.Now(), r, "project_rate_limit", 2, 0)
			relaytest.Budget(t, clock.Now(), r, "rate_limit", 600, 600)
		default:
			t.Fatalf("emit %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if ok < 2 {
		t.Fatalf("only %d emits accepted before the backstop", ok)
	}
	mtWaitMetrics(t, ts,
		mtSample{"relay_emits_rate_limited_total", `kind="project"`, float64(limited)},
		mtSample{"relay_emits_rate_limited_total", `kind="channel"`, 0},
		mtSample{"relay_emits_rate_limited_total", `kind="client"`, 0},
		mtSample{"relay_messages_emitted_total", `path="http"`, float64(ok)},
		mtSample{"relay_emit_duration_seconds_count", "", float64(ok + limited)},
	)
}

// TestMetricsClientEmits: CLIENT_EMIT_RATE_LIMIT_PER_SECOND=1 and two
// client-emits in the same second: one relayed (path="client"), one refused
// (kind="client").
func TestMetricsClientEmits(t *testing.T) {
	t.Parallel()
	clock := newClock() // both client-emits fall in one second of the window
	ts := debugServerAt(t, map[string]string{"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": "1"}, clock.Now)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	if secret == "" {
		t.Fatal("no client-emit secret")
	}
	listener := ts.Subscribed(t, p.PublicKey, "room")
	ann := ts.PresenceSub(t, p.PublicKey, "room", "ann")
	ann.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"t"}, TTL: time.Minute, Now: clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	ann.Send(relaytest.EmitFrame("room", "t", "1", tok))
	ann.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
	ann.Send(relaytest.EmitFrame("room", "t", "1", tok))
	ann.Expect(`{"error":"client_emit_rate_limited","channel":"room"}`)
	const acks, limited = 1, 1
	for range acks {
		listener.ExpectExcept(`{"channel":"room","type":"t","payload":1,"clientId":"ann"}`, "seq")
	}
	listener.ExpectSilence(100 * time.Millisecond)
	mtWaitMetrics(t, ts,
		mtSample{"relay_messages_emitted_total", `path="client"`, float64(acks)},
		mtSample{"relay_messages_emitted_total", `path="http"`, 0},
		mtSample{"relay_emits_rate_limited_total", `kind="client"`, float64(limited)},
		mtSample{"relay_emits_rate_limited_total", `kind="project"`, 0},
		mtSample{"relay_emits_rate_limited_total", `kind="channel"`, 0},
		mtSample{"relay_deliveries_total", "", float64(acks)}, // the listener; never the emitter
		mtSample{"relay_delivery_drops_total", "", 0},
	)
}

// TestMetricsDebugActorsMailboxAndPaging: /debug/actors reports non-negative
// mailbox depths, and pages through the project actors (sorted by id) with
// limit and offset.
func TestMetricsDebugActorsMailboxAndPaging(t *testing.T) {
	t.Parallel()
	ts := debugServer(t, nil)
	owner := ts.Signup("alice@example.com")
	var ids []string
	for i := range 5 {
		p := owner.CreateProject(fmt.Sprintf("p%d", i))
		if r := owner.Emit(p.SecretKey, `{"channel":"c","payload":1}`); r.Status != 200 {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		ids = append(ids, p.ID)
	}
	owner.CreateProject("idle") // no traffic: no actor, not listed
	slices.Sort(ids)

	type page struct {
		Projects []struct {
			ID          string `json:"id"`
			Mailbox     *int64 `json:"mailbox"`
			ChannelList []struct {
				Name    string `json:"name"`
				Mailbox *int64 `json:"mailbox"`
			} `json:"channelList"`
		} `json:"projects"`
		ProjectsMatching int `json:"projectsMatching"`
		Offset           int `json:"offset"`
		Limit            int `json:"limit"`
	}
	get := func(query string) page {
		t.Helper()
		status, body := relaytest.GetText(t, ts.Debug+"/debug/actors"+query)
		var v page
		if err := json.Unmarshal([]byte(body), &v); err != nil || status != 200 {
			t.Fatalf("/debug/actors%s: %d %s", query, status, body)
		}
		for _, p := range v.Projects {
			if p.Mailbox == nil || *p.Mailbox < 0 {
				t.Fatalf("/debug/actors%s: project %s mailbox %v: %s", query, p.ID, p.Mailbox, body)
			}
			for _, c := range p.ChannelList {
				if c.Mailbox == nil || *c.Mailbox < 0 {
					t.Fatalf("/debug/actors%s: channel %s mailbox %v: %s", query, c.Name, c.Mailbox, body)
				}
			}
		}
		return v
	}
	idsOf := func(v page) []string {
		out := []string{}
		for _, p := range v.Projects {
			out = append(out, p.ID)
		}
		return out
	}
	for _, c := range []struct {
		query         string
		from, to      int
		offset, limit int
	}{
		{"", 0, 5, 0, 50},
		{"?limit=2", 0, 2, 0, 2},
		{"?limit=2&offset=2", 2, 4, 2, 2},
		{"?limit=2&offset=4", 4, 5, 4, 2},
		{"?limit=2&offset=5", 5, 5, 5, 2},
		{"?limit=3&offset=1", 1, 4, 1, 3},
		{"?limit=0&offset=-3", 0, 5, 0, 50}, // out of range: the defaults
	} {
		v := get(c.query)
		if got, want := idsOf(v), ids[c.from:c.to]; !slices.Equal(got, want) ||
			v.ProjectsMatching != 5 || v.Offset != c.offset || v.Limit != c.limit {
			t.Fatalf("/debug/actors%s: projects %v matching %d offset %d limit %d; want %v matching 5 offset %d limit %d",
				c.query, got, v.ProjectsMatching, v.Offset, v.Limit, want, c.offset, c.limit)
		}
	}
	// One project's channels, with their mailboxes.
	v := get("?project=" + ids[0] + "&channel=*")
	if len(v.Projects) != 1 || len(v.Projects[0].ChannelList) != 1 || v.Projects[0].ChannelList[0].Name != "c" {
		t.Fatalf("channels of %s: %+v", ids[0], v)
	}
}
