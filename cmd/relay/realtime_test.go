package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// emit posts to /emit with a bearer key ("" sends no Authorization header).
func (c *client) emit(secretKey, body string) response {
	c.t.Helper()
	return c.bearerPost("/emit", secretKey, body)
}

// bearerPost posts a JSON body with Authorization: Bearer key ("" sends none).
func (c *client) bearerPost(path, key, body string) response {
	c.t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		h["Authorization"] = "Bearer " + key
	}
	return c.send("POST", path, body, "", h)
}

func num(m map[string]any, k string) float64 { f, _ := m[k].(float64); return f }

func TestSubscribeAndEmit(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")

		sub := ts.dialWS(p.publicKey)
		sub.send(`{"action":"subscribe","channel":"room:1"}`)
		sub.expect(`{"action":"subscribe","channel":"room:1","ok":true}`)

		r := owner.emit(p.secretKey, `{"channel":"room:1","payload":{"text":"hi", "n": [1, 2]}}`)
		if r.status != 200 {
			t.Fatalf("emit: %d %s", r.status, r.raw)
		}
		seq := num(r.json, "seq")
		if r.json["ok"] != true || r.json["channel"] != "room:1" || num(r.json, "delivered") != 1 || num(r.json, "subscriberCount") != 1 || seq <= 0 {
			t.Fatalf("emit body: %s", r.raw)
		}
		for _, k := range []string{"rate_limit", "project_rate_limit"} {
			b, _ := r.json[k].(map[string]any)
			if b == nil || num(b, "limit") == 0 || b["resetAt"] == nil {
				t.Fatalf("%s missing or malformed in %s", k, r.raw)
			}
		}
		sub.expect(fmt.Sprintf(`{"channel":"room:1","payload":{"text":"hi","n":[1,2]},"seq":%d}`, int64(seq)))

		r2 := owner.emit(p.secretKey, `{"channel":"room:1","payload":2}`)
		if num(r2.json, "seq") <= seq {
			t.Fatalf("seq did not increase: %v then %v", seq, r2.json["seq"])
		}
		sub.expect(fmt.Sprintf(`{"channel":"room:1","payload":2,"seq":%d}`, int64(num(r2.json, "seq"))))

		sub.send(`{"action":"ping"}`)
		sub.expect(`{"action":"pong","ok":true}`)
		sub.send(`{"action":"unsubscribe","channel":"room:1"}`)
		sub.expect(`{"action":"unsubscribe","channel":"room:1","ok":true}`)
		if r := owner.emit(p.secretKey, `{"channel":"room:1","payload":3}`); num(r.json, "delivered") != 0 || num(r.json, "subscriberCount") != 0 {
			t.Fatalf("after unsubscribe: %s", r.raw)
		}
		sub.expectSilence(200 * time.Millisecond)
	})
}

func TestHandshakeAuthentication(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")
		for name, key := range map[string]string{"missing": "", "unknown": "pk_live_nope", "secret key": p.secretKey} {
			if _, status, err := ts.tryDialWS(key); status != http.StatusUnauthorized {
				t.Fatalf("%s key: status %d (%v), want 401", name, status, err)
			}
		}
		ts.dialWS(p.publicKey) // the real key works

		// Revoke the public key: the very next handshake fails.
		keys := owner.do("GET", "/api/projects/"+p.id+"/keys", "")
		var pubID string
		for _, k := range keys.json["keys"].([]any) {
			if k := k.(map[string]any); k["keyType"] == "public" {
				pubID = k["id"].(string)
			}
		}
		owner.do("POST", "/api/projects/"+p.id+"/keys/"+pubID+"/revoke", "").expect(t, 200, `{"ok":true}`)
		if _, status, _ := ts.tryDialWS(p.publicKey); status != http.StatusUnauthorized {
			t.Fatalf("revoked key: status %d, want 401", status)
		}
		// Rotation: the new key works at once, the old one stays refused.
		rot := owner.do("POST", "/api/projects/"+p.id+"/keys", `{"keyType":"public"}`)
		ts.dialWS(rot.str("key", "raw"))

		// A plain GET without the upgrade headers is not a WebSocket.
		res, err := http.Get(ts.base + "/ws?publicKey=" + rot.str("key", "raw"))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain GET /ws: %d, want 400", res.StatusCode)
		}
	})
}

