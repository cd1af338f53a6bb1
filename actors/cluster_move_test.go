package actors

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A node that has just joined: its new channel grains hold what they are
// sent until the previous owner's state (or its end marker) is there, or
// stateWait passes. Without a remote: the grains are driven by hand, and
// the actor system is given the address of a member.

// joinedNode is a cluster of this node (127.0.0.1:1) and another
// (127.0.0.1:2) that this node has just joined, with a collector of what
// grains send back.
func joinedNode(t *testing.T) (*Cluster, *actor.PID, chan any) {
	t.Helper()
	return joinedNodeWith(t, Config{})
}

// joinedNodeWith is joinedNode with cfg for its actor system.
func joinedNodeWith(t *testing.T, cfg Config) (*Cluster, *actor.PID, chan any) {
	t.Helper()
	sys := newTestSystem(t, cfg)
	sys.as.ProcessRegistry.Address = "127.0.0.1:1" // local PIDs are then at this member's address
	c := newTestCluster(t, sys, nil)
	c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{
		{Id: c.self, Host: "127.0.0.1", Port: 1, Kinds: []string{ChannelKind}},
		{Id: "t@other", Host: "127.0.0.1", Port: 2, Kinds: []string{ChannelKind}},
	}})
	relay, got := relayStub(c)
	return c, relay, got
}

// relayStub stands for one node's relay: what a grain sends it.
func relayStub(c *Cluster) (*actor.PID, chan any) {
	got := make(chan any, 64)
	pid := c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *clusterpb.ChannelPublished, *clusterpb.ChannelJoined, *clusterpb.ChannelCatchUp, *clusterpb.ChannelDeliver:
			got <- m
		}
	}))
	return pid, got
}

// ownedChannel is a channel of project p this node owns (the other member
// owned it before this node joined).
func ownedChannel(t *testing.T, c *Cluster, prefix string) string {
	t.Helper()
	return owned(t, c, ChannelKind, "p/"+prefix+"-%d")
}

// owned is the first of 100 identities of kind (format of 0, 1, …) that
// this node owns.
func owned(t *testing.T, c *Cluster, kind, format string) string {
	t.Helper()
	for i := range 100 {
		if id := fmt.Sprintf(format, i); c.owns(kind, id) {
			return id
		}
	}
	t.Fatalf("this node owns none of 100 %s identities like %q", kind, format)
	return ""
}

func startGrain(c *Cluster, identity string) *actor.PID {
	pid := c.sys.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return newChannelGrain(c) }))
	c.sys.root.Send(pid, &pcluster.ClusterInit{Identity: &pcluster.ClusterIdentity{Kind: ChannelKind, Identity: identity}})
	return pid
}

func ref(pid *actor.PID) *clusterpb.Ref { return &clusterpb.Ref{Address: pid.Address, Id: pid.Id} }

// sendFrom sends msg to pid as from would: grains take a Ref only from its sender's node.
func sendFrom(c *Cluster, pid, from *actor.PID, msg any) {
	c.sys.root.RequestWithCustomSender(pid, msg, from)
}

func publishTo(c *Cluster, grain, relay *actor.PID, id string) {
	sendFrom(c, grain, relay, &clusterpb.ChannelPublish{Id: id, ReplyTo: ref(relay), Payload: []byte(`1`),
		AtUnixNano: time.Now().UnixNano(), ChannelLimit: 100})
}

func next(t *testing.T, got chan any, within time.Duration) any {
	t.Helper()
	select {
	case m := <-got:
		return m
	case <-time.After(within):
		t.Fatalf("nothing within %v", within)
		return nil
	}
}

func silent(t *testing.T, got chan any, d time.Duration) {
	t.Helper()
	select {
	case m := <-got:
		t.Fatalf("got %T %v, want nothing yet", m, m)
	case <-time.After(d):
	}
}

