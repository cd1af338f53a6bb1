package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// The in-process side of the harness: what needs package main (start, the
// app) or its response type. The black-box helpers that do not (the real
// binary, the request, polling, /metrics, the test clock) are in
// internal/relaytest.

func TestMain(m *testing.M) { storetest.Main(m) }

// testServer is a relay on a loopback port, stopped when the test ends: a
// process core started in this process (app set) or the real binary (app nil).
type testServer struct {
	t     testing.TB
	app   *app
	base  string            // http://127.0.0.1:PORT
	debug string            // http://127.0.0.1:PORT of the operator listener; "" when it is off
	logs  *relaytest.Buffer // the server's log
	now   func() time.Time  // the server's clock
}

// startServer starts a relay on dbURL with env overriding the defaults
// (RELAY_ADDR on a free loopback port, debug listener off, signup open to
// the addresses used by tests), on the wall clock.
func startServer(t testing.TB, dbURL string, env map[string]string) *testServer {
	t.Helper()
	return startServerAt(t, dbURL, env, time.Now)
}

// startServerAt is startServer on the clock now (a relaytest.Clock's Now):
// budgets, throttles, replay, tokens and usage days follow it.
func startServerAt(t testing.TB, dbURL string, env map[string]string, now func() time.Time) *testServer {
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
		// Every test socket comes from 127.0.0.1; the cap has its own test.
		"MAX_CONNECTIONS_PER_ADDRESS": "100000",
		// Nor may the share of HTTP slots refuse a test's burst of handshakes
		// (TestHTTPShareOfAddress tests it).
		"MAX_HTTP_CONNECTIONS_PER_ADDRESS": "4096",
	}
	for k, v := range env {
		vars[k] = v
	}
	cfg, err := LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	logs := &relaytest.Buffer{}
	a, err := start(context.Background(), cfg, newLogger(cfg, logs), now)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{t: t, app: a, base: "http://" + a.addr.String(), logs: logs, now: now}
	if a.debugAddr != nil {
		ts.debug = "http://" + a.debugAddr.String()
	}
	t.Cleanup(func() {
		if ts.app != nil { // else the test shut it down itself
			ts.stop()
		}
	})
	return ts
}

// stop shuts the in-process server down now, within 10 s, and fails the test
// on an error; ts.app is nil afterwards.
func (ts *testServer) stop() {
	ts.t.Helper()
	a := ts.app
	ts.app = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.shutdown(ctx); err != nil {
		ts.t.Fatalf("shutdown: %v", err)
	}
}

// newClock is a test clock standing half-way through the current wall-clock
// minute: a test can step it by seconds and stay in one budget window, and
// what the server stamps with it stays within a minute of the wall clock.
func newClock() *relaytest.Clock {
	return relaytest.NewClock(time.Now().Truncate(time.Minute).Add(30 * time.Second))
}

// debugServer starts a relay on SQLite with the operator listener on.
func debugServer(t testing.TB, env map[string]string) *testServer {
	t.Helper()
	return debugServerAt(t, env, time.Now)
}

// debugServerAt is debugServer on the clock now.
func debugServerAt(t testing.TB, env map[string]string, now func() time.Time) *testServer {
	t.Helper()
	vars := map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:0"}
	for k, v := range env {
		vars[k] = v
	}
	return startServerAt(t, storetest.SQLiteURL(t), vars, now)
}

// binaryServer is the real binary (relaytest.StartBinary) behind the same
// helpers.
func binaryServer(t testing.TB, proc *relaytest.Process) *testServer {
	return &testServer{t: t, base: proc.Base, debug: proc.Debug, logs: proc.Logs, now: time.Now}
}

// metrics scrapes the operator listener's /metrics.
func (ts *testServer) metrics(t testing.TB) relaytest.Metrics {
	t.Helper()
	if ts.debug == "" {
		t.Fatal("the operator listener is off")
	}
	return relaytest.ScrapeMetrics(t, ts.debug+"/metrics")
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
	ct := "application/json"
	if len(contentType) > 0 {
		ct = contentType[0]
	}
	return c.send(method, path, body, ct, nil)
}

// send is do with an explicit Content-Type ("" sends none; so does an empty
// body) and extra headers.
func (c *client) send(method, path, body, contentType string, header map[string]string) response {
	c.t.Helper()
	r, err := c.try(method, path, body, contentType, header)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// try is send returning the error instead of failing the test, for use off
// the test's goroutine.
func (c *client) try(method, path, body, contentType string, header map[string]string) (response, error) {
	h := http.Header{}
	if body != "" && contentType != "" {
		h.Set("Content-Type", contentType)
	}
	for k, v := range header {
		h[http.CanonicalHeaderKey(k)] = []string{v}
	}
	return request(c.http, method, c.ts.base+path, body, h)
}

// parallel sends n copies of one request at once and returns the answers.
func (c *client) parallel(t testing.TB, n int, method, path, body string) []response {
	t.Helper()
	out := make([]response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			out[i], errs[i] = c.try(method, path, body, "application/json", nil)
		}(i)
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// request is relaytest.Do answering this package's response.
func request(hc *http.Client, method, url, body string, header http.Header) (response, error) {
	r, err := relaytest.Do(hc, method, url, body, header)
	return response{status: r.Status, header: r.Header, raw: r.Raw, json: r.JSON}, err
}

// getText GETs url with the default client and returns status and body.
func getText(t testing.TB, url string) (int, string) {
	t.Helper()
	r, err := request(nil, "GET", url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r.status, r.raw
}

// withStacks is an error whose text ends with every goroutine's stack,
// taken only when it is printed (a failing poll would take it every time).
type withStacks string

func (e withStacks) Error() string {
	buf := make([]byte, 1<<20)
	return string(e) + "\n" + string(buf[:runtime.Stack(buf, true)])
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
