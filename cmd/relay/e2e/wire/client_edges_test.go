package wire

// The Go client (api/client) and the browser client (api/web/client.js) at
// the protocol's edges: subscribe refusals, client-emitted types named like
// server frames, a client that gave up, a revoked key.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	relay "github.com/relayhq/relay/api/client"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// goClient dials the Go client with no heartbeat (opts' other fields as
// given), closed when the test ends.
func goClient(t *testing.T, base, publicKey string, opts relay.Options) *relay.Client {
	t.Helper()
	opts.HeartbeatInterval = -1
	c, err := relay.Dial(context.Background(), base, publicKey, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// client_id_too_long and too_many_presence_members answer a subscribe (not
// subscribed): Subscribe returns the error. It used to know four codes only,
// and waited for its context.
func TestGoClientSubscribeRefusedClientIDTooLong(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	p := ts.Signup("alice@example.com").CreateProject("demo")
	c := goClient(t, ts.Base, p.PublicKey, relay.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := c.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: strings.Repeat("x", 129)})
	var re *relay.Error
	if !errors.As(err, &re) || re.Code != "client_id_too_long" {
		t.Fatalf("Subscribe with a 129-byte clientId: %v, want the client_id_too_long error", err)
	}
}

// too_many_channels refuses a subscribe to a new channel past
// MAX_CHANNELS_PER_PROJECT: Subscribe returns it (it waited for its context).
func TestGoClientSubscribeRefusedTooManyChannels(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"MAX_CHANNELS_PER_PROJECT": "1"})
	p := ts.Signup("alice@example.com").CreateProject("demo")
	c := goClient(t, ts.Base, p.PublicKey, relay.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.Subscribe(ctx, "a", relay.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	var re *relay.Error
	if _, err := c.Subscribe(ctx, "b", relay.SubscribeOptions{}); !errors.As(err, &re) || re.Code != "too_many_channels" {
		t.Fatalf("Subscribe to a second channel past the cap of one: %v, want too_many_channels", err)
	}
}

// The same refusal goes to the subscribe, not to an Emit waiting on that
// channel (it used to: the emit got the subscribe's error and the subscribe
// hung). A frozen proxy holds both frames so that both wait together.
func TestGoClientSubscribeRefusalNotTakenByAnEmit(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	px := relaytest.NewProxy(t, ts.Addr())
	ctx := context.Background()
	c := goClient(t, px.Base(), p.PublicKey, relay.Options{})
	if _, err := c.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: "ann"}); err != nil {
		t.Fatal(err)
	}
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	px.Frozen.Store(true)
	subErr, emitErr := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := c.Subscribe(sctx, "room", relay.SubscribeOptions{Presence: true, ClientID: strings.Repeat("x", 129)})
		subErr <- err
	}()
	// The subscribe is at the proxy (held) before the emit is sent, and the
	// emit is sent (waiting at the proxy, which reads no more) before both go on.
	relaytest.Eventually(t, 5*time.Second, func() bool { return px.Frozen.HeldReads() > 0 }, "the subscribe held at the proxy")
	go func() {
		_, err := c.Emit(sctx, "room", "chat", 1, tok)
		emitErr <- err
	}()
	relaytest.Eventually(t, 5*time.Second, func() bool { return px.UnreadFromClients() > 0 }, "the emit waiting at the proxy")
	px.Frozen.Store(false)
	if err := <-emitErr; err != nil {
		t.Errorf("Emit: %v, want its ack", err)
	}
	if err := <-subErr; err == nil || !strings.Contains(err.Error(), "client_id_too_long") {
		t.Errorf("Subscribe: %v, want client_id_too_long", err)
	}
}

