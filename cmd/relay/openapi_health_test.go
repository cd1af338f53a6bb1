package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestOpenAPIHealth: GET /api/projects/{id}/health, before and after
// traffic (latency null, then a number), and its refusals, through the
// validator.
func TestOpenAPIHealth(t *testing.T) {
	t.Parallel()
	router := loadOpenAPI(t)
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	st := &specTransport{t: t, router: router, next: http.DefaultTransport, seen: map[string]bool{}}
	owner := st.client(ts)
	wantStatus(t, owner.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`), 201)
	p := owner.CreateProject("spec")
	path := "/api/projects/" + p.ID + "/health"
	if r := owner.Do("GET", path, ""); r.Status != 200 || r.JSON["lastMinute"].(map[string]any)["latencyP99Ms"] != nil {
		t.Fatalf("fresh: %d %s", r.Status, r.Raw)
	}
	sub := ts.Subscribed(t, p.PublicKey, "room")
	wantStatus(t, owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`), 200)
	sub.Next(5 * time.Second)
	relaytest.Eventually(t, 5*time.Second, func() bool {
		r := owner.Do("GET", path, "")
		return r.Status == 200 && r.JSON["lastMinute"].(map[string]any)["latencyP99Ms"] != nil
	}, "a latency in the figures")

	anon := st.client(ts)
	anon.Do("GET", path, "").Expect(t, 401, `{"error":"unauthorized"}`)
	bob := st.client(ts)
	wantStatus(t, bob.Do("POST", "/api/auth/signup", `{"email":"bob@example.com","password":"correct horse"}`), 201)
	bob.Do("GET", path, "").Expect(t, 404, `{"error":"project_not_found"}`)
	wantStatus(t, owner.Do("POST", path, ""), 405)
}

// TestOpenAPIReadiness: /readyz and /readyz/traffic through the validator
// in each state a probe can find: both 200; the store gone (the SQLite
// directory moved away), /readyz 503 and /readyz/traffic 200 while an emit
// with a known key is still 200; draining, both 503; a wrong method, 405.
func TestOpenAPIReadiness(t *testing.T) {
	t.Parallel()
	router := loadOpenAPI(t)
	dir := filepath.Join(t.TempDir(), "data")
	ts := startServer(t, "sqlite:"+filepath.Join(dir, "relay.db"), nil)
	st := &specTransport{t: t, router: router, next: http.DefaultTransport, seen: map[string]bool{}}
	owner := st.client(ts)
	anon := st.client(ts)
	wantStatus(t, owner.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`), 201)
	p := owner.CreateProject("spec")
	wantStatus(t, owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`), 200) // the key is now cached
	anon.Do("GET", "/readyz", "").Expect(t, 200, `{"status":"ok"}`)
	anon.Do("GET", "/readyz/traffic", "").Expect(t, 200, `{"status":"ok"}`)

	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return anon.Do("GET", "/readyz", "").Status == 503 }, "/readyz 503 with the store gone")
	anon.Do("GET", "/readyz", "").Expect(t, 503, `{"status":"unavailable"}`)
	anon.Do("GET", "/readyz/traffic", "").Expect(t, 200, `{"status":"ok"}`)
	wantStatus(t, owner.Emit(p.SecretKey, `{"channel":"room","payload":2}`), 200)
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return anon.Do("GET", "/readyz", "").Status == 200 }, "/readyz 200 with the store back")

	wantStatus(t, anon.Do("POST", "/readyz/traffic", ""), 405)
	ts.app.api.Drain(context.Background())
	anon.Do("GET", "/readyz", "").Expect(t, 503, `{"status":"unavailable"}`)
	anon.Do("GET", "/readyz/traffic", "").Expect(t, 503, `{"status":"unavailable"}`)
	for _, k := range []string{"GET /readyz OK", "GET /readyz Service Unavailable", "GET /readyz/traffic OK", "GET /readyz/traffic Service Unavailable", "POST /readyz/traffic 405"} {
		if !st.seen[k] {
			t.Errorf("%s not validated; seen %v", k, st.seen)
		}
	}
}

func wantStatus(t *testing.T, r response, status int) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%d %s, want %d", r.Status, r.Raw, status)
	}
}
