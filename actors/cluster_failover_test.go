package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A channel's owner crashed: its grain starts again on this node without
// state, and the relays of every node register with it (README › Running
// several nodes › A crash). Grains are driven by hand, as in
// cluster_move_test.go.

// failoverNode is joinedNode a long time after the join: a grain started
// here expects no handed-over state (its previous owner died).
func failoverNode(t *testing.T) *Cluster {
	t.Helper()
	return failoverNodeWith(t, Config{})
}

// failoverNodeWith is failoverNode with cfg for its actor system.
func failoverNodeWith(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	c, _, _ := joinedNodeWith(t, cfg)
	c.moves.joinedAt.Store(time.Now().Add(-time.Hour).UnixNano())
	return c
}

func register(c *Cluster, grain, relay *actor.PID, lastSeq uint64, conns ...uint64) {
	reg := &clusterpb.ChannelRegister{Relay: ref(relay), LastSeq: lastSeq}
	for _, conn := range conns {
		reg.Subs = append(reg.Subs, &clusterpb.Subscriber{Conn: conn})
	}
	sendFrom(c, grain, relay, reg)
}

func seqsOf(ds []*clusterpb.ChannelDeliver) []uint64 {
	out := []uint64{}
	for _, d := range ds {
		out = append(out, d.Seq)
	}
	return out
}

// A relay that registers after the new owner stamped emits from another
// node gets them, after a gap when its last seq is older than the new ring;
// one that saw some gets the rest, no gap; one that saw all gets nothing.
func TestRegisterCatchesUpAfterACrash(t *testing.T) {
	c := failoverNode(t)
	grain := startGrain(c, ownedChannel(t, c, "crashed"))
	emitter, fromEmitter := relayStub(c)
	register(c, grain, emitter, 0) // a node with no subscriber of the channel
	var seqs []uint64
	for i := range 3 {
		publishTo(c, grain, emitter, fmt.Sprintf("e#%d", i))
		p, ok := next(t, fromEmitter, time.Second).(*clusterpb.ChannelPublished)
		if !ok || p.Error != "" || p.Seq == 0 {
			t.Fatalf("publish %d answered %v", i, p)
		}
		seqs = append(seqs, p.Seq)
	}

	late, fromLate := relayStub(c) // delivered up to 500, from the owner that died
	register(c, grain, late, 500, 1)
	if up, ok := next(t, fromLate, time.Second).(*clusterpb.ChannelCatchUp); !ok || !up.Gap || up.GapSince != 500 ||
		fmt.Sprint(seqsOf(up.Messages)) != fmt.Sprint(seqs) {
		t.Fatalf("late register got %v, want a gap since 500 and seqs %v", up, seqs)
	}

	mid, fromMid := relayStub(c)
	register(c, grain, mid, seqs[1], 2)
	if up, ok := next(t, fromMid, time.Second).(*clusterpb.ChannelCatchUp); !ok || up.Gap || fmt.Sprint(seqsOf(up.Messages)) != fmt.Sprint(seqs[2:]) {
		t.Fatalf("a register at %d got %v, want seq %d and no gap", seqs[1], up, seqs[2])
	}

	current, fromCurrent := relayStub(c)
	register(c, grain, current, seqs[2], 3)
	silent(t, fromCurrent, 200*time.Millisecond)
}

