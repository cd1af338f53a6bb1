package main

// api/openapi.yaml against the real server: every request these tests send
// and every answer they get goes through kin-openapi's validator
// (openapi3filter, JSON Schema 2020-12 for an OpenAPI 3.1 document). A route
// or status the document does not describe fails the test, and so does a body
// that does not match its schema.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/relayhq/relay/store/storetest"
)

const openAPIPath = "../../api/openapi.yaml"

var registerDecoders sync.Once

// loadOpenAPI loads and validates the document and routes on any host.
func loadOpenAPI(t testing.TB) routers.Router {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(openAPIPath)
	if err != nil {
		t.Fatalf("load %s: %v", openAPIPath, err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", openAPIPath, err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("%s: openapi %s, want 3.1", openAPIPath, doc.OpenAPI)
	}
	registerDecoders.Do(func() { openapi3filter.RegisterBodyDecoder("text/javascript", openapi3filter.PlainBodyDecoder) })
	doc.Servers = nil // the test server's address, whatever it is
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return router
}

// specTransport validates each exchange against the document.
type specTransport struct {
	t      testing.TB
	router routers.Router
	next   http.RoundTripper

	mu   sync.Mutex
	seen map[string]bool // "METHOD /path/template STATUS"
}

func (st *specTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	res, err := st.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	var resBody []byte
	if res.StatusCode != http.StatusSwitchingProtocols { // its body is the socket
		resBody, err = io.ReadAll(res.Body)
		res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(resBody))
		if err != nil {
			return nil, err
		}
	}
	if msg := st.check(req, body, res, resBody); msg != "" {
		shown := string(resBody)
		if len(shown) > 300 {
			shown = shown[:300] + "…"
		}
		st.t.Errorf("%s %s → %d %s: %s", req.Method, req.URL.RequestURI(), res.StatusCode, shown, msg)
	}
	return res, nil
}

// check returns what is wrong with the exchange, or "".
func (st *specTransport) check(req *http.Request, body []byte, res *http.Response, resBody []byte) string {
	ctx := context.Background()
	vreq := req.Clone(ctx)
	vreq.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := st.router.FindRoute(vreq)
	if errors.Is(err, routers.ErrMethodNotAllowed) {
		// Described once for every path (components.responses.MethodNotAllowed).
		st.record(req.Method + " " + req.URL.Path + " 405")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") == "" ||
			strings.TrimSpace(string(resBody)) != `{"error":"method_not_allowed"}` {
			return "a method the document does not list must answer 405 method_not_allowed with Allow"
		}
		return ""
	}
	if err != nil {
		return "route not in the document: " + err.Error()
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts}
	reqErr := openapi3filter.ValidateRequest(ctx, in)
	if reqErr != nil && (res.StatusCode < 400 || res.StatusCode >= 500) {
		return "the document refuses the request (" + reqErr.Error() + ") but the server accepted it"
	}
	st.record(route.Method + " " + route.Path + " " + http.StatusText(res.StatusCode))
	err = openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: res.StatusCode, Header: res.Header,
		Body: io.NopCloser(bytes.NewReader(resBody)), Options: opts,
	})
	if err != nil {
		return "response does not match the document: " + err.Error()
	}
	return ""
}

func (st *specTransport) record(k string) {
	st.mu.Lock()
	st.seen[k] = true
	st.mu.Unlock()
}

// specClient is ts.Client() with its exchanges validated by st.
func (st *specTransport) client(ts *testServer) *client {
	c := ts.Client()
	c.HTTP.Transport = st
	return c
}

