package main

// The browser reference client (/client.js) in real headless Chromium against
// the real server: subscribe and receive, presence between pages (sync, join,
// leave and the member list), client-emit with a token, the error event, a
// server restart mid-stream (reconnect, resubscribe, replay with a gap), a
// connection cut while the server stays up (replay, no gap, no duplicate),
// reconnect: false, and a server that stops answering (heartbeat timeout).
// The pages reach the server through the test proxy (goclient_test.go), which
// holds their reconnects until the test has emitted what they must replay.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// page is one tab running the client, logging what it sees into window.log.
type page struct {
	b   *browser
	ctx context.Context
}

func (b *browser) newTab(t *testing.T) *page {
	ctx, cancel := chromedp.NewContext(b.ctx)
	t.Cleanup(cancel)
	// The first Run opens the tab, and cancelling its context would close
	// it: run it without a timeout.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`1`)); err != nil {
		t.Fatalf("open tab: %v", err)
	}
	return &page{b: b, ctx: ctx}
}

func (p *page) run(action chromedp.Action[chromedp.Void]) {
	p.b.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 15*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, action); err != nil {
		p.b.t.Fatalf("tab: %v", err)
	}
}

// start loads base/demo (same origin, the service's CSP) and starts a client
// subscribed to channel with presence as clientID.
func (p *page) start(base, publicKey, channel, clientID string, options string) {
	p.b.t.Helper()
	p.run(chromedp.Navigate(base + "/demo"))
	p.run(chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`
		window.log = [];
		import("/client.js").then(({ Relay }) => {
			window.relay = new Relay({ url: location.origin, publicKey: %q, ...%s });
			relay.on("state", (s) => log.push("state:" + s));
			relay.on("error", (e) => log.push("error:" + e.code));
			relay.subscribe(%q, {
				presence: true, clientId: %q,
				onMessage: (m) => log.push("msg:" + m.seq + ":" + JSON.stringify(m.payload) + (m.replay ? ":replay" : "") +
					(m.clientId ? ":from:" + m.clientId + ":" + m.type : "")),
				onPresence: (e) => log.push("presence:" + e.event + ":" + e.members.join(",")),
				onGap: (g) => log.push("gap:" + g.since),
			});
		});`, publicKey, options, channel, clientID)))
}

// eval runs js in the page.
func (p *page) eval(js string) {
	p.b.t.Helper()
	p.run(chromedp.Evaluate[chromedp.Void](js))
}