func TestEmitErrors(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")
		c := ts.client()

		c.emit("", `{"channel":"a","payload":1}`).expect(t, 401, `{"error":"missing_secret_key"}`)
		c.emit("sk_live_unknown", `{"channel":"a","payload":1}`).expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.emit(p.publicKey, `{"channel":"a","payload":1}`).expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.emit(p.secretKey, `{"channel":"a",`).expect(t, 400, `{"error":"invalid_json"}`)
		c.emit(p.secretKey, `[1,2]`).expect(t, 400, `{"error":"invalid_json"}`)
		c.emit(p.secretKey, ``).expect(t, 400, `{"error":"invalid_json"}`)
		c.emit(p.secretKey, `{"channel":"bad channel!","payload":1}`).expect(t, 400, `{"error":"invalid_channel","channel":"bad channel!"}`)
		c.emit(p.secretKey, `{"channel":"","payload":1}`).expect(t, 400, `{"error":"invalid_channel","channel":""}`)
		c.emit(p.secretKey, `{"payload":1}`).expect(t, 400, `{"error":"invalid_channel","channel":""}`)
		long := strings.Repeat("a", 201)
		c.emit(p.secretKey, `{"channel":"`+long+`","payload":1}`).expect(t, 400, `{"error":"invalid_channel","channel":"`+long+`"}`)
		if r := c.emit(p.secretKey, `{"channel":"`+long[:200]+`","payload":1}`); r.status != 200 {
			t.Fatalf("200-char channel: %d %s", r.status, r.raw)
		}

		// Size is measured on the serialized {"channel":…,"payload":…}: exactly
		// at the cap passes, one byte over is refused.
		overhead := len(`{"channel":"big","payload":""}`)
		fill := strings.Repeat("x", 131072-overhead)
		if r := c.emit(p.secretKey, `{"channel":"big","payload":"`+fill+`"}`); r.status != 200 {
			t.Fatalf("message of exactly 131072 bytes: %d %s", r.status, r.raw)
		}
		c.emit(p.secretKey, `{"channel":"big","payload":"`+fill+`x"}`).expect(t, 413, `{"error":"payload_too_large","max_bytes":131072}`)
		c.emit(p.secretKey, `{"channel":"big","payload":"`+strings.Repeat("y", 2<<20)+`"}`).expect(t, 413, `{"error":"payload_too_large","max_bytes":131072}`)

		// Rotating the secret key: the old one fails on the very next request.
		rot := owner.do("POST", "/api/projects/"+p.id+"/keys", `{"keyType":"secret"}`)
		c.emit(p.secretKey, `{"channel":"a","payload":1}`).expect(t, 401, `{"error":"invalid_secret_key"}`)
		if r := c.emit(rot.str("key", "raw"), `{"channel":"a","payload":1}`); r.status != 200 {
			t.Fatalf("rotated key: %d %s", r.status, r.raw)
		}
		// Deleting the project: its keys fail at once.
		owner.do("DELETE", "/api/projects/"+p.id, "").expect(t, 200, `{"ok":true}`)
		c.emit(rot.str("key", "raw"), `{"channel":"a","payload":1}`).expect(t, 401, `{"error":"invalid_secret_key"}`)
	})
}

// budget checks one {limit, remaining, resetAt} object; resetAt is the end
// of the fixed one-minute window that now (the server's clock) is in.
func budget(t *testing.T, now time.Time, r response, field string, limit, remaining int) {
	t.Helper()
	b, _ := r.json[field].(map[string]any)
	if b == nil {
		t.Fatalf("%s missing: %s", field, r.raw)
	}
	reset, err := time.Parse(time.RFC3339, b["resetAt"].(string))
	want := now.Truncate(time.Minute).Add(time.Minute)
	if int(num(b, "limit")) != limit || int(num(b, "remaining")) != remaining || err != nil || !reset.Equal(want) {
		t.Fatalf("%s = %v, want limit %d remaining %d resetAt %v (%v)", field, b, limit, remaining, want.UTC(), err)
	}
}

