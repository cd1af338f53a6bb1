package main

// Webhook retries and event ids, and the recent deliveries on the dashboard
// and against the OpenAPI document, against the server in this process
// (its dispatcher's counters, the settings as the dashboard stores them) and
// real HTTP receivers on loopback (api/README.md › Webhooks and usage). The
// deliveries API and test events from outside: e2e/webhooks.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// setWebhook stores a project's webhook settings (the dashboard's job) in the
// server's own store, before the project has any live traffic.
func setWebhook(t *testing.T, ts *testServer, projectID, url, secret string) {
	t.Helper()
	if err := ts.app.store.SaveSettings(context.Background(), store.Settings{ProjectID: projectID, WebhookURL: url, WebhookSecret: secret}); err != nil {
		t.Fatal(err)
	}
	ts.app.actors.SettingsChanged(projectID)
}

func intOf(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

func strOf(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// TestWebhookRetries: a connect answered 500 comes again with the same id
// and body and then shows as delivered in 2 attempts; a 400 is not retried;
// a receiver down longer than WEBHOOK_RETRY_MAX_SECONDS is given up on.
func TestWebhookRetries(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_RETRY_MAX_SECONDS": "2",
	})
	owner := ts.Signup("alice@example.com")

	// 500, then 204: two attempts of one event.
	p := owner.CreateProject("flaky")
	flaky := relaytest.NewScriptedReceiver(t, "s1", 500, 204)
	setWebhook(t, ts, p.ID, flaky.URL+"/hook", "s1")
	ts.DialWS(p.PublicKey)
	first, second := flaky.Next(t), flaky.Next(t)
	id, _ := first.Event["id"].(string)
	if first.Body != second.Body || first.IDHeader != id || second.IDHeader != id || !relaytest.HookEventIDRe.MatchString(id) {
		t.Fatalf("a retry differs from its first attempt:\n%+v\n%+v", first, second)
	}
	relaytest.CheckEvent(t, first.Event, "connect", p.ID)
	d := owner.WaitDelivery(p.ID, id, 5*time.Second, func(d relaytest.Delivery) bool { return d.Status == "delivered" })
	if d.Attempts != 2 || intOf(d.StatusCode) != 204 || strOf(d.LastError) != "HTTP 500" || d.Event != "connect" || d.NextAttemptAt != nil {
		t.Fatalf("delivery %+v", d)
	}

	// 400: final at once.
	p2 := owner.CreateProject("refusing")
	refusing := relaytest.NewScriptedReceiver(t, "s2", 400)
	setWebhook(t, ts, p2.ID, refusing.URL, "s2")
	ts.DialWS(p2.PublicKey)
	id2, _ := refusing.Next(t).Event["id"].(string)
	d = owner.WaitDelivery(p2.ID, id2, 5*time.Second, func(d relaytest.Delivery) bool { return d.Status == "failed" })
	if d.Attempts != 1 || intOf(d.StatusCode) != 400 || strOf(d.LastError) != "HTTP 400" {
		t.Fatalf("delivery %+v", d)
	}
	if hr, ok := refusing.Got(); ok { // failed is final: no attempt can follow it
		t.Fatalf("a 400 was retried: %s", hr.Body)
	}

	// 503 for good: retried until the 2 s bound, then given up.
	p3 := owner.CreateProject("down")
	down := relaytest.NewScriptedReceiver(t, "s3", 503)
	setWebhook(t, ts, p3.ID, down.URL, "s3")
	start := time.Now()
	ts.DialWS(p3.PublicKey)
	id3, _ := down.Next(t).Event["id"].(string)
	d = owner.WaitDelivery(p3.ID, id3, 10*time.Second, func(d relaytest.Delivery) bool { return d.Status == "failed" })
	created, _ := time.Parse(time.RFC3339, d.CreatedAt)
	last, _ := time.Parse(time.RFC3339, strOf(d.LastAttemptAt))
	if d.Attempts < 2 || strOf(d.LastError) != "HTTP 503" || last.Sub(created) > 2*time.Second+time.Second || time.Since(start) > 8*time.Second {
		t.Fatalf("delivery %+v, after %v", d, time.Since(start))
	}
	if st := ts.app.webhooks.Stats(); st.Sent != 1 || st.Failed != 2 || st.Retried != int64(1+d.Attempts-1) || st.Queued != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestWebhookFailingProjectDelaysNobody: project A's receiver answers 500 to
// everything while A churns sockets, so its events are retried over and
// over; project B's connects and disconnects still arrive within a second.
func TestWebhookFailingProjectDelaysNobody(t *testing.T) {
	// Not parallel: the others' webhooks within 1 s.
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_QUEUE_PER_PROJECT": "100", "WEBHOOK_WORKERS": "4",
	})
	a := ts.Signup("alice@example.com").CreateProject("failing")
	b := ts.Signup("bob@example.com").CreateProject("healthy")
	var aRequests atomic.Int64
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		aRequests.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	setWebhook(t, ts, a.ID, failing.URL, "whsec-a")
	rec := relaytest.NewReceiver(t, "whsec-b", 0)
	setWebhook(t, ts, b.ID, rec.URL, "whsec-b")

	_, stop := churnSockets(t, ts, a.PublicKey, 4)
	defer stop()
	relaytest.Eventually(t, 10*time.Second, func() bool {
		st := ts.app.webhooks.Stats()
		return st.Retrying > 0 && st.ProjectsFull == 1
	}, "A's events waiting for retries, its queue full")

	for round := range 5 {
		start := time.Now()
		c := ts.DialWS(b.PublicKey)
		id := relaytest.CheckEvent(t, rec.Next(t), "connect", b.ID)
		if took := time.Since(start); took > time.Second {
			t.Fatalf("round %d: B's connect took %v behind A's retries", round, took)
		}
		start = time.Now()
		c.Conn.Close()
		if got := relaytest.CheckEvent(t, rec.Next(t), "disconnect", b.ID); got != id {
			t.Fatalf("disconnect of %s, want %s", got, id)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("round %d: B's disconnect took %v behind A's retries", round, took)
		}
	}
	if st := ts.app.webhooks.Stats(); st.Retried == 0 || st.InFlight > 4 || st.DroppedBy["queue_full"] != 0 {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("A's receiver got %d requests", aRequests.Load())
}

