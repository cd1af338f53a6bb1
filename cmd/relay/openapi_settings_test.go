package main

import (
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestOpenAPISettings: GET and PATCH …/settings, GET and POST
// …/webhook-secret and GET …/usage against the document, every status each can give from outside (200 400 401 404 405
// 413 415), every 400 code, on both stores.
func TestOpenAPISettings(t *testing.T) {
	t.Parallel()
	router := loadOpenAPI(t)
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServerAt(t, dbURL, nil, newClock().Now)
		st := &specTransport{t: t, router: router, next: http.DefaultTransport, seen: map[string]bool{}}
		want := func(r response, status int, code ...string) response {
			t.Helper()
			if r.Status != status || (len(code) > 0 && r.Str("error") != code[0]) {
				t.Fatalf("%d %s, want %d %v", r.Status, r.Raw, status, code)
			}
			return r
		}
		anon := st.client(ts)
		alice := st.client(ts)
		want(alice.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`), 201)
		p := want(alice.Do("POST", "/api/projects", `{"name":"main"}`), 201).Str("project", "id")
		gone := want(alice.Do("POST", "/api/projects", `{"name":"gone"}`), 201).Str("project", "id")
		want(alice.Do("DELETE", "/api/projects/"+gone, ""), 200)
		settings, usage := "/api/projects/"+p+"/settings", "/api/projects/"+p+"/usage"

		want(alice.Do("GET", settings, ""), 200)
		want(anon.Do("GET", settings, ""), 401, "unauthorized")
		want(alice.Do("GET", "/api/projects/"+gone+"/settings", ""), 404, "project_not_found")
		want(alice.Do("PUT", settings, `{}`), 405)
		want(alice.Do("PATCH", settings, `{}`), 400, "setting_required")
		want(alice.Do("PATCH", settings, `{"webhookUrl":7}`), 400, "invalid_json")
		want(alice.Do("PATCH", settings, `{"webhookUrl":"ftp://example.com/h"}`), 400, "invalid_webhook_url")
		want(alice.Do("PATCH", settings, `{"channelRateLimit":0}`), 400, "invalid_channel_rate_limit")
		want(alice.Do("PATCH", settings, `{"historyRetentionSeconds":-1}`), 400, "invalid_history_retention")
		want(alice.Do("PATCH", settings, `{"historyRetentionSeconds":3600}`), 200)
		want(alice.Do("PATCH", settings, `{"historyRetentionSeconds":0}`), 200)
		want(alice.Do("PATCH", settings, `{"webhookEvents":{"channel":true}}`), 400, "webhook_url_required")
		want(alice.Send("PATCH", settings, `{"channelRateLimit":5}`, "text/plain", nil), 415, "unsupported_media_type")
		want(anon.Do("PATCH", settings, `{"channelRateLimit":5}`), 401, "unauthorized")
		want(alice.Do("PATCH", "/api/projects/"+gone+"/settings", `{"channelRateLimit":5}`), 404, "project_not_found")
		big := st.client(ts) // a body refused before it is read ends its connection
		big.HTTP.Jar = alice.HTTP.Jar
		want(big.Do("PATCH", settings, `{"channelRateLimit":5,"x":"`+strings.Repeat("a", 70<<10)+`"}`), 413, "body_too_large")
		secret := "/api/projects/" + p + "/webhook-secret"
		want(alice.Do("GET", secret, ""), 400, "webhook_url_required")
		want(alice.Do("POST", secret, ""), 400, "webhook_url_required")
		want(alice.Do("PATCH", settings, `{"webhookUrl":"https://hooks.example.com/r","webhookEvents":{"channel":true,"presence":false},"channelRateLimit":25}`), 200)
		want(alice.Do("GET", settings, ""), 200) // with every setting set
		want(alice.Do("GET", secret, ""), 200)
		want(alice.Do("POST", secret, ""), 200)
		want(anon.Do("GET", secret, ""), 401, "unauthorized")
		want(anon.Do("POST", secret, ""), 401, "unauthorized")
		want(alice.Do("GET", "/api/projects/"+gone+"/webhook-secret", ""), 404, "project_not_found")
		want(alice.Do("POST", "/api/projects/"+gone+"/webhook-secret", ""), 404, "project_not_found")
		want(alice.Do("PUT", secret, ""), 405)
		want(alice.Do("PATCH", "/api/projects/"+p+"/client-emit-secret", ""), 200)
		want(alice.Do("PATCH", settings, `{"webhookUrl":null,"channelRateLimit":null}`), 200)

		want(alice.Do("GET", usage, ""), 200) // no rows
		today := time.Now().UTC().Format(time.DateOnly)
		if err := ts.app.store.AddUsage(t.Context(), store.Usage{ProjectID: p, Day: today, ConnectionCount: 3, MessageCount: 5, LatencyP99Ms: 2.5}); err != nil {
			t.Fatal(err)
		}
		want(alice.Do("GET", usage, ""), 200)
		want(alice.Do("GET", usage+"?from="+today+"&to="+today, ""), 200)
		want(alice.Do("GET", usage+"?from=yesterday", ""), 400, "invalid_query")
		want(alice.Do("GET", usage+"?to=2026-02-30", ""), 400, "invalid_query")
		want(anon.Do("GET", usage, ""), 401, "unauthorized")
		want(alice.Do("GET", "/api/projects/"+gone+"/usage", ""), 404, "project_not_found")
		want(alice.Do("POST", usage, ""), 405)

		var seen []string
		for k := range st.seen {
			seen = append(seen, k)
		}
		sort.Strings(seen)
		t.Logf("validated %d route × status pairs:\n%s", len(seen), strings.Join(seen, "\n"))
	})
}
