package main

// The Go reference client (api/client) against the real server: subscribe,
// presence, client-emit and the pairing of emit answers; reconnect after a
// server restart and after a cut connection (the server staying up), with
// replay, no gap and no duplicate; heartbeat; backoff through the injected
// clock; and no goroutine left behind, counted with no slack.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/relayhq/relay/api/backend"
	relay "github.com/relayhq/relay/api/client"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
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

// expectNoEvent fails if the subscription has an event ready.
func expectNoEvent(t *testing.T, s *relay.Subscription) {
	t.Helper()
	select {
	case ev := <-s.Events():
		t.Fatalf("unexpected event %+v (message %+v)", ev, ev.Message)
	default:
	}
}

// goroutineBaseline warms up what the process keeps for good (the actors'
// pool of turn goroutines, a keep-alive HTTP connection of owner) with one
// emit, and returns the goroutine count once it holds still.
func goroutineBaseline(t *testing.T, owner *client, p project) int {
	t.Helper()
	if r := owner.Emit(p.SecretKey, `{"channel":"warm-up","payload":0}`); r.Status != 200 {
		t.Fatalf("warm-up emit: %s", r.Raw)
	}
	// Still: the same count at six polls in a row (10 ms apart).
	last, same := -1, 0
	relaytest.Eventually(t, 10*time.Second, func() bool {
		if n := runtime.NumGoroutine(); n == last {
			same++
		} else {
			last, same = n, 0
		}
		return same >= 5
	}, "the goroutine count holding still")
	return last
}

// settleGoroutines waits until the process is back to at most before
// goroutines, with no slack, and dumps every stack if it is not.
func settleGoroutines(t *testing.T, before int) {
	t.Helper()
	relaytest.EventuallyNil(t, 10*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return withStacks(fmt.Sprintf("goroutines: %d before, %d after", before, n))
		}
		return nil
	})
}

func waitState(t *testing.T, c *relay.Client, want relay.State) {
	t.Helper()
	relaytest.EventuallyNil(t, 10*time.Second, func() error {
		if got := c.State(); got != want {
			return fmt.Errorf("state %s, want %s", got, want)
		}
		return nil
	})
}

// stepClock is a client Clock the test drives: every wait the client starts
// (backoff, the healthy-connection timer) is handed to the test, which fires
// it when it wants; a wait never fired never ends.
type stepClock struct{ waits chan *clockWait }

type clockWait struct {
	d time.Duration
	c chan time.Time
}

func newStepClock() *stepClock { return &stepClock{waits: make(chan *clockWait, 1024)} }

func (s *stepClock) After(d time.Duration) <-chan time.Time {
	w := &clockWait{d: d, c: make(chan time.Time, 1)}
	s.waits <- w
	return w.c
}

func (w *clockWait) fire() {
	select {
	case w.c <- time.Time{}:
	default:
	}
}

func (s *stepClock) next(t *testing.T) *clockWait {
	t.Helper()
	select {
	case w := <-s.waits:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("the client started no wait in 10s")
	}
	return nil
}

// backoff returns the client's next reconnect wait, passing over the
// healthy-connection timers (never fired: the connections are not healthy).
func (s *stepClock) backoff(t *testing.T) *clockWait {
	t.Helper()
	for {
		if w := s.next(t); w.d != relay.HealthyConnection {
			return w
		}
	}
}

// health returns the healthy-connection timer of the next connection.
func (s *stepClock) health(t *testing.T) *clockWait {
	t.Helper()
	w := s.next(t)
	if w.d != relay.HealthyConnection {
		t.Fatalf("wait of %v, want the healthy-connection timer", w.d)
	}
	return w
}

