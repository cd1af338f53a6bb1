package main

// The Go client's since against a ring whose messages expire on the
// server's test clock (the rest of the Go client's tests are in e2e/wire).

import (
	"context"
	"fmt"
	"testing"
	"time"

	relay "github.com/relayhq/relay/api/client"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestGoClientSubscribeSince: SubscribeOptions.Since replays what the ring
// still holds after it, before Subscribe returns; a since the ring no longer
// covers gives a Gap carrying that since as the exact uint64; and until a
// message arrives, a reconnect resumes from the starting since.
func TestGoClientSubscribeSince(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	clock := newClock()
	ts := startServerAt(t, storetest.SQLiteURL(t), map[string]string{"REPLAY_BUFFER_TTL_SECONDS": "2"}, clock.Now)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	px := relaytest.NewProxy(t, ts.Addr())
	before := relaytest.GoroutineBaseline(t, owner, p)
	ctx := context.Background()
	emit := func(channel, payload string) uint64 {
		t.Helper()
		return relaytest.ExactSeq(t, owner.Emit(p.SecretKey, `{"channel":"`+channel+`","payload":"`+payload+`"}`))
	}
	var seqs []uint64
	for i := range 3 {
		seqs = append(seqs, emit("feed", fmt.Sprint("m", i)))
	}
	clk := relaytest.NewStepClock()
	c, err := relay.Dial(ctx, px.Base(), p.PublicKey, relay.Options{Clock: clk.After, Jitter: func() float64 { return 0.5 }, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	expectReplay := func(s *relay.Subscription, seq uint64, payload string) {
		t.Helper()
		ev := relaytest.NextEvent(t, s)
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
	relaytest.ExpectNoEvent(t, s)
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
	relaytest.ExpectNoEvent(t, o)
	if seq, ok := o.LastSeq(); !ok || seq != last {
		t.Fatalf("LastSeq %d %v before any message, want the starting since %d", seq, ok, last)
	}
	px.Cut()
	away := emit("other", "o1")
	clk.Backoff(t).Fire()
	expectReplay(o, away, "o1")
	relaytest.ExpectNoEvent(t, o)

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
	if ev := relaytest.NextEvent(t, g); ev.Gap == nil || ev.Gap.Since != old {
		t.Fatalf("event %+v (gap %+v), want a gap since %d", ev, ev.Gap, old)
	}
	expectReplay(g, kept, "g2")
	relaytest.ExpectNoEvent(t, g)
	c.Close()
	d.Close()
	relaytest.SettleGoroutines(t, before)
}
