package relaytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is a relay serving on loopback, as the tests see it from outside:
// its listeners, its log and its clock. It is the real binary (ServerOf) or
// a server the test started in its own process.
type Server struct {
	T     testing.TB
	Base  string           // http://127.0.0.1:PORT
	Debug string           // http://127.0.0.1:PORT of the operator listener; "" when it is off
	Logs  *Buffer          // the server's log
	Now   func() time.Time // the server's clock
	// Shutdown stops a server the test started in its own process, for
	// Stop (nil for the binary, which Stop ends with SIGTERM).
	Shutdown func(context.Context) error

	proc    *Process // the binary, when it is one
	stopped bool     // by Stop
}

// Addr is the server's host:port, as a proxy or a dialer takes it.
func (s *Server) Addr() string { return strings.TrimPrefix(s.Base, "http://") }

// ServerOf is the binary proc behind the Server's helpers, for test t.
func ServerOf(t testing.TB, proc *Process) *Server {
	return &Server{T: t, Base: proc.Base, Debug: proc.Debug, Logs: proc.Logs, Now: time.Now, proc: proc}
}

// Stop ends the relay as an operator does (SIGTERM) and fails the test
// unless it exits 0 within 20 s; a server in the test's own process, unless
// its Shutdown succeeds within 10 s.
func (s *Server) Stop() {
	s.T.Helper()
	if err := s.stop(); err != nil {
		s.T.Fatal(err)
	}
}

func (s *Server) stop() error {
	if s.proc == nil {
		if s.Shutdown == nil {
			return errors.New("Stop: a server with neither a process nor a Shutdown")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		return nil
	}
	s.stopped = true
	s.proc.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.proc.Exited:
	case <-time.After(20 * time.Second):
		return fmt.Errorf("the relay did not exit within 20 s of SIGTERM:\n%s", s.Logs)
	}
	if code := s.proc.Cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("the relay exited %d after SIGTERM:\n%s", code, s.Logs)
	}
	return nil
}

// Metrics scrapes the operator listener's /metrics.
func (s *Server) Metrics(t testing.TB) Metrics {
	t.Helper()
	if s.Debug == "" {
		t.Fatal("the operator listener is off")
	}
	return ScrapeMetrics(t, s.Debug+"/metrics")
}

// Client is an HTTP client with its own cookie jar, like one browser.
type Client struct {
	T      testing.TB
	Server *Server
	HTTP   *http.Client
}

// Client is a fresh client of the server, with an empty cookie jar.
func (s *Server) Client() *Client {
	jar, _ := cookiejar.New(nil)
	return &Client{T: s.T, Server: s, HTTP: &http.Client{Jar: jar, Timeout: 10 * time.Second}}
}

// ClientFrom is a client whose connections come from ip, one of the loopback
// addresses 127.0.0.0/8 (Linux answers on all of them).
func (s *Server) ClientFrom(ip string) *Client {
	jar, _ := cookiejar.New(nil)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	s.T.Cleanup(tr.CloseIdleConnections)
	return &Client{T: s.T, Server: s, HTTP: &http.Client{Jar: jar, Transport: tr, Timeout: 20 * time.Second}}
}

// SessionCookie is the name of the dashboard's session cookie.
const SessionCookie = "service_session"

// WithCookie is a fresh client whose jar holds the session cookie value.
func (s *Server) WithCookie(value string) *Client {
	c := s.Client()
	u, err := url.Parse(s.Base)
	if err != nil {
		s.T.Fatal(err)
	}
	c.HTTP.Jar.SetCookies(u, []*http.Cookie{{Name: SessionCookie, Value: value, Path: "/"}})
	return c
}

// Signup creates and logs in a user (with Password) with a fresh cookie jar.
func (s *Server) Signup(email string) *Client {
	s.T.Helper()
	c := s.Client()
	r := c.Do("POST", "/api/auth/signup", `{"email":"`+email+`","password":"`+Password+`"}`)
	if r.Status != http.StatusCreated {
		s.T.Fatalf("signup %s: %d %s", email, r.Status, r.Raw)
	}
	return c
}

