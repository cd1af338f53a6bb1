package actors

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A peer with a valid certificate still cannot put bytes into a tenant's
// frames: the grain refuses a payload that is not JSON and a channel name no
// edge accepts, and a relay writes only messages that are one JSON object.
func TestPeersContentIsChecked(t *testing.T) {
	c := failoverNode(t)
	grain := startGrain(c, ownedChannel(t, c, "guarded"))
	emitter, fromEmitter := relayStub(c)
	watcher, fromWatcher := relayStub(c)
	sendFrom(c, grain, watcher, &clusterpb.ChannelJoin{Relay: ref(watcher), Sub: &clusterpb.Subscriber{Conn: 1}})
	if j, ok := next(t, fromWatcher, time.Second).(*clusterpb.ChannelJoined); !ok || j.Refused != "" {
		t.Fatalf("join answered %v", j)
	}
	for _, payload := range []string{`{"a":1}},"x":{`, `not json`, ``} {
		sendFrom(c, grain, emitter, &clusterpb.ChannelPublish{Id: "bad" + payload, ReplyTo: ref(emitter), Payload: []byte(payload),
			AtUnixNano: time.Now().UnixNano(), ChannelLimit: 100})
		if p, ok := next(t, fromEmitter, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "invalid_json" || p.Seq != 0 {
			t.Fatalf("payload %q answered %v, want invalid_json", payload, p)
		}
	}
	silent(t, fromWatcher, 100*time.Millisecond) // nothing stamped, nothing delivered
	publishTo(c, grain, emitter, "good")
	if p, ok := next(t, fromEmitter, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "" || p.Seq == 0 {
		t.Fatalf("a JSON payload answered %v", p)
	}
	if n := c.badContent.Load(); n != 3 {
		t.Errorf("refusals counted %d, want 3", n)
	}

	// A grain activated for a name that is not a channel stops at once.
	live := c.grainsLive.Load()
	startGrain(c, `p/room","x":"y`)
	waitFor(t, "the grain of a bad name to stop", func() bool { return c.grainsLive.Load() == live && c.badContent.Load() == 4 })
}

func TestRelayWritesOnlyJSONObjects(t *testing.T) {
	r, k := relayWithSocket(t)
	for i, msg := range []string{`{"a":1}}{"b":`, `[1]`, `"s"`, ``, `{"a":1} `, `{"seq":6}`} {
		r.deliver(nil, &clusterpb.ChannelDeliver{Seq: uint64(i + 1), Message: []byte(msg)})
	}
	got := framesOf(t, k)
	if strings.Join(got, " ") != "map[seq:6]" {
		t.Fatalf("the socket got %v, want only the JSON object", got)
	}
	if r.lastSeq != 6 {
		t.Errorf("lastSeq %d, want 6 (refused messages do not move it)", r.lastSeq)
	}
	r.presence(&clusterpb.ChannelPresence{Event: `join","x":"`, ClientId: "ann"})
	if len(r.roster) != 0 {
		t.Errorf("an unknown presence event changed the roster: %v", r.roster)
	}
	if got := grainCode(`x","y":"`); got != "service_unavailable" {
		t.Errorf("a grain's unknown error code became %q", got)
	}
}

// The channel limit a grain applies is its project's, as its own node
// loaded it (this node's project actor tells it, and again when it
// changes), not the one a publish names.
func TestGrainAppliesItsOwnChannelLimit(t *testing.T) {
	var project atomic.Int64 // the project's channel limit in the store
	project.Store(40)
	c := failoverNodeWith(t, Config{LoadSettings: func(context.Context, string) (Settings, error) {
		return Settings{ChannelRateLimit: int(project.Load())}, nil
	}})
	grain := startGrain(c, ownedChannel(t, c, "limited"))
	emitter, fromEmitter := relayStub(c)
	n := 0
	send := func(limit int32) *clusterpb.ChannelPublished {
		n++
		sendFrom(c, grain, emitter, &clusterpb.ChannelPublish{Id: fmt.Sprint(n), ReplyTo: ref(emitter), Payload: []byte(`1`),
			AtUnixNano: time.Now().UnixNano(), ChannelLimit: limit})
		p, _ := next(t, fromEmitter, time.Second).(*clusterpb.ChannelPublished)
		return p
	}
	waitFor(t, "the grain to apply its project's limit", func() bool { return send(1<<30).GetChannel().GetLimit() == 40 })
	for _, named := range []int32{1, 1 << 30} {
		if p := send(named); p.GetError() != "" || p.GetChannel().GetLimit() != 40 {
			t.Fatalf("a publish naming limit %d answered %v, want the project's 40", named, p)
		}
	}
	project.Store(50) // changed, and the node told (a dashboard's change, or another node's broadcast)
	c.sys.SettingsChanged("p")
	waitFor(t, "the grain to apply the project's new limit", func() bool { return send(1<<30).GetChannel().GetLimit() == 50 })
}

// A member acts only for itself: a join, register, publish or query that
// names a relay or reply-to on another node than its sender's (or comes
// without a sender) is refused and answered to no one; the same from the
// Ref's own node is served.
func TestAMemberActsOnlyForItself(t *testing.T) {
	c := failoverNode(t)
	identity := ownedChannel(t, c, "own")
	grain := startGrain(c, identity)
	victim, toVictim := relayStub(c)
	elsewhere := actor.NewPID("10.0.0.2:7000", "relay") // another member's node: never contacted
	spoofs := map[string]any{
		"join":     &clusterpb.ChannelJoin{Relay: ref(victim), Sub: &clusterpb.Subscriber{Conn: 1}},
		"register": &clusterpb.ChannelRegister{Relay: ref(victim), Subs: []*clusterpb.Subscriber{{Conn: 2}}},
		"publish": &clusterpb.ChannelPublish{Id: "spoof", ReplyTo: ref(victim), Payload: []byte(`1`),
			AtUnixNano: time.Now().UnixNano(), ChannelLimit: 100},
		"query": &clusterpb.ChannelQuery{Kind: 2, ReplyTo: ref(victim), Identity: identity},
	}
	for name, msg := range spoofs {
		before := c.badContent.Load()
		sendFrom(c, grain, elsewhere, msg)
		c.sys.root.Send(grain, msg) // no sender at all
		waitFor(t, name+" refused twice", func() bool { return c.badContent.Load() == before+2 })
	}
	before := c.badContent.Load()
	sendFrom(c, c.node, elsewhere, spoofs["query"]) // through the node actor, as queries come
	waitFor(t, "the routed query refused", func() bool { return c.badContent.Load() == before+1 })
	silent(t, toVictim, 100*time.Millisecond)

	// From its own node: served, and nothing of the spoofs took (no
	// subscriber, nothing stamped).
	sendFrom(c, grain, victim, &clusterpb.ChannelJoin{Relay: ref(victim), Sub: &clusterpb.Subscriber{Conn: 3}})
	j, ok := next(t, toVictim, time.Second).(*clusterpb.ChannelJoined)
	if !ok || j.Refused != "" || len(j.Replay) != 0 {
		t.Fatalf("join from its own node answered %v, want joined with nothing to replay", j)
	}
	emitter, toEmitter := relayStub(c)
	publishTo(c, grain, emitter, "own")
	if p, ok := next(t, toEmitter, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "" || p.Seq != j.Seq+1 || p.Subscribers != 1 {
		t.Fatalf("publish from its own node answered %v, want seq %d to its one subscriber", p, j.Seq+1)
	}
}

// A handoff names the member it comes from: one from another node than
// that member's is not taken (and not acked).
func TestHandoffOnlyFromTheMemberItNames(t *testing.T) {
	c, _, _ := joinedNode(t) // with member t@other at 127.0.0.1:2
	handoff := func(identity string) *clusterpb.GrainHandoff {
		return &clusterpb.GrainHandoff{From: "t@other", Grains: []*clusterpb.GrainState{{Identity: identity, Seq: 5000}}}
	}
	before := c.badContent.Load()
	sendFrom(c, c.node, actor.NewPID("127.0.0.1:1", "forger"), handoff("p/forged")) // this node's address, not t@other's
	c.sys.root.Send(c.node, handoff("p/forged"))                                    // no sender
	waitFor(t, "both forged handoffs refused", func() bool { return c.badContent.Load() == before+2 })
	sendFrom(c, c.node, actor.NewPID("127.0.0.1:2", "handoff"), handoff("p/real"))
	waitFor(t, "the real handoff taken", func() bool { _, ok := c.handoffs.Load("p/real"); return ok })
	if _, ok := c.handoffs.Load("p/forged"); ok {
		t.Fatal("a forged handoff's state was kept for the grain")
	}
}