// proxy is a loopback TCP proxy in front of the server. A test can freeze it
// (stop forwarding and keep the connections, like a server that hangs), cut
// every connection through it while the server stays up, hold new
// connections until released, refuse them, and put a server frame in front
// of what the server sends on the next connections.
type proxy struct {
	ln     net.Listener
	target string
	frozen freeze
	refuse atomic.Bool

	mu       sync.Mutex
	conns    map[net.Conn]bool
	hold     chan struct{} // non-nil: new connections wait until it is closed
	inject   []byte
	accepted int
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		ln.Close()
		px.release()
		px.cut()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go px.serve(in)
		}
	}()
	return px
}

func (px *proxy) base() string { return "http://" + px.ln.Addr().String() }

func (px *proxy) serve(in net.Conn) {
	px.mu.Lock()
	px.accepted++
	hold, inject := px.hold, px.inject
	px.conns[in] = true
	px.mu.Unlock()
	if hold != nil {
		<-hold
	}
	var out net.Conn
	var err error
	if !px.refuse.Load() {
		out, err = net.Dial("tcp", px.target)
	}
	px.mu.Lock()
	_, live := px.conns[in] // not cut while held
	if out != nil {
		px.conns[out] = true
	}
	px.mu.Unlock()
	if px.refuse.Load() || err != nil || !live {
		px.drop(in, out)
		return
	}
	go px.pipe(out, in, nil)
	px.pipe(in, out, inject)
}

func (px *proxy) drop(conns ...net.Conn) {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			c.Close()
			delete(px.conns, c)
		}
	}
}

// pipe copies src to dst; inject goes to dst right after the HTTP head.
func (px *proxy) pipe(dst, src net.Conn, inject []byte) {
	defer px.drop(dst, src)
	buf := make([]byte, 32<<10)
	var head []byte
	for {
		n, err := src.Read(buf)
		if err == nil {
			px.frozen.hold(n) // while frozen: the peer hears nothing
		}
		data := buf[:n]
		if inject != nil {
			head = append(head, data...)
			i := bytes.Index(head, []byte("\r\n\r\n"))
			if i < 0 && err == nil {
				continue
			}
			if i >= 0 {
				data = append(append(head[:i+4:i+4], inject...), head[i+4:]...)
			} else {
				data = head
			}
			inject = nil
		}
		if len(data) > 0 {
			if _, werr := dst.Write(data); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// freeze is a proxy's frozen switch: Store(true) makes every pipe hold the
// bytes it reads until Store(false).
type freeze struct {
	mu     sync.Mutex
	thawed chan struct{} // closed at Store(false); nil while not frozen
	held   int           // reads held since the last Store(true)
}

func (f *freeze) Store(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case on && f.thawed == nil:
		f.thawed, f.held = make(chan struct{}), 0
	case !on && f.thawed != nil:
		close(f.thawed)
		f.thawed = nil
	}
}

// hold waits while the proxy is frozen, counting a read of n bytes held.
func (f *freeze) hold(n int) {
	f.mu.Lock()
	thawed := f.thawed
	if thawed != nil && n > 0 {
		f.held++
	}
	f.mu.Unlock()
	if thawed != nil {
		<-thawed
	}
}

// heldReads is how many reads the pipes hold since the proxy froze.
func (f *freeze) heldReads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
}

// unreadFromClients is how many bytes the clients sent that the proxy has
// not read yet (a frozen pipe stops reading).
func (px *proxy) unreadFromClients() int {
	px.mu.Lock()
	defer px.mu.Unlock()
	total := 0
	for c := range px.conns {
		if c.LocalAddr().String() == px.ln.Addr().String() { // accepted from a client
			if n, ok := relaytest.Unread(c.LocalAddr(), c.RemoteAddr()); ok {
				total += n
			}
		}
	}
	return total
}

// cut closes every connection through the proxy.
func (px *proxy) cut() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for c := range px.conns {
		c.Close()
		delete(px.conns, c)
	}
}

// holdNew makes new connections wait (the client's reconnect hangs in its
// handshake) until release.
func (px *proxy) holdNew() {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.hold == nil {
		px.hold = make(chan struct{})
	}
}