// On returns the client c reporting to t (same cookie jar), for subtests.
func (c *Client) On(t testing.TB) *Client {
	cc := *c
	cc.T = t
	return &cc
}

// Do sends body (as application/json unless contentType says otherwise; ""
// body sends none) and decodes the answer.
func (c *Client) Do(method, path, body string, contentType ...string) Response {
	c.T.Helper()
	ct := "application/json"
	if len(contentType) > 0 {
		ct = contentType[0]
	}
	return c.Send(method, path, body, ct, nil)
}

// Send is Do with an explicit Content-Type ("" sends none; so does an empty
// body) and extra headers.
func (c *Client) Send(method, path, body, contentType string, header map[string]string) Response {
	c.T.Helper()
	r, err := c.Try(method, path, body, contentType, header)
	if err != nil {
		c.T.Fatal(err)
	}
	return r
}

// Try is Send returning the error instead of failing the test, for use off
// the test's goroutine.
func (c *Client) Try(method, path, body, contentType string, header map[string]string) (Response, error) {
	h := http.Header{}
	if body != "" && contentType != "" {
		h.Set("Content-Type", contentType)
	}
	for k, v := range header {
		h[http.CanonicalHeaderKey(k)] = []string{v}
	}
	return Do(c.HTTP, method, c.Server.Base+path, body, h)
}