func TestNewOwnerWaitsForTheMovedState(t *testing.T) {
	c, relay, got := joinedNode(t)
	identity := ownedChannel(t, c, "moved")
	grain := startGrain(c, identity)

	// Held: a publish, then a subscribe with since.
	publishTo(c, grain, relay, "new#1")
	sendFrom(c, grain, relay, &clusterpb.ChannelJoin{Relay: ref(relay), Sub: &clusterpb.Subscriber{Conn: 7}, HasSince: true, Since: 995})
	silent(t, got, 200*time.Millisecond)

	// The previous owner's state: seq 1000, its ring from 991, and the
	// answer to a publish it stamped.
	now := time.Now()
	st := &clusterpb.GrainState{Identity: identity, Seq: 1000, LowWater: 990, WindowStartUnixNano: now.Truncate(time.Minute).UnixNano(), WindowCount: 10,
		Answered: []*clusterpb.AnsweredPublish{{Id: "old#1", AtUnixNano: now.UnixNano(), Answer: &clusterpb.ChannelPublished{Seq: 1000}}}}
	for seq := uint64(991); seq <= 1000; seq++ {
		st.Replay = append(st.Replay, &clusterpb.ReplayEntry{Seq: seq, AtUnixNano: now.UnixNano(), Message: fmt.Appendf(nil, `{"seq":%d}`, seq)})
	}
	c.sys.root.Send(grain, st)

	// What it held, in order: the publish stamped above the old owner's
	// last seq, then the subscribe replayed from the moved ring, no gap.
	p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished)
	if !ok || p.Id != "new#1" || p.Seq <= 1000 || p.Error != "" {
		t.Fatalf("held publish answered %v, want a seq above 1000", p)
	}
	j, ok := next(t, got, time.Second).(*clusterpb.ChannelJoined)
	if !ok || j.Gap || len(j.Replay) != 6 || string(j.Replay[0]) != `{"seq":996}` {
		t.Fatalf("held subscribe answered %v, want the replay of 996…1000 and the new one, without a gap", j)
	}
	// A retry of what the old owner stamped is answered from memory.
	publishTo(c, grain, relay, "old#1")
	if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Seq != 1000 || p.Error != "" {
		t.Fatalf("a retry of a publish the old owner answered: %v, want its answer (seq 1000)", p)
	}
	if n := c.duplicates.Load(); n != 1 {
		t.Errorf("duplicates %d, want 1", n)
	}
	if _, waiting := c.moves.waiting.Load(identity); waiting {
		t.Error("the grain is still listed as waiting")
	}
}

// In a testing/synctest bubble: the clock is the bubble's, so the bound is
// checked to the nanosecond.
func TestNewOwnerStopsWaitingAtTheEndMarkerOrTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, relay, got := joinedNode(t)

		// The previous owner had no grain for the channel: its end marker
		// releases what waits, at once.
		cold := startGrain(c, ownedChannel(t, c, "cold"))
		publishTo(c, cold, relay, "cold#1")
		silent(t, got, 100*time.Millisecond)
		began := time.Now()
		c.takeHandoff(&clusterpb.GrainHandoff{From: "t@other"})
		if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Seq == 0 || p.Error != "" {
			t.Fatalf("after the end marker: %v", p)
		}
		if d := time.Since(began); d != 0 {
			t.Errorf("answered %v after the end marker", d)
		}
		// Once the marker is in, a new grain does not wait at all.
		later := startGrain(c, ownedChannel(t, c, "later"))
		publishTo(c, later, relay, "later#1")
		if p, ok := next(t, got, time.Millisecond).(*clusterpb.ChannelPublished); !ok || p.Seq == 0 {
			t.Fatalf("a grain started after the end marker: %v", p)
		}

		// No marker and no state (the previous owner died): the grain starts
		// from the clock at stateWait, not before.
		c2, relay2, got2 := joinedNode(t)
		lost := startGrain(c2, ownedChannel(t, c2, "lost"))
		began = time.Now()
		publishTo(c2, lost, relay2, "lost#1")
		advance(stateWait - time.Nanosecond)
		if len(got2) != 0 {
			t.Fatalf("answered before stateWait: %v", <-got2)
		}
		advance(time.Nanosecond)
		if len(got2) == 0 {
			t.Fatal("not answered at stateWait")
		}
		if p, ok := (<-got2).(*clusterpb.ChannelPublished); !ok || p.Error != "" || p.Seq < uint64(began.Add(-time.Minute).UnixMicro()) {
			t.Fatalf("after the bound: %v", p)
		}
	})
}

