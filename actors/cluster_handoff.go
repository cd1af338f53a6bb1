package actors

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
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

// handed is a grain's state (a *clusterpb.GrainState or ProjectState)
// waiting on the grain to start on its new owner.
type handed struct {
	state any
	at    time.Time
}

// keepOrGive keeps a handed state in held for the grain of id that will
// start here, or gives it to the one already running: kept first, then
// given, so a grain that starts meanwhile takes it itself (in ClusterInit,
// with claimHanded) and it is never stranded. States nobody came for within
// handoffKeep are forgotten.
func (c *Cluster) keepOrGive(held, running *sync.Map, id string, state any, now time.Time) {
	held.Range(func(k, v any) bool {
		if now.Sub(v.(*handed).at) > handoffKeep {
			held.Delete(k)
		}
		return true
	})
	held.Store(id, &handed{state: state, at: now})
	if pid, ok := running.Load(id); ok {
		if _, mine := held.LoadAndDelete(id); mine {
			c.sys.root.Send(pid.(*actor.PID), state)
		}
	}
}

// claimHanded takes the state handed for a grain of id starting now, if any.
func claimHanded(held *sync.Map, id string, now time.Time) (any, bool) {
	h, ok := held.LoadAndDelete(id)
	if !ok || now.Sub(h.(*handed).at) >= handoffKeep {
		return nil, false
	}
	return h.(*handed).state, true
}

// HandoffStats is what HandOff did.
type HandoffStats struct {
	Grains  int // grains frozen and handed off
	Members int // members they went to
	Failed  int // grains whose new owner did not acknowledge in time
}

// HandOff freezes every grain on this node, of both kinds (they stop
// stamping and granting), sends each one's state to the member that owns it
// once this node is gone (handOver: the project states first), waits for
// their acks (at most AckTimeout), then deregisters from etcd, so that the
// other members move the grains at once. Call it after the
// API stopped taking emits and before the sockets close; Leave finishes the
// departure.
func (c *Cluster) HandOff(ctx context.Context) (HandoffStats, error) {
	var st HandoffStats
	if !c.joined.Load() || c.leaving.Swap(true) {
		return st, nil
	}
	var pids []*actor.PID
	c.grains.Range(func(_, v any) bool {
		pids = append(pids, v.(*actor.PID))
		return true
	})
	st = c.handOver(ctx, c.freeze(pids, func(string) bool { return true }), c.view.Load().others)
	err := c.deregister(ctx)
	return st, err
}

// frozenGrains are the grains of both kinds frozen for a handoff: their
// states come back on the channels.
type frozenGrains struct {
	channels    chan *clusterpb.GrainState
	channelPIDs []*actor.PID
	projects    chan *clusterpb.ProjectState
	projectPIDs []*actor.PID
}

// freeze sends the channel grains pids, and the project grains here whose
// project moving says moves, a freeze at once (before protoactor's
// placement actor stops them).
func (c *Cluster) freeze(pids []*actor.PID, moving func(projectID string) bool) frozenGrains {
	f := frozenGrains{channels: make(chan *clusterpb.GrainState, len(pids)), channelPIDs: pids}
	for _, pid := range pids {
		c.sys.root.Send(pid, &freeze{reply: f.channels})
	}
	c.projectGrains.Range(func(k, p any) bool {
		if moving(k.(string)) {
			f.projectPIDs = append(f.projectPIDs, p.(*actor.PID))
		}
		return true
	})
	f.projects = make(chan *clusterpb.ProjectState, len(f.projectPIDs))
	for _, pid := range f.projectPIDs {
		c.sys.root.Send(pid, &freezeProject{reply: f.projects})
	}
	return f
}