// A client-emitted message's type is the sender's, "presence" or
// "replay_gap" included: a frame with a seq is a message (proto/PROTOCOL.md ›
// Server frames). It used to arrive as a presence event or a gap.
func TestGoClientEmittedTypeNamedLikePresence(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	ctx := context.Background()
	a := goClient(t, ts.Base, p.PublicKey, relay.Options{})
	b := goClient(t, ts.Base, p.PublicKey, relay.Options{})
	if _, err := a.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: "ann"}); err != nil {
		t.Fatal(err)
	}
	sb, err := b.Subscribe(ctx, "room", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"presence", "replay_gap"}, TTL: time.Minute})
	for _, typ := range []string{"presence", "replay_gap"} {
		seq, err := a.Emit(ctx, "room", typ, "hi", tok)
		if err != nil {
			t.Fatal(err)
		}
		ev := relaytest.NextEvent(t, sb)
		if ev.Message == nil || ev.Message.Seq != seq || ev.Message.Type != typ {
			t.Errorf("client-emitted message of type %q arrived as %+v (presence %+v, gap %+v), want a Message with seq %d", typ, ev, ev.Presence, ev.Gap, seq)
		}
		if last, _ := sb.LastSeq(); last != seq {
			t.Errorf("LastSeq %d after type %q, want %d (a reconnect would replay it)", last, typ, seq)
		}
	}
}

// A client that gave up (NoReconnect and a drop) is Closed, and Subscribe
// answers ErrClosed (it waited for a connection that never came).
func TestGoClientSubscribeAfterGivingUp(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	p := ts.Signup("alice@example.com").CreateProject("demo")
	px := relaytest.NewProxy(t, ts.Addr())
	c := goClient(t, px.Base(), p.PublicKey, relay.Options{NoReconnect: true})
	px.Cut()
	relaytest.WaitState(t, c, relay.Closed)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.Subscribe(ctx, "room", relay.SubscribeOptions{}); !errors.Is(err, relay.ErrClosed) {
		t.Fatalf("Subscribe on a client that stopped: %v, want ErrClosed", err)
	}
}

