package browser

// The browser reference client (/client.js) in real headless Chromium against
// the real server: subscribe and receive, presence between pages (sync, join,
// leave and the member list), client-emit with a token, the error event, a
// server restart mid-stream (reconnect, resubscribe, replay with a gap), a
// connection cut while the server stays up (replay, no gap, no duplicate),
// reconnect: false, and a server that stops answering (heartbeat timeout).
// The pages reach the server through the test proxy (relaytest.Proxy), which
// holds their reconnects until the test has emitted what they must replay.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestBrowserClient(t *testing.T) {
	t.Parallel()
	url := storetest.SQLiteURL(t)
	addr := relaytest.FreeAddr(t)
	env := map[string]string{"RELAY_ADDR": addr}
	ts := relaytest.Start(t, url, env)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	px := relaytest.NewProxy(t, addr)
	b := relaytest.NewBrowser(t, px.Base())

	ann, bob := b.NewTab(t), b.NewTab(t)
	ann.Start(px.Base(), p.PublicKey, "room", "ann", "{}")
	annAt := ann.WaitFor(0, "state:open", "presence:sync:")
	bob.Start(px.Base(), p.PublicKey, "room", "bob", "{}")
	bobAt := bob.WaitFor(0, "state:open", "presence:sync:ann")
	annAt = ann.WaitFor(annAt, "presence:join:bob")

	r := owner.Emit(p.SecretKey, `{"channel":"room","payload":{"hi":1}}`)
	seq := int64(relaytest.Num(r.JSON, "seq"))
	annAt = ann.WaitFor(annAt, fmt.Sprintf(`msg:%d:{"hi":1}`, seq))
	bobAt = bob.WaitFor(bobAt, fmt.Sprintf(`msg:%d:{"hi":1}`, seq))
	b.Shot("browser-client-two-pages")

	// Presence leave: a third page joins and closes; the member list follows.
	cat := b.NewTab(t)
	cat.Start(px.Base(), p.PublicKey, "room", "cat", "{}")
	cat.WaitFor(0, "state:open", "presence:sync:ann,bob")
	annAt = ann.WaitFor(annAt, "presence:join:bob,cat")
	bobAt = bob.WaitFor(bobAt, "presence:join:ann,cat")
	cat.Eval(`relay.close()`)
	cat.WaitFor(0, "state:closed")
	annAt = ann.WaitFor(annAt, "presence:leave:bob")
	bobAt = bob.WaitFor(bobAt, "presence:leave:ann")
	if !ann.Check(`JSON.stringify(relay.subs.get("room").members) === '["bob"]'`) {
		t.Fatalf("ann's member list after cat left: %q", ann.Log())
	}

	// Client-emit with a token: the promise resolves with the seq, the other
	// page gets the message with type and clientId. A refused emit rejects its
	// own promise with the code; it is not an error event.
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
	ann.Eval(fmt.Sprintf(`relay.emit("room", "chat", {t: 1}, %q).then((s) => log.push("emitted:" + s), (e) => log.push("emitfail:" + e.code))`, tok))
	var emitted int64
	annAt = ann.WaitForPrefix(annAt, "emitted:")
	if _, err := fmt.Sscanf(ann.Log()[annAt-1], "emitted:%d", &emitted); err != nil {
		t.Fatalf("emit: %q", ann.Log())
	}
	bobAt = bob.WaitFor(bobAt, fmt.Sprintf(`msg:%d:{"t":1}:from:ann:chat`, emitted))
	ann.Eval(fmt.Sprintf(`relay.emit("room", "cursor", 1, %q).then((s) => log.push("emitted:" + s), (e) => log.push("emitfail:" + e.code))`, tok))
	annAt = ann.WaitFor(annAt, "emitfail:invalid_emit_token")

	// The error event: an error frame that answers nothing the page waits for.
	ann.Eval(`relay.send({ action: "dance" })`)
	annAt = ann.WaitFor(annAt, "error:unknown_action")
	if n := ann.Count(0, "error:"); n != 1 {
		t.Fatalf("%d error events, want 1 (the refused emit is not one): %q", n, ann.Log())
	}

	// Restart the server on the same address and database. The pages'
	// reconnects are held at the proxy until the emits are done: they get a
	// gap (the old ring is gone) and the replay.
	px.HoldNew()
	ts.Stop()
	ts2 := relaytest.Start(t, url, env)
	c2 := ts2.Client()
	var seqs []int64
	for i := range 2 {
		r := c2.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, i))
		seqs = append(seqs, int64(relaytest.Num(r.JSON, "seq")))
	}
	px.Release()
	for _, pg := range []*relaytest.Tab{ann, bob} {
		at := annAt
		if pg == bob {
			at = bobAt
		}
		pg.WaitFor(at, "state:reconnecting", "state:open", fmt.Sprintf("gap:%d", emitted),
			fmt.Sprintf("msg:%d:0:replay", seqs[0]), fmt.Sprintf("msg:%d:1:replay", seqs[1]))
	}
	// Each page got each message once.
	for _, pg := range []*relaytest.Tab{ann, bob} {
		for _, s := range seqs {
			if n := pg.Count(0, fmt.Sprintf("msg:%d:", s)); n != 1 {
				t.Fatalf("message %d delivered %d times: %q", s, n, pg.Log())
			}
		}
	}
	b.Shot("browser-client-after-restart")

	// Heartbeat: through a proxy that stops forwarding, the page notices
	// within interval + ack timeout, and reconnects when it flows again.
	proxy := relaytest.NewProxy(t, addr)
	hb := b.NewTab(t)
	hb.Start(proxy.Base(), p.PublicKey, "hb", "carol", `{heartbeatIntervalMs: 300, heartbeatAckTimeoutMs: 400}`)
	at := hb.WaitFor(0, "state:open")
	proxy.Frozen.Store(true)
	at = hb.WaitFor(at, "state:reconnecting")
	proxy.Frozen.Store(false)
	hb.WaitFor(at, "state:open")
}

