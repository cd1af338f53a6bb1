package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A channel's seq after a crash or a handover: never at or below a seq a
// relay was told (it would drop the message as seen). Grains are driven by
// hand, as in cluster_failover_test.go.

// A relay that joined after a stamped message failed was told the last
// seq that landed, not the failed one: after a crash, the next owner goes
// on from the stored last seq, and the relay takes its messages (it would
// drop a seq it counts as seen, and catch-up would skip it).
func TestJoinSeqIsTheLandedOne(t *testing.T) {
	c, h, identity := storedChannel(t, "told", 500, 500)
	g1 := startGrain(c, identity)
	x, fromX := relayStub(c)
	register(c, g1, x, 500, 1)
	publishWith(c, g1, x, "ok#1", true, false) // stored (501 from the store)
	if p := nextPublished(t, fromX); p.Error != "" {
		t.Fatalf("first publish answered %v", p)
	}
	h.set(errors.New("store down"))
	publishWith(c, g1, x, "f#1", true, false) // stamped (502), its commit fails
	if p := nextPublished(t, fromX); p.Error != "service_unavailable" {
		t.Fatalf("failed commit answered %v", p)
	}
	h.set(nil)
	y, fromY := relayStub(c)
	j := joinAs(t, c, g1, y, fromY, 2)
	t.Logf("relay Y told seq %d (stored last %d)", j.Seq, h.stored()[len(h.stored())-1].Seq)
	c.sys.root.Stop(g1) // killed

	g2 := startGrain(c, identity)
	register(c, g2, x, 500, 1) // X registers first
	publishWith(c, g2, x, "new#1", true, false)
	p := nextPublished(t, fromX)
	if p.Error != "" {
		t.Fatalf("new publish %v", p)
	}
	register(c, g2, y, j.Seq, 2) // Y registers with what it was told
	if p.Seq <= j.Seq {
		select {
		case m := <-fromY:
			t.Logf("Y got %v", m)
		case <-time.After(300 * time.Millisecond):
		}
		t.Fatalf("acknowledged message seq %d <= relay Y's lastSeq %d: Y drops it, and its catch-up skips it", p.Seq, j.Seq)
	}
}

// A grain that never stamped, but heard from a relay what it delivered
// (a register after a crash), hands that seq on: the next owner goes on
// above it even when its own clock is behind.
func TestFreshGrainHandsOnWhatARelayDelivered(t *testing.T) {
	c := failoverNode(t)
	identity := ownedChannel(t, c, "raised")
	g1 := startGrain(c, identity)
	x, _ := relayStub(c)
	delivered := uint64(time.Now().Add(10 * time.Second).UnixMicro()) // a dead owner on a node whose clock ran ahead
	register(c, g1, x, delivered, 1)
	states := freezeFor(c, g1)
	st := <-states
	t.Logf("handed seq %d (relay delivered %d)", st.Seq, delivered)
	g2 := startGrain(c, identity)
	c.sys.root.Send(g2, st)
	y, fromY := relayStub(c)
	register(c, g2, y, 0, 3)
	publishTo(c, g2, y, "n#1")
	for {
		if p, ok := next(t, fromY, time.Second).(*clusterpb.ChannelPublished); ok {
			if p.Seq <= delivered {
				t.Fatalf("next owner stamped %d, relay X delivered %d already", p.Seq, delivered)
			}
			return
		}
	}
}

// freezeFor asks grain to freeze (its node hands it over): its state comes
// on the channel.
func freezeFor(c *Cluster, grain *actor.PID) chan *clusterpb.GrainState {
	states := make(chan *clusterpb.GrainState, 1)
	c.sys.root.Send(grain, &freeze{reply: states})
	return states
}

// joinAs subscribes connection conn of relay to grain, and returns the
// grain's answer.
func joinAs(t *testing.T, c *Cluster, grain, relay *actor.PID, got chan any, conn uint64) *clusterpb.ChannelJoined {
	t.Helper()
	sendFrom(c, grain, relay, &clusterpb.ChannelJoin{Relay: ref(relay), Sub: &clusterpb.Subscriber{Conn: conn}})
	j, ok := next(t, got, time.Second).(*clusterpb.ChannelJoined)
	if !ok {
		t.Fatal("no join answer")
	}
	return j
}

// nextPublished waits for the next ChannelPublished, skipping deliveries.
func nextPublished(t *testing.T, got chan any) *clusterpb.ChannelPublished {
	t.Helper()
	for {
		if p, ok := next(t, got, 2*time.Second).(*clusterpb.ChannelPublished); ok {
			return p
		}
	}
}

// A history channel with nothing stored answers a join with the clock's
// start: it is told, so the grain hands it on and the next owner (its clock
// behind) goes on above it.
func TestToldClockStartIsHandedOn(t *testing.T) {
	h := &memHistory{}
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	c := failoverNodeWith(t, Config{History: h, Now: func() time.Time { return time.Unix(0, clock.Load()) },
		LoadSettings: func(context.Context, string) (Settings, error) { return Settings{HistoryRetention: time.Hour}, nil }})
	identity := ownedChannel(t, c, "empty")
	g1 := startGrain(c, identity)
	y, fromY := relayStub(c)
	j := joinAs(t, c, g1, y, fromY, 2)
	states := freezeFor(c, g1)
	st := <-states
	clock.Add(-int64(time.Second)) // the next owner's node: its clock 1 s behind
	g2 := startGrain(c, identity)
	c.sys.root.Send(g2, st)
	x, fromX := relayStub(c)
	register(c, g2, x, 0, 1)
	publishWith(c, g2, x, "n#1", true, false)
	if p := nextPublished(t, fromX); p.Error != "" || p.Seq <= j.Seq {
		t.Fatalf("next owner stamped %v; relay Y was told %d and drops it", p, j.Seq)
	}
}

// A fresh grain raised by a register below its clock's start (the dead
// owner's clock was behind) hands on the relay's seq; the next owner goes
// on from it, and its ring's low water is not the old clock's start above
// its own messages: a since between them is told no replay_gap.
func TestFreshHandoverLowWaterNotAboveSeq(t *testing.T) {
	c := failoverNode(t)
	identity := ownedChannel(t, c, "lw")
	g1 := startGrain(c, identity)
	x, fromX := relayStub(c)
	delivered := uint64(time.Now().Add(-10 * time.Second).UnixMicro())
	register(c, g1, x, delivered, 1)
	states := freezeFor(c, g1)
	st := <-states
	g2 := startGrain(c, identity)
	c.sys.root.Send(g2, st)
	register(c, g2, x, delivered, 1)
	publishTo(c, g2, x, "n#1")
	seq := nextPublished(t, fromX).Seq
	if seq != delivered+1 {
		t.Fatalf("the next owner stamped %d, want %d", seq, delivered+1)
	}
	publishTo(c, g2, x, "n#2")
	nextPublished(t, fromX)
	y, fromY := relayStub(c)
	for i, since := range []uint64{delivered, seq} {
		sendFrom(c, g2, y, &clusterpb.ChannelJoin{Relay: ref(y), Sub: &clusterpb.Subscriber{Conn: uint64(10 + i)},
			HasSince: true, Since: float64(since)})
		for {
			if j, ok := next(t, fromY, time.Second).(*clusterpb.ChannelJoined); ok {
				if j.Gap || len(j.Replay) != 2-i {
					t.Errorf("join since %d: gap %v, %d replayed; want no gap and %d", since, j.Gap, len(j.Replay), 2-i)
				}
				break
			}
		}
	}
}
