package relaytest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// WebhookSignature is the X-Service-Signature of body under secret, worked
// out here (HMAC-SHA256, hex, "sha256=" first), not by the relay's code.
func WebhookSignature(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// SignedWebhook tells whether req carries body's signature under secret,
// compared in constant time, as a receiver should.
func SignedWebhook(req *http.Request, secret string, body []byte) bool {
	return hmac.Equal([]byte(req.Header.Get("X-Service-Signature")), []byte(WebhookSignature(secret, body)))
}

// HookLog is a webhook endpoint that keeps every request's exact body and
// signature header, for tests that compare bodies byte for byte.
type HookLog struct {
	URL    string // where it listens, on loopback
	mu     sync.Mutex
	bodies []hookRequest
}

type hookRequest struct{ body, signature string }

// NewHookLog starts a HookLog, closed when t ends.
func NewHookLog(t testing.TB) *HookLog {
	h := &HookLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.bodies = append(h.bodies, hookRequest{string(body), r.Header.Get("X-Service-Signature")})
		h.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

var (
	hookTimestamp = regexp.MustCompile(`"timestamp":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"`)
	hookID        = regexp.MustCompile(`^\{"id":"([A-Za-z0-9_-]{22})",`) // 16 random bytes, base64url, first
)

// ChannelEvents takes the requests received so far that are not connect or
// disconnect, checks each signature against secret, each id (first, unique)
// and each timestamp (UTC, milliseconds, within the last minute), and
// returns the bodies with the id replaced by "I" and the timestamp by "T",
// in the order they arrived.
func (h *HookLog) ChannelEvents(t testing.TB, secret string) []string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	ids := map[string]bool{}
	for _, r := range h.bodies {
		if want := WebhookSignature(secret, []byte(r.body)); r.signature != want {
			t.Fatalf("signature %q on %s, want %q", r.signature, r.body, want)
		}
		var ev struct{ Event string }
		if err := json.Unmarshal([]byte(r.body), &ev); err != nil {
			t.Fatalf("not JSON: %s", r.body)
		}
		if ev.Event == "connect" || ev.Event == "disconnect" {
			continue
		}
		m := hookTimestamp.FindStringSubmatch(r.body)
		if m == nil {
			t.Fatalf("no timestamp in %s", r.body)
		}
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err != nil || time.Since(at) > time.Minute || time.Until(at) > time.Second {
			t.Fatalf("timestamp %s: %v", m[1], err)
		}
		id := hookID.FindStringSubmatch(r.body)
		if id == nil || ids[id[1]] {
			t.Fatalf("no id, or a repeated one, in %s", r.body)
		}
		ids[id[1]] = true
		body := hookID.ReplaceAllString(r.body, `{"id":"I",`)
		out = append(out, hookTimestamp.ReplaceAllString(body, `"timestamp":"T"`))
	}
	return out
}

// ExpectEvents waits until the channel and presence events received since
// the last call are exactly want (in any order: a project has two
// deliveries under way at once, so they may overtake each other).
func (h *HookLog) ExpectEvents(t testing.TB, secret string, seen *int, want ...string) {
	t.Helper()
	h.ExpectEventsQuiet(t, secret, seen, 100*time.Millisecond, want...)
}

// ExpectEventsQuiet is ExpectEvents with nothing more for quiet once they
// have come.
func (h *HookLog) ExpectEventsQuiet(t testing.TB, secret string, seen *int, quiet time.Duration, want ...string) {
	t.Helper()
	var got []string
	Within(5*time.Second, func() bool {
		got = h.ChannelEvents(t, secret)[*seen:]
		return len(got) >= len(want)
	})
	// Time by nature: and nothing more within quiet (polled, so that one
	// more ends the wait at once).
	Within(quiet, func() bool { return len(h.ChannelEvents(t, secret)) > *seen+len(want) })
	got = h.ChannelEvents(t, secret)[*seen:]
	a, b := slices.Clone(got), slices.Clone(want)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	*seen += len(got)
}

// ChannelHook is a channel event's body as ChannelEvents returns it.
func ChannelHook(kind, projectID, channel string) string {
	return fmt.Sprintf(`{"id":"I","event":%q,"projectId":%q,"channel":%q,"timestamp":"T"}`, kind, projectID, channel)
}

// MemberHook is a presence event's body as ChannelEvents returns it.
func MemberHook(kind, projectID, channel, clientID string) string {
	return fmt.Sprintf(`{"id":"I","event":%q,"projectId":%q,"channel":%q,"clientId":%q,"timestamp":"T"}`, kind, projectID, channel, clientID)
}

// Bodies is every request's body received so far, in order.
func (h *HookLog) Bodies() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, len(h.bodies))
	for i, r := range h.bodies {
		out[i] = r.body
	}
	return out
}

