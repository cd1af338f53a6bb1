package webhooks

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestWebhooksConnectAndDisconnect(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := relaytest.Start(t, url, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		rec := relaytest.NewReceiver(t, "", 0)
		rec.SetSecret(owner.SetWebhook(t, p.ID, rec.URL+"/hook"))

		// Clean close with a status: the disconnect carries it.
		c := ts.DialWS(p.PublicKey)
		id := relaytest.CheckEvent(t, rec.Next(t), "connect", p.ID)
		c.SendRaw(relaytest.ClientFrame(0x8, true, append([]byte{0x0f, 0xa1}, "see you"...))) // 4001
		c.ExpectClose(4001, 5*time.Second)
		ev := rec.Next(t)
		if relaytest.CheckEvent(t, ev, "disconnect", p.ID, "disconnectStatusCode", "disconnectReason") != id ||
			ev["disconnectStatusCode"] != float64(4001) || ev["disconnectReason"] != "see you" {
			t.Fatalf("disconnect %v, want connection %s with 4001 see you", ev, id)
		}

		// Abrupt drop: a disconnect without a status.
		c2 := ts.DialWS(p.PublicKey)
		id2 := relaytest.CheckEvent(t, rec.Next(t), "connect", p.ID)
		if id2 == id {
			t.Fatal("connection ids repeat")
		}
		c2.Conn.UnderlyingConn().Close()
		if got := relaytest.CheckEvent(t, rec.Next(t), "disconnect", p.ID); got != id2 {
			t.Fatalf("disconnect for %s, want %s", got, id2)
		}
	})
}

func TestSlowWebhookDelaysNothing(t *testing.T) {
	// Not parallel: each handshake and emit within 1 s.
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_TIMEOUT_MS": "2000"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	rec := relaytest.NewReceiver(t, "", 10*time.Second)
	rec.SetSecret(owner.SetWebhook(t, p.ID, rec.URL))
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
	t.Parallel()
	// Down: nothing listens on the port.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	down := "http://" + ln.Addr().String() + "/hook"
	ln.Close()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true", "WEBHOOK_RETRY_MAX_ATTEMPTS": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	owner.SetWebhook(t, p.ID, down)
	c := ts.Subscribed(t, p.PublicKey, "a")
	c.Send(`{"action":"ping"}`)
	c.Expect(`{"action":"pong","ok":true}`)
	relaytest.Eventually(t, 5*time.Second, func() bool { return webhooks(t, ts, "failed") >= 1 }, "a failed delivery")

	// Private target with the default configuration: refused before connecting.
	ts2 := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner2 := ts2.Signup("alice@example.com")
	p2 := owner2.CreateProject("demo")
	rec := relaytest.NewReceiver(t, "", 0)
	rec.SetSecret(owner2.SetWebhook(t, p2.ID, rec.URL))
	ts2.Subscribed(t, p2.PublicKey, "a")
	relaytest.Eventually(t, 5*time.Second, func() bool { return webhooks(t, ts2, "refused") >= 1 }, "a refused delivery")
	select {
	case ev := <-rec.Events:
		t.Fatalf("a loopback receiver got %v without WEBHOOK_ALLOW_PRIVATE_ADDRESSES", ev)
	case <-time.After(200 * time.Millisecond):
	}
	if strings.Contains(ts2.Logs.String(), "level=ERROR") {
		t.Fatalf("errors logged:\n%s", ts2.Logs.String())
	}
}

// webhooks is how many webhook events ended with outcome, from the relay's
// /metrics (relay_webhooks_total; 0 before the first).
func webhooks(t *testing.T, ts *relaytest.Server, outcome string) float64 {
	v, _ := ts.Metrics(t).Value("relay_webhooks_total", `outcome="`+outcome+`"`)
	return v
}
