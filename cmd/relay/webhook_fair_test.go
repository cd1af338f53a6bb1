package main

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// TestWebhookQueueSettings: WEBHOOK_WORKERS, WEBHOOK_IN_FLIGHT_PER_PROJECT,
// WEBHOOK_QUEUE_PER_PROJECT and WEBHOOK_QUEUE_TOTAL each bound the
// dispatcher as api/README.md › Webhooks says, set here below their defaults, with
// receivers that never answer: A's first connect is under way and its next
// three wait, the two after that are dropped for A's own queue; C's connect
// takes the second and last worker; B's connect waits though B has nothing
// under way, and B's next is dropped for the shared queue.
func TestWebhookQueueSettings(t *testing.T) {
	t.Parallel()
	ts := debugServer(t, map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_TIMEOUT_MS": "60000",
		"WEBHOOK_WORKERS": "2", "WEBHOOK_IN_FLIGHT_PER_PROJECT": "1", "WEBHOOK_QUEUE_PER_PROJECT": "3", "WEBHOOK_QUEUE_TOTAL": "4",
	})
	owner := ts.Signup("alice@example.com")
	var keys []string
	var requests []*atomic.Int64
	for _, name := range []string{"a", "b", "c"} {
		p := owner.CreateProject(name)
		url, n := relaytest.HangingReceiver(t)
		setWebhook(t, ts, p.ID, url, "whsec-"+name)
		keys, requests = append(keys, p.PublicKey), append(requests, n)
	}
	a, b, c := 0, 1, 2
	connect := func(project, sockets int) {
		t.Helper()
		for range sockets {
			ts.DialWS(keys[project])
		}
	}
	drops := func(reason string) string { return `reason="` + reason + `"` }

	connect(a, 1)
	relaytest.Eventually(t, 5*time.Second, func() bool { return requests[a].Load() == 1 }, "A's first connect sent")
	connect(a, 5)
	mtWaitMetrics(t, ts, mtSample{"relay_webhook_in_flight", "", 1}, mtSample{"relay_webhook_queued", "", 3},
		mtSample{"relay_webhook_drops_total", drops("project_queue_full"), 2}, mtSample{"relay_webhook_projects_full", "", 1})
	connect(c, 1)
	relaytest.Eventually(t, 5*time.Second, func() bool { return requests[c].Load() == 1 }, "C's connect sent")
	connect(b, 1)
	mtWaitMetrics(t, ts, mtSample{"relay_webhook_in_flight", "", 2}, mtSample{"relay_webhook_queued", "", 4})
	connect(b, 1)
	mtWaitMetrics(t, ts, mtSample{"relay_webhook_drops_total", drops("queue_full"), 1},
		mtSample{"relay_webhook_drops_total", drops("project_queue_full"), 2},
		mtSample{"relay_webhook_in_flight", "", 2}, mtSample{"relay_webhook_queued", "", 4},
		mtSample{"relay_webhook_projects_queued", "", 3})
	if got := [3]int64{requests[a].Load(), requests[b].Load(), requests[c].Load()}; got != [3]int64{1, 0, 1} {
		t.Fatalf("requests received by A, B, C: %v, want [1 0 1]", got)
	}
}

