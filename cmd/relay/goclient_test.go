package main

import (
	"context"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	relay "github.com/relayhq/relay/api/client"
	"github.com/relayhq/relay/store/storetest"
)

func nextEvent(t *testing.T, s *relay.Subscription) relay.Event {
	t.Helper()
	select {
	case ev := <-s.Events():
		return ev
	case <-s.Done():
		t.Fatal("subscription ended")
	case <-time.After(10 * time.Second):
		t.Fatal("no event in 10s")
	}
	return relay.Event{}
}

func nextMessage(t *testing.T, s *relay.Subscription) *relay.Message {
	t.Helper()
	for {
		ev := nextEvent(t, s)
		if ev.Message != nil {
			return ev.Message
		}
	}
}

func TestGoClientSubscribePresenceEmit(t *testing.T) {
	before := runtime.NumGoroutine()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	secret := owner.do("PATCH", "/api/projects/"+p.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
	ctx := context.Background()

	a, err := relay.Dial(ctx, ts.base, p.publicKey, relay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := relay.Dial(ctx, ts.base, p.publicKey, relay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := a.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: "ann"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, sa); ev.Presence == nil || ev.Presence.Event != "sync" || len(ev.Presence.Members) != 0 {
		t.Fatalf("first event %+v", ev)
	}
	sb, err := b.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, sa); ev.Presence == nil || ev.Presence.Event != "join" || strings.Join(sa.Members(), ",") != "bob" {
		t.Fatalf("ann saw %+v, members %v", ev, sa.Members())
	}
	if ev := nextEvent(t, sb); ev.Presence == nil || strings.Join(ev.Presence.Members, ",") != "ann" {
		t.Fatalf("bob's sync %+v", ev)
	}

	r := owner.emit(p.secretKey, `{"channel":"room","payload":{"n":1}}`)
	for _, s := range []*relay.Subscription{sa, sb} {
		if m := nextMessage(t, s); string(m.Payload) != `{"n":1}` || int64(m.Seq) != int64(num(r.json, "seq")) {
			t.Fatalf("message %+v", m)
		}
	}

	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.id, Channel: "room", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
	seq, err := a.Emit(ctx, "room", "chat", map[string]string{"text": "hi"}, tok)
	if err != nil {
		t.Fatal(err)
	}
	if m := nextMessage(t, sb); m.Seq != seq || m.ClientID != "ann" || m.Type != "chat" || string(m.Payload) != `{"text":"hi"}` {
		t.Fatalf("client-emitted message %+v (seq %d)", m, seq)
	}
	if _, err := b.Emit(ctx, "room", "chat", 1, tok); err == nil || !strings.Contains(err.Error(), "emit_identity_mismatch") {
		t.Fatalf("bob with ann's token: %v", err)
	}
	if _, err := a.Subscribe(ctx, "bad name", relay.SubscribeOptions{}); err == nil {
		t.Fatal("invalid channel accepted")
	}

	if err := b.Unsubscribe(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, sa); ev.Presence == nil || ev.Presence.Event != "leave" || len(sa.Members()) != 0 {
		t.Fatalf("leave %+v", ev)
	}
	a.Close()
	b.Close()
	select {
	case <-sa.Done():
	default:
		t.Fatal("subscription not ended by Close")
	}
	if a.State() != relay.Closed {
		t.Fatalf("state %s after Close", a.State())
	}
	// No goroutine of the clients is left (the server's own are stopped too).
	ctxs, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ts.app.shutdown(ctxs)
	ts.app = nil
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeAddr reserves a loopback port for a server that restarts on it.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestGoClientReconnectsAndReplays(t *testing.T) {
	url := storetest.SQLiteURL(t)
	addr := freeAddr(t)
	env := map[string]string{"RELAY_ADDR": addr}
	ts := startServer(t, url, env)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	ctx := context.Background()

	var waits []time.Duration
	var mu sync.Mutex
	var states []relay.State
	c, err := relay.Dial(ctx, ts.base, p.publicKey, relay.Options{
		Clock: func(d time.Duration) <-chan time.Time {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
			return time.After(min(d, 100*time.Millisecond)) // time passes faster here
		},
		Jitter:            func() float64 { return 0.5 },
		HeartbeatInterval: -1,
		OnState:           func(s relay.State) { mu.Lock(); states = append(states, s); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Subscribe(ctx, "feed", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := owner.emit(p.secretKey, `{"channel":"feed","payload":"before"}`)
	if m := nextMessage(t, s); string(m.Payload) != `"before"` || int64(m.Seq) != int64(num(r.json, "seq")) {
		t.Fatalf("before restart: %+v", m)
	}

	// Restart the server on the same address and database.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ts.app.shutdown(sctx)
	ts.app = nil
	time.Sleep(300 * time.Millisecond) // a few failed attempts
	ts2 := startServer(t, url, env)
	owner2 := ts2.client()
	r1 := owner2.emit(p.secretKey, `{"channel":"feed","payload":"while away 1"}`)
	r2 := owner2.emit(p.secretKey, `{"channel":"feed","payload":"while away 2"}`)

	// The client resubscribes with since: the restart lost the old ring, so a
	// gap first, then what was emitted before it came back, flagged replay.
	ev := nextEvent(t, s)
	if ev.Gap == nil || int64(ev.Gap.Since) != int64(num(r.json, "seq")) {
		t.Fatalf("want a replay gap since %v, got %+v", r.json["seq"], ev)
	}
	for _, want := range []response{r1, r2} {
		m := nextMessage(t, s)
		if !m.Replay || int64(m.Seq) != int64(num(want.json, "seq")) {
			t.Fatalf("replayed %+v, want seq %v", m, want.json["seq"])
		}
	}
	r3 := owner2.emit(p.secretKey, `{"channel":"feed","payload":"live"}`)
	if m := nextMessage(t, s); m.Replay || int64(m.Seq) != int64(num(r3.json, "seq")) {
		t.Fatalf("live after reconnect %+v", m)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(waits) < 2 || waits[0] != 500*time.Millisecond || waits[1] != time.Second {
		t.Fatalf("backoff waits %v, want 500ms, 1s, … (jitter pinned to the middle)", waits)
	}
	joined := ""
	for _, st := range states {
		joined += string(st) + " "
	}
	if !strings.Contains(joined, "connecting open reconnecting") || !strings.HasSuffix(joined, "open ") {
		t.Fatalf("states %q", joined)
	}
}

// freezer is a loopback TCP proxy that can stop forwarding, like a server
// that hangs without closing.
type freezer struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
}

func newFreezer(t *testing.T, target string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					for f.frozen.Load() && err == nil {
						time.Sleep(10 * time.Millisecond) // hold the bytes: the peer hears nothing
					}
					if n > 0 {
						dst.Write(buf[:n])
					}
					if err != nil {
						dst.Close()
						return
					}
				}
			}
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	return f
}

func TestGoClientHeartbeatDetectsDeadServer(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	proxy := newFreezer(t, strings.TrimPrefix(ts.base, "http://"))
	var mu sync.Mutex
	var states []relay.State
	c, err := relay.Dial(context.Background(), "http://"+proxy.ln.Addr().String(), p.publicKey, relay.Options{
		HeartbeatInterval: 200 * time.Millisecond, HeartbeatAckTimeout: 300 * time.Millisecond,
		OnState: func(s relay.State) { mu.Lock(); states = append(states, s); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Subscribe(context.Background(), "a", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	proxy.frozen.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for c.State() != relay.Reconnecting {
		if time.Now().After(deadline) {
			t.Fatal("the client did not notice the frozen server")
		}
		time.Sleep(20 * time.Millisecond)
	}
	proxy.frozen.Store(false)
	for c.State() != relay.Open {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("no reconnect, state %s", c.State())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the resubscribe is in
	owner.emit(p.secretKey, `{"channel":"a","payload":"after"}`)
	for {
		m := nextMessage(t, s)
		if string(m.Payload) == `"after"` {
			break
		}
	}
}
