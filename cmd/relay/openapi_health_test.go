package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestOpenAPIHealth: GET /api/projects/{id}/health, before and after
// traffic (latency null, then a number), and its refusals, through the
// validator.
func TestOpenAPIHealth(t *testing.T) {
	router := loadOpenAPI(t)
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	st := &specTransport{t: t, router: router, next: http.DefaultTransport, seen: map[string]bool{}}
	owner := st.client(ts)
	wantStatus(t, owner.do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`), 201)
	p := owner.createProject("spec")
	path := "/api/projects/" + p.id + "/health"
	if r := owner.do("GET", path, ""); r.status != 200 || r.json["lastMinute"].(map[string]any)["latencyP99Ms"] != nil {
		t.Fatalf("fresh: %d %s", r.status, r.raw)
	}
	sub := subscribed(t, ts, p.publicKey, "room")
	wantStatus(t, owner.emit(p.secretKey, `{"channel":"room","payload":1}`), 200)
	sub.next(5 * time.Second)
	relaytest.Eventually(t, 5*time.Second, func() bool {
		r := owner.do("GET", path, "")
		return r.status == 200 && r.json["lastMinute"].(map[string]any)["latencyP99Ms"] != nil
	}, "a latency in the figures")

	anon := st.client(ts)
	anon.do("GET", path, "").expect(t, 401, `{"error":"unauthorized"}`)
	bob := st.client(ts)
	wantStatus(t, bob.do("POST", "/api/auth/signup", `{"email":"bob@example.com","password":"correct horse"}`), 201)
	bob.do("GET", path, "").expect(t, 404, `{"error":"project_not_found"}`)
	wantStatus(t, owner.do("POST", path, ""), 405)
}

func wantStatus(t *testing.T, r response, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("%d %s, want %d", r.status, r.raw, status)
	}
}