// TestDashboardWebhookDeliveries: the project page lists the recent
// deliveries and its button sends a test event (CSRF-checked); without a
// URL the button is absent and the route answers 409.
func TestDashboardWebhookDeliveries(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_RETRY_MAX_SECONDS": "60"})
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Hooks")
		page := "/projects/" + p.ID
		view := c.Get(page)
		if strings.Contains(view.Body, `id="webhook-deliveries"`) || strings.Contains(view.Body, `id="send-test-event"`) {
			t.Fatalf("deliveries card without a webhook:\n%s", view.Body)
		}
		c.Submit(page, page+"/webhook/test", nil).ExpectError(t, http.StatusBadRequest, "no webhook URL")

		rec := relaytest.NewScriptedReceiver(t, "", 500, 200)
		c.Submit(page, page+"/webhook", url.Values{"url": {rec.URL + "/hook"}}).ExpectRedirect(t, page+"?done=webhook-saved")
		rec.SetSecret(dashSettings(t, ts, p.ID).WebhookSecret) // generated with the URL
		view = c.Get(page)
		if view.ByID("no-deliveries") != "No deliveries yet." || !strings.Contains(view.Body, `id="send-test-event"`) {
			t.Fatalf("deliveries card:\n%s", view.Body)
		}
		if r := c.Post(page+"/webhook/test", url.Values{"csrf": {"forged"}}); r.Status != http.StatusForbidden {
			t.Fatalf("a forged form: %d", r.Status)
		}
		c.Submit(page, page+"/webhook/test", nil).ExpectRedirect(t, page+"?done=webhook-test")
		id, _ := rec.Next(t).Event["id"].(string) // answered 500: retried
		rec.Next(t)
		var shown relaytest.Page
		relaytest.Eventually(t, 10*time.Second, func() bool {
			shown = c.Get(page + "?done=webhook-test")
			return shown.ByID("delivery-status-"+id) == "delivered"
		}, "the test event delivered on the page")
		if shown.ByID("delivery-attempts-"+id) != "2" || shown.ByID("delivery-answer-"+id) != "200" ||
			shown.ByID("delivery-error-"+id) != "HTTP 500" || !strings.Contains(shown.NoticeText(), "Test event queued") {
			t.Fatalf("row of %s: attempts %q answer %q error %q notice %q", id, shown.ByID("delivery-attempts-"+id),
				shown.ByID("delivery-answer-"+id), shown.ByID("delivery-error-"+id), shown.NoticeText())
		}
		rows := regexp.MustCompile(`<tr class="delivery" id="delivery-([A-Za-z0-9_-]{22})"`).FindAllStringSubmatch(shown.Body, -1)
		if len(rows) != 1 || rows[0][1] != id {
			t.Fatalf("rows %v, want the one test event", rows)
		}
	})
}