func TestEmitRateLimits(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		// Fixed windows on minute boundaries: the clock stands still inside one.
		clock := newClock()
		ts := startServerAt(t, url, map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "3", "PROJECT_RATE_LIMIT_PER_MINUTE": "5"}, clock.Now)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")
		c := ts.client()
		for i := range 3 {
			r := c.emit(p.secretKey, `{"channel":"a","payload":1}`)
			if r.status != 200 {
				t.Fatalf("emit %d: %d %s", i, r.status, r.raw)
			}
			budget(t, clock.Now(), r, "rate_limit", 3, 2-i)
			budget(t, clock.Now(), r, "project_rate_limit", 5, 4-i)
		}
		r := c.emit(p.secretKey, `{"channel":"a","payload":1}`)
		if r.status != 429 || r.json["error"] != "channel_rate_limited" || len(r.json) != 3 {
			t.Fatalf("4th emit on a: %d %s", r.status, r.raw)
		}
		budget(t, clock.Now(), r, "rate_limit", 3, 0)
		budget(t, clock.Now(), r, "project_rate_limit", 5, 2) // a refused emit does not use the backstop

		// Another channel has its own budget; the project backstop still counts.
		for i := range 2 {
			if r := c.emit(p.secretKey, `{"channel":"b","payload":1}`); r.status != 200 {
				t.Fatalf("emit b %d: %d %s", i, r.status, r.raw)
			}
		}
		r = c.emit(p.secretKey, `{"channel":"c","payload":1}`)
		if r.status != 429 || r.json["error"] != "project_rate_limited" || len(r.json) != 3 {
			t.Fatalf("6th emit in project: %d %s", r.status, r.raw)
		}
		budget(t, clock.Now(), r, "rate_limit", 3, 3)
		budget(t, clock.Now(), r, "project_rate_limit", 5, 0)
	})
}

func TestWebSocketErrors(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		p := ts.signup("alice@example.com").createProject("demo")
		ws := ts.dialWS(p.publicKey)
		ws.send(`{"action":`)
		ws.expect(`{"error":"invalid_json"}`)
		ws.send(`"subscribe"`)
		ws.expect(`{"error":"invalid_json"}`)
		ws.send(`{"action":"dance"}`)
		ws.expect(`{"error":"unknown_action"}`)
		ws.send(`{"channel":"a"}`)
		ws.expect(`{"error":"unknown_action"}`)
		ws.send(`{"action":"subscribe","channel":"no spaces"}`)
		ws.expect(`{"error":"invalid_channel","channel":"no spaces"}`)
		ws.send(`{"action":"unsubscribe","channel":"é"}`)
		ws.expect(`{"error":"invalid_channel","channel":"é"}`)
		ws.send(`{"action":"subscribe"}`)
		ws.expect(`{"error":"invalid_channel","channel":""}`)
		ws.send(`{"action":"subscribe","channel":"a","presence":true}`)
		ws.expect(`{"error":"client_id_required","channel":"a"}`)
		ws.send(`{"action":"subscribe","channel":"a","since":"yesterday"}`)
		ws.expect(`{"error":"invalid_since","channel":"a"}`)
		// The connection is still usable after every error.
		ws.send(`{"action":"ping"}`)
		ws.expect(`{"action":"pong","ok":true}`)
	})
}

func TestFanOutToManySubscribers(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")
		other := owner.createProject("other")
		const n = 50
		subs := make([]*wsClient, n)
		for i := range subs {
			subs[i] = ts.dialWS(p.publicKey)
			subs[i].send(`{"action":"subscribe","channel":"news"}`)
			subs[i].expect(`{"action":"subscribe","channel":"news","ok":true}`)
		}
		// Same channel name in another project: isolated.
		stranger := ts.dialWS(other.publicKey)
		stranger.send(`{"action":"subscribe","channel":"news"}`)
		stranger.expect(`{"action":"subscribe","channel":"news","ok":true}`)

		r := owner.emit(p.secretKey, `{"channel":"news","payload":"x"}`)
		if num(r.json, "delivered") != n || num(r.json, "subscriberCount") != n {
			t.Fatalf("emit: %s", r.raw)
		}
		for _, s := range subs {
			s.expect(fmt.Sprintf(`{"channel":"news","payload":"x","seq":%d}`, int64(num(r.json, "seq"))))
		}
		stranger.expectSilence(200 * time.Millisecond)

		// A subscriber that goes away is no longer counted.
		subs[0].conn.Close()
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r = owner.emit(p.secretKey, `{"channel":"news","payload":"y"}`)
			return num(r.json, "subscriberCount") == n-1
		}, "closed subscriber no longer counted")
	})
}