// TestWebhooksFairBetweenProjects replays the attack of "Hardening, second
// round": project A's receiver accepts and never answers while A opens and
// closes sockets as fast as it can. Project B's connect and disconnect
// webhooks still arrive within a second; A holds no more than its two
// deliveries in flight and its own queue fills and drops, counted on
// /metrics (totals, no project label) and named once in a warning; no log
// line shows the query string of A's webhook URL.
func TestWebhooksFairBetweenProjects(t *testing.T) {
	// Not parallel: each webhook within 1 s.
	ts := debugServer(t, map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
		"WEBHOOK_QUEUE_PER_PROJECT":       "200",
		"WEBHOOK_TIMEOUT_MS":              "2500",
	})
	a := ts.Signup("alice@example.com").CreateProject("attacker")
	b := ts.Signup("bob@example.com").CreateProject("bystander")

	hangingURL, aRequests := relaytest.HangingReceiver(t)
	setWebhook(t, ts, a.ID, hangingURL+"/hook?token=s3cret-a", "whsec-a")
	rec := relaytest.NewReceiver(t, "whsec-b", 0)
	setWebhook(t, ts, b.ID, rec.URL+"/hook", "whsec-b")

	// A churns sockets from 8 goroutines until B is done.
	churned, stop := churnSockets(t, ts, a.PublicKey, 8)
	defer stop()
	relaytest.Eventually(t, 10*time.Second, func() bool {
		return ts.Metrics(t).Get(t, "relay_webhook_projects_full", "") == 1
	}, "A's webhook queue full")

	// B, meanwhile: every event within a second.
	bEvents := int64(0)
	within := func(what string, start time.Time) {
		t.Helper()
		if took := time.Since(start); took > time.Second {
			t.Fatalf("B's %s webhook took %v while A churned (%d sockets so far)", what, took, churned.Load())
		}
	}
	// At least 5 rounds, and until A has churned 2 000 sockets (the attack
	// measured 6 000 in all; its queue is full long before).
	for round := 0; round < 5 || churned.Load() < 2000; round++ {
		start := time.Now()
		c := ts.DialWS(b.PublicKey)
		id := relaytest.CheckEvent(t, rec.Next(t), "connect", b.ID)
		within("connect", start)
		start = time.Now()
		c.Conn.Close()
		if got := relaytest.CheckEvent(t, rec.Next(t), "disconnect", b.ID); got != id {
			t.Fatalf("disconnect of %s, want %s", got, id)
		}
		within("disconnect", start)
		bEvents += 2
	}
	stop()
	n := churned.Load()
	t.Logf("A churned %d sockets; A's receiver got %d requests", n, aRequests.Load())

	// Every event is accounted for: B's sent, A's 2n queued, in flight,
	// failed (timed out) or dropped because A's own queue was full; none
	// dropped for the shared bound.
	relaytest.EventuallyNil(t, 10*time.Second, func() error {
		m := ts.Metrics(t)
		get := func(name, labels string) float64 { return m.Get(t, name, labels) }
		sent, failed := get("relay_webhooks_total", `outcome="sent"`), get("relay_webhooks_total", `outcome="failed"`)
		ownDrops, sharedDrops := get("relay_webhook_drops_total", `reason="project_queue_full"`), get("relay_webhook_drops_total", `reason="queue_full"`)
		queued, inFlight := get("relay_webhook_queued", ""), get("relay_webhook_in_flight", "")
		if sent != float64(bEvents) || sharedDrops != 0 || ownDrops == 0 || sent+failed+ownDrops+queued+inFlight != float64(2*n+bEvents) ||
			get("relay_webhooks_total", `outcome="dropped"`) != ownDrops || inFlight > 2 ||
			get("relay_webhook_projects_queued", "") != 1 || get("relay_webhook_project_overflows_total", "") != 1 {
			return fmt.Errorf("sent %v failed %v dropped (own queue) %v (shared) %v queued %v in flight %v, for %d events of A and %d of B",
				sent, failed, ownDrops, sharedDrops, queued, inFlight, 2*n, bEvents)
		}
		return nil
	})
	if m := ts.Metrics(t); m.Get(t, "relay_webhook_projects_full", "") != 1 {
		t.Fatal("A's queue is no longer full")
	}

	logs := ts.Logs.String()
	if strings.Contains(logs, "s3cret-a") {
		t.Fatalf("A's webhook query string was logged:\n%s", logs)
	}
	if !strings.Contains(logs, "webhook queue of a project is full") || !strings.Contains(logs, "project="+a.ID) ||
		!strings.Contains(logs, "/hook?redacted") {
		t.Fatalf("no warning naming A with its URL redacted:\n%s", logs)
	}
}

// churnSockets opens and closes sockets of publicKey from workers
// goroutines, as fast as they go, until stop (which may be called more
// than once); churned counts the sockets.
func churnSockets(t *testing.T, ts *testServer, publicKey string, workers int) (churned *atomic.Int64, stop func()) {
	churned = new(atomic.Int64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
			for {
				select {
				case <-done:
					return
				default:
				}
				c, _, err := d.Dial(ts.WSURL(publicKey), nil)
				if err != nil {
					t.Errorf("churning sockets: dial: %v", err)
					return
				}
				churned.Add(1)
				c.Close()
			}
		}()
	}
	return churned, sync.OnceFunc(func() { close(done); wg.Wait() })
}