// handOver collects the frozen grains' states (within freezeTimeout: the
// rest stopped meanwhile, or are stuck) and sends each to the node actor of
// its owner in owners, per owner in messages of about handoffChunk bytes:
// the project states first, as soon as they are in (their grains answer at
// once, and a new owner counts a project's windows from zero until its
// state comes), then the channel states. It waits for the acks (at most
// AckTimeout) and stops the project grains (protoactor's placement stops
// the channel grains). Its stats count the channel grains.
func (c *Cluster) handOver(ctx context.Context, f frozenGrains, owners *cluster.Rendezvous) HandoffStats {
	var st HandoffStats
	out := handoffMessages{c: c, owners: owners, byOwner: map[string][]*clusterpb.GrainHandoff{}, size: map[string]int{}, members: map[string]bool{}}
	bound := time.NewTimer(freezeTimeout)
	defer bound.Stop()
	w := freezeWait{bound: bound.C, done: ctx.Done()}
	for got := 0; got < len(f.projectPIDs); got++ {
		p, ok := awaitState(&w, f.projects)
		if !ok {
			break
		}
		if h := out.add(ProjectKind, p.ProjectId, proto.Size(p)); h != nil {
			h.Projects = append(h.Projects, p)
		}
	}
	sent := out.send()
	for st.Grains < len(f.channelPIDs) {
		s, ok := awaitState(&w, f.channels)
		if !ok {
			break
		}
		st.Grains++
		if h := out.add(ChannelKind, s.Identity, proto.Size(s)); h != nil {
			h.Grains = append(h.Grains, s)
		} else {
			st.Failed++ // no member left to take it
		}
	}
	st.Failed += len(f.channelPIDs) - st.Grains
	sent = append(sent, out.send()...)
	st.Members = len(out.members)
	for _, s := range sent {
		if _, err := s.f.Result(); err != nil {
			st.Failed += len(s.h.Grains)
			c.log.Warn("grain handoff not acknowledged: its channels restart empty (replay_gap for clients that resume), its projects' budget windows empty",
				"member", s.owner, "grains", len(s.h.Grains), "projects", len(s.h.Projects), "err", err)
		}
	}
	for _, pid := range f.projectPIDs {
		c.sys.root.Poison(pid)
	}
	return st
}

// freezeWait is how long a handoff waits for frozen grains' states: until
// bound (freezeTimeout) or done (the caller gave up); over once either came.
type freezeWait struct {
	bound <-chan time.Time
	done  <-chan struct{}
	over  bool
}

// awaitState takes the next state from ch: waiting for it until the wait
// is over, and after that only one already there (grains that answered
// are handed over even when another never does). False: none.
func awaitState[T any](w *freezeWait, ch <-chan T) (T, bool) {
	var zero T
	if w.over {
		select {
		case v := <-ch:
			return v, true
		default:
			return zero, false
		}
	}
	select {
	case v := <-ch:
		return v, true
	case <-w.bound:
	case <-w.done:
	}
	w.over = true
	return awaitState(w, ch)
}

// handoffMessages gathers grain states per owner into messages of about
// handoffChunk bytes, and sends what it holds.
type handoffMessages struct {
	c       *Cluster
	owners  *cluster.Rendezvous
	byOwner map[string][]*clusterpb.GrainHandoff // not sent yet
	size    map[string]int                       // bytes in each owner's last message
	members map[string]bool                      // owners sent to
}

// add returns the message a state of kind and identity goes in; nil when
// no member but this one is left to take it.
func (m *handoffMessages) add(kind, identity string, bytes int) *clusterpb.GrainHandoff {
	owner := m.owners.GetByClusterIdentity(&cluster.ClusterIdentity{Kind: kind, Identity: identity})
	if owner == "" || owner == m.c.sys.as.Address() {
		return nil
	}
	hs := m.byOwner[owner]
	if len(hs) == 0 || m.size[owner] > handoffChunk {
		hs = append(hs, &clusterpb.GrainHandoff{From: m.c.self})
		m.byOwner[owner], m.size[owner] = hs, 0
	}
	m.size[owner] += bytes
	return hs[len(hs)-1]
}

// sentHandoff is one message sent and its ack to come.
type sentHandoff struct {
	owner string
	h     *clusterpb.GrainHandoff
	f     *actor.Future
}

// send sends every message gathered so far.
func (m *handoffMessages) send() []sentHandoff {
	var sent []sentHandoff
	for owner, hs := range m.byOwner {
		m.members[owner] = true
		for _, h := range hs {
			sent = append(sent, sentHandoff{owner, h, m.c.sys.root.RequestFuture(actor.NewPID(owner, NodeActorName), h, m.c.ackTimeout)})
		}
	}
	clear(m.byOwner)
	clear(m.size)
	return sent
}

func grainOwner(owners *cluster.Rendezvous, identity string) string {
	return owners.GetByClusterIdentity(&cluster.ClusterIdentity{Kind: ChannelKind, Identity: identity})
}

