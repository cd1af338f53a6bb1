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

// /emit, /emit-tokens/revoke and /emit/batch read their body as JSON
// whatever its Content-Type says (curl -d declares a form): the protocol
// defines those bodies as JSON and lists no 415 (api/README.md › Endpoints › HTTP choices).
func TestConnectionPlaneContentType(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	c := ts.signup("alice@example.com")
	p := c.createProject("a")
	auth := map[string]string{"Authorization": "Bearer " + p.secretKey}
	for _, path := range []string{"/emit", "/emit-tokens/revoke", "/emit/batch"} {
		body := `{"channel":"a","payload":1}`
		switch path {
		case "/emit-tokens/revoke":
			body = `{"jti":"x"}`
		case "/emit/batch":
			body = `{"messages":[{"channel":"a","payload":1}]}`
		}
		for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "application/merge-patch+json",
			"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx", "bogus"} {
			r := c.send("POST", path, body, ct, auth)
			if ok := r.json["ok"] == true || r.json["results"] != nil; r.status != http.StatusOK || !ok {
				t.Errorf("%s with Content-Type %q: %d %s", path, ct, r.status, r.raw)
			}
		}
		// Whatever it declares, a body that is not JSON is invalid_json.
		c.send("POST", path, "channel=a&payload=1", "application/x-www-form-urlencoded", auth).expect(t, http.StatusBadRequest, `{"error":"invalid_json"}`)
		// The secret key is checked first, as the session is on /api/*.
		c.send("POST", path, body, "text/plain", nil).expect(t, http.StatusUnauthorized, `{"error":"missing_secret_key"}`)
	}
}