// TestBrowserClientProtocolEdges: client.js in Chromium.
//  1. a client-emitted message of type "presence" reaches onMessage (a frame
//     with a seq is a message);
//  2. client_id_too_long refuses a subscribe: its onError and ready get it;
//  3. after close 4001 (key revoked) the client stops, rather than retry a
//     handshake that can only fail.
func TestBrowserClientProtocolEdges(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	b := relaytest.NewBrowser(t, ts.Base)
	ann, bob := b.NewTab(t), b.NewTab(t)
	ann.Start(ts.Base, p.PublicKey, "room", "ann", "{}")
	ann.WaitFor(0, "state:open", "presence:sync:")
	bob.Start(ts.Base, p.PublicKey, "room", "bob", "{maxReconnectDelayMs: 300}")
	bobAt := bob.WaitFor(0, "state:open", "presence:sync:ann")

	// 1.
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann", Types: []string{"presence"}, TTL: time.Minute})
	ann.Eval(fmt.Sprintf(`relay.emit("room", "presence", "hi", %q).then((s) => log.push("emitted:" + s), (e) => log.push("emitfail:" + e.code))`, tok))
	ann.WaitForPrefix(0, "emitted:")
	bob.WaitForPrefix(bobAt, "msg:") // fails with bob's log if it never comes as a message
	if bob.Count(bobAt, "msg:") != 1 {
		t.Errorf("1. bob's log after ann's client-emit of type presence: %q, want a msg: line", bob.Log()[bobAt:])
	}
	step1At := bobAt // checked again at the end: no second copy came meanwhile
	bobAt = len(bob.Log())

	// 2.
	bob.Eval(`relay.subscribe("long", {presence: true, clientId: "x".repeat(129), onError: (e) => log.push("suberr:" + e.code)}).ready.catch((e) => log.push("readyfail:" + e.code))`)
	refusedTwice := func(from int) bool {
		return bob.Count(from, "suberr:client_id_too_long") == 1 && bob.Count(from, "readyfail:client_id_too_long") == 1
	}
	if !relaytest.Within(5*time.Second, func() bool { return refusedTwice(bobAt) }) {
		t.Errorf("2. bob's log after a refused subscribe: %q, want suberr: and readyfail:", bob.Log()[bobAt:])
	}
	bob.Eval(`relay.unsubscribe("long")`)
	step2At := bobAt // checked again at the end: no second report came meanwhile
	bobAt = len(bob.Log())

	// 3.
	bob.Eval(`{ const c = relay.connect.bind(relay); relay.connect = () => { log.push("connect"); c(); }; }`)
	var keys struct {
		Keys []struct{ ID, KeyType string } `json:"keys"`
	}
	if err := json.Unmarshal([]byte(owner.Do("GET", "/api/projects/"+p.ID+"/keys", "").Raw), &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys.Keys {
		if k.KeyType == "public" {
			owner.Do("POST", "/api/projects/"+p.ID+"/keys/"+k.ID+"/revoke", "")
		}
	}
	// Time by nature: no retry loop within 5 s (polled, so that a second
	// attempt fails the test when it comes).
	relaytest.Within(5*time.Second, func() bool { return bob.Count(bobAt, "connect") > 1 })
	if n := bob.Count(bobAt, "connect"); n > 1 || !bob.Check(`relay.state === "closed"`) {
		t.Errorf("3. after 4001: %d connection attempts in 5 s, state not closed; log %q", n, bob.Log()[bobAt:])
	}
	if n := bob.Count(step1At, "msg:"); n != 1 {
		t.Errorf("1. bob's log has %d msg: lines since ann's client-emit, want 1: %q", n, bob.Log()[step1At:])
	}
	if !refusedTwice(step2At) {
		t.Errorf("2. bob's log since the refused subscribe: %q, want one suberr: and one readyfail:", bob.Log()[step2At:])
	}
}

// A re-subscribe the server refuses leaves the earlier subscription as it
// was, on the server and in the Go client alike: its messages keep coming on
// the same Subscription. (The client used to drop it, and with it every
// message the server still sent.)
func TestGoClientRefusedResubscribeKeepsTheSubscription(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"MAX_PRESENCE_MEMBERS_PER_CHANNEL": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	ts.PresenceSub(t, p.PublicKey, "room", "first").Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	ctx := context.Background()
	c := goClient(t, ts.Base, p.PublicKey, relay.Options{})
	s, err := c.Subscribe(ctx, "room", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var re *relay.Error
	if _, err := c.Subscribe(ctx, "room", relay.SubscribeOptions{Presence: true, ClientID: "second"}); !errors.As(err, &re) || re.Code != "too_many_presence_members" {
		t.Fatalf("re-subscribe over the cap: %v", err)
	}
	r := owner.Emit(p.SecretKey, `{"channel":"room","payload":7}`)
	if r.Status != 200 || relaytest.Num(r.JSON, "subscriberCount") != 2 {
		t.Fatalf("emit: %d %s", r.Status, r.Raw)
	}
	if ev := relaytest.NextEvent(t, s); ev.Message == nil || string(ev.Message.Payload) != "7" {
		t.Fatalf("after the refused re-subscribe: %+v, want the message", ev)
	}
}

// The browser client, the same: a re-subscribe the server refuses rejects
// its ready, and the earlier subscription (whose member stays, held by
// another socket too) keeps its handlers and gets the channel's messages.
func TestBrowserClientRefusedResubscribeKeepsTheSubscription(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"MAX_PRESENCE_MEMBERS_PER_CHANNEL": "2"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	ts.PresenceSub(t, p.PublicKey, "room", "other").Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	ts.PresenceSub(t, p.PublicKey, "room", "first").Expect(`{"type":"presence","channel":"room","event":"sync","members":["other"]}`)
	tab := relaytest.NewBrowser(t, ts.Base).NewTab(t)
	tab.Start(ts.Base, p.PublicKey, "room", "first", "{}") // members: other, first (the cap)
	at := tab.WaitFor(0, "state:open", "presence:sync:first,other")
	tab.Eval(`relay.subscribe("room", {presence: true, clientId: "second"}).ready.catch((e) => log.push("readyfail:" + e.code))`)
	at = tab.WaitForPrefix(at, "readyfail:too_many_presence_members")
	r := owner.Emit(p.SecretKey, `{"channel":"room","payload":7}`)
	if r.Status != 200 {
		t.Fatalf("emit: %d %s", r.Status, r.Raw)
	}
	tab.WaitForPrefix(at, fmt.Sprintf("msg:%d:7", int64(relaytest.Num(r.JSON, "seq"))))
}