// TestOpenAPI walks every route of the public listener, its success and the
// errors that can be provoked from outside (400 401 403 404 405 409 413 415
// 429, and 304 and 101), on both stores, through the validator.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	router := loadOpenAPI(t)
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServerAt(t, dbURL, map[string]string{
			"EMIT_RATE_LIMIT_PER_MINUTE":    "2",
			"PROJECT_RATE_LIMIT_PER_MINUTE": "3",
			"MAX_CHANNELS_PER_PROJECT":      "2",
			"MAX_PROJECTS_PER_USER":         "6",
			"MAX_REVOCATIONS_PER_PROJECT":   "1",
			"REVOKE_REQUESTS_PER_MINUTE":    "3",
			"MAX_CONNECTIONS_PER_PROJECT":   "1",
			"LOGIN_ATTEMPTS_PER_MINUTE":     "2",
		}, newClock().Now)
		st := &specTransport{t: t, router: router, next: http.DefaultTransport, seen: map[string]bool{}}
		// want checks the status and, for an error, its code (// comment).
		want := func(r response, status int, code ...string) response {
			t.Helper()
			if r.Status != status || (len(code) > 0 && r.Str("error") != code[0]) {
				t.Fatalf("%d %s, want %d %v", r.Status, r.Raw, status, code)
			}
			return r
		}
		bearer := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

		// Auth.
		anon := st.client(ts)
		want(anon.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"short"}`), 400)
		want(anon.Do("POST", "/api/auth/signup", `{"email":"alice@example.com"}`), 400)
		want(anon.Do("POST", "/api/auth/signup", `{"email":`), 400)
		want(anon.Do("POST", "/api/auth/signup", `{"email":"dave@example.com","password":"correct horse"}`), 403)
		want(anon.Send("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`, "text/plain", nil), 415)
		// A body refused before it is read ends its connection: a fresh client.
		want(st.client(ts).Do("POST", "/api/auth/signup", `{"email":"`+strings.Repeat("a", 70<<10)+`"}`), 413)
		alice := st.client(ts)
		want(alice.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`), 201)
		want(anon.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`), 409)
		want(anon.Do("POST", "/api/auth/login", `{"email":"alice@example.com"}`), 400)
		want(anon.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`), 200)
		want(anon.Do("POST", "/api/auth/logout", ""), 200)
		want(anon.Do("GET", "/api/auth/logout", ""), 405)

		// Projects.
		want(anon.Do("GET", "/api/projects", ""), 401)
		want(anon.Do("POST", "/api/projects", `{"name":"x"}`), 401)
		want(alice.Do("POST", "/api/projects", `{"name":" "}`), 400)
		want(alice.Do("POST", "/api/projects", ""), 400)
		pr := want(alice.Do("POST", "/api/projects", `{"name":"main"}`), 201)
		p := project{ID: pr.Str("project", "id"), PublicKey: pr.Str("keys", "publicKey"), SecretKey: pr.Str("keys", "secretKey")}
		want(alice.Do("GET", "/api/projects", ""), 200)
		want(alice.Do("GET", "/api/projects/"+p.ID, ""), 200)
		want(alice.Do("GET", "/api/projects/00000000-0000-0000-0000-000000000000", ""), 404)
		want(alice.Do("GET", "/api/projects/not-a-uuid", ""), 404)
		want(anon.Do("GET", "/api/projects/"+p.ID, ""), 401)
		want(alice.Do("PATCH", "/api/projects/"+p.ID, `{"name":"renamed"}`), 200)
		want(alice.Do("PATCH", "/api/projects/"+p.ID, `{"name":""}`), 400)
		want(alice.Send("PATCH", "/api/projects/"+p.ID, `{"name":"x"}`, "", nil), 415)
		want(alice.Do("PUT", "/api/projects/"+p.ID, `{"name":"x"}`), 405)
		gone := want(alice.Do("POST", "/api/projects", `{"name":"gone"}`), 201).Str("project", "id")
		want(alice.Do("DELETE", "/api/projects/"+gone, ""), 200)
		want(alice.Do("DELETE", "/api/projects/"+gone, ""), 404)

		// Keys and the client-emit secret.
		keys := want(alice.Do("GET", "/api/projects/"+p.ID+"/keys", ""), 200)
		want(alice.Do("GET", "/api/projects/"+gone+"/keys", ""), 404)
		want(alice.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"master"}`), 400)
		want(alice.Do("POST", "/api/projects/"+p.ID+"/keys", `{"type":"public"}`), 400)
		want(alice.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"secret"}`), 201)
		// Rotation with an overlap window: the answer says until when the old
		// key stays valid, the list shows its expiresAt.
		want(alice.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public","overlapSeconds":86401}`), 400)
		want(alice.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public","overlapSeconds":300}`), 201)
		want(alice.Do("GET", "/api/projects/"+p.ID+"/keys", ""), 200)
		want(alice.Do("POST", "/api/projects/"+gone+"/keys", `{"keyType":"secret"}`), 404)
		keyList, _ := keys.JSON["keys"].([]any)
		var publicKeyID string
		for _, k := range keyList {
			if m, _ := k.(map[string]any); m["keyType"] == "public" {
				publicKeyID, _ = m["id"].(string)
			}
		}
		want(alice.Do("GET", "/api/projects/"+p.ID+"/keys", ""), 200) // a revoked key listed
		want(alice.Do("POST", "/api/projects/"+p.ID+"/keys/00000000-0000-0000-0000-000000000000/revoke", ""), 404)
		want(alice.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", ""), 200)
		want(alice.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{"regenerate":true}`), 200)
		want(alice.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `[`), 400)
		want(alice.Do("PATCH", "/api/projects/"+gone+"/client-emit-secret", ""), 404)
		// Channel authorization: every status of its three routes.
		authz := "/api/projects/" + p.ID + "/authorization"
		want(alice.Do("GET", authz, ""), 200)
		want(anon.Do("GET", authz, ""), 401, "unauthorized")
		want(alice.Do("GET", "/api/projects/"+gone+"/authorization", ""), 404, "project_not_found")
		want(alice.Do("PATCH", authz, `{}`), 400, "authorization_required")
		want(alice.Do("PATCH", authz, `{"authorization":"yes"}`), 400, "invalid_json")
		want(alice.Send("PATCH", authz, `{"authorization":true}`, "text/plain", nil), 415, "unsupported_media_type")
		want(alice.Do("PATCH", "/api/projects/"+gone+"/authorization", `{"authorization":true}`), 404, "project_not_found")
		want(anon.Do("PATCH", authz, `{"authorization":true}`), 401, "unauthorized")
		want(alice.Do("PATCH", authz, `{"authorization":true}`), 200)
		want(alice.Do("PATCH", authz, `{"jwksUrl":"ftp://example.com/jwks"}`), 400, "invalid_jwks_url")
		want(alice.Do("PATCH", authz, `{"jwksUrl":7}`), 400, "invalid_json")
		if r := want(alice.Do("PATCH", authz, `{"jwksUrl":"https://example.com/jwks.json"}`), 200); r.JSON["jwksUrl"] != "https://example.com/jwks.json" {
			t.Fatalf("jwksUrl set: %s", r.Raw)
		}
		want(alice.Do("GET", authz, ""), 200) // with the JWKS URL
		want(alice.Do("PATCH", authz, `{"authorization":true,"jwksUrl":null}`), 200)
		want(alice.Do("POST", authz+"/rotate-secret", `{"overlapSeconds":86401}`), 400, "invalid_overlap")
		want(alice.Do("POST", authz+"/rotate-secret", `[`), 400, "invalid_json")
		want(alice.Send("POST", authz+"/rotate-secret", `{}`, "text/plain", nil), 415, "unsupported_media_type")
		want(alice.Do("POST", "/api/projects/"+gone+"/authorization/rotate-secret", ""), 404, "project_not_found")
		want(anon.Do("POST", authz+"/rotate-secret", ""), 401, "unauthorized")
		if r := want(alice.Do("POST", authz+"/rotate-secret", `{"overlapSeconds":300}`), 200); r.JSON["previousSecretExpiresAt"] == nil {
			t.Fatalf("rotation with an overlap: %s", r.Raw)
		}
		want(alice.Do("GET", authz, ""), 200) // with the previous secret's end
		want(alice.Do("POST", authz+"/rotate-secret", ""), 200)
		want(alice.Do("PUT", authz, ""), 405)
		want(alice.Do("GET", authz+"/rotate-secret", ""), 405)
		big := st.client(ts) // a body refused before it is read ends its connection
		big.HTTP.Jar = alice.HTTP.Jar
		want(big.Do("PATCH", authz, `{"authorization":true,"x":"`+strings.Repeat("a", 70<<10)+`"}`), 413, "body_too_large")
		big = st.client(ts)
		big.HTTP.Jar = alice.HTTP.Jar
		want(big.Do("POST", authz+"/rotate-secret", `{"x":"`+strings.Repeat("a", 70<<10)+`"}`), 413, "body_too_large")
		want(alice.Do("PATCH", authz, `{"authorization":false}`), 200)

		// The secret key was rotated: fetch a fresh pair.
		pr = want(alice.Do("POST", "/api/projects", `{"name":"emit"}`), 201)
		e := project{ID: pr.Str("project", "id"), PublicKey: pr.Str("keys", "publicKey"), SecretKey: pr.Str("keys", "secretKey")}

		// Emit.
		want(anon.Send("POST", "/emit", `{"channel":"a","payload":1}`, "application/json", nil), 401, "missing_secret_key")
		want(anon.Send("POST", "/emit", `{"channel":"a","payload":1}`, "application/json", bearer(p.SecretKey)), 401) // rotated
		want(anon.Send("POST", "/emit", `{"channel":"a","payload":1}`, "application/json", bearer(e.PublicKey)), 401)
		want(anon.Send("POST", "/emit", `{"channel":`, "application/json", bearer(e.SecretKey)), 400)
		want(anon.Send("POST", "/emit", `{"channel":"a b","payload":1}`, "application/json", bearer(e.SecretKey)), 400, "invalid_channel")
		want(anon.Send("POST", "/emit", `channel=a&payload=1`, "application/x-www-form-urlencoded", bearer(e.SecretKey)), 400, "invalid_json")
		want(anon.Send("POST", "/emit", `{"channel":"a","payload":"`+strings.Repeat("x", 140<<10)+`"}`, "application/json", bearer(e.SecretKey)), 413)
		want(anon.Send("POST", "/emit", `{"channel":"a","payload":{"n":1}}`, "application/json", bearer(e.SecretKey)), 200)
		want(anon.Send("POST", "/emit", `{"channel":"a"}`, "application/json", bearer(e.SecretKey)), 200)
		want(anon.Send("POST", "/emit", `{"channel":"a","payload":1}`, "application/json", bearer(e.SecretKey)), 429, "channel_rate_limited")
		want(anon.Send("POST", "/emit", `{"channel":"b","payload":1}`, "application/json", bearer(e.SecretKey)), 200)
		want(anon.Send("POST", "/emit", `{"channel":"b","payload":1}`, "application/json", bearer(e.SecretKey)), 429, "project_rate_limited")
		want(anon.Send("POST", "/emit", `{"channel":"c","payload":1}`, "application/json", bearer(e.SecretKey)), 429, "too_many_channels")
		want(anon.Send("GET", "/emit", "", "", nil), 405)

		// Token revocation.
		revoke := func(body, ct string, key string) response {
			return anon.Send("POST", "/emit-tokens/revoke", body, ct, bearer(key))
		}
		want(anon.Send("POST", "/emit-tokens/revoke", `{"jti":"a"}`, "application/json", nil), 401)
		want(revoke(`{"jti":"a"}`, "application/json", "sk_live_nope"), 401)
		want(revoke(`{"jti":"a"}`, "application/json", e.SecretKey), 200)
		want(revoke(`{"jti":"b","clientId":null}`, "application/json", e.SecretKey), 429, "too_many_revocations")
		want(revoke(`{}`, "application/json", e.SecretKey), 400, "jti_or_client_id_required")
		want(revoke(`{"jti":"c"}`, "application/x-www-form-urlencoded", e.SecretKey), 429, "too_many_attempts") // the fourth call this minute
		pr = want(alice.Do("POST", "/api/projects", `{"name":"revoke"}`), 201)
		rk, rpk := pr.Str("keys", "secretKey"), pr.Str("keys", "publicKey")
		want(revoke(`[]`, "application/json", rk), 400)
		want(revoke(`clientId=u`, "application/x-www-form-urlencoded", rk), 400, "invalid_json")
		want(st.client(ts).Send("POST", "/emit-tokens/revoke", `{"clientId":"`+strings.Repeat("u", 70<<10)+`"}`, "application/json", bearer(rk)), 413)

		// The WebSocket handshake.
		ws := func(key string) *http.Response {
			t.Helper()
			keyBytes := make([]byte, 16)
			rand.Read(keyBytes)
			req, _ := http.NewRequest("GET", ts.Base+"/ws?publicKey="+key, nil)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString(keyBytes))
			res, err := alice.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { res.Body.Close() })
			return res
		}
		want(st.client(ts).Send("POST", "/ws", "", "", nil), 405)
		if res := ws(""); res.StatusCode != 401 {
			t.Fatalf("no key: %d", res.StatusCode)
		}
		if res := ws(e.SecretKey); res.StatusCode != 401 {
			t.Fatalf("secret key: %d", res.StatusCode)
		}
		if res := ws(e.PublicKey); res.StatusCode != 101 {
			t.Fatalf("public key: %d", res.StatusCode)
		}
		if res := ws(e.PublicKey); res.StatusCode != 429 { // MAX_CONNECTIONS_PER_PROJECT 1
			t.Fatalf("second connection: %d", res.StatusCode)
		}
		// Not a handshake: the upgrader answers 400 on the hijacked socket and
		// the server closes it, without Connection: close, so the client must
		// not pool that connection (a POST sent on it later is reset).
		once := &specTransport{t: t, router: router, next: &http.Transport{DisableKeepAlives: true}, seen: st.seen}
		if r := want(once.client(ts).Send("GET", "/ws?publicKey="+rpk, "", "", nil), 400); !strings.Contains(r.Raw, "WebSocket endpoint") {
			t.Fatalf("plain GET /ws: %q, want the plain-text explanation", r.Raw)
		}
		want(once.client(ts).Send("GET", "/ws?publicKey="+rpk, "", "", map[string]string{
			"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "8", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
		}), 426)
		want(alice.Do("POST", "/api/projects/"+p.ID+"/keys/"+publicKeyID+"/revoke", ""), 200)

		// Service routes.
		want(anon.Do("GET", "/healthz", ""), 200)
		want(anon.Do("GET", "/readyz", ""), 200)
		want(anon.Do("GET", "/readyz/traffic", ""), 200)
		js := want(anon.Do("GET", "/client.js", ""), 200)
		want(anon.Send("GET", "/client.js", "", "", map[string]string{"If-None-Match": js.Header.Get("ETag")}), 304)
		dts := want(anon.Do("GET", "/client.d.ts", ""), 200)
		want(anon.Send("GET", "/client.d.ts", "", "", map[string]string{"If-None-Match": dts.Header.Get("ETag")}), 304)

		// Last, as they throttle the address: failed logins.
		want(anon.Do("POST", "/api/auth/login", `{"email":"bob@example.com","password":"wrong password"}`), 401)
		for i := 0; ; i++ {
			r := anon.Do("POST", "/api/auth/login", `{"email":"bob@example.com","password":"wrong password"}`)
			if r.Status == 429 {
				break
			}
			if i == 10 {
				t.Fatalf("no 429 after %d failed logins: %d %s", i+2, r.Status, r.Raw)
			}
		}

		// Undescribed paths fail the validator; the server answers them 404.
		check := &specTransport{t: t, router: router, seen: map[string]bool{}}
		for _, path := range []string{"/api/nope", "/api/projects/x/keys//revoke", "/metrics"} {
			req, _ := http.NewRequest("GET", ts.Base+path, nil)
			if msg := check.check(req, nil, &http.Response{StatusCode: 404}, []byte(`{"error":"not_found"}`)); !strings.Contains(msg, "not in the document") {
				t.Errorf("%s: the validator found %q, want a route not in the document", path, msg)
			}
		}

		var seen []string
		for k := range st.seen {
			seen = append(seen, k)
		}
		sort.Strings(seen)
		t.Logf("validated %d route × status pairs:\n%s", len(seen), strings.Join(seen, "\n"))
	})
}

// TestOpenAPIQueries: the server-side queries and actions against the
// document, every status each can give.
func TestOpenAPIQueries(t *testing.T) {
	t.Parallel()
	router := loadOpenAPI(t)
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServerAt(t, dbURL, map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "1"}, newClock().Now)
		st := &specTransport{t: t, router: router, next: http.DefaultTransport, seen: map[string]bool{}}
		want := func(r response, status int, code ...string) response {
			t.Helper()
			if r.Status != status || (len(code) > 0 && r.Str("error") != code[0]) {
				t.Fatalf("%d %s, want %d %v", r.Status, r.Raw, status, code)
			}
			return r
		}
		p := ts.Signup("alice@example.com").CreateProject("q")
		key := map[string]string{"Authorization": "Bearer " + p.SecretKey}
		anon := st.client(ts)
		ann := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		ann.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)

		for _, path := range []string{"/channels", "/channels/room", "/channels/room/members", "/channels/room/messages"} {
			want(anon.Send("GET", path, "", "", nil), 401, "missing_secret_key")
			want(anon.Send("GET", path, "", "", map[string]string{"Authorization": "Bearer sk_nope"}), 401, "invalid_secret_key")
			want(anon.Send("DELETE", path, "", "", key), 405)
		}
		want(anon.Send("GET", "/channels", "", "", key), 200)
		want(anon.Send("GET", "/channels?limit=1&cursor=a", "", "", key), 200)
		want(anon.Send("GET", "/channels?limit=0", "", "", key), 400, "invalid_query")
		want(anon.Send("GET", "/channels?cursor=a%20b", "", "", key), 400, "invalid_query")
		want(anon.Send("GET", "/channels/room", "", "", key), 200)
		want(anon.Send("GET", "/channels/a!", "", "", key), 400, "invalid_channel")
		want(anon.Send("GET", "/channels/room/members", "", "", key), 200)
		want(anon.Send("GET", "/channels/a!/members", "", "", key), 400, "invalid_channel")
		want(anon.Send("POST", "/emit/batch", `{"messages":[{"channel":"room","payload":{"n":1}},{"channel":"room","payload":2},{"channel":"a b"},{"channel":"x","payload":"`+strings.Repeat("x", 130<<10)+`"},1]}`, "application/json", key), 200)
		want(anon.Send("GET", "/channels/room/messages", "", "", key), 200)
		want(anon.Send("GET", "/channels/room/messages?since=1", "", "", key), 200)
		want(anon.Send("GET", "/channels/room/messages?since=x", "", "", key), 400, "invalid_since")
		want(anon.Send("GET", "/channels/a!/messages", "", "", key), 400, "invalid_channel")

		want(anon.Send("POST", "/clients/ann/disconnect", "", "", nil), 401, "missing_secret_key")
		want(anon.Send("GET", "/clients/ann/disconnect", "", "", key), 405)
		want(anon.Send("POST", "/clients/ann/disconnect", "", "", key), 200)
		ann.ExpectClose(4003, 5*time.Second)

		want(anon.Send("POST", "/emit/batch", `{"messages":[]}`, "application/json", nil), 401, "missing_secret_key")
		want(anon.Send("GET", "/emit/batch", "", "", key), 405)
		want(anon.Send("POST", "/emit/batch", `{"messages":[]}`, "application/json", key), 400, "invalid_batch")
		want(anon.Send("POST", "/emit/batch", `[`, "application/json", key), 400, "invalid_json")
		want(anon.Send("POST", "/emit/batch", `{"messages":[]}`, "text/plain", key), 400, "invalid_batch") // read as JSON whatever it declares
		want(anon.Send("POST", "/emit/batch", `{"messages":["`+strings.Repeat("x", 4<<20)+`"]}`, "application/json", key), 413)

		var seen []string
		for k := range st.seen {
			seen = append(seen, k)
		}
		sort.Strings(seen)
		t.Logf("validated %d route × status pairs:\n%s", len(seen), strings.Join(seen, "\n"))
	})
}