func TestProjectDeletedClosesConnections(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")
		ws := ts.dialWS(p.publicKey)
		ws.send(`{"action":"subscribe","channel":"a"}`)
		ws.expect(`{"action":"subscribe","channel":"a","ok":true}`)
		owner.do("DELETE", "/api/projects/"+p.id, "").expect(t, 200, `{"ok":true}`)
		ws.expectClose(4004, 5*time.Second)
		if _, status, _ := ts.tryDialWS(p.publicKey); status != http.StatusUnauthorized {
			t.Fatalf("deleted project's key: %d", status)
		}
	})
}

func TestIdleConnectionClosed(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"IDLE_TIMEOUT_SECONDS": "1"})
	p := ts.signup("alice@example.com").createProject("demo")
	ws := ts.dialWS(p.publicKey)
	if f := ws.expectClose(1001, 5*time.Second); f.reason != "idle timeout" {
		t.Fatalf("reason %q", f.reason)
	}
}

func TestShutdownClosesConnectionsWithGoingAway(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	clients := make([]*wsClient, 20)
	for i := range clients {
		clients[i] = ts.dialWS(p.publicKey)
		clients[i].send(`{"action":"subscribe","channel":"a"}`)
		clients[i].expect(`{"action":"subscribe","channel":"a","ok":true}`)
	}
	r := owner.emit(p.secretKey, `{"channel":"a","payload":"last"}`)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- ts.app.shutdown(ctx)
	}()
	for _, c := range clients {
		c.expect(fmt.Sprintf(`{"channel":"a","payload":"last","seq":%d}`, int64(num(r.json, "seq"))))
		c.expectClose(1001, 5*time.Second)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ts.app = nil // already shut down
}

func subscribed(t *testing.T, ts *testServer, publicKey, channel string) *wsClient {
	t.Helper()
	c := ts.dialWS(publicKey)
	c.send(`{"action":"subscribe","channel":"` + channel + `"}`)
	c.expect(`{"action":"subscribe","channel":"` + channel + `","ok":true}`)
	return c
}

func TestRawFrames(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	p := ts.signup("alice@example.com").createProject("demo")

	t.Run("split frame reassembled", func(t *testing.T) {
		c := ts.dialWS(p.publicKey)
		f := clientFrame(0x1, true, []byte(`{"action":"subscribe","channel":"split"}`))
		for i, part := range [][]byte{f[:1], f[1:3], f[3:10], f[10:]} {
			c.sendRaw(part)
			// The server reads each part before the next is sent.
			relaytest.Eventually(t, 5*time.Second, func() bool {
				n, ok := relaytest.Unread(c.conn.RemoteAddr(), c.conn.LocalAddr())
				return ok && n == 0
			}, "the server reading part %d of the frame", i+1)
		}
		c.expect(`{"action":"subscribe","channel":"split","ok":true}`)
		c.conn.Close()
	})
	t.Run("fragmented message", func(t *testing.T) {
		c := ts.dialWS(p.publicKey)
		c.sendRaw(append(append(clientFrame(0x1, false, []byte(`{"action":`)),
			clientFrame(0x9, true, []byte("hb"))...), // a ping between fragments
			clientFrame(0x0, true, []byte(`"ping"}`))...))
		c.expect(`{"action":"pong","ok":true}`)
		c.conn.Close()
	})
	t.Run("oversize frame closed 1009", func(t *testing.T) {
		c := ts.dialWS(p.publicKey)
		c.sendRaw(clientFrame(0x1, true, make([]byte, 300<<10)))
		c.expectClose(1009, 5*time.Second)
	})
	t.Run("garbage bytes closed 1002", func(t *testing.T) {
		c := ts.dialWS(p.publicKey)
		c.sendRaw([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		c.expectClose(1002, 5*time.Second)
	})
	t.Run("unmasked frame closed 1002", func(t *testing.T) {
		c := ts.dialWS(p.publicKey)
		c.sendRaw([]byte{0x81, 0x02, '{', '}'})
		c.expectClose(1002, 5*time.Second)
	})
	t.Run("invalid utf-8 closed 1007", func(t *testing.T) {
		c := ts.dialWS(p.publicKey)
		c.sendRaw(clientFrame(0x1, true, []byte{'"', 0xff, '"'}))
		c.expectClose(1007, 5*time.Second)
	})
	t.Run("client close echoed", func(t *testing.T) {
		c := ts.dialWS(p.publicKey)
		c.sendRaw(clientFrame(0x8, true, []byte{0x0f, 0xa0, 'b', 'y', 'e'})) // 4000 "bye"
		c.expectClose(4000, 5*time.Second)
	})
	// Every one of those connections is gone from the server.
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		if n := ts.app.transport.Len(); n != 0 {
			return fmt.Errorf("%d connections left", n)
		}
		return nil
	})
}