// check evaluates a boolean expression in the page.
func (p *page) check(js string) bool {
	p.b.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
	if err != nil {
		p.b.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// waitForPrefix waits for a log line starting with prefix after position
// from, and returns the position after it.
func (p *page) waitForPrefix(from int, prefix string) int {
	p.b.t.Helper()
	after := 0
	relaytest.EventuallyNil(p.b.t, 15*time.Second, func() error {
		log := p.log()
		for i := from; i < len(log); i++ {
			if strings.HasPrefix(log[i], prefix) {
				after = i + 1
				return nil
			}
		}
		return fmt.Errorf("waiting for %q… after %d; log: %q", prefix, from, log)
	})
	return after
}

// count is how many log lines from position from on start with prefix.
func (p *page) count(from int, prefix string) int {
	n := 0
	for _, l := range p.log()[from:] {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func (p *page) log() []string {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.log || []`))
	if err != nil {
		p.b.t.Fatalf("read log: %v", err)
	}
	return v
}

// waitFor waits until the log holds want (in order, not necessarily adjacent)
// after position from, and returns the position after the last match.
func (p *page) waitFor(from int, want ...string) int {
	p.b.t.Helper()
	after := 0
	relaytest.EventuallyNil(p.b.t, 15*time.Second, func() error {
		log := p.log()
		i, pos := 0, from
		for ; pos < len(log) && i < len(want); pos++ {
			if log[pos] == want[i] {
				i++
			}
		}
		if i == len(want) {
			after = pos
			return nil
		}
		return fmt.Errorf("waiting for %q after %d; log: %q", want, from, log)
	})
	return after
}

func TestBrowserClient(t *testing.T) {
	url := storetest.SQLiteURL(t)
	addr := relaytest.FreeAddr(t)
	env := map[string]string{"RELAY_ADDR": addr}
	ts := startServer(t, url, env)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	px := newProxy(t, addr)
	b := newBrowser(t, px.base())

	ann, bob := b.newTab(t), b.newTab(t)
	ann.start(px.base(), p.PublicKey, "room", "ann", "{}")
	annAt := ann.waitFor(0, "state:open", "presence:sync:")
	bob.start(px.base(), p.PublicKey, "room", "bob", "{}")
	bobAt := bob.waitFor(0, "state:open", "presence:sync:ann")
	annAt = ann.waitFor(annAt, "presence:join:bob")

	r := owner.Emit(p.SecretKey, `{"channel":"room","payload":{"hi":1}}`)
	seq := int64(relaytest.Num(r.JSON, "seq"))
	annAt = ann.waitFor(annAt, fmt.Sprintf(`msg:%d:{"hi":1}`, seq))
	bobAt = bob.waitFor(bobAt, fmt.Sprintf(`msg:%d:{"hi":1}`, seq))
	b.shot("browser-client-two-pages")

	// Presence leave: a third page joins and closes; the member list follows.
	cat := b.newTab(t)
	cat.start(px.base(), p.PublicKey, "room", "cat", "{}")
	cat.waitFor(0, "state:open", "presence:sync:ann,bob")
	annAt = ann.waitFor(annAt, "presence:join:bob,cat")
	bobAt = bob.waitFor(bobAt, "presence:join:ann,cat")
	cat.eval(`relay.close()`)
	cat.waitFor(0, "state:closed")
	annAt = ann.waitFor(annAt, "presence:leave:bob")
	bobAt = bob.waitFor(bobAt, "presence:leave:ann")
	if !ann.check(`JSON.stringify(relay.subs.get("room").members) === '["bob"]'`) {
		t.Fatalf("ann's member list after cat left: %q", ann.log())
	}

	// Client-emit with a token: the promise resolves with the seq, the other
	// page gets the message with type and clientId. A refused emit rejects its
	// own promise with the code; it is not an error event.
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
	ann.eval(fmt.Sprintf(`relay.emit("room", "chat", {t: 1}, %q).then((s) => log.push("emitted:" + s), (e) => log.push("emitfail:" + e.code))`, tok))
	var emitted int64
	annAt = ann.waitForPrefix(annAt, "emitted:")
	if _, err := fmt.Sscanf(ann.log()[annAt-1], "emitted:%d", &emitted); err != nil {
		t.Fatalf("emit: %q", ann.log())
	}
	bobAt = bob.waitFor(bobAt, fmt.Sprintf(`msg:%d:{"t":1}:from:ann:chat`, emitted))
	ann.eval(fmt.Sprintf(`relay.emit("room", "cursor", 1, %q).then((s) => log.push("emitted:" + s), (e) => log.push("emitfail:" + e.code))`, tok))
	annAt = ann.waitFor(annAt, "emitfail:invalid_emit_token")

	// The error event: an error frame that answers nothing the page waits for.
	ann.eval(`relay.send({ action: "dance" })`)
	annAt = ann.waitFor(annAt, "error:unknown_action")
	if n := ann.count(0, "error:"); n != 1 {
		t.Fatalf("%d error events, want 1 (the refused emit is not one): %q", n, ann.log())
	}

	// Restart the server on the same address and database. The pages'
	// reconnects are held at the proxy until the emits are done: they get a
	// gap (the old ring is gone) and the replay.
	px.holdNew()
	ts.stop()
	ts2 := startServer(t, url, env)
	c2 := ts2.Client()
	var seqs []int64
	for i := range 2 {
		r := c2.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, i))
		seqs = append(seqs, int64(relaytest.Num(r.JSON, "seq")))
	}
	px.release()
	for _, pg := range []*page{ann, bob} {
		at := annAt
		if pg == bob {
			at = bobAt
		}
		pg.waitFor(at, "state:reconnecting", "state:open", fmt.Sprintf("gap:%d", emitted),
			fmt.Sprintf("msg:%d:0:replay", seqs[0]), fmt.Sprintf("msg:%d:1:replay", seqs[1]))
	}
	// Each page got each message once.
	for _, pg := range []*page{ann, bob} {
		for _, s := range seqs {
			if n := pg.count(0, fmt.Sprintf("msg:%d:", s)); n != 1 {
				t.Fatalf("message %d delivered %d times: %q", s, n, pg.log())
			}
		}
	}
	b.shot("browser-client-after-restart")

	// Heartbeat: through a proxy that stops forwarding, the page notices
	// within interval + ack timeout, and reconnects when it flows again.
	proxy := newProxy(t, addr)
	hb := b.newTab(t)
	hb.start(proxy.base(), p.PublicKey, "hb", "carol", `{heartbeatIntervalMs: 300, heartbeatAckTimeoutMs: 400}`)
	at := hb.waitFor(0, "state:open")
	proxy.frozen.Store(true)
	at = hb.waitFor(at, "state:reconnecting")
	proxy.frozen.Store(false)
	hb.waitFor(at, "state:open")
}

// TestBrowserClientCut: the connection is cut while the server stays up;
// what is emitted while the page is away (its reconnect held at the proxy)
// comes back replayed, each message once and with no gap, although the new
// connection starts with a copy of a message the page already has. With
// reconnect: false a cut ends in the closed state, with no reconnect planned.
func TestBrowserClientCut(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	px := newProxy(t, strings.TrimPrefix(ts.Base, "http://"))
	b := newBrowser(t, px.base())
	emit := func(payload string) int64 {
		r := owner.Emit(p.SecretKey, `{"channel":"feed","payload":"`+payload+`"}`)
		if r.Status != 200 {
			t.Fatalf("emit: %s", r.Raw)
		}
		return int64(relaytest.Num(r.JSON, "seq"))
	}

	pg := b.newTab(t)
	pg.start(px.base(), p.PublicKey, "feed", "dan", "{}")
	at := pg.waitFor(0, "state:open", "presence:sync:")
	first := emit("first")
	at = pg.waitFor(at, fmt.Sprintf(`msg:%d:"first"`, first))
	for round := 1; round <= 2; round++ {
		px.injectNext(fmt.Sprintf(`{"channel":"feed","payload":"duplicate","seq":%d,"replay":true}`, first))
		px.holdNew()
		px.cut()
		var away []int64
		for i := range 3 {
			away = append(away, emit(fmt.Sprintf("away %d", i)))
		}
		at = pg.waitFor(at, "state:reconnecting")
		px.release()
		at = pg.waitFor(at, "state:open")
		// The channel has the resumed subscription (its ack comes from the
		// channel) before "live" is emitted, or "live" may be replayed with
		// the rest.
		relaytest.Eventually(t, 5*time.Second, func() bool { return pg.check(`relay.subs.get("feed").acked === true`) }, "the resumed subscription acked")
		live := emit("live")
		want := []string{}
		for i, s := range away {
			want = append(want, fmt.Sprintf(`msg:%d:"away %d":replay`, s, i))
		}
		want = append(want, fmt.Sprintf(`msg:%d:"live"`, live))
		end := pg.waitFor(at, want[len(want)-1])
		var got []string
		for _, l := range pg.log()[at:end] {
			if strings.HasPrefix(l, "msg:") || strings.HasPrefix(l, "gap:") {
				got = append(got, l)
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("round %d: after the reconnect %q, want exactly %q", round, got, want)
		}
		at, first = end, live
	}
	px.injectNext("")

	// reconnect: false — a cut ends in the closed state.
	once := b.newTab(t)
	once.start(px.base(), p.PublicKey, "feed", "eve", "{reconnect: false}")
	oat := once.waitFor(0, "state:open", "presence:sync:dan")
	px.cut()
	once.waitFor(oat, "state:closed")
	if !once.check(`relay.state === "closed" && relay.ws === null && relay.reconnectTimer === undefined`) || once.count(0, "state:reconnecting") != 0 {
		t.Fatalf("reconnect: false after a cut: %q", once.log())
	}
}
