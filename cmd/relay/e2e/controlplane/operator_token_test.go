package controlplane

import (
	"net/http"
	"strings"
	"testing"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestOperatorToken: with RELAY_DEBUG_TOKEN set, every route of the operator
// listener requires "Authorization: Bearer <token>": none, a wrong one or
// another scheme gets 401 {"error":"unauthorized"}; the right one gets 200.
func TestOperatorToken(t *testing.T) {
	t.Parallel()
	const token = "operator-token-0123456789"
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"RELAY_DEBUG_TOKEN": token})
	for _, path := range []string{"/metrics", "/debug/actors", "/debug/", "/debug/pprof/", "/debug/pprof/cmdline", "/nope"} {
		t.Run(path, func(t *testing.T) {
			for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong-token-0123456789", "Bearer " + token + "x",
				"Bearer " + token[:len(token)-1], "Basic " + token, token, "Bearer  " + token} {
				h := http.Header{}
				if auth != "" {
					h.Set("Authorization", auth)
				}
				r, err := relaytest.Do(nil, "GET", ts.Debug+path, "", h)
				if err != nil {
					t.Fatal(err)
				}
				if r.Status != http.StatusUnauthorized {
					t.Fatalf("Authorization %q: %d %.200s", auth, r.Status, r.Raw)
				}
				r.Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
				if !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("WWW-Authenticate %q", r.Header.Get("WWW-Authenticate"))
				}
			}
			want := http.StatusOK
			if path == "/nope" {
				want = http.StatusNotFound
			}
			for _, auth := range []string{"Bearer " + token, "bearer " + token} {
				r, err := relaytest.Do(nil, "GET", ts.Debug+path, "", http.Header{"Authorization": {auth}})
				if err != nil {
					t.Fatal(err)
				}
				if r.Status != want {
					t.Fatalf("Authorization %q: %d, want %d: %.200s", auth, r.Status, want, r.Raw)
				}
			}
		})
	}
	r, err := relaytest.Do(nil, "GET", ts.Debug+"/metrics", "", http.Header{"Authorization": {"Bearer " + token}})
	if err != nil || !strings.Contains(r.Raw, "relay_connections_open") {
		t.Fatalf("/metrics with the token: %v %.300s", err, r.Raw)
	}
	if strings.Contains(ts.Logs.String(), token) {
		t.Fatal("the token appears in the logs")
	}
	// The public listener knows nothing of it.
	if status, _ := relaytest.GetText(t, ts.Base+"/healthz"); status != http.StatusOK {
		t.Fatalf("/healthz: %d", status)
	}
}

// TestOperatorWithoutTokenServesLoopbackNames: without RELAY_DEBUG_TOKEN
// (loopback only), a request must name a loopback host; another name gets
// 401. A web page that rebinds its own name to 127.0.0.1 (DNS rebinding)
// used to read /debug/actors, pprof and /metrics from the operator's browser.
func TestOperatorWithoutTokenServesLoopbackNames(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	_, port, _ := strings.Cut(strings.TrimPrefix(ts.Debug, "http://"), ":")
	for _, path := range []string{"/debug/actors", "/debug/pprof/cmdline", "/metrics"} {
		for host, want := range map[string]int{
			"attacker.example:" + port: http.StatusUnauthorized, "attacker.example": http.StatusUnauthorized,
			"127.0.0.1:" + port: http.StatusOK, "localhost:" + port: http.StatusOK, "LOCALHOST": http.StatusOK,
			"[::1]:" + port: http.StatusOK, "127.0.0.2": http.StatusOK,
		} {
			req, err := http.NewRequest("GET", ts.Debug+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = host
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != want {
				t.Errorf("%s with Host %q: %d, want %d", path, host, res.StatusCode, want)
			}
		}
	}
}
