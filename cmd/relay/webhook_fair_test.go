package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// TestWebhooksFairBetweenProjects replays the attack of "Hardening, second
// round": project A's receiver accepts and never answers while A opens and
// closes sockets as fast as it can. Project B's connect and disconnect
// webhooks still arrive within a second; A holds no more than its two
// deliveries in flight and its own queue fills and drops, counted on
// /metrics (totals, no project label) and named once in a warning; no log
// line shows the query string of A's webhook URL.
func TestWebhooksFairBetweenProjects(t *testing.T) {
	ts := debugServer(t, map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
		"WEBHOOK_QUEUE_PER_PROJECT":       "200",
		"WEBHOOK_TIMEOUT_MS":              "2500",
	})
	a := ts.signup("alice@example.com").createProject("attacker")
	b := ts.signup("bob@example.com").createProject("bystander")

	hang := make(chan struct{})
	var aRequests atomic.Int64
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aRequests.Add(1)
		select { // accepts, reads, never answers
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(hang) }) // runs first: the server can then close
	setWebhook(t, ts, a.id, hanging.URL+"/hook?token=s3cret-a", "whsec-a")
	rec := newReceiver(t, "whsec-b", 0)
	setWebhook(t, ts, b.id, rec.srv.URL+"/hook", "whsec-b")

	// A churns sockets from 8 goroutines until B is done.
	stop := make(chan struct{})
	var churned atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, _, err := d.Dial(ts.wsURL(a.publicKey), nil)
				if err != nil {
					t.Errorf("A's dial: %v", err)
					return
				}
				churned.Add(1)
				c.Close()
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	relaytest.Eventually(t, 10*time.Second, func() bool {
		return ts.metrics(t).Get(t, "relay_webhook_projects_full", "") == 1
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
		c := ts.dialWS(b.publicKey)
		id := checkEvent(t, rec.next(t), "connect", b.id)
		within("connect", start)
		start = time.Now()
		c.conn.Close()
		if got := checkEvent(t, rec.next(t), "disconnect", b.id); got != id {
			t.Fatalf("disconnect of %s, want %s", got, id)
		}
		within("disconnect", start)
		bEvents += 2
	}
	close(stop)
	wg.Wait()
	n := churned.Load()
	t.Logf("A churned %d sockets; A's receiver got %d requests", n, aRequests.Load())

	// Every event is accounted for: B's sent, A's 2n queued, in flight,
	// failed (timed out) or dropped because A's own queue was full; none
	// dropped for the shared bound.
	relaytest.EventuallyNil(t, 10*time.Second, func() error {
		m := ts.metrics(t)
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
	if m := ts.metrics(t); m.Get(t, "relay_webhook_projects_full", "") != 1 {
		t.Fatal("A's queue is no longer full")
	}

	logs := ts.logs.String()
	if strings.Contains(logs, "s3cret-a") {
		t.Fatalf("A's webhook query string was logged:\n%s", logs)
	}
	if !strings.Contains(logs, "webhook queue of a project is full") || !strings.Contains(logs, "project="+a.id) ||
		!strings.Contains(logs, "/hook?redacted") {
		t.Fatalf("no warning naming A with its URL redacted:\n%s", logs)
	}
}
