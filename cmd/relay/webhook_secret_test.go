package main

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/relayhq/relay/store/storetest"
)

// TestWebhookSecretAPI: GET and POST …/webhook-secret and `relay admin
// project webhook-secret`, on both stores: refused without a webhook URL
// (and for others' projects) with the exact bodies; the secret read is the
// one webhooks are signed with (a test event); a regenerated one is stored
// and signs the webhooks that follow (a connect); a URL change keeps it, the
// URL's removal removes it.
func TestWebhookSecretAPI(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		alice, bob := ts.signup("alice@example.com"), ts.signup("bob@example.com")
		p := alice.createProject("hooks")
		path := "/api/projects/" + p.id + "/webhook-secret"
		settings := "/api/projects/" + p.id + "/settings"

		alice.do("GET", path, "").expect(t, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		alice.do("POST", path, "").expect(t, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		adminFails(t, dbURL, 1, "webhook_url_required", "project", "webhook-secret", "--project", p.id)
		adminFails(t, dbURL, 1, "webhook_url_required", "project", "webhook-secret", "--project", p.id, "--regenerate")
		ts.client().do("GET", path, "").expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		ts.client().do("POST", path, "").expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		bob.do("GET", path, "").expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		bob.do("POST", path, "").expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		alice.do("GET", "/api/projects/00000000-0000-0000-0000-000000000000/webhook-secret", "").expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		alice.do("DELETE", path, "").expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)
		adminFails(t, dbURL, 1, "project_not_found", "project", "webhook-secret", "--project", "00000000-0000-0000-0000-000000000000")
		adminFails(t, dbURL, 2, "--project is required", "project", "webhook-secret")

		// Set with the URL: the secret read is the stored one, and signs.
		rec := newScriptedReceiver(t, "", 200)
		r := alice.do("PATCH", settings, fmt.Sprintf(`{"webhookUrl":%q}`, rec.srv.URL+"/hook"))
		if r.status != http.StatusOK {
			t.Fatalf("set the webhook URL: %d %s", r.status, r.raw)
		}
		first := alice.do("GET", path, "").str("webhookSecret")
		if stored := dashSettings(t, ts, p.id).WebhookSecret; first == "" || first != stored {
			t.Fatalf("GET answered %q, the store holds %q", first, stored)
		}
		alice.do("GET", path, "").expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, first))
		if v := adminOK(t, dbURL, "project", "webhook-secret", "--project", p.id); canonical(v) != fmt.Sprintf(`{"webhookSecret":%q}`, first) {
			t.Fatalf("relay admin printed %v", v)
		}
		rec.mu.Lock()
		rec.secret = first
		rec.mu.Unlock()
		alice.do("POST", "/api/projects/"+p.id+"/webhook-test", "")
		rec.next(t)

		// Regenerated: a new secret, stored, signing the webhooks that follow
		// (the project's actor starts with the connect, and loads it).
		r = alice.do("POST", path, `{"ignored":true}`)
		second := r.str("webhookSecret")
		r.expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, second))
		if second == "" || second == first || dashSettings(t, ts, p.id).WebhookSecret != second {
			t.Fatalf("regenerated %q (was %q), stored %q", second, first, dashSettings(t, ts, p.id).WebhookSecret)
		}
		rec.mu.Lock()
		rec.secret = second
		rec.mu.Unlock()
		ts.dialWS(p.publicKey)
		if ev := rec.next(t).ev["event"]; ev != "connect" {
			t.Fatalf("webhook %v, want connect", ev)
		}

		// relay admin --regenerate: another secret, which the API then reads.
		third, _ := adminOK(t, dbURL, "project", "webhook-secret", "--project", p.id, "--regenerate")["webhookSecret"].(string)
		if third == "" || third == second {
			t.Fatalf("relay admin --regenerate printed %q (was %q)", third, second)
		}
		alice.do("GET", path, "").expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, third))

		// A URL change keeps it; removing the URL removes it.
		alice.do("PATCH", settings, `{"webhookUrl":"https://hooks.example.com/b"}`)
		alice.do("GET", path, "").expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, third))
		alice.do("PATCH", settings, `{"webhookUrl":null}`)
		alice.do("GET", path, "").expect(t, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		if s := dashSettings(t, ts, p.id).WebhookSecret; s != "" {
			t.Fatalf("the secret stayed with the URL removed: %q", s)
		}
	})
}