// TestOpenAPIWebhookDeliveries: the two routes against api/openapi.yaml,
// every status each can give from outside (503 aside: a node shutting
// down), on both stores.
func TestOpenAPIWebhookDeliveries(t *testing.T) {
	t.Parallel()
	router := loadOpenAPI(t)
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{
			"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_QUEUE_PER_PROJECT": "1", "WEBHOOK_IN_FLIGHT_PER_PROJECT": "1", "WEBHOOK_TIMEOUT_MS": "60000",
		})
		st := &specTransport{t: t, router: router, next: http.DefaultTransport, seen: map[string]bool{}}
		want := func(r response, status int, code ...string) response {
			t.Helper()
			if r.Status != status || (len(code) > 0 && r.Str("error") != code[0]) {
				t.Fatalf("%d %s, want %d %v", r.Status, r.Raw, status, code)
			}
			return r
		}
		alice, anon := st.client(ts), st.client(ts)
		want(alice.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`), 201)
		project := func(name string) string {
			return want(alice.Do("POST", "/api/projects", `{"name":"`+name+`"}`), 201).Str("project", "id")
		}
		paths := func(id string) (string, string) {
			return "/api/projects/" + id + "/webhook-deliveries", "/api/projects/" + id + "/webhook-test"
		}
		list, test := paths(project("none"))
		want(alice.Do("GET", list, ""), 200)
		want(alice.Do("POST", test, ""), 400, "webhook_url_required")
		want(anon.Do("GET", list, ""), 401, "unauthorized")
		want(anon.Do("POST", test, ""), 401, "unauthorized")
		goneList, goneTest := paths("00000000-0000-0000-0000-000000000000")
		want(alice.Do("GET", goneList, ""), 404, "project_not_found")
		want(alice.Do("POST", goneTest, ""), 404, "project_not_found")
		want(alice.Do("PUT", list, ""), 405)
		want(alice.Do("GET", test, ""), 405)

		// Delivered; and retrying after a 500 (statusCode, lastError, nextAttemptAt).
		okID := project("ok")
		okRec := relaytest.NewScriptedReceiver(t, "s", 200)
		setWebhook(t, ts, okID, okRec.URL, "s")
		okList, okTest := paths(okID)
		id := want(alice.Do("POST", okTest, ""), 202).Str("delivery", "id")
		okRec.Next(t)
		relaytest.Eventually(t, 5*time.Second, func() bool {
			return strings.Contains(want(alice.Do("GET", okList, ""), 200).Raw, `"status":"delivered"`)
		}, "the test event delivered")
		failID := project("failing")
		failRec := relaytest.NewScriptedReceiver(t, "s", 500)
		setWebhook(t, ts, failID, failRec.URL, "s")
		failList, failTest := paths(failID)
		want(alice.Do("POST", failTest, ""), 202)
		failRec.Next(t)
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r := want(alice.Do("GET", failList, ""), 200)
			return strings.Contains(r.Raw, `"status":"retrying"`) && strings.Contains(r.Raw, `"lastError":"HTTP 500"`)
		}, "the failing test event waiting for its retry")
		if id == "" {
			t.Fatal("no id")
		}

		// A full queue: one under way, one waiting, the third refused.
		busyID := project("busy")
		hanging, requests := relaytest.HangingReceiver(t)
		setWebhook(t, ts, busyID, hanging, "s")
		_, busyTest := paths(busyID)
		want(alice.Do("POST", busyTest, ""), 202)
		relaytest.Eventually(t, 5*time.Second, func() bool { return requests.Load() == 1 }, "the first test event under way")
		want(alice.Do("POST", busyTest, ""), 202)
		want(alice.Do("POST", busyTest, ""), 429, "webhook_queue_full")

		for _, k := range []string{
			"GET /api/projects/{projectId}/webhook-deliveries OK", "GET /api/projects/{projectId}/webhook-deliveries Unauthorized",
			"GET /api/projects/{projectId}/webhook-deliveries Not Found", "POST /api/projects/{projectId}/webhook-test Accepted",
			"POST /api/projects/{projectId}/webhook-test Unauthorized", "POST /api/projects/{projectId}/webhook-test Not Found",
			"POST /api/projects/{projectId}/webhook-test Bad Request", "POST /api/projects/{projectId}/webhook-test Too Many Requests",
		} {
			if !st.seen[k] {
				t.Errorf("not validated: %s", k)
			}
		}
	})
}
