package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/relayhq/relay/store/storetest"
)

// A malformed path (empty, "." or ".." segments) answers the JSON 404, not
// net/http's redirect to the cleaned path.
func TestMalformedPathsAnswerJSON404(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	c := ts.signup("alice@example.com")
	p := c.createProject("a")
	c.http.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, path := range []string{
		"/api/projects/" + p.id + "/keys//revoke",
		"/api/projects//keys",
		"//api/projects",
		"/api/projects/" + p.id + "/./keys",
		"/api/projects/x/../" + p.id,
		"/emit/",
		"/client.js/.",
	} {
		for _, method := range []string{"GET", "POST"} {
			r := c.send(method, path, "", "", nil)
			if r.status != http.StatusNotFound || strings.TrimSpace(r.raw) != `{"error":"not_found"}` || r.header.Get("Location") != "" {
				t.Errorf("%s %s: %d %q Location %q, want 404 not_found", method, path, r.status, r.raw, r.header.Get("Location"))
			}
		}
	}
}

// /emit and /emit-tokens/revoke refuse a body declared other than JSON with
// 415, like /api/*; a body without Content-Type is read as JSON (README ›
// Endpoints, api/openapi.yaml).
func TestConnectionPlaneContentType(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	c := ts.signup("alice@example.com")
	p := c.createProject("a")
	auth := map[string]string{"Authorization": "Bearer " + p.secretKey}
	for _, path := range []string{"/emit", "/emit-tokens/revoke"} {
		body := `{"channel":"a","payload":1}`
		if path != "/emit" {
			body = `{"jti":"x"}`
		}
		for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx", "bogus"} {
			c.send("POST", path, body, ct, auth).expect(t, http.StatusUnsupportedMediaType, `{"error":"unsupported_media_type"}`)
		}
		for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "application/merge-patch+json"} {
			if r := c.send("POST", path, body, ct, auth); r.status != http.StatusOK || r.json["ok"] != true {
				t.Errorf("%s with Content-Type %q: %d %s", path, ct, r.status, r.raw)
			}
		}
		// The secret key is checked first, as the session is on /api/*.
		c.send("POST", path, body, "text/plain", nil).expect(t, http.StatusUnauthorized, `{"error":"missing_secret_key"}`)
	}
}
