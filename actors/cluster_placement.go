package actors

import (
	"errors"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/eventstream"
)

// placement is the cluster's identity lookup: protoactor's disthash
// (rendezvous hashing over the member list, and on every node an activator
// that starts a kind's grain when asked), with one rule added: a node
// starts, or names, only a grain it owns in its own member list, once it
// has joined. A request for any other (from a member whose list is a moment
// older or newer, or from a peer not playing by the rules) is answered
// Failed, and the requester's lookup asks again shortly (grainLookup).
// disthash's activator starts a grain for whatever identity it is asked.
type placement struct {
	c         *Cluster
	pc        *cluster.Cluster
	activator *actor.PID
	topology  *eventstream.Subscription
	// local, in tests, finds every grain in this node's actor system, with
	// no remote and no activator (cluster_inprocess_test.go).
	local func(kind, identity string) *actor.PID
}

// activatorName is disthash's: nodes of an older version ask it.
const activatorName = disthash.PartitionActivatorActorName

// activationWait bounds one ask of a grain's owner (disthash waits 5 s).
// The owner answers at once (a grain starts after its answer), so a longer
// wait is a lost request: a peer tears its connection to an address down
// up to 2 s late (its writer sleeps between connection attempts), dropping
// what was queued on it, when a node restarts on that address. Asked again
// (grainLookup), a lost request costs the channel this long, not 5 s; a
// lookup whose asks go unanswered again and again waits longer each time
// (an owner that slow would answer every short ask too late), up to
// activationWaitMax.
const (
	activationWait    = time.Second
	activationWaitMax = 5 * time.Second
)

var _ cluster.IdentityLookup = (*placement)(nil)

func (p *placement) Setup(pc *cluster.Cluster, _ []string, _ bool) {
	p.pc = pc
	props := actor.PropsFromProducer(func() actor.Actor { return newActivator(p.c, pc.TryGetClusterKind, p.RemovePid) })
	p.activator, _ = pc.ActorSystem.Root.SpawnNamed(props, activatorName)
	// Subscribed after Cluster.topology (JoinCluster subscribes first), so
	// that the grains that move freeze before the activator stops them.
	p.topology = pc.ActorSystem.EventStream.Subscribe(func(ev any) {
		if t, ok := ev.(*cluster.ClusterTopology); ok {
			pc.ActorSystem.Root.Send(p.activator, t)
		}
	})
}

func (p *placement) Shutdown() {
	p.pc.ActorSystem.EventStream.Unsubscribe(p.topology)
	if err := p.pc.ActorSystem.Root.PoisonFuture(p.activator).Wait(); err != nil {
		p.c.log.Warn("cluster activator did not stop", "err", err)
	}
}

// RemovePid tells every member that a grain ended, as disthash does.
func (p *placement) RemovePid(ci *cluster.ClusterIdentity, pid *actor.PID) {
	p.pc.MemberList.BroadcastEvent(&cluster.ActivationTerminated{Pid: pid, ClusterIdentity: ci}, true)
}

func (p *placement) Get(ci *cluster.ClusterIdentity) *actor.PID {
	pid, _, _ := p.get(ci.Kind, ci.Identity, activationWaitMax)
	return pid
}

// get asks the owner of a grain in this node's member list for it: its
// PID; nil when no member hosts the kind or the owner did not answer, and
// then refused when it answered that it does not own the grain, lost when
// it did not answer within wait.
func (p *placement) get(kind, identity string, wait time.Duration) (pid *actor.PID, refused, lost bool) {
	if p.local != nil {
		return p.local(kind, identity), false, false
	}
	owner := p.c.ownerAddress(kind, identity)
	if owner == "" {
		return nil, false, false
	}
	req := &cluster.ActivationRequest{ClusterIdentity: &cluster.ClusterIdentity{Kind: kind, Identity: identity}}
	res, err := p.pc.ActorSystem.Root.RequestFuture(actor.NewPID(owner, activatorName), req, wait).Result()
	r, ok := res.(*cluster.ActivationResponse)
	switch {
	case err != nil || !ok:
		return nil, false, errors.Is(err, actor.ErrTimeout)
	case r.Failed || r.Pid == nil:
		return nil, true, false
	}
	return r.Pid, false, false
}

