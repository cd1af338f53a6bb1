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

func TestSubscribeAndEmit(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")

		sub := ts.DialWS(p.PublicKey)
		sub.Send(`{"action":"subscribe","channel":"room:1"}`)
		sub.Expect(`{"action":"subscribe","channel":"room:1","ok":true}`)

		r := owner.Emit(p.SecretKey, `{"channel":"room:1","payload":{"text":"hi", "n": [1, 2]}}`)
		if r.Status != 200 {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		seq := relaytest.Num(r.JSON, "seq")
		if r.JSON["ok"] != true || r.JSON["channel"] != "room:1" || relaytest.Num(r.JSON, "delivered") != 1 || relaytest.Num(r.JSON, "subscriberCount") != 1 || seq <= 0 {
			t.Fatalf("emit body: %s", r.Raw)
		}
		for _, k := range []string{"rate_limit", "project_rate_limit"} {
			b, _ := r.JSON[k].(map[string]any)
			if b == nil || relaytest.Num(b, "limit") == 0 || b["resetAt"] == nil {
				t.Fatalf("%s missing or malformed in %s", k, r.Raw)
			}
		}
		sub.Expect(fmt.Sprintf(`{"channel":"room:1","payload":{"text":"hi","n":[1,2]},"seq":%d}`, int64(seq)))

		r2 := owner.Emit(p.SecretKey, `{"channel":"room:1","payload":2}`)
		if relaytest.Num(r2.JSON, "seq") <= seq {
			t.Fatalf("seq did not increase: %v then %v", seq, r2.JSON["seq"])
		}
		sub.Expect(fmt.Sprintf(`{"channel":"room:1","payload":2,"seq":%d}`, int64(relaytest.Num(r2.JSON, "seq"))))

		sub.Send(`{"action":"ping"}`)
		sub.Expect(`{"action":"pong","ok":true}`)
		sub.Send(`{"action":"unsubscribe","channel":"room:1"}`)
		sub.Expect(`{"action":"unsubscribe","channel":"room:1","ok":true}`)
		if r := owner.Emit(p.SecretKey, `{"channel":"room:1","payload":3}`); relaytest.Num(r.JSON, "delivered") != 0 || relaytest.Num(r.JSON, "subscriberCount") != 0 {
			t.Fatalf("after unsubscribe: %s", r.Raw)
		}
		sub.ExpectSilence(200 * time.Millisecond)
	})
}