// A node that joins becomes the owner of some channels (rendezvous hashing
// moves a channel only to the member that joined). Their previous owner
// hands them over as a leaving node does, while the joining node's grains
// hold what they are sent until the state is there:
//
//   - moveOut, on every member that was one already, when the member list
//     changes: the grains whose owner is now another member freeze (they
//     refuse to stamp from then on) before protoactor's placement actor stops
//     them, and their states go to their new owners' node actors, batched per
//     owner, within freezeTimeout and AckTimeout. Then every member that
//     joined is sent an empty GrainHandoff: the end marker, "nothing more is
//     coming from me".
//   - A grain that starts on a node that joined less than moveWindow ago,
//     for a channel whose owner without this node (its owner before the join)
//     is another member that has not sent its end marker yet, awaits: it
//     holds its publishes, subscribes, leaves, registers, queries and the
//     ends of relays until the state arrives, the
//     marker arrives (that member had no grain for the channel), or stateWait
//     passes (that member died, or is too slow: the grain starts from the
//     clock as after a crash). So the channel never has two grains stamping,
//     a `since` is answered from the moved ring, and an emit id the old owner
//     answered is answered from memory, not stamped again.

// moveWindow: how long after it joined a node's new grains may wait for a
// state; stateWait: how long one waits at most.
const (
	moveWindow = 5 * time.Second
	stateWait  = time.Second
)

// moves is a node's record of grain moves.
type moves struct {
	joinedAt atomic.Int64 // unix ns: when this node first saw itself a member
	done     sync.Map     // member id → time: its end marker arrived
	waiting  sync.Map     // identity → *actor.PID: grains holding messages until a state arrives
}

// moveOut hands the grains that another member owns in the new member list
// v (the one before is old) to it, and sends each member that joined the
// end marker. It must run before protoactor's placement actor gets the
// topology: the freezes are then in the grains' mailboxes before the
// placement actor's poison.
func (c *Cluster) moveOut(old, v *memberView, in bool) {
	if !in || c.leaving.Load() {
		return // HandOff moves the grains of a node that leaves
	}
	self := c.sys.as.Address()
	var ids []string
	var pids []*actor.PID
	c.grains.Range(func(k, p any) bool {
		if owner := grainOwner(v.owners, k.(string)); owner != "" && owner != self {
			ids, pids = append(ids, k.(string)), append(pids, p.(*actor.PID))
		}
		return true
	})
	var joined []string // node actors' addresses
	for _, m := range v.raw {
		if m.Id != c.self && m.Address() != self && !slices.ContainsFunc(old.raw, func(o *cluster.Member) bool { return o.Id == m.Id }) {
			joined = append(joined, m.Address())
		}
	}
	f := c.freeze(pids, func(id string) bool {
		owner := v.owners.GetByClusterIdentity(&cluster.ClusterIdentity{Kind: ProjectKind, Identity: id})
		return owner != "" && owner != self
	})
	if len(pids) == 0 && len(joined) == 0 && len(f.projectPIDs) == 0 {
		return
	}
	go func() {
		began := time.Now()
		st := c.handOver(context.Background(), f, v.owners)
		for _, addr := range joined {
			c.sys.root.RequestFuture(actor.NewPID(addr, NodeActorName), &clusterpb.GrainHandoff{From: c.self}, c.ackTimeout)
		}
		// The placement actor has stopped them already; a frozen grain left
		// running would hold its subscribers forever.
		for i, pid := range pids {
			if p, ok := c.grains.Load(ids[i]); ok && p.(*actor.PID).Equal(pid) {
				c.sys.root.Poison(pid)
			}
		}
		if len(pids) > 0 {
			c.log.Info("handed moved channel grains to their new owners", "grains", st.Grains, "to_members", st.Members,
				"failed", st.Failed, "took", time.Since(began).Round(time.Millisecond))
		}
	}()
}

// stateComing: a state for this node's new grain of identity may be on its
// way from the channel's owner before this node joined (see moveOut).
func (c *Cluster) stateComing(identity string) bool {
	if !c.joined.Load() {
		return true // joining: started by a member that saw this node first (recheckWaiting)
	}
	if time.Since(time.Unix(0, c.moves.joinedAt.Load())) > moveWindow || !c.owns(ChannelKind, identity) {
		return false
	}
	v, self := c.view.Load(), c.sys.as.Address()
	prev := grainOwner(v.others, identity)
	if prev == "" || prev == self { // a previous life of this node (killed, its lease not run out yet)
		return false
	}
	coming := false
	for _, m := range v.raw { // two lives of one member share an address
		if m.Address() == prev {
			if _, done := c.moves.done.Load(m.Id); done {
				return false
			}
			coming = true
		}
	}
	return coming
}

// recheckWaiting asks every waiting grain whether its state may still come.
func (c *Cluster) recheckWaiting() {
	c.moves.waiting.Range(func(_, pid any) bool {
		c.sys.root.Send(pid.(*actor.PID), &recheckWait{})
		return true
	})
}

