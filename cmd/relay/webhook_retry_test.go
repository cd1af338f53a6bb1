package main

// Webhook retries, event ids, the recent deliveries (JSON and dashboard)
// and test events, against the real server and real HTTP receivers on
// loopback (api/README.md › Webhooks and usage).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// scriptedRequest is one request a scriptedReceiver got.
type scriptedRequest struct {
	body, idHeader string
	ev             map[string]any
}

// setWebhook stores a project's webhook settings (the dashboard's job) in the
// server's own store, before the project has any live traffic.
func setWebhook(t *testing.T, ts *testServer, projectID, url, secret string) {
	t.Helper()
	if err := ts.app.store.SaveSettings(context.Background(), store.Settings{ProjectID: projectID, WebhookURL: url, WebhookSecret: secret}); err != nil {
		t.Fatal(err)
	}
	ts.app.actors.SettingsChanged(projectID)
}

// scriptedReceiver answers each request with the next status of its script
// (the last one repeats), after checking its signature, and hands over the
// requests.
type scriptedReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	secret   string
	statuses []int
	got      chan scriptedRequest
	bad      chan string
}

func newScriptedReceiver(t *testing.T, secret string, statuses ...int) *scriptedReceiver {
	r := &scriptedReceiver{secret: secret, statuses: statuses, got: make(chan scriptedRequest, 1000), bad: make(chan string, 100)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		secret := r.secret
		r.mu.Unlock()
		if !relaytest.SignedWebhook(req, secret, body) {
			r.bad <- "bad signature on " + string(body)
		}
		hr := scriptedRequest{body: string(body), idHeader: req.Header.Get("X-Relay-Event-Id")}
		if err := json.Unmarshal(body, &hr.ev); err != nil {
			r.bad <- "not JSON: " + string(body)
		}
		r.mu.Lock()
		status := r.statuses[0]
		if len(r.statuses) > 1 {
			r.statuses = r.statuses[1:]
		}
		r.mu.Unlock()
		select {
		case r.got <- hr:
		default:
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *scriptedReceiver) next(t *testing.T) scriptedRequest {
	t.Helper()
	select {
	case hr := <-r.got:
		return hr
	case b := <-r.bad:
		t.Fatal(b)
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook within 10 s")
	}
	return scriptedRequest{}
}

// delivery is one entry of GET …/webhook-deliveries.
type delivery struct {
	ID            string  `json:"id"`
	Event         string  `json:"event"`
	CreatedAt     string  `json:"createdAt"`
	Status        string  `json:"status"`
	Attempts      int     `json:"attempts"`
	StatusCode    *int    `json:"statusCode"`
	LastError     *string `json:"lastError"`
	LastAttemptAt *string `json:"lastAttemptAt"`
	NextAttemptAt *string `json:"nextAttemptAt"`
}

// deliveries lists projectID's deliveries through the API.
func deliveries(c *client, projectID string) []delivery {
	c.T.Helper()
	r := c.Do("GET", "/api/projects/"+projectID+"/webhook-deliveries", "")
	var out struct{ Deliveries []delivery }
	if r.Status != http.StatusOK || json.Unmarshal([]byte(r.Raw), &out) != nil {
		c.T.Fatalf("deliveries: %d %s", r.Status, r.Raw)
	}
	return out.Deliveries
}

// waitDelivery polls the API until the delivery with id satisfies ok.
func waitDelivery(c *client, projectID, id string, within time.Duration, ok func(delivery) bool) delivery {
	c.T.Helper()
	var found delivery
	relaytest.EventuallyNil(c.T, within, func() error {
		for _, d := range deliveries(c, projectID) {
			if d.ID == id {
				found = d
				if ok(d) {
					return nil
				}
				return fmt.Errorf("delivery %+v", d)
			}
		}
		return fmt.Errorf("no delivery %s", id)
	})
	return found
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
	flaky := newScriptedReceiver(t, "s1", 500, 204)
	setWebhook(t, ts, p.ID, flaky.srv.URL+"/hook", "s1")
	ts.DialWS(p.PublicKey)
	first, second := flaky.next(t), flaky.next(t)
	id, _ := first.ev["id"].(string)
	if first.body != second.body || first.idHeader != id || second.idHeader != id || !relaytest.HookEventIDRe.MatchString(id) {
		t.Fatalf("a retry differs from its first attempt:\n%+v\n%+v", first, second)
	}
	relaytest.CheckEvent(t, first.ev, "connect", p.ID)
	d := waitDelivery(owner, p.ID, id, 5*time.Second, func(d delivery) bool { return d.Status == "delivered" })
	if d.Attempts != 2 || intOf(d.StatusCode) != 204 || strOf(d.LastError) != "HTTP 500" || d.Event != "connect" || d.NextAttemptAt != nil {
		t.Fatalf("delivery %+v", d)
	}

	// 400: final at once.
	p2 := owner.CreateProject("refusing")
	refusing := newScriptedReceiver(t, "s2", 400)
	setWebhook(t, ts, p2.ID, refusing.srv.URL, "s2")
	ts.DialWS(p2.PublicKey)
	id2, _ := refusing.next(t).ev["id"].(string)
	d = waitDelivery(owner, p2.ID, id2, 5*time.Second, func(d delivery) bool { return d.Status == "failed" })
	if d.Attempts != 1 || intOf(d.StatusCode) != 400 || strOf(d.LastError) != "HTTP 400" {
		t.Fatalf("delivery %+v", d)
	}
	select { // failed is final: no attempt can follow it
	case hr := <-refusing.got:
		t.Fatalf("a 400 was retried: %s", hr.body)
	default:
	}

	// 503 for good: retried until the 2 s bound, then given up.
	p3 := owner.CreateProject("down")
	down := newScriptedReceiver(t, "s3", 503)
	setWebhook(t, ts, p3.ID, down.srv.URL, "s3")
	start := time.Now()
	ts.DialWS(p3.PublicKey)
	id3, _ := down.next(t).ev["id"].(string)
	d = waitDelivery(owner, p3.ID, id3, 10*time.Second, func(d delivery) bool { return d.Status == "failed" })
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

var (
	deliveryIDRe   = regexp.MustCompile(`"id":"([A-Za-z0-9_-]{22})"`)
	deliveryTimeRe = regexp.MustCompile(`"(createdAt|lastAttemptAt|timestamp)":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"`)
)

// masked is body with its event ids replaced by I and its times by T.
func masked(body string) string {
	return deliveryTimeRe.ReplaceAllString(deliveryIDRe.ReplaceAllString(body, `"id":"I"`), `"$1":"T"`)
}

// TestWebhookDeliveriesAPI: the deliveries list and the test event, their
// exact bodies and refusals, on both stores.
func TestWebhookDeliveriesAPI(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		alice, bob := ts.Signup("alice@example.com"), ts.Signup("bob@example.com")
		p := alice.CreateProject("hooks")
		list, test := "/api/projects/"+p.ID+"/webhook-deliveries", "/api/projects/"+p.ID+"/webhook-test"

		alice.Do("GET", list, "").Expect(t, 200, `{"deliveries":[]}`)
		alice.Do("POST", test, "").Expect(t, 400, `{"error":"webhook_url_required"}`)
		ts.Client().Do("GET", list, "").Expect(t, 401, `{"error":"unauthorized"}`)
		ts.Client().Do("POST", test, "").Expect(t, 401, `{"error":"unauthorized"}`)
		bob.Do("GET", list, "").Expect(t, 404, `{"error":"project_not_found"}`)
		bob.Do("POST", test, "").Expect(t, 404, `{"error":"project_not_found"}`)
		alice.Do("GET", "/api/projects/00000000-0000-0000-0000-000000000000/webhook-deliveries", "").Expect(t, 404, `{"error":"project_not_found"}`)
		alice.Do("DELETE", list, "").Expect(t, 405, `{"error":"method_not_allowed"}`)
		alice.Do("GET", test, "").Expect(t, 405, `{"error":"method_not_allowed"}`)

		rec := newScriptedReceiver(t, "whsec", 200)
		setWebhook(t, ts, p.ID, rec.srv.URL+"/hook", "whsec")
		r := alice.Do("POST", test, `{"ignored":true}`)
		r.Expect(t, 202, fmt.Sprintf(`{"delivery":{"id":%q,"event":"test","createdAt":%q,"status":"pending","attempts":0,`+
			`"statusCode":null,"lastError":null,"lastAttemptAt":null,"nextAttemptAt":null}}`, r.Str("delivery", "id"), r.Str("delivery", "createdAt")))
		if got := masked(r.Raw); strings.TrimSpace(got) != `{"delivery":{"id":"I","event":"test","createdAt":"T","status":"pending","attempts":0,"statusCode":null,"lastError":null,"lastAttemptAt":null,"nextAttemptAt":null}}` {
			t.Fatalf("202 body %s", r.Raw)
		}
		id := r.Str("delivery", "id")
		hr := rec.next(t)
		if masked(hr.body) != fmt.Sprintf(`{"id":"I","event":"test","projectId":%q,"timestamp":"T"}`, p.ID) || hr.idHeader != id || hr.ev["id"] != id {
			t.Fatalf("test event %s (X-Relay-Event-Id %s), want id %s", hr.body, hr.idHeader, id)
		}
		waitDelivery(alice, p.ID, id, 5*time.Second, func(d delivery) bool { return d.Status == "delivered" })
		r = alice.Do("GET", list, "")
		if got := strings.TrimSpace(masked(r.Raw)); r.Status != 200 || !strings.Contains(r.Raw, `"id":"`+id+`"`) ||
			got != `{"deliveries":[{"id":"I","event":"test","createdAt":"T","status":"delivered","attempts":1,"statusCode":200,"lastError":null,"lastAttemptAt":"T","nextAttemptAt":null}]}` {
			t.Fatalf("deliveries: %d %s", r.Status, r.Raw)
		}

		// A connect, then a second test: newest first.
		ts.DialWS(p.PublicKey)
		connectID, _ := rec.next(t).ev["id"].(string)
		id2 := alice.Do("POST", test, "").Str("delivery", "id")
		rec.next(t)
		waitDelivery(alice, p.ID, id2, 5*time.Second, func(d delivery) bool { return d.Status == "delivered" })
		var ids []string
		for _, d := range deliveries(alice, p.ID) {
			ids = append(ids, d.Event+":"+d.ID)
		}
		if want := []string{"test:" + id2, "connect:" + connectID, "test:" + id}; fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Fatalf("deliveries %v, want %v", ids, want)
		}
		bob.Do("GET", list, "").Expect(t, 404, `{"error":"project_not_found"}`)
	})
}