func (px *proxy) release() {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.hold != nil {
		close(px.hold)
		px.hold = nil
	}
}

// injectNext puts a server text frame carrying msg in front of the server's
// bytes on every later connection ("" stops it).
func (px *proxy) injectNext(msg string) {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.inject = nil
	if msg != "" {
		px.inject = ws.MustCompileFrame(ws.NewTextFrame([]byte(msg)))
	}
}

func (px *proxy) accepts() int {
	px.mu.Lock()
	defer px.mu.Unlock()
	return px.accepted
}

func TestGoClientSubscribePresenceEmit(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	ctx := context.Background()
	before := goroutineBaseline(t, owner, p)

	a, err := relay.Dial(ctx, ts.Base, p.PublicKey, relay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := relay.Dial(ctx, ts.Base, p.PublicKey, relay.Options{})
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

	r := owner.Emit(p.SecretKey, `{"channel":"room","payload":{"n":1}}`)
	for _, s := range []*relay.Subscription{sa, sb} {
		if m := nextMessage(t, s); string(m.Payload) != `{"n":1}` || int64(m.Seq) != int64(relaytest.Num(r.JSON, "seq")) {
			t.Fatalf("message %+v", m)
		}
	}

	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
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
	var re *relay.Error
	if _, err := a.Emit(ctx, "bad name", "chat", 1, tok); !errors.As(err, &re) || re.Code != "invalid_channel" {
		t.Fatalf("emit on an invalid channel: %v", err)
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
	settleGoroutines(t, before)
}

// TestGoClientPairsEmitAnswers: emits from many goroutines at once, past the
// per-clientId cap and some with a type the token does not allow; each Emit
// must return its own answer. The listener tells which emit each accepted seq
// belongs to (the payload is the emit's index).
func TestGoClientPairsEmitAnswers(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": "5"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	ctx := context.Background()
	listener := ts.Subscribed(t, p.PublicKey, "room")
	a, err := relay.Dial(ctx, ts.Base, p.PublicKey, relay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: "ann"}); err != nil {
		t.Fatal(err)
	}
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"msg"}, TTL: time.Minute})

	const n = 48
	type result struct {
		seq uint64
		err error
	}
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			typ := "msg"
			if i%4 == 3 {
				typ = "cursor"
			}
			<-start
			ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			seq, err := a.Emit(ectx, "room", typ, i, tok)
			results[i] = result{seq, err}
		}()
	}
	close(start)
	wg.Wait()

	accepted := map[int64]int{} // seq → index of the Emit that returned it
	for i, r := range results {
		var re *relay.Error
		switch {
		case i%4 == 3:
			if !errors.As(r.err, &re) || re.Code != "invalid_emit_token" || re.Channel != "room" {
				t.Fatalf("emit %d (type not allowed): %v, want invalid_emit_token", i, r.err)
			}
		case r.err == nil:
			accepted[int64(r.seq)] = i
		case !errors.As(r.err, &re) || re.Code != "client_emit_rate_limited":
			t.Fatalf("emit %d: %v, want an ack or client_emit_rate_limited", i, r.err)
		}
	}
	if len(accepted) < 5 {
		t.Fatalf("%d emits accepted, want at least the cap, 5", len(accepted))
	}
	for range accepted {
		m := listener.ExpectExcept(`{"channel":"room","type":"msg","clientId":"ann"}`, "seq", "payload")
		seq, payload := int64(relaytest.Num(m, "seq")), int(relaytest.Num(m, "payload"))
		if i, ok := accepted[seq]; !ok || i != payload {
			t.Fatalf("seq %d carried emit %d, but Emit %d returned it (ok %v)", seq, payload, i, ok)
		}
	}
	listener.ExpectSilence(100 * time.Millisecond)
}