// The owner died after stamping an emit and before answering it: the retry
// reaches the new grain, which holds it until the relays have registered
// what they delivered, then answers it with its first seq (the grain's
// counts, a budget) instead of stamping it again; what came behind it
// from the same relay is stamped after it. In a testing/synctest bubble:
// the hold is failoverSettle exactly.
func TestRetryOfAStampedEmitIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := failoverNode(t)
		grain := startGrain(c, ownedChannel(t, c, "retried"))
		started := time.Now()
		emitter, fromEmitter := relayStub(c)
		limit := int32(c.sys.cfg.EmitRatePerMinute) // the project's, as the edge and the grain's node read it
		sendFrom(c, grain, emitter, &clusterpb.ChannelPublish{Id: "dead#1", ReplyTo: ref(emitter), Payload: []byte(`1`),
			AtUnixNano: time.Now().UnixNano(), ChannelLimit: limit, Resent: true})
		publishTo(c, grain, emitter, "new#1")
		silent(t, fromEmitter, 100*time.Millisecond)

		witness, fromWitness := relayStub(c) // its subscriber got dead#1 as seq 900
		sendFrom(c, grain, witness, &clusterpb.ChannelRegister{Relay: ref(witness), LastSeq: 900,
			Subs: []*clusterpb.Subscriber{{Conn: 5}}, Recent: []*clusterpb.RecentPublish{{Id: "dead#1", Seq: 900}}})

		p, ok := next(t, fromEmitter, 2*time.Second).(*clusterpb.ChannelPublished)
		if held := time.Since(started); held != failoverSettle {
			t.Errorf("the retry was answered %v after the grain started, want at its %v settle", held, failoverSettle)
		}
		if !ok || p.Id != "dead#1" || p.Seq != 900 || p.Error != "" || p.Subscribers != 1 || p.Delivered != 1 ||
			p.Channel == nil || p.Channel.Limit != limit {
			t.Fatalf("the retry answered %v, want id dead#1, seq 900, 1 subscriber, a budget of %d", p, limit)
		}
		if n := c.duplicates.Load(); n != 1 {
			t.Errorf("duplicates %d, want 1", n)
		}
		p, ok = next(t, fromEmitter, time.Second).(*clusterpb.ChannelPublished)
		if !ok || p.Id != "new#1" || p.Seq <= 900 || p.Error != "" {
			t.Fatalf("the publish behind it answered %v", p)
		}
		// The witness: its catch-up (a gap: the dead owner's ring is gone), then
		// new#1, and dead#1 never again.
		if up, ok := next(t, fromWitness, time.Second).(*clusterpb.ChannelCatchUp); !ok || !up.Gap || len(up.Messages) != 0 {
			t.Fatalf("witness catch-up %v", up)
		}
		if d, ok := next(t, fromWitness, time.Second).(*clusterpb.ChannelDeliver); !ok || d.Seq != p.Seq || d.PublishId != "new#1" {
			t.Fatalf("witness got %v, want new#1 at seq %d", d, p.Seq)
		}
		silent(t, fromWitness, 100*time.Millisecond)
	})
}

// A grain frozen while it holds resent publishes for its failover settle
// stamps none of them when the settle ends: its state went to the next
// owner, which would stamp the same seqs. They are refused not_owner, and
// their relays send them to the next owner. In a testing/synctest bubble.
func TestFrozenGrainStampsNothingItHeldForTheSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := failoverNode(t)
		grain := startGrain(c, ownedChannel(t, c, "settling"))
		emitter, fromEmitter := relayStub(c)
		sendFrom(c, grain, emitter, &clusterpb.ChannelPublish{Id: "dead#1", ReplyTo: ref(emitter), Payload: []byte(`1`),
			AtUnixNano: time.Now().UnixNano(), ChannelLimit: 60, Resent: true})
		synctest.Wait()
		states := make(chan *clusterpb.GrainState, 1)
		c.sys.root.Send(grain, &freeze{reply: states})
		handed := (<-states).Seq
		advance(failoverSettle)
		p, ok := next(t, fromEmitter, time.Second).(*clusterpb.ChannelPublished)
		if !ok || p.Id != "dead#1" || p.Error != errNotOwner || p.Seq != 0 {
			t.Fatalf("the frozen grain answered %v at the settle's end, want not_owner (its state handed seq %d)", p, handed)
		}
	})
}

