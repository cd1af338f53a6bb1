package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// receiver is a webhook endpoint that checks every signature with a
// constant-time compare and hands over the events it accepted.
type receiver struct {
	srv    *httptest.Server
	secret string
	events chan map[string]any
	bad    chan string
	delay  time.Duration
}

func newReceiver(t *testing.T, secret string, delay time.Duration) *receiver {
	r := &receiver{secret: secret, events: make(chan map[string]any, 100), bad: make(chan string, 100), delay: delay}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		mac := hmac.New(sha256.New, []byte(r.secret))
		mac.Write(body)
		want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
		if !hmac.Equal([]byte(req.Header.Get("X-Service-Signature")), []byte(want)) {
			r.bad <- "bad signature on " + string(body)
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
			r.bad <- "not JSON: " + string(body)
		}
		r.events <- ev
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case ev := <-r.events:
		return ev
	case b := <-r.bad:
		t.Fatal(b)
	case <-time.After(5 * time.Second):
		t.Fatal("no webhook within 5s")
	}
	return nil
}

// setWebhook stores a project's webhook settings (the dashboard's job) in the
// server's own store, before the project has any live traffic.
func setWebhook(t *testing.T, ts *testServer, projectID, url, secret string) {
	t.Helper()
	if err := ts.app.store.SaveSettings(context.Background(), store.Settings{ProjectID: projectID, WebhookURL: url, WebhookSecret: secret}); err != nil {
		t.Fatal(err)
	}
	ts.app.actors.SettingsChanged(projectID)
}

// hookEventIDRe is an event's id: 16 random bytes, base64url.
var hookEventIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

func checkEvent(t *testing.T, ev map[string]any, kind, projectID string, fields ...string) string {
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
	if id, _ := ev["id"].(string); !hookEventIDRe.MatchString(id) {
		t.Fatalf("event id %v in %v", ev["id"], ev)
	}
	id, _ := ev["connectionId"].(string)
	if id == "" {
		t.Fatalf("no connectionId in %v", ev)
	}
	return id
}

func TestWebhooksConnectAndDisconnect(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		p := ts.Signup("alice@example.com").CreateProject("demo")
		rec := newReceiver(t, "whsec-test", 0)
		setWebhook(t, ts, p.ID, rec.srv.URL+"/hook", "whsec-test")

		// Clean close with a status: the disconnect carries it.
		c := ts.DialWS(p.PublicKey)
		id := checkEvent(t, rec.next(t), "connect", p.ID)
		c.SendRaw(relaytest.ClientFrame(0x8, true, append([]byte{0x0f, 0xa1}, "see you"...))) // 4001
		c.ExpectClose(4001, 5*time.Second)
		ev := rec.next(t)
		if checkEvent(t, ev, "disconnect", p.ID, "disconnectStatusCode", "disconnectReason") != id ||
			ev["disconnectStatusCode"] != float64(4001) || ev["disconnectReason"] != "see you" {
			t.Fatalf("disconnect %v, want connection %s with 4001 see you", ev, id)
		}

		// Abrupt drop: a disconnect without a status.
		c2 := ts.DialWS(p.PublicKey)
		id2 := checkEvent(t, rec.next(t), "connect", p.ID)
		if id2 == id {
			t.Fatal("connection ids repeat")
		}
		c2.Conn.UnderlyingConn().Close()
		if got := checkEvent(t, rec.next(t), "disconnect", p.ID); got != id2 {
			t.Fatalf("disconnect for %s, want %s", got, id2)
		}
	})
}

func TestSlowWebhookDelaysNothing(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_TIMEOUT_MS": "2000"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	rec := newReceiver(t, "s", 10*time.Second)
	setWebhook(t, ts, p.ID, rec.srv.URL, "s")
	listener := ts.Subscribed(t, p.PublicKey, "a")
	for i := range 20 {
		start := time.Now()
		c := ts.Subscribed(t, p.PublicKey, "a")
		if d := time.Since(start); d > time.Second {
			t.Fatalf("handshake %d took %v behind a 10 s webhook receiver", i, d)
		}
		c.Conn.Close()
	}
	start := time.Now()
	r := owner.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
	listener.ExpectExcept(`{"channel":"a","payload":1}`, "seq")
	if d := time.Since(start); d > time.Second || r.Status != 200 {
		t.Fatalf("emit took %v (%d)", d, r.Status)
	}
}

func TestWebhookReceiverDownOrPrivate(t *testing.T) {
	// Down: nothing listens on the port.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	down := "http://" + ln.Addr().String() + "/hook"
	ln.Close()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_RETRY_MAX_ATTEMPTS": "1"})
	p := ts.Signup("alice@example.com").CreateProject("demo")
	setWebhook(t, ts, p.ID, down, "s")
	c := ts.Subscribed(t, p.PublicKey, "a")
	c.Send(`{"action":"ping"}`)
	c.Expect(`{"action":"pong","ok":true}`)
	relaytest.Eventually(t, 5*time.Second, func() bool { return ts.app.webhooks.Stats().Failed >= 1 }, "a failed delivery")

	// Private target with the default configuration: refused before connecting.
	ts2 := startServer(t, storetest.SQLiteURL(t), nil)
	p2 := ts2.Signup("alice@example.com").CreateProject("demo")
	rec := newReceiver(t, "s", 0)
	setWebhook(t, ts2, p2.ID, rec.srv.URL, "s")
	ts2.Subscribed(t, p2.PublicKey, "a")
	relaytest.Eventually(t, 5*time.Second, func() bool { return ts2.app.webhooks.Stats().Refused >= 1 }, "a refused delivery")
	select {
	case ev := <-rec.events:
		t.Fatalf("a loopback receiver got %v without WEBHOOK_ALLOW_PRIVATE_ADDRESSES", ev)
	case <-time.After(200 * time.Millisecond):
	}
	if strings.Contains(ts2.Logs.String(), "level=ERROR") {
		t.Fatalf("errors logged:\n%s", ts2.Logs.String())
	}
}
