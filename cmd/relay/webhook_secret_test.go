package main

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestWebhookSecretAPI: GET and POST …/webhook-secret and `relay admin
// project webhook-secret`, on both stores: refused without a webhook URL
// (and for others' projects) with the exact bodies; the secret read is the
// one webhooks are signed with (a test event); a regenerated one is stored
// and signs the webhooks that follow (a connect); a URL change keeps it, the
// URL's removal removes it.
func TestWebhookSecretAPI(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		alice, bob := ts.Signup("alice@example.com"), ts.Signup("bob@example.com")
		p := alice.CreateProject("hooks")
		path := "/api/projects/" + p.ID + "/webhook-secret"
		settings := "/api/projects/" + p.ID + "/settings"

		alice.Do("GET", path, "").Expect(t, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		alice.Do("POST", path, "").Expect(t, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		adminFails(t, dbURL, 1, "webhook_url_required", "project", "webhook-secret", "--project", p.ID)
		adminFails(t, dbURL, 1, "webhook_url_required", "project", "webhook-secret", "--project", p.ID, "--regenerate")
		ts.Client().Do("GET", path, "").Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		ts.Client().Do("POST", path, "").Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		bob.Do("GET", path, "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		bob.Do("POST", path, "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		alice.Do("GET", "/api/projects/00000000-0000-0000-0000-000000000000/webhook-secret", "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		alice.Do("DELETE", path, "").Expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)
		adminFails(t, dbURL, 1, "project_not_found", "project", "webhook-secret", "--project", "00000000-0000-0000-0000-000000000000")
		adminFails(t, dbURL, 2, "--project is required", "project", "webhook-secret")

		// Set with the URL: the secret read is the stored one, and signs.
		rec := relaytest.NewScriptedReceiver(t, "", 200)
		r := alice.Do("PATCH", settings, fmt.Sprintf(`{"webhookUrl":%q}`, rec.URL+"/hook"))
		if r.Status != http.StatusOK {
			t.Fatalf("set the webhook URL: %d %s", r.Status, r.Raw)
		}
		first := alice.Do("GET", path, "").Str("webhookSecret")
		if stored := dashSettings(t, ts, p.ID).WebhookSecret; first == "" || first != stored {
			t.Fatalf("GET answered %q, the store holds %q", first, stored)
		}
		alice.Do("GET", path, "").Expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, first))
		if v := adminOK(t, dbURL, "project", "webhook-secret", "--project", p.ID); relaytest.Canonical(v) != fmt.Sprintf(`{"webhookSecret":%q}`, first) {
			t.Fatalf("relay admin printed %v", v)
		}
		rec.SetSecret(first)
		alice.Do("POST", "/api/projects/"+p.ID+"/webhook-test", "")
		rec.Next(t)

		// Regenerated: a new secret, stored, signing the webhooks that follow
		// (the project's actor starts with the connect, and loads it).
		r = alice.Do("POST", path, `{"ignored":true}`)
		second := r.Str("webhookSecret")
		r.Expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, second))
		if second == "" || second == first || dashSettings(t, ts, p.ID).WebhookSecret != second {
			t.Fatalf("regenerated %q (was %q), stored %q", second, first, dashSettings(t, ts, p.ID).WebhookSecret)
		}
		rec.SetSecret(second)
		ts.DialWS(p.PublicKey)
		if ev := rec.Next(t).Event["event"]; ev != "connect" {
			t.Fatalf("webhook %v, want connect", ev)
		}

		// relay admin --regenerate: another secret, which the API then reads.
		third, _ := adminOK(t, dbURL, "project", "webhook-secret", "--project", p.ID, "--regenerate")["webhookSecret"].(string)
		if third == "" || third == second {
			t.Fatalf("relay admin --regenerate printed %q (was %q)", third, second)
		}
		alice.Do("GET", path, "").Expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, third))

		// A URL change keeps it; removing the URL removes it.
		alice.Do("PATCH", settings, `{"webhookUrl":"https://hooks.example.com/b"}`)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, fmt.Sprintf(`{"webhookSecret":%q}`, third))
		alice.Do("PATCH", settings, `{"webhookUrl":null}`)
		alice.Do("GET", path, "").Expect(t, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		if s := dashSettings(t, ts, p.ID).WebhookSecret; s != "" {
			t.Fatalf("the secret stayed with the URL removed: %q", s)
		}
	})
}