func TestGoClientReconnectsAndReplays(t *testing.T) {
	url := storetest.SQLiteURL(t)
	addr := relaytest.FreeAddr(t) // the restarted server listens there again
	env := map[string]string{"RELAY_ADDR": addr}
	ts := startServer(t, url, env)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	ctx := context.Background()

	clk := newStepClock()
	var mu sync.Mutex
	var states []relay.State
	c, err := relay.Dial(ctx, ts.Base, p.PublicKey, relay.Options{
		Clock:             clk.After,
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
	r := owner.Emit(p.SecretKey, `{"channel":"feed","payload":"before"}`)
	if m := nextMessage(t, s); string(m.Payload) != `"before"` || int64(m.Seq) != int64(relaytest.Num(r.JSON, "seq")) {
		t.Fatalf("before restart: %+v", m)
	}

	// Restart the server on the same address and database. Two attempts fail
	// while it is down; the third waits until the emits below are done.
	ts.stop()
	var waits []time.Duration
	for range 2 {
		w := clk.backoff(t)
		waits = append(waits, w.d)
		w.fire()
	}
	third := clk.backoff(t)
	waits = append(waits, third.d)
	ts2 := startServer(t, url, env)
	owner2 := ts2.Client()
	r1 := owner2.Emit(p.SecretKey, `{"channel":"feed","payload":"while away 1"}`)
	r2 := owner2.Emit(p.SecretKey, `{"channel":"feed","payload":"while away 2"}`)
	third.fire()

	// The client resubscribes with since: the restart lost the old ring, so a
	// gap first, then what was emitted before it came back, flagged replay.
	ev := nextEvent(t, s)
	if ev.Gap == nil || ev.Gap.Since != exactSeq(t, r) {
		t.Fatalf("want a replay gap since %v, got %+v", r.JSON["seq"], ev)
	}
	for _, want := range []response{r1, r2} {
		ev := nextEvent(t, s)
		if m := ev.Message; m == nil || !m.Replay || int64(m.Seq) != int64(relaytest.Num(want.JSON, "seq")) {
			t.Fatalf("replayed %+v, want seq %v", ev, want.JSON["seq"])
		}
	}
	r3 := owner2.Emit(p.SecretKey, `{"channel":"feed","payload":"live"}`)
	if ev := nextEvent(t, s); ev.Message == nil || ev.Message.Replay || int64(ev.Message.Seq) != int64(relaytest.Num(r3.JSON, "seq")) {
		t.Fatalf("live after reconnect %+v", ev)
	}
	if fmt.Sprint(waits) != "[500ms 1s 2s]" {
		t.Fatalf("backoff waits %v, want 500ms, 1s, 2s (jitter pinned to the middle)", waits)
	}
	mu.Lock()
	defer mu.Unlock()
	joined := ""
	for _, st := range states {
		joined += string(st) + " "
	}
	if !strings.Contains(joined, "connecting open reconnecting") || !strings.HasSuffix(joined, "open ") {
		t.Fatalf("states %q", joined)
	}
}

// TestGoClientReplaysAfterCut: the connection is cut while the server stays
// up, messages are emitted while the client is away (its reconnect held on
// the injected clock), and the client gets each of them once, replayed, with
// no gap. The next connection also starts with a copy of a message the client
// already has, which it must drop. Three rounds, then no goroutine is left.
func TestGoClientReplaysAfterCut(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	px := newProxy(t, strings.TrimPrefix(ts.Base, "http://"))
	before := goroutineBaseline(t, owner, p)
	ctx := context.Background()

	clk := newStepClock()
	c, err := relay.Dial(ctx, px.base(), p.PublicKey, relay.Options{Clock: clk.After, Jitter: func() float64 { return 0.5 }, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Subscribe(ctx, "feed", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	emit := func(payload string) int64 {
		r := owner.Emit(p.SecretKey, `{"channel":"feed","payload":"`+payload+`"}`)
		if r.Status != 200 {
			t.Fatalf("emit: %s", r.Raw)
		}
		return int64(relaytest.Num(r.JSON, "seq"))
	}
	last := emit("live 0")
	if m := nextMessage(t, s); int64(m.Seq) != last || m.Replay {
		t.Fatalf("first message %+v", m)
	}
	for round := 1; round <= 3; round++ {
		px.injectNext(fmt.Sprintf(`{"channel":"feed","payload":"duplicate","seq":%d,"replay":true}`, last))
		px.cut()
		var away []int64
		for i := range 3 {
			away = append(away, emit(fmt.Sprintf("away %d.%d", round, i)))
		}
		clk.backoff(t).fire() // the client noticed the cut; let it reconnect now
		for i, seq := range away {
			ev := nextEvent(t, s)
			if m := ev.Message; m == nil || !m.Replay || int64(m.Seq) != seq || string(m.Payload) != fmt.Sprintf(`"away %d.%d"`, round, i) {
				t.Fatalf("round %d: event %+v (message %+v), want the replay of seq %d", round, ev, ev.Message, seq)
			}
		}
		last = emit(fmt.Sprintf("live %d", round))
		if ev := nextEvent(t, s); ev.Message == nil || ev.Message.Replay || int64(ev.Message.Seq) != last {
			t.Fatalf("round %d: live event %+v, want seq %d", round, ev, last)
		}
		expectNoEvent(t, s)
		if seq, ok := s.LastSeq(); !ok || int64(seq) != last {
			t.Fatalf("LastSeq %d %v, want %d", seq, ok, last)
		}
	}
	if px.accepts() != 4 {
		t.Fatalf("%d connections through the proxy, want 4", px.accepts())
	}
	c.Close()
	settleGoroutines(t, before)
}

func TestGoClientHeartbeatDetectsDeadServer(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	proxy := newProxy(t, strings.TrimPrefix(ts.Base, "http://"))
	before := goroutineBaseline(t, owner, p)
	c, err := relay.Dial(context.Background(), proxy.base(), p.PublicKey, relay.Options{
		HeartbeatInterval: 200 * time.Millisecond, HeartbeatAckTimeout: 300 * time.Millisecond,
		MaxReconnectDelay: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Subscribe(context.Background(), "a", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		proxy.frozen.Store(true)
		waitState(t, c, relay.Reconnecting) // the pong never came: the client closed the socket
		proxy.frozen.Store(false)
		waitState(t, c, relay.Open)
		// The resubscribe is in once an emit reaches the subscription.
		relaytest.Eventually(t, 10*time.Second, func() bool {
			owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"a","payload":"after %d"}`, round))
			select {
			case ev := <-s.Events():
				return ev.Message != nil && string(ev.Message.Payload) == fmt.Sprintf(`"after %d"`, round)
			case <-time.After(100 * time.Millisecond):
				return false
			}
		}, "round %d: a message after the reconnect", round)
		for len(s.Events()) > 0 { // copies emitted before the resubscribe was in
			<-s.Events()
		}
	}
	c.Close()
	settleGoroutines(t, before)
}

// TestGoClientCloseDuringReconnect: Close while the client waits out a
// backoff, and Close while its reconnect hangs in the handshake, both return
// at once and leave no goroutine.
func TestGoClientCloseDuringReconnect(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	px := newProxy(t, strings.TrimPrefix(ts.Base, "http://"))
	before := goroutineBaseline(t, owner, p)
	ctx := context.Background()

	closeWithin := func(c *relay.Client) {
		t.Helper()
		done := make(chan struct{})
		go func() { c.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not return")
		}
		if c.State() != relay.Closed {
			t.Fatalf("state %s after Close", c.State())
		}
	}

	clk := newStepClock()
	c, err := relay.Dial(ctx, px.base(), p.PublicKey, relay.Options{Clock: clk.After, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Subscribe(ctx, "a", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	px.cut()
	clk.backoff(t) // never fired: the client waits for good
	waitState(t, c, relay.Reconnecting)
	closeWithin(c)
	select {
	case <-s.Done():
	default:
		t.Fatal("subscription not ended by Close")
	}
	if _, err := c.Subscribe(ctx, "a", relay.SubscribeOptions{}); !errors.Is(err, relay.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}

	clk2 := newStepClock()
	c2, err := relay.Dial(ctx, px.base(), p.PublicKey, relay.Options{Clock: clk2.After, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	px.holdNew()
	n := px.accepts()
	px.cut()
	clk2.backoff(t).fire()
	relaytest.Eventually(t, 10*time.Second, func() bool { return px.accepts() != n }, "the reconnect in its handshake, held")
	closeWithin(c2)
	px.release() // the proxy's own goroutine for the held connection ends
	settleGoroutines(t, before)
}

// TestGoClientBackoffThroughClock: the waits the client actually starts, seen
// through the injected clock: 500 ms × 2^attempt with ±50 % jitter, capped,
// and back to the first step after a healthy connection (HealthyConnection,
// also on the injected clock), but not after a short one.
func TestGoClientBackoffThroughClock(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	p := ts.Signup("alice@example.com").CreateProject("demo")
	px := newProxy(t, strings.TrimPrefix(ts.Base, "http://"))
	ctx := context.Background()

	var mu sync.Mutex
	var jitters []float64 // as handed to the client, one per backoff
	cycle := []float64{0, 0.999999, 0.5}
	jitter := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		j := cycle[len(jitters)%len(cycle)]
		jitters = append(jitters, j)
		return j
	}
	lastJitter := func() float64 { mu.Lock(); defer mu.Unlock(); return jitters[len(jitters)-1] }
	const max = 3 * time.Second
	clk := newStepClock()
	c, err := relay.Dial(ctx, px.base(), p.PublicKey, relay.Options{Clock: clk.After, Jitter: jitter, MaxReconnectDelay: max, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	clk.health(t) // the first connection's: never fired

	check := func(w *clockWait, attempt int, base time.Duration) {
		t.Helper()
		j := lastJitter()
		if want := relay.Backoff(attempt, max, j); w.d != want {
			t.Fatalf("attempt %d: waited %v, want %v (jitter %v)", attempt, w.d, want, j)
		}
		if w.d < base/2 || w.d >= base*3/2 {
			t.Fatalf("attempt %d: waited %v, outside %v ± 50 %%", attempt, w.d, base)
		}
		if j == 0 && w.d != base/2 {
			t.Fatalf("attempt %d: lowest jitter gave %v, want %v", attempt, w.d, base/2)
		}
		if j > 0.99 && w.d < base*3/2-time.Millisecond {
			t.Fatalf("attempt %d: highest jitter gave %v, want just under %v", attempt, w.d, base*3/2)
		}
	}

	// The server is unreachable: each attempt fails, the waits grow to the cap.
	px.refuse.Store(true)
	px.cut()
	var w *clockWait
	for attempt, base := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, max, max, max} {
		w = clk.backoff(t)
		check(w, attempt, base)
		if attempt < 5 {
			w.fire()
		}
	}

	// A healthy connection: the next drop starts from the first step again.
	px.refuse.Store(false)
	w.fire()
	h := clk.health(t)
	waitState(t, c, relay.Open)
	h.fire()
	px.cut()
	w = clk.backoff(t)
	check(w, 0, 500*time.Millisecond)

	// A short one (its timer never fires): the next drop goes on growing.
	w.fire()
	clk.health(t)
	waitState(t, c, relay.Open)
	px.cut()
	check(clk.backoff(t), 1, time.Second)
}

// exactSeq is the seq of an emit answer, read from the body as a uint64 (not
// through a float64).
func exactSeq(t *testing.T, r response) uint64 {
	t.Helper()
	var v struct {
		Seq *uint64 `json:"seq"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &v); err != nil || v.Seq == nil || r.Status != 200 {
		t.Fatalf("emit answer %d %s: no seq (%v)", r.Status, r.Raw, err)
	}
	return *v.Seq
}

// TestGoClientSubscribeSince: SubscribeOptions.Since replays what the ring
// still holds after it, before Subscribe returns; a since the ring no longer
// covers gives a Gap carrying that since as the exact uint64; and until a
// message arrives, a reconnect resumes from the starting since.
func TestGoClientSubscribeSince(t *testing.T) {
	clock := newClock()
	ts := startServerAt(t, storetest.SQLiteURL(t), map[string]string{"REPLAY_BUFFER_TTL_SECONDS": "2"}, clock.Now)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	px := newProxy(t, strings.TrimPrefix(ts.Base, "http://"))
	before := goroutineBaseline(t, owner, p)
	ctx := context.Background()
	emit := func(channel, payload string) uint64 {
		t.Helper()
		return exactSeq(t, owner.Emit(p.SecretKey, `{"channel":"`+channel+`","payload":"`+payload+`"}`))
	}
	var seqs []uint64
	for i := range 3 {
		seqs = append(seqs, emit("feed", fmt.Sprint("m", i)))
	}
	clk := newStepClock()
	c, err := relay.Dial(ctx, px.base(), p.PublicKey, relay.Options{Clock: clk.After, Jitter: func() float64 { return 0.5 }, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	expectReplay := func(s *relay.Subscription, seq uint64, payload string) {
		t.Helper()
		ev := nextEvent(t, s)
		if m := ev.Message; m == nil || !m.Replay || m.Seq != seq || string(m.Payload) != `"`+payload+`"` {
			t.Fatalf("event %+v (message %+v), want the replay of %s, seq %d", ev, ev.Message, payload, seq)
		}
	}

	// From the first: the two after it, replayed in order, no gap, all
	// queued by the time Subscribe returns.
	s, err := c.Subscribe(ctx, "feed", relay.SubscribeOptions{Since: new(seqs[0])})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Events()); n != 2 {
		t.Fatalf("%d events queued when Subscribe returned, want the 2 replayed", n)
	}
	expectReplay(s, seqs[1], "m1")
	expectReplay(s, seqs[2], "m2")
	expectNoEvent(t, s)
	if seq, ok := s.LastSeq(); !ok || seq != seqs[2] {
		t.Fatalf("LastSeq %d %v, want %d", seq, ok, seqs[2])
	}

	// From the latest, on another channel: nothing to replay; LastSeq is the
	// starting since, and a reconnect before any message resumes from it, so
	// what was emitted while the client was away comes back, with no gap.
	last := emit("other", "o0")
	o, err := c.Subscribe(ctx, "other", relay.SubscribeOptions{Since: new(last)})
	if err != nil {
		t.Fatal(err)
	}
	expectNoEvent(t, o)
	if seq, ok := o.LastSeq(); !ok || seq != last {
		t.Fatalf("LastSeq %d %v before any message, want the starting since %d", seq, ok, last)
	}
	px.cut()
	away := emit("other", "o1")
	clk.backoff(t).fire()
	expectReplay(o, away, "o1")
	expectNoEvent(t, o)

	// A since the ring no longer covers (its messages expired): a Gap with
	// that since, exactly, then what the ring still holds.
	old := emit("old", "g0")
	emit("old", "g1")
	clock.Advance(2500 * time.Millisecond)
	kept := emit("old", "g2")
	d, err := relay.Dial(ctx, ts.Base, p.PublicKey, relay.Options{HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	g, err := d.Subscribe(ctx, "old", relay.SubscribeOptions{Since: new(old)})
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, g); ev.Gap == nil || ev.Gap.Since != old {
		t.Fatalf("event %+v (gap %+v), want a gap since %d", ev, ev.Gap, old)
	}
	expectReplay(g, kept, "g2")
	expectNoEvent(t, g)
	c.Close()
	d.Close()
	settleGoroutines(t, before)
}
