package main

import (
	"net/http"
	"strings"
	"testing"
)

// TestOperatorToken: with RELAY_DEBUG_TOKEN set, every route of the operator
// listener requires "Authorization: Bearer <token>": none, a wrong one or
// another scheme gets 401 {"error":"unauthorized"}; the right one gets 200.
func TestOperatorToken(t *testing.T) {
	const token = "operator-token-0123456789"
	ts := debugServer(t, map[string]string{"RELAY_DEBUG_TOKEN": token})
	for _, path := range []string{"/metrics", "/debug/actors", "/debug/", "/debug/pprof/", "/debug/pprof/cmdline", "/nope"} {
		t.Run(path, func(t *testing.T) {
			for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong-token-0123456789", "Bearer " + token + "x",
				"Bearer " + token[:len(token)-1], "Basic " + token, token, "Bearer  " + token} {
				h := http.Header{}
				if auth != "" {
					h.Set("Authorization", auth)
				}
				r, err := request(nil, "GET", ts.debug+path, "", h)
				if err != nil {
					t.Fatal(err)
				}
				if r.status != http.StatusUnauthorized {
					t.Fatalf("Authorization %q: %d %.200s", auth, r.status, r.raw)
				}
				r.expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
				if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
				}
			}
			want := http.StatusOK
			if path == "/nope" {
				want = http.StatusNotFound
			}
			for _, auth := range []string{"Bearer " + token, "bearer " + token} {
				r, err := request(nil, "GET", ts.debug+path, "", http.Header{"Authorization": {auth}})
				if err != nil {
					t.Fatal(err)
				}
				if r.status != want {
					t.Fatalf("Authorization %q: %d, want %d: %.200s", auth, r.status, want, r.raw)
				}
			}
		})
	}
	r, err := request(nil, "GET", ts.debug+"/metrics", "", http.Header{"Authorization": {"Bearer " + token}})
	if err != nil || !strings.Contains(r.raw, "relay_connections_open") {
		t.Fatalf("/metrics with the token: %v %.300s", err, r.raw)
	}
	if strings.Contains(ts.logs.String(), token) {
		t.Fatal("the token appears in the logs")
	}
	// The public listener knows nothing of it.
	if status, _ := getText(t, ts.base+"/healthz"); status != http.StatusOK {
		t.Fatalf("/healthz: %d", status)
	}
}

// TestOperatorWithoutTokenServesLoopbackNames: without RELAY_DEBUG_TOKEN
// (loopback only), a request must name a loopback host; another name gets
// 401. A web page that rebinds its own name to 127.0.0.1 (DNS rebinding)
// used to read /debug/actors, pprof and /metrics from the operator's browser.
func TestOperatorWithoutTokenServesLoopbackNames(t *testing.T) {
	ts := debugServer(t, nil)
	_, port, _ := strings.Cut(strings.TrimPrefix(ts.debug, "http://"), ":")
	for _, path := range []string{"/debug/actors", "/debug/pprof/cmdline", "/metrics"} {
		for host, want := range map[string]int{
			"attacker.example:" + port: http.StatusUnauthorized, "attacker.example": http.StatusUnauthorized,
			"127.0.0.1:" + port: http.StatusOK, "localhost:" + port: http.StatusOK, "LOCALHOST": http.StatusOK,
			"[::1]:" + port: http.StatusOK, "127.0.0.2": http.StatusOK,
		} {
			req, err := http.NewRequest("GET", ts.debug+path, nil)
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
