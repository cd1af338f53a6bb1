package main

// The browser reference client (/client.js) in real headless Chromium against
// the real server: subscribe and receive, presence between two pages, a
// server restart mid-stream (reconnect, resubscribe, replay with a gap), and
// a server that stops answering (heartbeat timeout, reconnect).

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

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
			relay.subscribe(%q, {
				presence: true, clientId: %q,
				onMessage: (m) => log.push("msg:" + m.seq + ":" + JSON.stringify(m.payload) + (m.replay ? ":replay" : "")),
				onPresence: (e) => log.push("presence:" + e.event + ":" + e.members.join(",")),
				onGap: (g) => log.push("gap:" + g.since),
			});
		});`, publicKey, options, channel, clientID)))
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
	deadline := time.Now().Add(15 * time.Second)
	for {
		log := p.log()
		i, pos := 0, from
		for ; pos < len(log) && i < len(want); pos++ {
			if log[pos] == want[i] {
				i++
			}
		}
		if i == len(want) {
			return pos
		}
		if time.Now().After(deadline) {
			p.b.t.Fatalf("waiting for %q after %d; log: %q", want, from, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBrowserClient(t *testing.T) {
	url := storetest.SQLiteURL(t)
	addr := freeAddr(t)
	env := map[string]string{"RELAY_ADDR": addr}
	ts := startServer(t, url, env)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	b := newBrowser(t, ts.base)

	ann, bob := b.newTab(t), b.newTab(t)
	ann.start(ts.base, p.publicKey, "room", "ann", "{}")
	annAt := ann.waitFor(0, "state:open", "presence:sync:")
	bob.start(ts.base, p.publicKey, "room", "bob", "{}")
	bobAt := bob.waitFor(0, "state:open", "presence:sync:ann")
	annAt = ann.waitFor(annAt, "presence:join:bob")

	r := owner.emit(p.secretKey, `{"channel":"room","payload":{"hi":1}}`)
	seq := int64(num(r.json, "seq"))
	annAt = ann.waitFor(annAt, fmt.Sprintf(`msg:%d:{"hi":1}`, seq))
	bobAt = bob.waitFor(bobAt, fmt.Sprintf(`msg:%d:{"hi":1}`, seq))
	b.shot("browser-client-two-pages")

	// Restart the server on the same address and database, emit while the
	// pages reconnect: they get a gap (the old ring is gone) and the replay.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts.app.shutdown(ctx)
	ts.app = nil
	ts2 := startServer(t, url, env)
	c2 := ts2.client()
	var seqs []int64
	for i := range 2 {
		r := c2.emit(p.secretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, i))
		seqs = append(seqs, int64(num(r.json, "seq")))
	}
	for _, pg := range []*page{ann, bob} {
		at := annAt
		if pg == bob {
			at = bobAt
		}
		pg.waitFor(at, "state:reconnecting", "state:open", fmt.Sprintf("gap:%d", seq),
			fmt.Sprintf("msg:%d:0:replay", seqs[0]), fmt.Sprintf("msg:%d:1:replay", seqs[1]))
	}
	// Each page got each message once.
	for _, pg := range []*page{ann, bob} {
		n := 0
		for _, l := range pg.log() {
			if strings.HasPrefix(l, fmt.Sprintf("msg:%d:", seqs[0])) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("message %d delivered %d times: %q", seqs[0], n, pg.log())
		}
	}
	b.shot("browser-client-after-restart")

	// Heartbeat: through a proxy that stops forwarding, the page notices
	// within interval + ack timeout, and reconnects when it flows again.
	proxy := newFreezer(t, addr)
	hb := b.newTab(t)
	hb.start("http://"+proxy.ln.Addr().String(), p.publicKey, "hb", "carol", `{heartbeatIntervalMs: 300, heartbeatAckTimeoutMs: 400}`)
	at := hb.waitFor(0, "state:open")
	proxy.frozen.Store(true)
	at = hb.waitFor(at, "state:reconnecting")
	proxy.frozen.Store(false)
	hb.waitFor(at, "state:open")
}
