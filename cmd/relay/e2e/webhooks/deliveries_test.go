package webhooks

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestWebhookDeliveriesAPI: the deliveries list and the test event, their
// exact bodies and refusals, on both stores.
func TestWebhookDeliveriesAPI(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
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

		rec := relaytest.NewScriptedReceiver(t, "", 200)
		rec.SetSecret(alice.SetWebhook(t, p.ID, rec.URL+"/hook"))
		r := alice.Do("POST", test, `{"ignored":true}`)
		r.Expect(t, 202, fmt.Sprintf(`{"delivery":{"id":%q,"event":"test","createdAt":%q,"status":"pending","attempts":0,`+
			`"statusCode":null,"lastError":null,"lastAttemptAt":null,"nextAttemptAt":null}}`, r.Str("delivery", "id"), r.Str("delivery", "createdAt")))
		if got := relaytest.Masked(r.Raw); strings.TrimSpace(got) != `{"delivery":{"id":"I","event":"test","createdAt":"T","status":"pending","attempts":0,"statusCode":null,"lastError":null,"lastAttemptAt":null,"nextAttemptAt":null}}` {
			t.Fatalf("202 body %s", r.Raw)
		}
		id := r.Str("delivery", "id")
		hr := rec.Next(t)
		if relaytest.Masked(hr.Body) != fmt.Sprintf(`{"id":"I","event":"test","projectId":%q,"timestamp":"T"}`, p.ID) || hr.IDHeader != id || hr.Event["id"] != id {
			t.Fatalf("test event %s (X-Relay-Event-Id %s), want id %s", hr.Body, hr.IDHeader, id)
		}
		alice.WaitDelivery(p.ID, id, 5*time.Second, func(d relaytest.Delivery) bool { return d.Status == "delivered" })
		r = alice.Do("GET", list, "")
		if got := strings.TrimSpace(relaytest.Masked(r.Raw)); r.Status != 200 || !strings.Contains(r.Raw, `"id":"`+id+`"`) ||
			got != `{"deliveries":[{"id":"I","event":"test","createdAt":"T","status":"delivered","attempts":1,"statusCode":200,"lastError":null,"lastAttemptAt":"T","nextAttemptAt":null}]}` {
			t.Fatalf("deliveries: %d %s", r.Status, r.Raw)
		}

		// A connect, then a second test: newest first.
		ts.DialWS(p.PublicKey)
		connectID, _ := rec.Next(t).Event["id"].(string)
		id2 := alice.Do("POST", test, "").Str("delivery", "id")
		rec.Next(t)
		alice.WaitDelivery(p.ID, id2, 5*time.Second, func(d relaytest.Delivery) bool { return d.Status == "delivered" })
		var ids []string
		for _, d := range alice.Deliveries(p.ID) {
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
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_QUEUE_PER_PROJECT": "1", "WEBHOOK_IN_FLIGHT_PER_PROJECT": "1", "WEBHOOK_TIMEOUT_MS": "60000",
	})
	alice := ts.Signup("alice@example.com")
	p := alice.CreateProject("busy")
	hanging, requests := relaytest.HangingReceiver(t)
	alice.SetWebhook(t, p.ID, hanging)
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
