package controlplane

import (
	"net/http"
	"strings"
	"testing"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// A malformed path (empty, "." or ".." segments) answers the JSON 404, not
// net/http's redirect to the cleaned path.
func TestMalformedPathsAnswerJSON404(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	c := ts.Signup("alice@example.com")
	p := c.CreateProject("a")
	c.HTTP.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, path := range []string{
		"/api/projects/" + p.ID + "/keys//revoke",
		"/api/projects//keys",
		"//api/projects",
		"/api/projects/" + p.ID + "/./keys",
		"/api/projects/x/../" + p.ID,
		"/emit/",
		"/client.js/.",
	} {
		for _, method := range []string{"GET", "POST"} {
			r := c.Send(method, path, "", "", nil)
			if r.Status != http.StatusNotFound || strings.TrimSpace(r.Raw) != `{"error":"not_found"}` || r.Header.Get("Location") != "" {
				t.Errorf("%s %s: %d %q Location %q, want 404 not_found", method, path, r.Status, r.Raw, r.Header.Get("Location"))
			}
		}
	}
}

// /emit, /emit-tokens/revoke and /emit/batch read their body as JSON
// whatever its Content-Type says (curl -d declares a form): the protocol
// defines those bodies as JSON and lists no 415 (api/README.md › Endpoints › HTTP choices).
func TestConnectionPlaneContentType(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	c := ts.Signup("alice@example.com")
	p := c.CreateProject("a")
	auth := map[string]string{"Authorization": "Bearer " + p.SecretKey}
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
			r := c.Send("POST", path, body, ct, auth)
			if ok := r.JSON["ok"] == true || r.JSON["results"] != nil; r.Status != http.StatusOK || !ok {
				t.Errorf("%s with Content-Type %q: %d %s", path, ct, r.Status, r.Raw)
			}
		}
		// Whatever it declares, a body that is not JSON is invalid_json.
		c.Send("POST", path, "channel=a&payload=1", "application/x-www-form-urlencoded", auth).Expect(t, http.StatusBadRequest, `{"error":"invalid_json"}`)
		// The secret key is checked first, as the session is on /api/*.
		c.Send("POST", path, body, "text/plain", nil).Expect(t, http.StatusUnauthorized, `{"error":"missing_secret_key"}`)
	}
}