// Receiver is a webhook endpoint that checks every signature with a
// constant-time compare and hands over the events it accepted.
type Receiver struct {
	URL    string                 // where it listens, on loopback
	Events chan map[string]any    // the events accepted, in order
	Bad    chan string            // what it refused, and why
	secret atomic.Pointer[string] // the signing secret (SetSecret)
	delay  time.Duration
}

// NewReceiver starts a receiver checking signatures with secret ("": set
// it later with SetSecret, before any event can come); delay makes it a slow
// one, answering after delay. It is closed when t ends.
func NewReceiver(t testing.TB, secret string, delay time.Duration) *Receiver {
	r := &Receiver{Events: make(chan map[string]any, 100), Bad: make(chan string, 100), delay: delay}
	r.SetSecret(secret)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if !SignedWebhook(req, *r.secret.Load(), body) {
			r.Bad <- "bad signature on " + string(body)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.delay > 0 {
			select { // a slow receiver, until the sender gives up
			case <-time.After(r.delay):
			case <-req.Context().Done():
				return
			}
		}
		var ev map[string]any
		if err := json.Unmarshal(body, &ev); err != nil {
			r.Bad <- "not JSON: " + string(body)
		}
		r.Events <- ev
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// SetSecret is the signing secret the receiver checks from now on.
func (r *Receiver) SetSecret(secret string) { r.secret.Store(&secret) }

// Next is the next event accepted; a refusal, or none within 5 s, fails
// the test.
func (r *Receiver) Next(t testing.TB) map[string]any {
	t.Helper()
	select {
	case ev := <-r.Events:
		return ev
	case b := <-r.Bad:
		t.Fatal(b)
	case <-time.After(5 * time.Second):
		t.Fatal("no webhook within 5s")
	}
	return nil
}

// HookEventIDRe is an event's id: 16 random bytes, base64url.
var HookEventIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

// CheckEvent checks a connect or disconnect event's fields (the common
// ones, then fields) and values, and returns its connectionId.
func CheckEvent(t testing.TB, ev map[string]any, kind, projectID string, fields ...string) string {
	t.Helper()
	keys := map[string]bool{"id": true, "event": true, "projectId": true, "connectionId": true, "timestamp": true}
	for _, f := range fields {
		keys[f] = true
	}
	for k := range ev {
		if !keys[k] {
			t.Fatalf("unexpected field %q in %v", k, ev)
		}
	}
	if ev["event"] != kind || ev["projectId"] != projectID || len(ev) != len(keys) {
		t.Fatalf("event %v, want %s for %s with %v", ev, kind, projectID, fields)
	}
	if ts, err := time.Parse(time.RFC3339, ev["timestamp"].(string)); err != nil || time.Since(ts) > time.Minute {
		t.Fatalf("timestamp %v: %v", ev["timestamp"], err)
	}
	if id, _ := ev["id"].(string); !HookEventIDRe.MatchString(id) {
		t.Fatalf("event id %v in %v", ev["id"], ev)
	}
	id, _ := ev["connectionId"].(string)
	if id == "" {
		t.Fatalf("no connectionId in %v", ev)
	}
	return id
}

// SetWebhook sets the project's webhook URL through the settings API and
// returns the signing secret the relay made for it (GET …/webhook-secret).
// It does not wait for a running project to reload its settings: set it
// before the project has live traffic, or use SetWebhookEvents, which does.
func (c *Client) SetWebhook(t testing.TB, projectID, url string) (secret string) {
	t.Helper()
	return c.setWebhook(t, projectID, map[string]any{"webhookUrl": url})
}

// SetWebhookEvents is SetWebhook with the events sent beyond connect and
// disconnect; it returns once the project's actor, when it runs, has them
// (/debug/actors on the operator listener), as a dashboard user's next
// action would find them.
func (c *Client) SetWebhookEvents(t testing.TB, projectID, hookURL string, channel, presence bool) (secret string) {
	t.Helper()
	secret = c.setWebhook(t, projectID, map[string]any{"webhookUrl": hookURL, "webhookEvents": map[string]bool{"channel": channel, "presence": presence}})
	want := []string{}
	if channel {
		want = append(want, "channel")
	}
	if presence {
		want = append(want, "presence")
	}
	EventuallyNil(t, 5*time.Second, func() error {
		r, err := Do(nil, "GET", c.Server.Debug+"/debug/actors?project="+url.QueryEscape(projectID), "", nil)
		if err != nil {
			return err
		}
		if r.Status != http.StatusOK {
			return fmt.Errorf("/debug/actors: %d %s", r.Status, r.Raw)
		}
		var v struct {
			Projects []struct {
				WebhookEvents []string `json:"webhookEvents"`
			} `json:"projects"`
		}
		if err := json.Unmarshal([]byte(r.Raw), &v); err != nil {
			return fmt.Errorf("/debug/actors: %v: %s", err, r.Raw)
		}
		if len(v.Projects) > 0 && !slices.Equal(v.Projects[0].WebhookEvents, want) {
			return fmt.Errorf("webhook events %v, want %v", v.Projects[0].WebhookEvents, want)
		}
		return nil
	})
	return secret
}

func (c *Client) setWebhook(t testing.TB, projectID string, settings map[string]any) (secret string) {
	t.Helper()
	cc := c.On(t)
	if r := cc.Do("PATCH", "/api/projects/"+projectID+"/settings", JSON(settings)); r.Status != http.StatusOK {
		t.Fatalf("set the webhook: %d %s", r.Status, r.Raw)
	}
	r := cc.Do("GET", "/api/projects/"+projectID+"/webhook-secret", "")
	if secret = r.Str("webhookSecret"); r.Status != http.StatusOK || secret == "" {
		t.Fatalf("the webhook secret: %d %s", r.Status, r.Raw)
	}
	return secret
}

// ScriptedRequest is one request a ScriptedReceiver got: its body, its
// X-Relay-Event-Id header and the body decoded; Bad says what was wrong
// with it ("" for nothing: signed with the secret, and JSON).
type ScriptedRequest struct {
	Body, IDHeader string
	Event          map[string]any
	Bad            string
}

// ScriptedReceiver is a webhook endpoint that answers each request with the
// next status of its script (the last one repeats), after checking its
// signature, and hands over the requests.
type ScriptedReceiver struct {
	URL      string
	secret   atomic.Pointer[string]
	mu       sync.Mutex
	statuses []int
	got      chan ScriptedRequest
}

// NewScriptedReceiver starts a receiver checking signatures with secret
// ("": set it with SetSecret before any event can come) and answering with
// statuses. It is closed when t ends.
func NewScriptedReceiver(t testing.TB, secret string, statuses ...int) *ScriptedReceiver {
	r := &ScriptedReceiver{statuses: statuses, got: make(chan ScriptedRequest, 1000)}
	r.SetSecret(secret)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		sr := ScriptedRequest{Body: string(body), IDHeader: req.Header.Get("X-Relay-Event-Id")}
		if err := json.Unmarshal(body, &sr.Event); err != nil {
			sr.Bad = "not JSON: " + string(body)
		}
		if !SignedWebhook(req, *r.secret.Load(), body) {
			sr.Bad = "bad signature on " + string(body)
		}
		r.mu.Lock()
		status := r.statuses[0]
		if len(r.statuses) > 1 {
			r.statuses = r.statuses[1:]
		}
		r.mu.Unlock()
		select {
		case r.got <- sr:
		default:
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// SetSecret sets the secret signatures are checked with.
func (r *ScriptedReceiver) SetSecret(secret string) { r.secret.Store(&secret) }

// Next is the next request; a bad one, or none within 10 s, fails the test.
func (r *ScriptedReceiver) Next(t testing.TB) ScriptedRequest {
	t.Helper()
	select {
	case sr := <-r.got:
		if sr.Bad != "" {
			t.Fatal(sr.Bad)
		}
		return sr
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook within 10 s")
	}
	return ScriptedRequest{}
}

// HangingReceiver is a webhook endpoint that accepts and reads every
// request and never answers until the test ends; it counts the requests.
// Start it after the server: its cleanup then runs first, so the server's
// shutdown does not wait on it.
func HangingReceiver(t testing.TB) (url string, requests *atomic.Int64) {
	hang := make(chan struct{})
	requests = &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) }) // before srv.Close, which waits for the handlers
	return srv.URL, requests
}

// Delivery is one entry of GET …/webhook-deliveries.
type Delivery struct {
	ID            string  `json:"id"`
	Event         string  `json:"event"`
	CreatedAt     string  `json:"createdAt"`
	Status        string  `json:"status"`
	Attempts      int     `json:"attempts"`
	StatusCode    *int    `json:"statusCode"`
	LastError     *string `json:"lastError"`
	LastAttemptAt *string `json:"lastAttemptAt"`
	NextAttemptAt *string `json:"nextAttemptAt"`
}

// Deliveries lists projectID's deliveries through the API.
func (c *Client) Deliveries(projectID string) []Delivery {
	c.T.Helper()
	r := c.Do("GET", "/api/projects/"+projectID+"/webhook-deliveries", "")
	var out struct{ Deliveries []Delivery }
	if r.Status != http.StatusOK || json.Unmarshal([]byte(r.Raw), &out) != nil {
		c.T.Fatalf("deliveries: %d %s", r.Status, r.Raw)
	}
	return out.Deliveries
}

// WaitDelivery polls the API until the delivery with id satisfies ok.
func (c *Client) WaitDelivery(projectID, id string, within time.Duration, ok func(Delivery) bool) Delivery {
	c.T.Helper()
	var found Delivery
	EventuallyNil(c.T, within, func() error {
		for _, d := range c.Deliveries(projectID) {
			if d.ID == id {
				found = d
				if ok(d) {
					return nil
				}
				return fmt.Errorf("delivery %+v", d)
			}
		}
		return fmt.Errorf("no delivery %s", id)
	})
	return found
}

var (
	deliveryIDRe   = regexp.MustCompile(`"id":"([A-Za-z0-9_-]{22})"`)
	deliveryTimeRe = regexp.MustCompile(`"(createdAt|lastAttemptAt|timestamp)":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"`)
)

// Masked is a delivery's or an event's JSON with its event ids replaced by
// I and its times by T, to compare whole bodies.
func Masked(body string) string {
	return deliveryTimeRe.ReplaceAllString(deliveryIDRe.ReplaceAllString(body, `"id":"I"`), `"$1":"T"`)
}

// Got is a request already received and not yet taken, if any: Next
// without the wait (and without the check: see Bad).
func (r *ScriptedReceiver) Got() (ScriptedRequest, bool) {
	select {
	case sr := <-r.got:
		return sr, true
	default:
		return ScriptedRequest{}, false
	}
}
