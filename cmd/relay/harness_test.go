package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// syncBuffer collects the server's logs for assertions.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testServer is a real relay process core (store, listener, handlers) on a
// loopback port, stopped when the test ends.
type testServer struct {
	t    testing.TB
	app  *app
	base string // http://127.0.0.1:PORT
	logs *syncBuffer
}

// startServer starts a relay on dbURL with env overriding the defaults
// (RELAY_ADDR on a free loopback port, debug listener off, signup open to
// the addresses used by tests).
func startServer(t testing.TB, dbURL string, env map[string]string) *testServer {
	t.Helper()
	vars := map[string]string{
		"RELAY_ADDR":            "127.0.0.1:0",
		"RELAY_DEBUG_ADDR":      "",
		"DATABASE_URL":          dbURL,
		"ALLOWED_SIGNUP_EMAILS": "alice@example.com,bob@example.com,carol@example.com",
		"LOG_LEVEL":             "debug",
		// Tests sign up and fail logins far faster than people; the throttle
		// has its own test.
		"LOGIN_ATTEMPTS_PER_MINUTE":  "100000",
		"SIGNUP_ATTEMPTS_PER_MINUTE": "100000",
	}
	for k, v := range env {
		vars[k] = v
	}
	cfg, err := LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	a, err := start(context.Background(), cfg, newLogger(cfg, logs))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{t: t, app: a, base: "http://" + a.addr.String(), logs: logs}
	t.Cleanup(func() {
		if ts.app == nil {
			return // the test shut it down itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return ts
}

// client is an HTTP client with its own cookie jar, like one browser.
type client struct {
	t    testing.TB
	ts   *testServer
	http *http.Client
}

func (ts *testServer) client() *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: ts.t, ts: ts, http: &http.Client{Jar: jar, Timeout: 10 * time.Second}}
}

// response is a decoded reply: status, headers, raw body and the JSON object
// it holds (nil if it is not a JSON object).
type response struct {
	status int
	header http.Header
	raw    string
	json   map[string]any
}

// do sends body (as application/json unless contentType says otherwise; ""
// body sends none) and decodes the answer.
func (c *client) do(method, path, body string, contentType ...string) response {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.ts.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	ct := "application/json"
	if len(contentType) > 0 {
		ct = contentType[0]
	}
	if body != "" && ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := response{status: res.StatusCode, header: res.Header, raw: string(raw)}
	json.Unmarshal(raw, &r.json)
	return r
}

// expect fails unless the reply has the status and exactly the JSON body want.
func (r response) expect(t testing.TB, status int, want string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.raw)
	}
	var got, exp any
	if err := json.Unmarshal([]byte(r.raw), &got); err != nil {
		t.Fatalf("body is not JSON: %q", r.raw)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatalf("bad expectation %q: %v", want, err)
	}
	if g, e := canonical(got), canonical(exp); g != e {
		t.Fatalf("body %s, want %s", g, e)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
}

func canonical(v any) string { b, _ := json.Marshal(v); return string(b) }

// str digs a string out of the decoded JSON by path: r.str("project", "id").
func (r response) str(path ...string) string {
	var v any = r.json
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	s, _ := v.(string)
	return s
}

// signup creates and logs in a user with a fresh cookie jar.
func (ts *testServer) signup(email string) *client {
	ts.t.Helper()
	c := ts.client()
	r := c.do("POST", "/api/auth/signup", `{"email":"`+email+`","password":"correct horse"}`)
	if r.status != http.StatusCreated {
		ts.t.Fatalf("signup %s: %d %s", email, r.status, r.raw)
	}
	return c
}

// project is a created project with its raw keys.
type project struct {
	id, publicKey, secretKey string
}

func (c *client) createProject(name string) project {
	c.t.Helper()
	r := c.do("POST", "/api/projects", `{"name":"`+name+`"}`)
	if r.status != http.StatusCreated {
		c.t.Fatalf("create project: %d %s", r.status, r.raw)
	}
	return project{id: r.str("project", "id"), publicKey: r.str("keys", "publicKey"), secretKey: r.str("keys", "secretKey")}
}