func TestThousandConnectionsSubscribeAtOnce(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	const n = 1000
	clients := make([]*wsClient, n)
	errs := make(chan error, n)
	for i := range clients {
		go func() {
			c, _, err := ts.tryDialWS(p.publicKey)
			if err == nil {
				clients[i] = c
				c.send(`{"action":"subscribe","channel":"crowd"}`)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range clients {
		c.expect(`{"action":"subscribe","channel":"crowd","ok":true}`)
	}
	r := owner.emit(p.secretKey, `{"channel":"crowd","payload":"all"}`)
	if num(r.json, "delivered") != n || num(r.json, "subscriberCount") != n {
		t.Fatalf("emit: %s", r.raw)
	}
	for _, c := range clients {
		c.expect(fmt.Sprintf(`{"channel":"crowd","payload":"all","seq":%d}`, int64(num(r.json, "seq"))))
	}
}

// TestSlowReaderDoesNotSlowOthers: a subscriber that never reads is dropped
// as a slow consumer; the others get every message.
func TestSlowReaderDoesNotSlowOthers(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000",
	})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	slow, _, err := ts.dialWSWith(p.publicKey, false)
	if err != nil {
		t.Fatal(err)
	}
	slow.send(`{"action":"subscribe","channel":"firehose"}`)
	fast := subscribed(t, ts, p.publicKey, "firehose")
	// The slow subscription is in (its ack is never read).
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		if r := owner.bearerGet("/channels/firehose", p.secretKey); num(r.json, "subscriberCount") != 2 {
			return fmt.Errorf("GET /channels/firehose: %d %s, want 2 subscribers", r.status, r.raw)
		}
		return nil
	})

	payload := `"` + strings.Repeat("p", 100<<10) + `"`
	const n = 400 // 40 MiB: beyond the slow peer's socket buffers and its 8 MiB queue
	for i := range n {
		r := owner.emit(p.secretKey, `{"channel":"firehose","payload":`+payload+`}`)
		if r.status != 200 {
			t.Fatalf("emit %d: %d %s", i, r.status, r.raw)
		}
		if i == 0 && num(r.json, "subscriberCount") != 2 {
			t.Fatalf("first emit: %s", r.raw)
		}
		if _, ok := fast.next(5 * time.Second); !ok {
			t.Fatalf("fast reader starved at message %d", i)
		}
	}
	if st := ts.app.transport.Stats(); st.SlowConsumers != 1 {
		t.Fatalf("transport stats %+v, want one slow consumer", st)
	}
	r := owner.emit(p.secretKey, `{"channel":"firehose","payload":1}`)
	if num(r.json, "subscriberCount") != 1 {
		t.Fatalf("slow consumer still subscribed: %s", r.raw)
	}
}

func TestAbruptDisconnectRemovesSubscriptions(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	c := ts.dialWS(p.publicKey)
	for _, ch := range []string{"a", "b", "c"} {
		c.send(`{"action":"subscribe","channel":"` + ch + `"}`)
		c.expect(`{"action":"subscribe","channel":"` + ch + `","ok":true}`)
	}
	c.conn.UnderlyingConn().Close() // TCP gone, no close frame
	for _, ch := range []string{"a", "b", "c"} {
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r := owner.emit(p.secretKey, `{"channel":"`+ch+`","payload":1}`)
			return num(r.json, "subscriberCount") == 0
		}, "channel %s lets go of the dropped connection", ch)
	}
}