// A relay writes each seq once, in order, whoever sends it (a catch-up, a
// late message of a grain it left), and a gap from the seq its sockets
// have; it remembers what it delivered for its next register.
func TestRelayDeliversEachSeqOnce(t *testing.T) {
	r, k := relayWithSocket(t)
	msg := func(seq uint64) []byte { return fmt.Appendf(nil, `{"seq":%d}`, seq) }

	r.deliver(nil, &clusterpb.ChannelDeliver{Seq: 10, Message: msg(10), PublishId: "a"})
	r.deliver(nil, &clusterpb.ChannelDeliver{Seq: 10, Message: msg(10), PublishId: "a"})
	r.deliver(nil, &clusterpb.ChannelDeliver{Seq: 9, Message: msg(9), PublishId: "z"})
	// The relay registered at 8; a late message raised it to 10 meanwhile.
	up := &clusterpb.ChannelCatchUp{Gap: true, GapSince: 8}
	for seq := uint64(9); seq <= 12; seq++ {
		up.Messages = append(up.Messages, &clusterpb.ChannelDeliver{Seq: seq, Message: msg(seq)})
	}
	r.caughtUp(nil, up)

	got := framesOf(t, k)
	want := []string{"map[seq:10]", "map[channel:room since:10 type:replay_gap]", "map[seq:11]", "map[seq:12]"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the socket got %v, want %v", got, want)
	}
	if seq, ok := r.recent.get("a"); !ok || seq != 10 || r.recent.len() != 1 {
		t.Fatalf("remembered a→%d (%v) of %d, want only a→10", seq, ok, r.recent.len())
	}
}

// relayWithSocket is channel room's relay on a node of its own, with one
// socket subscribed.
func relayWithSocket(t *testing.T) (*channelRelay, *sink) {
	sys := newTestSystem(t, Config{})
	r := newChannelRelay(newTestCluster(t, sys, nil), "p", "room", sys.cfg, &projectUsage{health: sys.cfg.health.of("p")})
	k := &sink{id: 1}
	r.fan.subs.put(channelSub{sink: k})
	return r, k
}

// framesOf is what k was sent, each frame's JSON printed as Go prints it.
func framesOf(t *testing.T, k *sink) []string {
	var got []string
	for _, m := range k.messages(t) {
		got = append(got, fmt.Sprint(m))
	}
	return got
}

// A node that notices a pause refuses to stamp until etcd shows the
// registration it made at join; another one (the lease lapsed and the
// provider registered again) means it was dropped, and it leaves.
func TestPauseFence(t *testing.T) {
	sys := newTestSystem(t, Config{})
	c := newTestCluster(t, sys, nil)
	if c.fenced() {
		t.Fatal("fenced before joining")
	}
	c.fence.start, c.fence.rev = time.Now(), 7
	if _, paused := c.fence.beat(100 * time.Millisecond); paused || c.fenced() {
		t.Fatal("fenced by a pulse on time")
	}
	gap, paused := c.fence.beat(1600 * time.Millisecond)
	if !paused || gap != 1500*time.Millisecond || !c.fenced() {
		t.Fatalf("a pulse 1.5 s late: paused %v, gap %v, fenced %v", paused, gap, c.fenced())
	}
	if _, again := c.fence.beat(1700 * time.Millisecond); again {
		t.Fatal("the fence went up twice")
	}
	c.fence.registration = func(context.Context) (int64, error) { return 7, nil }
	c.liftFence()
	if c.fenced() {
		t.Fatal("still fenced with the registration of the join in etcd")
	}

	// A pulse that has not come for over a second fences before it comes.
	c.fence.start = time.Now().Add(-3 * time.Second)
	c.fence.last.Store(int64(time.Second))
	if !c.fenced() {
		t.Fatal("not fenced while the pulse is 2 s late")
	}

	// etcd does not answer, then shows another registration: dropped.
	calls := 0
	c.fence.registration = func(context.Context) (int64, error) {
		if calls++; calls == 1 {
			return 0, errors.New("etcd does not answer")
		}
		return 8, nil
	}
	c.fence.fenced.Store(true)
	c.liftFence()
	select {
	case err := <-c.Lost():
		if !strings.Contains(err.Error(), "paused longer than its etcd lease") {
			t.Fatalf("lost: %v", err)
		}
	default:
		t.Fatal("not lost with another registration in etcd")
	}
	if calls != 2 || !c.fenced() {
		t.Fatalf("%d reads of etcd, fenced %v; want 2, fenced", calls, c.fenced())
	}
}
