package controlplane

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// hdrCheck fails unless h carries, exactly once each, the security headers
// api/server.go sets on every response of the public listener; JSON answers
// must also be application/json and not cached.
func hdrCheck(t *testing.T, what string, h http.Header, jsonBody bool) {
	t.Helper()
	exact := map[string]string{
		"X-Content-Type-Options": "nosniff",
		"X-Frame-Options":        "DENY",
		"Referrer-Policy":        "same-origin",
	}
	if jsonBody {
		exact["Cache-Control"] = "no-store"
	}
	for k, want := range exact {
		if got := h.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("%s: %s = %q, want exactly %q", what, k, got, want)
		}
	}
	csp := h.Values("Content-Security-Policy")
	if len(csp) != 1 {
		t.Errorf("%s: Content-Security-Policy = %q, want one", what, csp)
		return
	}
	directives := map[string]bool{}
	for _, d := range strings.Split(csp[0], ";") {
		directives[strings.Join(strings.Fields(d), " ")] = true
	}
	for _, d := range []string{"frame-ancestors 'none'", "default-src 'self'", "base-uri 'none'", "form-action 'self'"} {
		if !directives[d] {
			t.Errorf("%s: Content-Security-Policy %q lacks %q", what, csp[0], d)
		}
	}
	if ct := h.Get("Content-Type"); jsonBody && !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: Content-Type %q, want application/json", what, ct)
	}
}

// hdrGet sends method path with optional headers and returns status, headers and body.
func hdrGet(t *testing.T, ts *relaytest.Server, method, path string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	c := &relaytest.Client{T: t, Server: ts, HTTP: &http.Client{Timeout: 10 * time.Second}}
	r := c.Send(method, path, "", "", hdr)
	return r.Status, r.Header, r.Raw
}

// TestSecurityHeadersOnConnectionPlane: /emit (200, every error, 429),
// /emit-tokens/revoke and the refused /ws handshake carry the headers.
func TestSecurityHeadersOnConnectionPlane(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	c := ts.Client()

	check := func(what string, r relaytest.Response, status int, body string) {
		t.Helper()
		r.Expect(t, status, body)
		hdrCheck(t, what, r.Header, true)
	}
	ok := c.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
	if ok.Status != 200 {
		t.Fatalf("emit: %d %s", ok.Status, ok.Raw)
	}
	hdrCheck(t, "emit 200", ok.Header, true)
	// One Date, of now: the relay sets its own (api's httpDate), which must
	// replace net/http's, not stand beside it.
	if dates := ok.Header.Values("Date"); len(dates) != 1 {
		t.Errorf("emit 200: Date %q, want exactly one", dates)
	} else if at, err := http.ParseTime(dates[0]); err != nil || time.Since(at).Abs() > 5*time.Second {
		t.Errorf("emit 200: Date %q (%v), want now in HTTP's format", dates[0], err)
	}
	// The channel budget is one a minute: the next emit on a is refused
	// (unless the minute just turned, then the one after).
	for i := 0; ; i++ {
		r := c.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
		if r.Status == 429 {
			if r.JSON["error"] != "channel_rate_limited" {
				t.Fatalf("429: %s", r.Raw)
			}
			hdrCheck(t, "emit 429", r.Header, true)
			break
		}
		if r.Status != 200 || i == 2 {
			t.Fatalf("emit %d: %d %s", i, r.Status, r.Raw)
		}
	}
	check("emit missing key", c.Emit("", `{"channel":"a","payload":1}`), 401, `{"error":"missing_secret_key"}`)
	check("emit unknown key", c.Emit("sk_live_nope", `{"channel":"a","payload":1}`), 401, `{"error":"invalid_secret_key"}`)
	check("emit bad JSON", c.Emit(p.SecretKey, `{"channel":`), 400, `{"error":"invalid_json"}`)
	check("emit bad channel", c.Emit(p.SecretKey, `{"channel":"a b","payload":1}`), 400, `{"error":"invalid_channel","channel":"a b"}`)
	check("emit too large", c.Emit(p.SecretKey, `{"channel":"a","payload":"`+strings.Repeat("x", 131072)+`"}`), 413, `{"error":"payload_too_large","max_bytes":131072}`)
	check("emit over the body cap", c.Emit(p.SecretKey, `{"channel":"a","payload":"`+strings.Repeat("x", 2<<20)+`"}`), 413, `{"error":"payload_too_large","max_bytes":131072}`)
	status, h, body := hdrGet(t, ts, "GET", "/emit", nil)
	if status != 405 || !strings.Contains(body, `"method_not_allowed"`) {
		t.Fatalf("GET /emit: %d %s", status, body)
	}
	hdrCheck(t, "GET /emit 405", h, true)

	check("revoke 200", c.Revoke(p.SecretKey, `{"jti":"x"}`), 200, `{"ok":true}`)
	check("revoke 400", c.Revoke(p.SecretKey, `{}`), 400, `{"error":"jti_or_client_id_required"}`)
	check("revoke bad JSON", c.Revoke(p.SecretKey, `{`), 400, `{"error":"invalid_json"}`)
	check("revoke 401", c.Revoke("", `{"jti":"x"}`), 401, `{"error":"missing_secret_key"}`)
	check("revoke unknown key", c.Revoke("sk_live_nope", `{"jti":"x"}`), 401, `{"error":"invalid_secret_key"}`)

	// /ws refused: a plain GET without a key, and a real handshake with an
	// unknown one.
	status, h, body = hdrGet(t, ts, "GET", "/ws", nil)
	if status != 401 {
		t.Fatalf("GET /ws without a key: %d %s", status, body)
	}
	hdrCheck(t, "/ws 401 plain", h, true)
	r := ts.Handshake("/ws?publicKey=pk_live_unknown")
	r.Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	hdrCheck(t, "/ws 401 handshake", r.Header, true)
	// The upgrade itself (101, written by the WebSocket library on the
	// hijacked socket) carries them too.
	r = ts.Handshake("/ws?publicKey=" + p.PublicKey)
	if r.Status != http.StatusSwitchingProtocols {
		t.Fatalf("handshake with the public key: %d %s", r.Status, r.Raw)
	}
	hdrCheck(t, "/ws 101", r.Header, false)
	// A plain GET with a good key is no WebSocket: the library's 400.
	status, h, _ = hdrGet(t, ts, "GET", "/ws?publicKey="+p.PublicKey, nil)
	if status != 400 {
		t.Fatalf("plain GET /ws with a key: %d", status)
	}
	hdrCheck(t, "/ws 400", h, false)
}

