package wire

// The Go reference client (api/client) against the real server: subscribe,
// presence, client-emit and the pairing of emit answers; reconnect after a
// server restart and after a cut connection (the server staying up), with
// replay, no gap and no duplicate; heartbeat; backoff through the injected
// clock; and no goroutine of the client left behind, counted with no slack
// in this process (the relay is another process).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	relay "github.com/relayhq/relay/api/client"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// proxiedRelay starts what the Go-client tests that cut connections start
// from: a relay, a project, a proxy in front of the relay, and the test
// process's goroutine count before any client (GoroutineBaseline).
func proxiedRelay(t *testing.T) (owner *relaytest.Client, p relaytest.Project, px *relaytest.Proxy, before int) {
	t.Helper()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner = ts.Signup("alice@example.com")
	p = owner.CreateProject("demo")
	px = relaytest.NewProxy(t, ts.Addr())
	return owner, p, px, relaytest.GoroutineBaseline(t, owner, p)
}

func TestGoClientSubscribePresenceEmit(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	ctx := context.Background()
	before := relaytest.GoroutineBaseline(t, owner, p)

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
	if ev := relaytest.NextEvent(t, sa); ev.Presence == nil || ev.Presence.Event != "sync" || len(ev.Presence.Members) != 0 {
		t.Fatalf("first event %+v", ev)
	}
	sb, err := b.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := relaytest.NextEvent(t, sa); ev.Presence == nil || ev.Presence.Event != "join" || strings.Join(sa.Members(), ",") != "bob" {
		t.Fatalf("ann saw %+v, members %v", ev, sa.Members())
	}
	if ev := relaytest.NextEvent(t, sb); ev.Presence == nil || strings.Join(ev.Presence.Members, ",") != "ann" {
		t.Fatalf("bob's sync %+v", ev)
	}

	r := owner.Emit(p.SecretKey, `{"channel":"room","payload":{"n":1}}`)
	for _, s := range []*relay.Subscription{sa, sb} {
		if m := relaytest.NextMessage(t, s); string(m.Payload) != `{"n":1}` || int64(m.Seq) != int64(relaytest.Num(r.JSON, "seq")) {
			t.Fatalf("message %+v", m)
		}
	}

	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
	seq, err := a.Emit(ctx, "room", "chat", map[string]string{"text": "hi"}, tok)
	if err != nil {
		t.Fatal(err)
	}
	if m := relaytest.NextMessage(t, sb); m.Seq != seq || m.ClientID != "ann" || m.Type != "chat" || string(m.Payload) != `{"text":"hi"}` {
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
	if ev := relaytest.NextEvent(t, sa); ev.Presence == nil || ev.Presence.Event != "leave" || len(sa.Members()) != 0 {
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
	relaytest.SettleGoroutines(t, before)
}

// TestGoClientPairsEmitAnswers: emits from many goroutines at once, past the
// per-clientId cap and some with a type the token does not allow; each Emit
// must return its own answer. The listener tells which emit each accepted seq
// belongs to (the payload is the emit's index).
func TestGoClientPairsEmitAnswers(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": "5"})
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
	t.Parallel()
	url := storetest.SQLiteURL(t)
	addr := relaytest.FreeAddr(t) // the restarted server listens there again
	env := map[string]string{"RELAY_ADDR": addr}
	ts := relaytest.Start(t, url, env)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	ctx := context.Background()

	clk := relaytest.NewStepClock()
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
	if m := relaytest.NextMessage(t, s); string(m.Payload) != `"before"` || int64(m.Seq) != int64(relaytest.Num(r.JSON, "seq")) {
		t.Fatalf("before restart: %+v", m)
	}

	// Restart the server on the same address and database. Two attempts fail
	// while it is down; the third waits until the emits below are done.
	ts.Stop()
	var waits []time.Duration
	for range 2 {
		w := clk.Backoff(t)
		waits = append(waits, w.D)
		w.Fire()
	}
	third := clk.Backoff(t)
	waits = append(waits, third.D)
	ts2 := relaytest.Start(t, url, env)
	owner2 := ts2.Client()
	r1 := owner2.Emit(p.SecretKey, `{"channel":"feed","payload":"while away 1"}`)
	r2 := owner2.Emit(p.SecretKey, `{"channel":"feed","payload":"while away 2"}`)
	third.Fire()

	// The client resubscribes with since: the restart lost the old ring, so a
	// gap first, then what was emitted before it came back, flagged replay.
	ev := relaytest.NextEvent(t, s)
	if ev.Gap == nil || ev.Gap.Since != relaytest.ExactSeq(t, r) {
		t.Fatalf("want a replay gap since %v, got %+v", r.JSON["seq"], ev)
	}
	for _, want := range []relaytest.Response{r1, r2} {
		ev := relaytest.NextEvent(t, s)
		if m := ev.Message; m == nil || !m.Replay || int64(m.Seq) != int64(relaytest.Num(want.JSON, "seq")) {
			t.Fatalf("replayed %+v, want seq %v", ev, want.JSON["seq"])
		}
	}
	r3 := owner2.Emit(p.SecretKey, `{"channel":"feed","payload":"live"}`)
	if ev := relaytest.NextEvent(t, s); ev.Message == nil || ev.Message.Replay || int64(ev.Message.Seq) != int64(relaytest.Num(r3.JSON, "seq")) {
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
	// Not parallel: it counts the process's goroutines.
	owner, p, px, before := proxiedRelay(t)
	ctx := context.Background()

	clk := relaytest.NewStepClock()
	c, err := relay.Dial(ctx, px.Base(), p.PublicKey, relay.Options{Clock: clk.After, Jitter: func() float64 { return 0.5 }, HeartbeatInterval: -1})
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
	if m := relaytest.NextMessage(t, s); int64(m.Seq) != last || m.Replay {
		t.Fatalf("first message %+v", m)
	}
	for round := 1; round <= 3; round++ {
		px.InjectNext(fmt.Sprintf(`{"channel":"feed","payload":"duplicate","seq":%d,"replay":true}`, last))
		px.Cut()
		var away []int64
		for i := range 3 {
			away = append(away, emit(fmt.Sprintf("away %d.%d", round, i)))
		}
		clk.Backoff(t).Fire() // the client noticed the cut; let it reconnect now
		for i, seq := range away {
			ev := relaytest.NextEvent(t, s)
			if m := ev.Message; m == nil || !m.Replay || int64(m.Seq) != seq || string(m.Payload) != fmt.Sprintf(`"away %d.%d"`, round, i) {
				t.Fatalf("round %d: event %+v (message %+v), want the replay of seq %d", round, ev, ev.Message, seq)
			}
		}
		last = emit(fmt.Sprintf("live %d", round))
		if ev := relaytest.NextEvent(t, s); ev.Message == nil || ev.Message.Replay || int64(ev.Message.Seq) != last {
			t.Fatalf("round %d: live event %+v, want seq %d", round, ev, last)
		}
		relaytest.ExpectNoEvent(t, s)
		if seq, ok := s.LastSeq(); !ok || int64(seq) != last {
			t.Fatalf("LastSeq %d %v, want %d", seq, ok, last)
		}
	}
	if px.Accepts() != 4 {
		t.Fatalf("%d connections through the proxy, want 4", px.Accepts())
	}
	c.Close()
	relaytest.SettleGoroutines(t, before)
}

func TestGoClientHeartbeatDetectsDeadServer(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	owner, p, proxy, before := proxiedRelay(t)
	c, err := relay.Dial(context.Background(), proxy.Base(), p.PublicKey, relay.Options{
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
		proxy.Frozen.Store(true)
		relaytest.WaitState(t, c, relay.Reconnecting) // the pong never came: the client closed the socket
		proxy.Frozen.Store(false)
		relaytest.WaitState(t, c, relay.Open)
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
	relaytest.SettleGoroutines(t, before)
}

// TestGoClientCloseDuringReconnect: Close while the client waits out a
// backoff, and Close while its reconnect hangs in the handshake, both return
// at once and leave no goroutine.
func TestGoClientCloseDuringReconnect(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	_, p, px, before := proxiedRelay(t)
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

	clk := relaytest.NewStepClock()
	c, err := relay.Dial(ctx, px.Base(), p.PublicKey, relay.Options{Clock: clk.After, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Subscribe(ctx, "a", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	clk.Backoff(t) // never fired: the client waits for good
	relaytest.WaitState(t, c, relay.Reconnecting)
	closeWithin(c)
	select {
	case <-s.Done():
	default:
		t.Fatal("subscription not ended by Close")
	}
	if _, err := c.Subscribe(ctx, "a", relay.SubscribeOptions{}); !errors.Is(err, relay.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}

	clk2 := relaytest.NewStepClock()
	c2, err := relay.Dial(ctx, px.Base(), p.PublicKey, relay.Options{Clock: clk2.After, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	px.HoldNew()
	n := px.Accepts()
	px.Cut()
	clk2.Backoff(t).Fire()
	relaytest.Eventually(t, 10*time.Second, func() bool { return px.Accepts() != n }, "the reconnect in its handshake, held")
	closeWithin(c2)
	px.Release() // the proxy's own goroutine for the held connection ends
	relaytest.SettleGoroutines(t, before)
}

// TestGoClientBackoffThroughClock: the waits the client actually starts, seen
// through the injected clock: 500 ms × 2^attempt with ±50 % jitter, capped,
// and back to the first step after a healthy connection (HealthyConnection,
// also on the injected clock), but not after a short one.
func TestGoClientBackoffThroughClock(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	p := ts.Signup("alice@example.com").CreateProject("demo")
	px := relaytest.NewProxy(t, ts.Addr())
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
	clk := relaytest.NewStepClock()
	c, err := relay.Dial(ctx, px.Base(), p.PublicKey, relay.Options{Clock: clk.After, Jitter: jitter, MaxReconnectDelay: max, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	clk.Health(t) // the first connection's: never fired

	check := func(w *relaytest.ClockWait, attempt int, base time.Duration) {
		t.Helper()
		j := lastJitter()
		if want := relay.Backoff(attempt, max, j); w.D != want {
			t.Fatalf("attempt %d: waited %v, want %v (jitter %v)", attempt, w.D, want, j)
		}
		if w.D < base/2 || w.D >= base*3/2 {
			t.Fatalf("attempt %d: waited %v, outside %v ± 50 %%", attempt, w.D, base)
		}
		if j == 0 && w.D != base/2 {
			t.Fatalf("attempt %d: lowest jitter gave %v, want %v", attempt, w.D, base/2)
		}
		if j > 0.99 && w.D < base*3/2-time.Millisecond {
			t.Fatalf("attempt %d: highest jitter gave %v, want just under %v", attempt, w.D, base*3/2)
		}
	}

	// The server is unreachable: each attempt fails, the waits grow to the cap.
	px.Refuse.Store(true)
	px.Cut()
	var w *relaytest.ClockWait
	for attempt, base := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, max, max, max} {
		w = clk.Backoff(t)
		check(w, attempt, base)
		if attempt < 5 {
			w.Fire()
		}
	}

	// A healthy connection: the next drop starts from the first step again.
	px.Refuse.Store(false)
	w.Fire()
	h := clk.Health(t)
	relaytest.WaitState(t, c, relay.Open)
	h.Fire()
	px.Cut()
	w = clk.Backoff(t)
	check(w, 0, 500*time.Millisecond)

	// A short one (its timer never fires): the next drop goes on growing.
	w.Fire()
	clk.Health(t)
	relaytest.WaitState(t, c, relay.Open)
	px.Cut()
	check(clk.Backoff(t), 1, time.Second)
}