// A grain started on a member that does not own the channel (a lookup that
// used the member list before a change) stops by itself at strayAfter,
// unless it holds something. In a testing/synctest bubble.
func TestStrayGrainStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, relay, got := joinedNode(t)
		var identity string
		for i := range 100 {
			if id := fmt.Sprintf("p/stray-%d", i); !c.owns(ChannelKind, id) {
				identity = id
				break
			}
		}
		stray := startGrain(c, identity)
		publishTo(c, stray, relay, "stray#1")
		if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != errNotOwner {
			t.Fatalf("a grain off its owner answered %v, want not_owner", p)
		}
		advance(strayAfter - time.Nanosecond)
		if _, ok := c.grains.Load(identity); !ok {
			t.Fatal("the stray grain stopped before strayAfter")
		}
		advance(time.Nanosecond)
		if _, ok := c.grains.Load(identity); ok {
			t.Fatal("the stray grain is still there at strayAfter")
		}
	})
}

// A joining node can be handed grains before its own member list shows
// their sender (the sender saw the registration in its watch first): the
// handoff waits for the list, then is taken and acked. One from a member
// that is never listed is refused, unanswered, once the sender's ack bound
// has passed. In a testing/synctest bubble.
func TestHandoffBeforeItsSenderIsListed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sys := newTestSystem(t, Config{})
		sys.as.ProcessRegistry.Address = "127.0.0.1:1"
		c := newTestCluster(t, sys, nil) // lists no member yet: it has just registered
		acks := make(chan *clusterpb.GrainHandoffAck, 4)
		ackTo := c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
			if a, ok := ctx.Message().(*clusterpb.GrainHandoffAck); ok {
				acks <- a
			}
		}))
		process, _ := c.sys.as.ProcessRegistry.GetLocal(ackTo.Id)
		from := actor.NewPID("127.0.0.1:2", "future$7") // the sender's future: the ack goes there, nowhere else
		c.sys.as.ProcessRegistry.RegisterAddressResolver(func(to *actor.PID) (actor.Process, bool) {
			return process, to.Equal(from)
		})
		sendFrom(c, c.node, from, &clusterpb.GrainHandoff{From: "t@other", Grains: []*clusterpb.GrainState{{Identity: "p/early", Seq: 5000}}})
		sendFrom(c, c.node, from, &clusterpb.GrainHandoff{From: "t@never"})
		advance(c.ackTimeout / 2)
		if _, taken := c.handoffs.Load("p/early"); taken || len(acks) > 0 || c.badContent.Load() != 0 {
			t.Fatalf("before the member list: taken %v, %d acks, %d refused; want it kept, unanswered", taken, len(acks), c.badContent.Load())
		}

		c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{
			{Id: c.self, Host: "127.0.0.1", Port: 1, Kinds: []string{ChannelKind}},
			{Id: "t@other", Host: "127.0.0.1", Port: 2, Kinds: []string{ChannelKind}},
		}})
		synctest.Wait()
		if _, taken := c.handoffs.Load("p/early"); !taken || len(acks) != 1 {
			t.Fatalf("once its sender is listed: taken %v, %d acks; want it taken and acked", taken, len(acks))
		}
		if a := <-acks; a.Taken != 1 {
			t.Errorf("acked %d grains, want 1", a.Taken)
		}
		if n := c.badContent.Load(); n != 0 {
			t.Errorf("%d refused before the ack bound, want 0", n)
		}

		advance(c.ackTimeout / 2)
		if n := c.badContent.Load(); n != 1 || len(acks) != 0 {
			t.Errorf("after the ack bound: %d refused, %d acks; want the unlisted sender's handoff refused, unanswered", n, len(acks))
		}
	})
}

// The handoffs kept for members not listed yet are bounded: past
// earlyHandoffMax (or earlyHandoffBytes), one is refused at once.
func TestEarlyHandoffsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sys := newTestSystem(t, Config{})
		sys.as.ProcessRegistry.Address = "127.0.0.1:1"
		c := newTestCluster(t, sys, nil)
		from := actor.NewPID("127.0.0.1:2", "future$1")
		for i := range earlyHandoffMax + 1 {
			sendFrom(c, c.node, from, &clusterpb.GrainHandoff{From: fmt.Sprintf("t@made-up-%d", i)})
		}
		synctest.Wait()
		if n := c.badContent.Load(); n != 1 {
			t.Fatalf("%d refused before the ack bound, want the one past %d", n, earlyHandoffMax)
		}
		advance(c.ackTimeout)
		if n := c.badContent.Load(); n != earlyHandoffMax+1 {
			t.Errorf("%d refused after the ack bound, want all %d", n, earlyHandoffMax+1)
		}
	})
}