// TestBrowserClientCut: the connection is cut while the server stays up;
// what is emitted while the page is away (its reconnect held at the proxy)
// comes back replayed, each message once and with no gap, although the new
// connection starts with a copy of a message the page already has. With
// reconnect: false a cut ends in the closed state, with no reconnect planned.
func TestBrowserClientCut(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	px := relaytest.NewProxy(t, ts.Addr())
	b := relaytest.NewBrowser(t, px.Base())
	emit := func(payload string) int64 {
		r := owner.Emit(p.SecretKey, `{"channel":"feed","payload":"`+payload+`"}`)
		if r.Status != 200 {
			t.Fatalf("emit: %s", r.Raw)
		}
		return int64(relaytest.Num(r.JSON, "seq"))
	}

	pg := b.NewTab(t)
	pg.Start(px.Base(), p.PublicKey, "feed", "dan", "{}")
	at := pg.WaitFor(0, "state:open", "presence:sync:")
	first := emit("first")
	at = pg.WaitFor(at, fmt.Sprintf(`msg:%d:"first"`, first))
	for round := 1; round <= 2; round++ {
		px.InjectNext(fmt.Sprintf(`{"channel":"feed","payload":"duplicate","seq":%d,"replay":true}`, first))
		px.HoldNew()
		px.Cut()
		var away []int64
		for i := range 3 {
			away = append(away, emit(fmt.Sprintf("away %d", i)))
		}
		at = pg.WaitFor(at, "state:reconnecting")
		px.Release()
		at = pg.WaitFor(at, "state:open")
		// The channel has the resumed subscription (its ack comes from the
		// channel) before "live" is emitted, or "live" may be replayed with
		// the rest.
		relaytest.Eventually(t, 5*time.Second, func() bool { return pg.Check(`relay.subs.get("feed").acked === true`) }, "the resumed subscription acked")
		live := emit("live")
		want := []string{}
		for i, s := range away {
			want = append(want, fmt.Sprintf(`msg:%d:"away %d":replay`, s, i))
		}
		want = append(want, fmt.Sprintf(`msg:%d:"live"`, live))
		end := pg.WaitFor(at, want[len(want)-1])
		var got []string
		for _, l := range pg.Log()[at:end] {
			if strings.HasPrefix(l, "msg:") || strings.HasPrefix(l, "gap:") {
				got = append(got, l)
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("round %d: after the reconnect %q, want exactly %q", round, got, want)
		}
		at, first = end, live
	}
	px.InjectNext("")

	// reconnect: false — a cut ends in the closed state.
	once := b.NewTab(t)
	once.Start(px.Base(), p.PublicKey, "feed", "eve", "{reconnect: false}")
	oat := once.WaitFor(0, "state:open", "presence:sync:dan")
	px.Cut()
	once.WaitFor(oat, "state:closed")
	if !once.Check(`relay.state === "closed" && relay.ws === null && relay.reconnectTimer === undefined`) || once.Count(0, "state:reconnecting") != 0 {
		t.Fatalf("reconnect: false after a cut: %q", once.Log())
	}
}