// TestSecurityHeadersOnOtherRoutes: health, readiness, the browser client
// (200 and 304) and JSON 404/401/405 answers carry the headers.
func TestSecurityHeadersOnOtherRoutes(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	for _, c := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/healthz", 200, `{"status":"ok"}`},
		{"GET", "/readyz", 200, `{"status":"ok"}`},
		{"GET", "/readyz/traffic", 200, `{"status":"ok"}`},
		{"POST", "/readyz/traffic", 405, `{"error":"method_not_allowed"}`},
		{"GET", "/no-such-page", 404, `{"error":"not_found"}`},
		{"GET", "/api/no-such-route", 404, `{"error":"not_found"}`},
		{"POST", "/emit-tokens/nope", 404, `{"error":"not_found"}`},
		{"GET", "/api/projects", 401, `{"error":"unauthorized"}`},
		{"POST", "/healthz", 405, `{"error":"method_not_allowed"}`},
	} {
		status, h, body := hdrGet(t, ts, c.method, c.path, nil)
		r := relaytest.Response{Status: status, Header: h, Raw: body}
		r.Expect(t, c.status, c.body)
		hdrCheck(t, c.method+" "+c.path, h, true)
	}
	status, h, body := hdrGet(t, ts, "GET", "/client.js", nil)
	if status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/javascript") || len(body) == 0 || h.Get("ETag") == "" {
		t.Fatalf("/client.js: %d %q %q", status, h.Get("Content-Type"), h.Get("ETag"))
	}
	hdrCheck(t, "/client.js", h, false)
	status, h304, _ := hdrGet(t, ts, "GET", "/client.js", map[string]string{"If-None-Match": h.Get("ETag")})
	if status != 304 {
		t.Fatalf("/client.js with its ETag: %d", status)
	}
	hdrCheck(t, "/client.js 304", h304, false)
}