// TestWebhookTestQueueFull: a test event that finds the project's queue
// full answers 429 webhook_queue_full at once.
func TestWebhookTestQueueFull(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_QUEUE_PER_PROJECT": "1", "WEBHOOK_IN_FLIGHT_PER_PROJECT": "1", "WEBHOOK_TIMEOUT_MS": "60000",
	})
	alice := ts.Signup("alice@example.com")
	p := alice.CreateProject("busy")
	hanging, requests := hangingReceiver(t)
	setWebhook(t, ts, p.ID, hanging, "s")
	test := "/api/projects/" + p.ID + "/webhook-test"
	if r := alice.Do("POST", test, ""); r.Status != 202 {
		t.Fatalf("first: %d %s", r.Status, r.Raw)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return requests.Load() == 1 }, "the first test event under way")
	if r := alice.Do("POST", test, ""); r.Status != 202 { // waits in the queue
		t.Fatalf("second: %d %s", r.Status, r.Raw)
	}
	alice.Do("POST", test, "").Expect(t, 429, `{"error":"webhook_queue_full"}`)
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

		rec := newScriptedReceiver(t, "", 500, 200)
		c.Submit(page, page+"/webhook", url.Values{"url": {rec.srv.URL + "/hook"}}).ExpectRedirect(t, page+"?done=webhook-saved")
		rec.mu.Lock()
		rec.secret = dashSettings(t, ts, p.ID).WebhookSecret // generated with the URL
		rec.mu.Unlock()
		view = c.Get(page)
		if view.ByID("no-deliveries") != "No deliveries yet." || !strings.Contains(view.Body, `id="send-test-event"`) {
			t.Fatalf("deliveries card:\n%s", view.Body)
		}
		if r := c.Post(page+"/webhook/test", url.Values{"csrf": {"forged"}}); r.Status != http.StatusForbidden {
			t.Fatalf("a forged form: %d", r.Status)
		}
		c.Submit(page, page+"/webhook/test", nil).ExpectRedirect(t, page+"?done=webhook-test")
		id, _ := rec.next(t).ev["id"].(string) // answered 500: retried
		rec.next(t)
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
		okRec := newScriptedReceiver(t, "s", 200)
		setWebhook(t, ts, okID, okRec.srv.URL, "s")
		okList, okTest := paths(okID)
		id := want(alice.Do("POST", okTest, ""), 202).Str("delivery", "id")
		okRec.next(t)
		relaytest.Eventually(t, 5*time.Second, func() bool {
			return strings.Contains(want(alice.Do("GET", okList, ""), 200).Raw, `"status":"delivered"`)
		}, "the test event delivered")
		failID := project("failing")
		failRec := newScriptedReceiver(t, "s", 500)
		setWebhook(t, ts, failID, failRec.srv.URL, "s")
		failList, failTest := paths(failID)
		want(alice.Do("POST", failTest, ""), 202)
		failRec.next(t)
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r := want(alice.Do("GET", failList, ""), 200)
			return strings.Contains(r.Raw, `"status":"retrying"`) && strings.Contains(r.Raw, `"lastError":"HTTP 500"`)
		}, "the failing test event waiting for its retry")
		if id == "" {
			t.Fatal("no id")
		}

		// A full queue: one under way, one waiting, the third refused.
		busyID := project("busy")
		hanging, requests := hangingReceiver(t)
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
