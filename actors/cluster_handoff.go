package actors

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/proto"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A node that stops gracefully hands its channel grains to their next
// owners before it deregisters (HandOff), so that clients that reconnect
// elsewhere resume with `since` and no replay_gap. A crash cannot: the new
// owner starts from the clock (seq still rises) with an empty ring, and a
// `since` from before is answered with replay_gap.

// handoffKeep bounds how long a handed-off state waits for its grain to
// start on the new owner (the first relay that looks the grain up starts it).
const handoffKeep = 30 * time.Second

// freezeTimeout bounds collecting the frozen grains' states.
const freezeTimeout = time.Second

// handoffChunk: a handoff message takes grains until its size passes this
// (rings are up to 1 MiB each; the remote takes messages up to 64 MiB).
const handoffChunk = 8 << 20

// handedOff is a grain state waiting on its new owner.
type handedOff struct {
	state *clusterpb.GrainState
	at    time.Time
}

// HandoffStats is what HandOff did.
type HandoffStats struct {
	Grains  int // grains frozen and handed off
	Members int // members they went to
	Failed  int // grains whose new owner did not acknowledge in time
}

// HandOff freezes every channel grain on this node (they stop stamping), sends
// each one's state to the member that owns the channel once this node is
// gone, waits for their acks (at most AckTimeout), then deregisters from
// etcd, so that the other members move the grains at once. Call it after the
// API stopped taking emits and before the sockets close; Leave finishes the
// departure.
func (c *Cluster) HandOff(ctx context.Context) (HandoffStats, error) {
	var st HandoffStats
	if c.pc == nil || c.leaving.Swap(true) {
		return st, nil
	}
	rest := cluster.NewRendezvous()
	var others []*cluster.Member
	for _, m := range c.view.Load().raw {
		if m.Id != c.self {
			others = append(others, m)
		}
	}
	rest.UpdateMembers(others)
	// Freeze every grain at once, then collect their states within one bound.
	var pids []*actor.PID
	c.grains.Range(func(_, v any) bool {
		pids = append(pids, v.(*actor.PID))
		return true
	})
	states := make(chan *clusterpb.GrainState, len(pids))
	for _, pid := range pids {
		c.sys.root.Send(pid, &freeze{reply: states})
	}
	byOwner := map[string][]*clusterpb.GrainHandoff{} // per owner, messages of about handoffChunk bytes each
	size := map[string]int{}                          // bytes in each owner's last message
	bound := time.NewTimer(freezeTimeout)
	defer bound.Stop()
collect:
	for range pids {
		select {
		case s := <-states:
			st.Grains++
			owner := rest.GetByClusterIdentity(&cluster.ClusterIdentity{Kind: ChannelKind, Identity: s.Identity})
			if owner == "" {
				st.Failed++ // no member left to take it
				continue
			}
			hs := byOwner[owner]
			if len(hs) == 0 || size[owner] > handoffChunk {
				hs = append(hs, &clusterpb.GrainHandoff{From: c.self})
				byOwner[owner], size[owner] = hs, 0
			}
			hs[len(hs)-1].Grains = append(hs[len(hs)-1].Grains, s)
			size[owner] += proto.Size(s)
		case <-bound.C: // the rest stopped meanwhile, or are stuck
			break collect
		case <-ctx.Done():
			break collect
		}
	}
	st.Failed += len(pids) - st.Grains
	st.Members = len(byOwner)
	type sent struct {
		owner string
		n     int
		f     *actor.Future
	}
	var futures []sent
	for owner, hs := range byOwner {
		for _, h := range hs {
			futures = append(futures, sent{owner, len(h.Grains), c.sys.root.RequestFuture(actor.NewPID(owner, NodeActorName), h, c.ackTimeout)})
		}
	}
	for _, s := range futures {
		if _, err := s.f.Result(); err != nil {
			st.Failed += s.n
			c.log.Warn("grain handoff not acknowledged: those channels restart empty (replay_gap for clients that resume)",
				"member", s.owner, "grains", s.n, "err", err)
		}
	}
	err := c.deregister(ctx)
	return st, err
}

// takeHandoff keeps the states for grains that will start here, or gives
// them to grains already running.
func (c *Cluster) takeHandoff(h *clusterpb.GrainHandoff) {
	now := time.Now()
	c.handoffs.Range(func(k, v any) bool { // forget states nobody came for
		if now.Sub(v.(*handedOff).at) > handoffKeep {
			c.handoffs.Delete(k)
		}
		return true
	})
	for _, s := range h.Grains {
		// Kept first, then given to a grain already running (a grain that
		// starts meanwhile takes it itself in ClusterInit): never stranded.
		c.handoffs.Store(s.Identity, &handedOff{state: s, at: now})
		if pid, ok := c.grains.Load(s.Identity); ok {
			if _, mine := c.handoffs.LoadAndDelete(s.Identity); mine {
				c.sys.root.Send(pid.(*actor.PID), s)
			}
		}
	}
	c.log.Info("took channel grains from a leaving member", "from", h.From, "grains", len(h.Grains))
}
