package actors

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
)

// A node starts only the grains it owns in its own member list: a request
// for another member's grain, or for a kind it does not host, is answered
// Failed and starts nothing; one for its own starts the grain once and names
// it again after. Before it has joined (its list is not the cluster's yet) it
// starts what it is asked. After a change of the member list it stops the
// grains it no longer owns, and tells the members of each grain that stops.
func TestActivatorStartsOnlyOwnedGrains(t *testing.T) {
	c, _, _ := joinedNode(t) // with member t@other at 127.0.0.1:2
	// The kind's grain here is a probe that reports the identity it was
	// started with (a channel grain needs the cluster extension).
	started := make(chan string, 16)
	probe := actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*actor.Started); ok {
			started <- pcluster.GetClusterIdentity(ctx).Identity
		}
	})
	kind := (&pcluster.Kind{Kind: ChannelKind, Props: probe}).Build(nil)
	kinds := func(name string) (*pcluster.ActivatedKind, bool) { return kind, name == ChannelKind }
	stopped := make(chan string, 16)
	act := c.sys.root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return newActivator(c, kinds, func(ci *pcluster.ClusterIdentity, _ *actor.PID) { stopped <- ci.Identity })
	}))
	ask := func(kindName, identity string) *pcluster.ActivationResponse {
		t.Helper()
		res, err := c.sys.root.RequestFuture(act, &pcluster.ActivationRequest{
			ClusterIdentity: &pcluster.ClusterIdentity{Kind: kindName, Identity: identity}}, time.Second).Result()
		r, ok := res.(*pcluster.ActivationResponse)
		if err != nil || !ok {
			t.Fatalf("activation of %s %s: %v %v", kindName, identity, res, err)
		}
		return r
	}
	grainStarted := func(identity string) {
		t.Helper()
		select {
		case id := <-started:
			if id != identity {
				t.Fatalf("started %s, want %s", id, identity)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not started", identity)
		}
	}

	var theirs string
	for i := range 100 {
		if id := "p/theirs-" + string(rune('a'+i%26)) + string(rune('a'+i/26)); !c.owns(ChannelKind, id) {
			theirs = id
			break
		}
	}
	if theirs == "" {
		t.Fatal("the other member owns none of 100 channels")
	}
	if r := ask(ChannelKind, theirs); !r.Failed || r.Pid != nil {
		t.Fatalf("another member's grain: answered %v, want Failed", r)
	}
	if c.activationRefusals.Load() != 1 || kind.Count() != 0 {
		t.Fatalf("refused: %d refusals, %d grains of the kind", c.activationRefusals.Load(), kind.Count())
	}
	bad := c.badContent.Load()
	if r := ask("nosuchkind", "p/x"); !r.Failed || c.badContent.Load() != bad+1 {
		t.Fatalf("an unknown kind: answered %v, %d refused for content", r, c.badContent.Load()-bad)
	}

	mine := ownedChannel(t, c, "mine")
	first := ask(ChannelKind, mine)
	if first.Failed || first.Pid == nil {
		t.Fatalf("its own grain: answered %v", first)
	}
	grainStarted(mine)
	if again := ask(ChannelKind, mine); !again.Pid.Equal(first.Pid) || kind.Count() != 1 {
		t.Fatalf("asked again: %v (first %v), %d grains of the kind", again.Pid, first.Pid, kind.Count())
	}

	// Not joined yet: its member list is not the cluster's, so it starts
	// what it is asked (the grain itself stops if it turns out a stray).
	c.joined.Store(false)
	if r := ask(ChannelKind, theirs); r.Failed || r.Pid == nil {
		t.Fatalf("before joining: answered %v, want the grain", r)
	}
	grainStarted(theirs)
	c.joined.Store(true)

	// The other member leaves and comes back alone in the list: this node
	// owns nothing, and stops both grains.
	other := &pcluster.Member{Id: "t@other", Host: "127.0.0.1", Port: 2, Kinds: []string{ChannelKind}}
	c.sys.root.Send(act, &pcluster.ClusterTopology{Members: []*pcluster.Member{other}})
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-stopped:
			got[id] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("grains stopped after the change: %v, want %s and %s", got, mine, theirs)
		}
	}
	if !got[mine] || !got[theirs] || kind.Count() != 0 {
		t.Fatalf("stopped %v, %d grains of the kind left", got, kind.Count())
	}
	select {
	case id := <-started:
		t.Fatalf("%s started besides", id)
	default:
	}
}