// activator starts this node's grains as its children, and stops those
// another member owns after a change of the member list.
type activator struct {
	c       *Cluster
	kind    func(name string) (*cluster.ActivatedKind, bool)
	stopped func(*cluster.ClusterIdentity, *actor.PID) // tells the members
	grains  map[string]placed                          // by ClusterIdentity.AsKey
	byPID   map[string]string                          // PID id → key in grains
}

func newActivator(c *Cluster, kind func(string) (*cluster.ActivatedKind, bool), stopped func(*cluster.ClusterIdentity, *actor.PID)) *activator {
	return &activator{c: c, kind: kind, stopped: stopped, grains: map[string]placed{}, byPID: map[string]string{}}
}

type placed struct {
	ci  *cluster.ClusterIdentity
	pid *actor.PID
}

func (a *activator) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *cluster.ActivationRequest:
		ctx.Respond(a.activate(ctx, m.GetClusterIdentity()))
	case *cluster.ClusterTopology:
		a.moved(ctx, m)
	case *actor.Terminated:
		a.ended(m.Who)
	case *actor.Stopping:
		// Every grain told at once, then waited for: one at a time, many
		// grains would outlast the leave's bound.
		stopping := make(map[string]*actor.Future, len(a.grains))
		for key, g := range a.grains {
			stopping[key] = ctx.PoisonFuture(g.pid)
		}
		for key, f := range stopping {
			if err := f.Wait(); err != nil {
				ctx.Logger().Warn("grain did not stop", slog.String("identity", key), slog.Any("err", err))
			}
		}
	}
}

// activate answers a request for a grain: the running one, or one started
// now, if this node owns it; Failed if it does not (once joined: before, its
// member list is not the cluster's yet) or the kind is not one of ours.
func (a *activator) activate(ctx actor.Context, ci *cluster.ClusterIdentity) *cluster.ActivationResponse {
	c := a.c
	kind, ok := a.kind(ci.GetKind())
	switch {
	case !ok:
		c.refuseContent("activation of an unknown kind", ci.GetKind())
		return &cluster.ActivationResponse{Failed: true}
	case c.joined.Load() && !c.owns(ci.Kind, ci.Identity):
		c.activationRefusals.Add(1)
		return &cluster.ActivationResponse{Failed: true}
	}
	key := ci.AsKey()
	if g, ok := a.grains[key]; ok {
		return &cluster.ActivationResponse{Pid: g.pid}
	}
	ci = &cluster.ClusterIdentity{Kind: ci.Kind, Identity: ci.Identity} // not the request's, which the remote may reuse
	pid := ctx.SpawnPrefix(cluster.WithClusterIdentity(kind.Props, ci), ci.Identity)
	kind.Inc()
	a.grains[key] = placed{ci: ci, pid: pid}
	a.byPID[pid.Id] = key
	return &cluster.ActivationResponse{Pid: pid}
}

// moved stops the grains another member owns in the new member list.
func (a *activator) moved(ctx actor.Context, t *cluster.ClusterTopology) {
	owners := cluster.NewRendezvous()
	owners.UpdateMembers(t.Members)
	self := ctx.ActorSystem().Address()
	for _, g := range a.grains {
		if owners.GetByClusterIdentity(g.ci) != self {
			ctx.Poison(g.pid)
		}
	}
}

// ended forgets a grain that stopped and tells the members.
func (a *activator) ended(who *actor.PID) {
	key, ok := a.byPID[who.Id]
	if !ok {
		return
	}
	g := a.grains[key]
	delete(a.grains, key)
	delete(a.byPID, who.Id)
	if kind, ok := a.kind(g.ci.Kind); ok {
		kind.Dec()
	}
	a.stopped(g.ci, g.pid)
}