// takeHandoff keeps the states for grains that will start here, or gives
// them to grains already running.
func (c *Cluster) takeHandoff(h *clusterpb.GrainHandoff) {
	now := time.Now()
	c.takeProjects(h, now)
	if len(h.Grains) == 0 && len(h.Projects) == 0 { // a move's end marker (moveOut)
		c.moves.done.Store(h.From, now) // before the recheck: a grain that starts meanwhile sees one or the other
		c.recheckWaiting()
		c.log.Info("a member has handed over every channel grain that moved here", "from", h.From)
		return
	}
	if len(h.Grains) == 0 {
		return
	}
	for _, st := range h.Grains {
		c.keepOrGive(&c.handoffs, &c.grains, st.Identity, st, now)
	}
	c.log.Info("took channel grains from another member", "from", h.From, "grains", len(h.Grains))
}

// A joining node can be handed grains before it lists their sender: the
// sender saw the new registration in its watch while this node still reads
// the member list it registered in. Such a handoff (from a member id this
// node does not list) waits for the next member lists, up to the ack bound
// (this node's, counted from its arrival; the new grains themselves wait
// for a state at most stateWait); one from a listed member's id at another
// address is refused at once.

// earlyHandoffBytes and earlyHandoffMax bound the handoffs kept waiting
// for a member list: a joining node takes about handoffChunk per message,
// and a peer cannot pin more than this much memory with made-up member ids.
const (
	earlyHandoffBytes = 32 * handoffChunk
	earlyHandoffMax   = 256
)

// earlyHandoff is a handoff kept until its sender is listed, or until.
type earlyHandoff struct {
	h      *clusterpb.GrainHandoff
	bytes  int
	sender *actor.PID
	until  time.Time
}

// earlyHandoffDue asks the node actor to drop the early handoffs whose wait
// is over.
type earlyHandoffDue struct{}

// takeHandoff takes a handoff from a listed member and acks it, keeps one
// from a member not listed yet, and refuses the rest unanswered (a real
// member's handoff then times out and says so).
func (n *nodeActor) takeHandoff(ctx actor.Context, h *clusterpb.GrainHandoff) {
	ok, listed := n.c.memberAt(h.From, ctx.Sender())
	switch {
	case ok:
		n.c.takeHandoff(h)
		ctx.Respond(&clusterpb.GrainHandoffAck{Taken: int32(len(h.Grains))})
	case !listed && ctx.Sender() != nil:
		size := proto.Size(h)
		if len(n.early) >= earlyHandoffMax || n.earlyBytes+size > earlyHandoffBytes {
			n.c.refuseContent("handoff from a member not listed here, past the bound of those kept", h.From)
			return
		}
		n.early = append(n.early, earlyHandoff{h: h, bytes: size, sender: ctx.Sender(), until: time.Now().Add(n.c.ackTimeout)})
		n.earlyBytes += size
		node, root := ctx.Self(), ctx.ActorSystem().Root
		time.AfterFunc(n.c.ackTimeout, func() { root.Send(node, &earlyHandoffDue{}) })
	default:
		n.c.refuseContent("member id not at its sender's address", h.From)
	}
}

// takeEarlyHandoffs takes the early handoffs whose senders are listed now,
// and refuses those whose wait is over.
func (n *nodeActor) takeEarlyHandoffs(ctx actor.Context) {
	now := time.Now()
	n.early = slices.DeleteFunc(n.early, func(e earlyHandoff) bool {
		ok, listed := n.c.memberAt(e.h.From, e.sender)
		switch {
		case ok:
			n.c.takeHandoff(e.h)
			ctx.Send(e.sender, &clusterpb.GrainHandoffAck{Taken: int32(len(e.h.Grains))})
		case listed:
			n.c.refuseContent("member id not at its sender's address", e.h.From)
		case now.Before(e.until):
			return false
		default:
			n.c.refuseContent("handoff from a member still not listed here after the ack bound", e.h.From)
		}
		n.earlyBytes -= e.bytes
		return true
	})
}

// Project grains move the same way, without the wait: a project grain that
// starts before its state arrives counts from zero, and the state, when it
// comes, adds its counts to the same windows (projectGrain.adopt).

// takeProjects keeps the project states for grains that will start here, or
// gives them to grains already running.
func (c *Cluster) takeProjects(h *clusterpb.GrainHandoff, now time.Time) {
	if len(h.Projects) == 0 {
		return
	}
	for _, st := range h.Projects {
		c.keepOrGive(&c.projectHandoffs, &c.projectGrains, st.ProjectId, st, now)
	}
	c.log.Info("took project grains from another member", "from", h.From, "projects", len(h.Projects))
}