func TestHandshakeAuthentication(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		for name, key := range map[string]string{"missing": "", "unknown": "pk_live_nope", "secret key": p.SecretKey} {
			if _, status, err := ts.TryDialWS(key); status != http.StatusUnauthorized {
				t.Fatalf("%s key: status %d (%v), want 401", name, status, err)
			}
		}
		ts.DialWS(p.PublicKey) // the real key works

		// Revoke the public key: the very next handshake fails.
		keys := owner.Do("GET", "/api/projects/"+p.ID+"/keys", "")
		var pubID string
		for _, k := range keys.JSON["keys"].([]any) {
			if k := k.(map[string]any); k["keyType"] == "public" {
				pubID = k["id"].(string)
			}
		}
		owner.Do("POST", "/api/projects/"+p.ID+"/keys/"+pubID+"/revoke", "").Expect(t, 200, `{"ok":true}`)
		if _, status, _ := ts.TryDialWS(p.PublicKey); status != http.StatusUnauthorized {
			t.Fatalf("revoked key: status %d, want 401", status)
		}
		// Rotation: the new key works at once, the old one stays refused.
		rot := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public"}`)
		ts.DialWS(rot.Str("key", "raw"))

		// A plain GET without the upgrade headers is not a WebSocket.
		res, err := http.Get(ts.Base + "/ws?publicKey=" + rot.Str("key", "raw"))
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
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		c := ts.Client()

		c.Emit("", `{"channel":"a","payload":1}`).Expect(t, 401, `{"error":"missing_secret_key"}`)
		c.Emit("sk_live_unknown", `{"channel":"a","payload":1}`).Expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.Emit(p.PublicKey, `{"channel":"a","payload":1}`).Expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.Emit(p.SecretKey, `{"channel":"a",`).Expect(t, 400, `{"error":"invalid_json"}`)
		c.Emit(p.SecretKey, `[1,2]`).Expect(t, 400, `{"error":"invalid_json"}`)
		c.Emit(p.SecretKey, ``).Expect(t, 400, `{"error":"invalid_json"}`)
		c.Emit(p.SecretKey, `{"channel":"bad channel!","payload":1}`).Expect(t, 400, `{"error":"invalid_channel","channel":"bad channel!"}`)
		c.Emit(p.SecretKey, `{"channel":"","payload":1}`).Expect(t, 400, `{"error":"invalid_channel","channel":""}`)
		c.Emit(p.SecretKey, `{"payload":1}`).Expect(t, 400, `{"error":"invalid_channel","channel":""}`)
		long := strings.Repeat("a", 201)
		c.Emit(p.SecretKey, `{"channel":"`+long+`","payload":1}`).Expect(t, 400, `{"error":"invalid_channel","channel":"`+long+`"}`)
		if r := c.Emit(p.SecretKey, `{"channel":"`+long[:200]+`","payload":1}`); r.Status != 200 {
			t.Fatalf("200-char channel: %d %s", r.Status, r.Raw)
		}

		// Size is measured on the serialized {"channel":…,"payload":…}: exactly
		// at the cap passes, one byte over is refused.
		overhead := len(`{"channel":"big","payload":""}`)
		fill := strings.Repeat("x", 131072-overhead)
		if r := c.Emit(p.SecretKey, `{"channel":"big","payload":"`+fill+`"}`); r.Status != 200 {
			t.Fatalf("message of exactly 131072 bytes: %d %s", r.Status, r.Raw)
		}
		c.Emit(p.SecretKey, `{"channel":"big","payload":"`+fill+`x"}`).Expect(t, 413, `{"error":"payload_too_large","max_bytes":131072}`)
		c.Emit(p.SecretKey, `{"channel":"big","payload":"`+strings.Repeat("y", 2<<20)+`"}`).Expect(t, 413, `{"error":"payload_too_large","max_bytes":131072}`)

		// Rotating the secret key: the old one fails on the very next request.
		rot := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"secret"}`)
		c.Emit(p.SecretKey, `{"channel":"a","payload":1}`).Expect(t, 401, `{"error":"invalid_secret_key"}`)
		if r := c.Emit(rot.Str("key", "raw"), `{"channel":"a","payload":1}`); r.Status != 200 {
			t.Fatalf("rotated key: %d %s", r.Status, r.Raw)
		}
		// Deleting the project: its keys fail at once.
		owner.Do("DELETE", "/api/projects/"+p.ID, "").Expect(t, 200, `{"ok":true}`)
		c.Emit(rot.Str("key", "raw"), `{"channel":"a","payload":1}`).Expect(t, 401, `{"error":"invalid_secret_key"}`)
	})
}

func TestEmitRateLimits(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		// Fixed windows on minute boundaries: the clock stands still inside one.
		clock := newClock()
		ts := startServerAt(t, url, map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "3", "PROJECT_RATE_LIMIT_PER_MINUTE": "5"}, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		c := ts.Client()
		for i := range 3 {
			r := c.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
			if r.Status != 200 {
				t.Fatalf("emit %d: %d %s", i, r.Status, r.Raw)
			}
			relaytest.Budget(t, clock.Now(), r, "rate_limit", 3, 2-i)
			relaytest.Budget(t, clock.Now(), r, "project_rate_limit", 5, 4-i)
		}
		r := c.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
		if r.Status != 429 || r.JSON["error"] != "channel_rate_limited" || len(r.JSON) != 3 {
			t.Fatalf("4th emit on a: %d %s", r.Status, r.Raw)
		}
		relaytest.Budget(t, clock.Now(), r, "rate_limit", 3, 0)
		relaytest.Budget(t, clock.Now(), r, "project_rate_limit", 5, 2) // a refused emit does not use the backstop

		// Another channel has its own budget; the project backstop still counts.
		for i := range 2 {
			if r := c.Emit(p.SecretKey, `{"channel":"b","payload":1}`); r.Status != 200 {
				t.Fatalf("emit b %d: %d %s", i, r.Status, r.Raw)
			}
		}
		r = c.Emit(p.SecretKey, `{"channel":"c","payload":1}`)
		if r.Status != 429 || r.JSON["error"] != "project_rate_limited" || len(r.JSON) != 3 {
			t.Fatalf("6th emit in project: %d %s", r.Status, r.Raw)
		}
		relaytest.Budget(t, clock.Now(), r, "rate_limit", 3, 3)
		relaytest.Budget(t, clock.Now(), r, "project_rate_limit", 5, 0)
	})
}

func TestWebSocketErrors(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		p := ts.Signup("alice@example.com").CreateProject("demo")
		ws := ts.DialWS(p.PublicKey)
		ws.Send(`{"action":`)
		ws.Expect(`{"error":"invalid_json"}`)
		ws.Send(`"subscribe"`)
		ws.Expect(`{"error":"invalid_json"}`)
		ws.Send(`{"action":"dance"}`)
		ws.Expect(`{"error":"unknown_action"}`)
		ws.Send(`{"channel":"a"}`)
		ws.Expect(`{"error":"unknown_action"}`)
		ws.Send(`{"action":"subscribe","channel":"no spaces"}`)
		ws.Expect(`{"error":"invalid_channel","channel":"no spaces"}`)
		ws.Send(`{"action":"unsubscribe","channel":"é"}`)
		ws.Expect(`{"error":"invalid_channel","channel":"é"}`)
		ws.Send(`{"action":"subscribe"}`)
		ws.Expect(`{"error":"invalid_channel","channel":""}`)
		ws.Send(`{"action":"subscribe","channel":"a","presence":true}`)
		ws.Expect(`{"error":"client_id_required","channel":"a"}`)
		ws.Send(`{"action":"subscribe","channel":"a","since":"yesterday"}`)
		ws.Expect(`{"error":"invalid_since","channel":"a"}`)
		// The connection is still usable after every error.
		ws.Send(`{"action":"ping"}`)
		ws.Expect(`{"action":"pong","ok":true}`)
	})
}

func TestFanOutToManySubscribers(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		other := owner.CreateProject("other")
		const n = 50
		subs := make([]*wsClient, n)
		for i := range subs {
			subs[i] = ts.DialWS(p.PublicKey)
			subs[i].Send(`{"action":"subscribe","channel":"news"}`)
			subs[i].Expect(`{"action":"subscribe","channel":"news","ok":true}`)
		}
		// Same channel name in another project: isolated.
		stranger := ts.DialWS(other.PublicKey)
		stranger.Send(`{"action":"subscribe","channel":"news"}`)
		stranger.Expect(`{"action":"subscribe","channel":"news","ok":true}`)

		r := owner.Emit(p.SecretKey, `{"channel":"news","payload":"x"}`)
		if relaytest.Num(r.JSON, "delivered") != n || relaytest.Num(r.JSON, "subscriberCount") != n {
			t.Fatalf("emit: %s", r.Raw)
		}
		for _, s := range subs {
			s.Expect(fmt.Sprintf(`{"channel":"news","payload":"x","seq":%d}`, int64(relaytest.Num(r.JSON, "seq"))))
		}
		stranger.ExpectSilence(200 * time.Millisecond)

		// A subscriber that goes away is no longer counted.
		subs[0].Conn.Close()
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r = owner.Emit(p.SecretKey, `{"channel":"news","payload":"y"}`)
			return relaytest.Num(r.JSON, "subscriberCount") == n-1
		}, "closed subscriber no longer counted")
	})
}

func TestProjectDeletedClosesConnections(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		ws := ts.DialWS(p.PublicKey)
		ws.Send(`{"action":"subscribe","channel":"a"}`)
		ws.Expect(`{"action":"subscribe","channel":"a","ok":true}`)
		owner.Do("DELETE", "/api/projects/"+p.ID, "").Expect(t, 200, `{"ok":true}`)
		ws.ExpectClose(4004, 5*time.Second)
		if _, status, _ := ts.TryDialWS(p.PublicKey); status != http.StatusUnauthorized {
			t.Fatalf("deleted project's key: %d", status)
		}
	})
}

func TestIdleConnectionClosed(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"IDLE_TIMEOUT_SECONDS": "1"})
	p := ts.Signup("alice@example.com").CreateProject("demo")
	ws := ts.DialWS(p.PublicKey)
	if f := ws.ExpectClose(1001, 5*time.Second); f.Reason != "idle timeout" {
		t.Fatalf("reason %q", f.Reason)
	}
}

func TestShutdownClosesConnectionsWithGoingAway(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	clients := make([]*wsClient, 20)
	for i := range clients {
		clients[i] = ts.DialWS(p.PublicKey)
		clients[i].Send(`{"action":"subscribe","channel":"a"}`)
		clients[i].Expect(`{"action":"subscribe","channel":"a","ok":true}`)
	}
	r := owner.Emit(p.SecretKey, `{"channel":"a","payload":"last"}`)
	a := ts.app
	ts.app = nil // this test shuts it down
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- a.shutdown(ctx)
	}()
	for _, c := range clients {
		c.Expect(fmt.Sprintf(`{"channel":"a","payload":"last","seq":%d}`, int64(relaytest.Num(r.JSON, "seq"))))
		c.ExpectClose(1001, 5*time.Second)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRawFrames(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	p := ts.Signup("alice@example.com").CreateProject("demo")

	t.Run("split frame reassembled", func(t *testing.T) {
		c := ts.DialWS(p.PublicKey)
		f := relaytest.ClientFrame(0x1, true, []byte(`{"action":"subscribe","channel":"split"}`))
		for i, part := range [][]byte{f[:1], f[1:3], f[3:10], f[10:]} {
			c.SendRaw(part)
			// The server reads each part before the next is sent.
			relaytest.Eventually(t, 5*time.Second, func() bool {
				n, ok := relaytest.Unread(c.Conn.RemoteAddr(), c.Conn.LocalAddr())
				return ok && n == 0
			}, "the server reading part %d of the frame", i+1)
		}
		c.Expect(`{"action":"subscribe","channel":"split","ok":true}`)
		c.Conn.Close()
	})
	t.Run("fragmented message", func(t *testing.T) {
		c := ts.DialWS(p.PublicKey)
		c.SendRaw(append(append(relaytest.ClientFrame(0x1, false, []byte(`{"action":`)),
			relaytest.ClientFrame(0x9, true, []byte("hb"))...), // a ping between fragments
			relaytest.ClientFrame(0x0, true, []byte(`"ping"}`))...))
		c.Expect(`{"action":"pong","ok":true}`)
		c.Conn.Close()
	})
	t.Run("oversize frame closed 1009", func(t *testing.T) {
		c := ts.DialWS(p.PublicKey)
		c.SendRaw(relaytest.ClientFrame(0x1, true, make([]byte, 300<<10)))
		c.ExpectClose(1009, 5*time.Second)
	})
	t.Run("garbage bytes closed 1002", func(t *testing.T) {
		c := ts.DialWS(p.PublicKey)
		c.SendRaw([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		c.ExpectClose(1002, 5*time.Second)
	})
	t.Run("unmasked frame closed 1002", func(t *testing.T) {
		c := ts.DialWS(p.PublicKey)
		c.SendRaw([]byte{0x81, 0x02, '{', '}'})
		c.ExpectClose(1002, 5*time.Second)
	})
	t.Run("invalid utf-8 closed 1007", func(t *testing.T) {
		c := ts.DialWS(p.PublicKey)
		c.SendRaw(relaytest.ClientFrame(0x1, true, []byte{'"', 0xff, '"'}))
		c.ExpectClose(1007, 5*time.Second)
	})
	t.Run("client close echoed", func(t *testing.T) {
		c := ts.DialWS(p.PublicKey)
		c.SendRaw(relaytest.ClientFrame(0x8, true, []byte{0x0f, 0xa0, 'b', 'y', 'e'})) // 4000 "bye"
		c.ExpectClose(4000, 5*time.Second)
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
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	const n = 1000
	clients := make([]*wsClient, n)
	errs := make(chan error, n)
	for i := range clients {
		go func() {
			c, _, err := ts.TryDialWS(p.PublicKey)
			if err == nil {
				clients[i] = c
				c.Send(`{"action":"subscribe","channel":"crowd"}`)
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
		c.Expect(`{"action":"subscribe","channel":"crowd","ok":true}`)
	}
	r := owner.Emit(p.SecretKey, `{"channel":"crowd","payload":"all"}`)
	if relaytest.Num(r.JSON, "delivered") != n || relaytest.Num(r.JSON, "subscriberCount") != n {
		t.Fatalf("emit: %s", r.Raw)
	}
	for _, c := range clients {
		c.Expect(fmt.Sprintf(`{"channel":"crowd","payload":"all","seq":%d}`, int64(relaytest.Num(r.JSON, "seq"))))
	}
}

// TestSlowReaderDoesNotSlowOthers: a subscriber that never reads is dropped
// as a slow consumer; the others get every message.
func TestSlowReaderDoesNotSlowOthers(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000",
	})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	slow, _, err := ts.DialWSWith(p.PublicKey, false)
	if err != nil {
		t.Fatal(err)
	}
	slow.Send(`{"action":"subscribe","channel":"firehose"}`)
	fast := ts.Subscribed(t, p.PublicKey, "firehose")
	// The slow subscription is in (its ack is never read).
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		if r := owner.BearerGet("/channels/firehose", p.SecretKey); relaytest.Num(r.JSON, "subscriberCount") != 2 {
			return fmt.Errorf("GET /channels/firehose: %d %s, want 2 subscribers", r.Status, r.Raw)
		}
		return nil
	})

	payload := `"` + strings.Repeat("p", 100<<10) + `"`
	const n = 400 // 40 MiB: beyond the slow peer's socket buffers and its 8 MiB queue
	for i := range n {
		r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":`+payload+`}`)
		if r.Status != 200 {
			t.Fatalf("emit %d: %d %s", i, r.Status, r.Raw)
		}
		if i == 0 && relaytest.Num(r.JSON, "subscriberCount") != 2 {
			t.Fatalf("first emit: %s", r.Raw)
		}
		if _, ok := fast.Next(5 * time.Second); !ok {
			t.Fatalf("fast reader starved at message %d", i)
		}
	}
	if st := ts.app.transport.Stats(); st.SlowConsumers != 1 {
		t.Fatalf("transport stats %+v, want one slow consumer", st)
	}
	r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":1}`)
	if relaytest.Num(r.JSON, "subscriberCount") != 1 {
		t.Fatalf("slow consumer still subscribed: %s", r.Raw)
	}
}

func TestAbruptDisconnectRemovesSubscriptions(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	c := ts.DialWS(p.PublicKey)
	for _, ch := range []string{"a", "b", "c"} {
		c.Send(`{"action":"subscribe","channel":"` + ch + `"}`)
		c.Expect(`{"action":"subscribe","channel":"` + ch + `","ok":true}`)
	}
	c.Conn.UnderlyingConn().Close() // TCP gone, no close frame
	for _, ch := range []string{"a", "b", "c"} {
		relaytest.Eventually(t, 5*time.Second, func() bool {
			r := owner.Emit(p.SecretKey, `{"channel":"`+ch+`","payload":1}`)
			return relaytest.Num(r.JSON, "subscriberCount") == 0
		}, "channel %s lets go of the dropped connection", ch)
	}
}