// Parallel sends n copies of one request at once and returns the answers.
func (c *Client) Parallel(t testing.TB, n int, method, path, body string) []Response {
	t.Helper()
	out := make([]Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			out[i], errs[i] = c.Try(method, path, body, "application/json", nil)
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

// BearerPost posts a JSON body with Authorization: Bearer key ("" sends none).
func (c *Client) BearerPost(path, key, body string) Response {
	c.T.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		h["Authorization"] = "Bearer " + key
	}
	return c.Send("POST", path, body, "", h)
}

// BearerGet sends a GET with Authorization: Bearer key ("" sends none).
func (c *Client) BearerGet(path, key string) Response {
	c.T.Helper()
	h := map[string]string{}
	if key != "" {
		h["Authorization"] = "Bearer " + key
	}
	return c.Send("GET", path, "", "", h)
}

// Emit posts to /emit with a bearer key ("" sends no Authorization header).
func (c *Client) Emit(secretKey, body string) Response {
	c.T.Helper()
	return c.BearerPost("/emit", secretKey, body)
}

// EmitNoFail is Emit that reports a refused connection as status 0; it never
// fails the test, so it also serves off the test's goroutine.
func (c *Client) EmitNoFail(secretKey, body string) Response {
	r, _ := c.Try("POST", "/emit", body, "", map[string]string{"Authorization": "Bearer " + secretKey})
	return r
}

// Revoke posts to /emit-tokens/revoke with a bearer key.
func (c *Client) Revoke(secretKey, body string) Response {
	c.T.Helper()
	return c.BearerPost("/emit-tokens/revoke", secretKey, body)
}

// Project is a created project and its raw keys.
type Project struct {
	ID, PublicKey, SecretKey string
}

// CreateProject creates a project named name.
func (c *Client) CreateProject(name string) Project {
	c.T.Helper()
	r := c.Do("POST", "/api/projects", `{"name":"`+name+`"}`)
	p := Project{ID: r.Str("project", "id"), PublicKey: r.Str("keys", "publicKey"), SecretKey: r.Str("keys", "secretKey")}
	if r.Status != http.StatusCreated || p.ID == "" || p.PublicKey == "" || p.SecretKey == "" {
		c.T.Fatalf("create project: %d %s", r.Status, r.Raw)
	}
	return p
}

// HealthFigures is one window of GET /api/projects/{id}/health.
type HealthFigures struct {
	Emits                 int64    `json:"emits"`
	EmitsHTTP             int64    `json:"emitsHttp"`
	EmitsClient           int64    `json:"emitsClient"`
	Deliveries            int64    `json:"deliveries"`
	Dropped               int64    `json:"dropped"`
	SlowClosed            int64    `json:"slowConsumersClosed"`
	ChannelRateLimited    int64    `json:"channelRateLimited"`
	ProjectRateLimited    int64    `json:"projectRateLimited"`
	ClientEmitRateLimited int64    `json:"clientEmitRateLimited"`
	LatencySamples        int64    `json:"latencySamples"`
	P50                   *float64 `json:"latencyP50Ms"`
	P99                   *float64 `json:"latencyP99Ms"`
}

// HealthReply is the body of GET /api/projects/{id}/health.
type HealthReply struct {
	ProjectID   string        `json:"projectId"`
	At          string        `json:"at"`
	Connections int           `json:"connections"`
	LastMinute  HealthFigures `json:"lastMinute"`
	LastHour    HealthFigures `json:"lastHour"`
}

// Health reads a project's health; anything but a 200 fails the test.
func (c *Client) Health(projectID string) HealthReply {
	c.T.Helper()
	r := c.Do("GET", "/api/projects/"+projectID+"/health", "")
	if r.Status != http.StatusOK {
		c.T.Fatalf("health: %d %s", r.Status, r.Raw)
	}
	var h HealthReply
	if err := json.Unmarshal([]byte(r.Raw), &h); err != nil {
		c.T.Fatalf("health body %s: %v", r.Raw, err)
	}
	return h
}

// Expect fails unless the reply has the status and exactly the JSON body want.
func (r Response) Expect(t testing.TB, status int, want string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d; body %s", r.Status, status, r.Raw)
	}
	var got, exp any
	if err := json.Unmarshal([]byte(r.Raw), &got); err != nil {
		t.Fatalf("body is not JSON: %q", r.Raw)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatalf("bad expectation %q: %v", want, err)
	}
	if g, e := Canonical(got), Canonical(exp); g != e {
		t.Fatalf("body %s, want %s", g, e)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
}

// Str digs a string out of the decoded JSON by path: r.Str("project", "id").
func (r Response) Str(path ...string) string {
	var v any = r.JSON
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	s, _ := v.(string)
	return s
}

// Canonical is v as compact JSON with sorted object keys, to compare JSON
// values whatever their spacing and key order.
func Canonical(v any) string { b, _ := json.Marshal(v); return string(b) }

// Num is m[k] as a number (0 when it is not one).
func Num(m map[string]any, k string) float64 { f, _ := m[k].(float64); return f }

// GetText GETs url with the default client and returns status and body.
func GetText(t testing.TB, url string) (int, string) {
	t.Helper()
	r, err := Do(nil, "GET", url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r.Status, r.Raw
}

// Budget checks one {limit, remaining, resetAt} object of r; resetAt is the
// end of the fixed one-minute window that now (the server's clock) is in.
func Budget(t testing.TB, now time.Time, r Response, field string, limit, remaining int) {
	t.Helper()
	b, _ := r.JSON[field].(map[string]any)
	if b == nil {
		t.Fatalf("%s missing: %s", field, r.Raw)
	}
	reset, err := time.Parse(time.RFC3339, b["resetAt"].(string))
	want := now.Truncate(time.Minute).Add(time.Minute)
	if int(Num(b, "limit")) != limit || int(Num(b, "remaining")) != remaining || err != nil || !reset.Equal(want) {
		t.Fatalf("%s = %v, want limit %d remaining %d resetAt %v (%v)", field, b, limit, remaining, want.UTC(), err)
	}
}

// EmitFrame is a client emit of payload (JSON) as typ on channel, with the
// client-emit token.
func EmitFrame(channel, typ, payload, token string) string {
	return `{"action":"emit","channel":"` + channel + `","type":"` + typ + `","payload":` + payload + `,"token":"` + token + `"}`
}

// AuthorizationBody is the exact body of the authorization routes with no
// channel marked private.
func AuthorizationBody(on bool, secret, previousUntil, jwksURL any) string {
	return JSON(map[string]any{"authorization": on, "secret": secret, "previousSecretExpiresAt": previousUntil, "jwksUrl": jwksURL,
		"privateChannels": []string{}})
}
