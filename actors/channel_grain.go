package actors

import (
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/proto/clusterpb"
	"github.com/relayhq/relay/transport"
)

// ChannelKind is the cluster kind of channel grains; a grain's identity is
// PROJECT_ID/CHANNEL (kind names cannot contain "/", identities may).
const ChannelKind = "relay-channel"

// dedupeWindow is how long a grain remembers the answer to a publish id, so
// that a retry (a relay that heard nothing within publishRetryAfter) is
// answered the same instead of being stamped twice. It covers the edge's
// whole wait (the HTTP emit gives up after 5 s).
const dedupeWindow = 10 * time.Second

// channelGrain is a channel's single writer in a cluster: seq, the replay
// ring, the emit window and the presence roster of every node. It sends each
// stamped message once to every relay (one per node with subscribers), which
// writes it to its sockets. Every field is owned by Receive.
type channelGrain struct {
	c        *Cluster
	cfg      *Config
	identity string // PROJECT_ID/CHANNEL
	project  string
	name     string // the channel

	seq    uint64
	window fixedWindow
	replay replayRing
	relays map[string]*grainRelay // by Ref key

	members roster // presence subscriptions of the whole cluster

	// The channel and presence webhooks are decided here, for the whole
	// cluster: subCount is the subscribers of every relay, occupied whether
	// the channel was last said (or handed over) to be occupied. hooks is
	// the project's target, from this node's project actor (watchHooks).
	hooks    channelHooks
	subCount int
	occupied bool

	answered answerMemory[*clusterpb.ChannelPublished] // publish id → its answer, for dedupeWindow
	quiet    quietPeriod

	born      time.Time
	rosterDue bool // a ChannelRoster waits for rosterSettle after the start
	frozen    bool // handed off: refuses to stamp (not_owner) and ignores subscribers until it stops

	// waiting: the channel's previous owner may be handing its state over
	// (this node just joined, see moveOut); publishes and membership
	// messages wait in held, in order, until it is here (at most stateWait).
	waiting   bool
	waitStart time.Time
	held      []any
	heldPubs  int

	// adopted: the grain took its predecessor's state (a handoff); a grain
	// that did not (its owner crashed) holds publishes sent again after an
	// earlier attempt (ChannelPublish.resent) for failoverSettle after its
	// start, so that the relays' registers bring what the crashed grain
	// stamped first and a retry is answered instead of stamped twice.
	adopted bool
	resent  []*clusterpb.ChannelPublish // a settleOver is due while it holds any
}

// failoverSettle: how long a grain started without state holds resent
// publishes (see adopted). Every node hears of the member list change at
// about the same time, and its relays register as soon as they do.
const failoverSettle = 500 * time.Millisecond

// settleOver: failoverSettle has passed; the resent publishes go on.
type settleOver struct{}

// heldMax bounds the publishes a waiting grain holds; more are refused
// not_owner (their relays send them again 300 ms later).
const heldMax = 1024

// recheckWait: something a waiting grain waits for may have changed (an
// end marker arrived, or this node now knows the member list).
type recheckWait struct{}

// waitOver: stateWait has passed.
type waitOver struct{}

// strayCheck: a grain started on a member that does not own its channel (a
// lookup that used the member list before a change) refuses to stamp, and
// its ring is not the channel's. It stops strayAfter later unless it holds
// something (a ring or publish answers handed to it): relays registered with
// it look the grain up again, and one that holds something is handed over
// at the next change of the member list.
type strayCheck struct{}

const strayAfter = time.Second

// rosterSettle: a grain started without a handed-off state (its owner
// crashed) waits this long for every relay to register again before it
// sends the roster, so presence subscribers do not see members of a node
// that has not registered yet leave and join again.
const rosterSettle = 2 * time.Second

// freeze asks a grain for its state and makes it refuse to stamp: its node
// is leaving and hands the state to the next owner.
type freeze struct{ reply chan *clusterpb.GrainState }

// rosterTick sends the roster once rosterSettle has passed.
type rosterTick struct{}

// grainRelay is one node's relay as the grain knows it.
type grainRelay struct {
	pid  *actor.PID
	subs map[uint64]*clusterpb.Subscriber
}

func refKey(r *clusterpb.Ref) string { return r.GetAddress() + "/" + r.GetId() }

func newChannelGrain(c *Cluster) *channelGrain {
	cfg := c.sys.cfg
	seq := uint64(cfg.Now().UnixMicro()) // see newChannelActor: seq keeps rising across lives
	return &channelGrain{
		c: c, cfg: cfg, seq: seq,
		window:   fixedWindow{size: time.Minute},
		replay:   replayRing{ttl: cfg.ReplayTTL, maxBytes: cfg.ReplayMaxBytes, lowWater: seq},
		relays:   map[string]*grainRelay{},
		members:  newRoster(),
		answered: newAnswerMemory[*clusterpb.ChannelPublished](),
	}
}

func (g *channelGrain) Receive(ctx actor.Context) {
	msg := ctx.Message()
	if g.waiting && g.hold(ctx, msg) {
		return
	}
	g.handle(ctx, msg)
}

func (g *channelGrain) handle(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *actor.Started:
		g.c.grainsLive.Add(1)
		g.c.activations.Add(1)
		scheduleQuietTick(ctx, g.cfg.ActorDormancy)
	case *cluster.ClusterInit:
		g.identity = m.Identity.Identity
		g.born = g.cfg.Now()
		g.project, g.name = splitIdentity(g.identity)
		g.replay.project, g.replay.projectMax = g.c.replayBytes(g.project), int64(g.cfg.MaxReplayBytesPerProject)
		// This node's project actor (started if need be) knows the project's
		// webhook settings and tells the grain now and at every change.
		g.c.sys.tell(g.project, &watchHooks{grain: ctx.Self()})
		g.c.grains.Store(g.identity, ctx.Self())
		if st, ok := claimHanded(&g.c.handoffs, g.identity, time.Now()); ok {
			g.adopt(ctx, st.(*clusterpb.GrainState))
		} else {
			g.await(ctx)
		}
		if g.c.joined.Load() && !g.owner() {
			g.strayLater(ctx)
		}
	case *actor.Stopped:
		if g.project != "" {
			g.c.sys.tellRunning(g.project, &unwatchHooks{grain: ctx.Self()})
		}
		g.replay.release()
		g.c.grainsLive.Add(-1)
		g.c.grains.CompareAndDelete(g.identity, ctx.Self())
		g.c.moves.waiting.CompareAndDelete(g.identity, ctx.Self())
	case *freeze:
		g.frozen = true
		m.reply <- g.state()
		g.endWait(ctx, "frozen") // what it held is refused or ignored now
	case *clusterpb.GrainState:
		g.adopt(ctx, m)
		g.endWait(ctx, "state")
	case *recheckWait:
		if g.waiting && !g.c.stateComing(g.identity) {
			g.endWait(ctx, "nothing to come")
		}
	case *waitOver:
		g.endWait(ctx, "timed out")
	case *strayCheck:
		switch {
		case g.owner() || g.frozen: // the owner after all; or handed off and stopping
		case g.replay.empty() && g.answered.len() == 0:
			ctx.Poison(ctx.Self())
		default:
			g.strayLater(ctx)
		}
	case *rosterTick:
		g.rosterDue = false
		g.sendRoster(ctx)
	case *settleOver:
		held := g.resent
		g.resent = nil
		for _, m := range held {
			g.publish(ctx, m)
		}
	case *hooksChanged:
		g.hooks.set(g.cfg, m.target)
	case *clusterpb.ChannelPublish:
		g.publish(ctx, m)
	case *clusterpb.ChannelQuery:
		g.answerQuery(ctx, m)
	case *clusterpb.ChannelJoin, *clusterpb.ChannelLeave, *clusterpb.ChannelRegister, *actor.Terminated:
		if g.frozen {
			return // handed off: the next owner has the subscribers; relays send these to it again
		}
		g.membership(ctx, m)
	case *quietTick:
		scheduleQuietTick(ctx, g.cfg.ActorDormancy)
		if g.quiet.dormantAgain(g.dormant()) {
			ctx.Poison(ctx.Self())
		}
	}
}

// membership handles subscribes, leaves, registers and relays that end.
func (g *channelGrain) membership(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *clusterpb.ChannelJoin:
		g.join(ctx, m)
	case *clusterpb.ChannelLeave:
		if r := g.relays[refKey(m.Relay)]; r != nil {
			for _, conn := range m.Conns {
				g.remove(ctx, r, conn)
			}
		}
	case *clusterpb.ChannelRegister:
		g.register(ctx, m)
	case *actor.Terminated: // a relay stopped, or its node is gone
		key := m.Who.Address + "/" + m.Who.Id
		if r := g.relays[key]; r != nil {
			for conn := range r.subs {
				g.remove(ctx, r, conn)
			}
			delete(g.relays, key)
		}
	}
}

// await starts holding messages if the channel's previous owner may be
// handing its state over (see moveOut), for stateWait at most.
func (g *channelGrain) await(ctx actor.Context) {
	g.c.moves.waiting.Store(g.identity, ctx.Self()) // before the check: an end marker arriving meanwhile rechecks
	if !g.c.stateComing(g.identity) {
		g.c.moves.waiting.CompareAndDelete(g.identity, ctx.Self())
		return
	}
	g.waiting, g.waitStart = true, g.cfg.Now()
	self, root := ctx.Self(), ctx.ActorSystem().Root
	time.AfterFunc(stateWait, func() { root.Send(self, &waitOver{}) })
}

func (g *channelGrain) strayLater(ctx actor.Context) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	time.AfterFunc(strayAfter, func() { root.Send(self, &strayCheck{}) })
}

// hold keeps a message while the grain waits; false: handle it now.
func (g *channelGrain) hold(ctx actor.Context, msg any) bool {
	switch m := msg.(type) {
	case *clusterpb.ChannelPublish:
		if g.heldPubs >= heldMax {
			g.refuseNotOwner(ctx, m)
			return true
		}
		g.heldPubs++
	case *clusterpb.ChannelJoin, *clusterpb.ChannelLeave, *clusterpb.ChannelRegister, *actor.Terminated, *clusterpb.ChannelQuery:
	default:
		return false
	}
	g.held = append(g.held, msg)
	return true
}

// endWait handles what the grain held, in the order it came.
func (g *channelGrain) endWait(ctx actor.Context, why string) {
	if !g.waiting {
		return
	}
	g.waiting = false
	g.c.moves.waiting.CompareAndDelete(g.identity, ctx.Self())
	g.c.log.Debug("channel grain waited for its previous owner's state", "channel", g.identity, "end", why,
		"waited", g.cfg.Now().Sub(g.waitStart), "held", len(g.held))
	held := g.held
	g.held, g.heldPubs = nil, 0
	for _, m := range held {
		g.handle(ctx, m)
	}
}

// owner: this node is the channel's owner in the latest member list. A
// grain whose node no longer is (a member joined or left) refuses to stamp;
// the placement actor stops it, and the relays find the new owner.
func (g *channelGrain) owner() bool { return g.c.owns(ChannelKind, g.identity) }

func (g *channelGrain) publish(ctx actor.Context, m *clusterpb.ChannelPublish) {
	now := g.cfg.Now()
	g.answered.forget(now)
	replyTo := actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId())
	if prev, ok := g.answered.get(m.Id); ok {
		g.c.duplicates.Add(1)
		if prev.Channel == nil && prev.Error == "" {
			// Stamped by a predecessor that died, known from a relay's
			// register (catchUp): its counts and budget are this grain's now.
			prev = &clusterpb.ChannelPublished{Id: m.Id, Seq: prev.Seq, Subscribers: int32(g.subCount), Delivered: int32(g.subCount),
				Channel: budgetToProto(g.window.peek(now, int(m.ChannelLimit)))}
		}
		ctx.Send(replyTo, prev)
		return
	}
	answer := func(a *clusterpb.ChannelPublished) {
		a.Id = m.Id
		ctx.Send(replyTo, a)
	}
	if g.frozen || !g.owner() || g.c.fenced() {
		g.refuseNotOwner(ctx, m)
		return
	}
	if g.holdResent(ctx, m, now) {
		return
	}
	if m.NotAfterUnixNano != 0 && now.UnixNano() > m.NotAfterUnixNano {
		answer(&clusterpb.ChannelPublished{Error: errExpired})
		return
	}
	at := now // the owner's clock: windows must not roll back and forth with the senders' clocks
	limit := int(m.ChannelLimit)
	res := &clusterpb.ChannelPublished{}
	g.answered.remember(m.Id, now, res)
	if m.Client && !g.emitterSubscribed(m) { // rule 4, as the channel actor checks it
		res.Error = string(proto.CodeEmitIdentityMismatch)
		answer(res)
		return
	}
	if m.ProjectDenied {
		g.cfg.counters.RateLimitedProject.Add(1)
		res.Error, res.Channel = string(proto.CodeProjectRateLimited), budgetToProto(g.window.peek(at, limit))
		answer(res)
		return
	}
	budget, ok := g.window.take(at, limit)
	res.Channel = budgetToProto(budget)
	if !ok {
		g.cfg.counters.RateLimitedChannel.Add(1)
		res.Error = string(proto.CodeChannelRateLimited)
		answer(res)
		return
	}
	g.seq++
	msg := transport.FramePayload(encodeMessage(g.name, m.Payload, g.seq, m.Client, m.MsgType, m.ClientId))
	g.replay.add(g.seq, at, msg)
	res.Seq = g.seq
	var origin *grainRelay // a client emit's relay, whose emitter is skipped
	if m.Client {
		origin = g.relays[refKey(m.ReplyTo)]
	}
	deliver := &clusterpb.ChannelDeliver{Seq: g.seq, Message: msg, AcceptedUnixNano: m.AtUnixNano, PublishId: m.Id}
	for _, r := range g.relays {
		if len(r.subs) == 0 {
			continue
		}
		res.Subscribers += int32(len(r.subs))
		d := deliver
		if r == origin {
			if _, subscribed := r.subs[m.OriginConn]; subscribed {
				res.Delivered-- // the emitter is skipped
			}
			d = &clusterpb.ChannelDeliver{Seq: g.seq, Message: msg, SkipConn: m.OriginConn, AcceptedUnixNano: m.AtUnixNano, PublishId: m.Id}
		}
		res.Delivered += int32(len(r.subs))
		g.c.send(ctx, r.pid, d)
	}
	answer(res)
}

// holdResent keeps a resent publish (and every publish after it, so that one
// relay's stay in order) while a grain started without state settles.
func (g *channelGrain) holdResent(ctx actor.Context, m *clusterpb.ChannelPublish, now time.Time) bool {
	if len(g.resent) == 0 && (!m.Resent || g.adopted || now.Sub(g.born) >= failoverSettle) {
		return false
	}
	if len(g.resent) >= heldMax {
		g.refuseNotOwner(ctx, m)
		return true
	}
	if len(g.resent) == 0 {
		self, root := ctx.Self(), ctx.ActorSystem().Root
		time.AfterFunc(max(failoverSettle-now.Sub(g.born), 0), func() { root.Send(self, &settleOver{}) })
	}
	g.resent = append(g.resent, m)
	return true
}

// refuseNotOwner answers a publish not_owner: its relay looks the grain up
// again and sends it once more 300 ms later.
func (g *channelGrain) refuseNotOwner(ctx actor.Context, m *clusterpb.ChannelPublish) {
	g.c.ownerRefusals.Add(1)
	ctx.Send(actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId()), &clusterpb.ChannelPublished{Id: m.Id, Error: errNotOwner})
}

// emitterSubscribed: a client emit's connection holds a presence
// subscription under the token's clientId (channelActor.emitterSubscribed).
func (g *channelGrain) emitterSubscribed(m *clusterpb.ChannelPublish) bool {
	r := g.relays[refKey(m.ReplyTo)]
	if r == nil {
		return false
	}
	s := r.subs[m.OriginConn]
	return s != nil && s.Presence && s.ClientId == m.ClientId
}

const (
	errNotOwner = "not_owner"
	errExpired  = "expired"
)

// relay returns the grain's record of a relay, watching it when new: its
// Terminated (it stopped, or its node went away) removes its subscribers.
func (g *channelGrain) relay(ctx actor.Context, ref *clusterpb.Ref) *grainRelay {
	key := refKey(ref)
	r := g.relays[key]
	if r == nil {
		r = &grainRelay{pid: actor.NewPID(ref.Address, ref.Id), subs: map[uint64]*clusterpb.Subscriber{}}
		g.relays[key] = r
		ctx.Watch(r.pid)
	}
	return r
}

// join subscribes one socket: replay, then the sync in the answer, then a
// join to everyone else.
func (g *channelGrain) join(ctx actor.Context, m *clusterpb.ChannelJoin) {
	r := g.relay(ctx, m.Relay)
	sub := m.Sub
	ans := &clusterpb.ChannelJoined{Conn: sub.Conn}
	old, existed := r.subs[sub.Conn]
	wasMember := existed && old.Presence
	same := wasMember && sub.Presence && old.ClientId == sub.ClientId
	if sub.Presence && !same && g.members.full(sub.ClientId, wasMember && g.members.only(old.ClientId), g.cfg.MaxPresenceMembers) {
		ans.Refused = string(proto.CodeTooManyPresenceMembers)
		ans.Seq = g.seq
		g.c.send(ctx, r.pid, ans)
		return
	}
	if m.HasSince {
		if g.replay.request(m.Since, g.cfg.Now(), g.cfg.counters) {
			ans.Gap, ans.GapSince = true, m.Since
		}
		g.replay.each(m.Since, func(_ uint64, msg []byte) { ans.Replay = append(ans.Replay, msg) })
	}
	if wasMember && !same {
		g.removeMember(ctx, old.ClientId, r, sub.Conn)
	}
	r.subs[sub.Conn] = sub
	if !existed {
		g.subCount++
	}
	if sub.Presence {
		ans.Members = slices.Clone(g.members.others(sub.ClientId, same)) // the answer may stay in this process
	}
	ans.Seq = g.seq
	g.c.send(ctx, r.pid, ans)
	if g.subCount > 0 && !g.occupied {
		g.occupied = true
		g.hooks.occupancy(g.cfg, g.project, g.name, true)
	}
	if sub.Presence && !same {
		g.addMember(ctx, sub.ClientId, r, sub.Conn)
	}
}

func (g *channelGrain) remove(ctx actor.Context, r *grainRelay, conn uint64) {
	sub, ok := r.subs[conn]
	if !ok {
		return
	}
	delete(r.subs, conn)
	g.subCount--
	if sub.Presence {
		g.removeMember(ctx, sub.ClientId, r, conn)
	}
	g.vacated()
}

// vacated sends channel_vacated when no relay has subscribers left and the
// channel was occupied.
func (g *channelGrain) vacated() {
	if g.subCount == 0 && g.occupied {
		g.occupied = false
		g.hooks.occupancy(g.cfg, g.project, g.name, false)
	}
}

func (g *channelGrain) addMember(ctx actor.Context, clientID string, from *grainRelay, conn uint64) {
	if g.members.add(clientID) {
		g.presenceEvent(ctx, proto.PresenceJoin, clientID, from, conn)
	}
}

func (g *channelGrain) removeMember(ctx actor.Context, clientID string, from *grainRelay, conn uint64) {
	if g.members.remove(clientID) {
		g.presenceEvent(ctx, proto.PresenceLeave, clientID, from, conn)
	}
}

// presenceEvent goes to every relay, so that each keeps the roster its
// presence subscribers have been told (see ChannelRoster), and to the webhook.
func (g *channelGrain) presenceEvent(ctx actor.Context, event, clientID string, from *grainRelay, conn uint64) {
	g.hooks.member(g.cfg, g.project, g.name, clientID, event == proto.PresenceJoin)
	ev := &clusterpb.ChannelPresence{Event: event, ClientId: clientID}
	for _, r := range g.relays {
		e := ev
		if r == from {
			e = &clusterpb.ChannelPresence{Event: event, ClientId: clientID, ExceptConn: conn}
		}
		g.c.send(ctx, r.pid, e)
	}
}

// register replaces what the grain held for a relay with its whole state,
// without join or leave events; if the member list changed, every relay
// gets the new roster and tells its presence subscribers the difference.
//
// Webhooks: the subscribers and members a register brings are not new (a
// grain saw them join, perhaps one that crashed), so they send nothing;
// those it takes away left while the relay was away (their leave went to a
// grain that handed off or died), so they send member_removed and, for the
// last subscriber, channel_vacated.
func (g *channelGrain) register(ctx actor.Context, m *clusterpb.ChannelRegister) {
	if m.LastSeq > g.seq {
		g.seq = m.LastSeq
		g.replay.lowWater = max(g.replay.lowWater, g.seq) // what came before it is not here
	}
	r := g.relay(ctx, m.Relay)
	g.catchUp(ctx, r, m)
	before := g.members.list()
	for _, sub := range r.subs {
		if sub.Presence {
			g.members.remove(sub.ClientId)
		}
	}
	g.subCount -= len(r.subs)
	r.subs = make(map[uint64]*clusterpb.Subscriber, len(m.Subs))
	g.addSubs(r, m.Subs)
	g.subCount += len(r.subs)
	if g.hooks.wantsPresence() {
		for _, id := range before {
			if g.members.counts[id] == 0 {
				g.hooks.member(g.cfg, g.project, g.name, id, false)
			}
		}
	}
	if g.subCount > 0 {
		g.occupied = true
	}
	g.vacated()
	if g.rosterDue {
		return // sent to every relay when the settle ends
	}
	if slices.Equal(before, g.members.sorted) { // (nil and empty are equal)
		if !g.settling() { // the relay may hold members that left while it was away
			g.c.send(ctx, r.pid, &clusterpb.ChannelRoster{Members: g.members.list()})
		}
		return
	}
	if g.settling() {
		g.rosterLater(ctx)
		return
	}
	g.sendRoster(ctx)
}

// catchUp sends a registering relay what the grain stamped after the last
// seq the relay saw, after a gap when the ring no longer holds all of it, and
// remembers what the relay delivered lately: a retry of one of those is
// answered, not stamped again (a grain that started after a crash).
func (g *channelGrain) catchUp(ctx actor.Context, r *grainRelay, m *clusterpb.ChannelRegister) {
	now := g.cfg.Now()
	for _, p := range m.Recent { // without counts or budget: publish fills them in
		g.answered.adopt(p.Id, now, &clusterpb.ChannelPublished{Id: p.Id, Seq: p.Seq})
	}
	if m.LastSeq == 0 || len(m.Subs) == 0 || m.LastSeq >= g.seq {
		return // nothing it missed, or nobody to give it to
	}
	g.replay.expire(now)
	up := &clusterpb.ChannelCatchUp{}
	if g.replay.gapAfter(float64(m.LastSeq)) {
		up.Gap, up.GapSince = true, m.LastSeq
		g.cfg.counters.ReplayGaps.Add(1)
	}
	g.replay.each(float64(m.LastSeq), func(seq uint64, msg []byte) {
		up.Messages = append(up.Messages, &clusterpb.ChannelDeliver{Seq: seq, Message: msg})
	})
	g.c.send(ctx, r.pid, up)
}

// settling: the grain started less than rosterSettle ago.
func (g *channelGrain) settling() bool { return g.cfg.Now().Sub(g.born) < rosterSettle }

// rosterLater sends the roster to every relay once the settle is over.
func (g *channelGrain) rosterLater(ctx actor.Context) {
	if g.rosterDue {
		return
	}
	g.rosterDue = true
	self, root := ctx.Self(), ctx.ActorSystem().Root
	time.AfterFunc(max(rosterSettle-g.cfg.Now().Sub(g.born), 0), func() { root.Send(self, &rosterTick{}) })
}

func (g *channelGrain) sendRoster(ctx actor.Context) {
	roster := &clusterpb.ChannelRoster{Members: g.members.list()}
	for _, r := range g.relays {
		g.c.send(ctx, r.pid, roster)
	}
}

// state is what a grain hands to the channel's next owner.
func (g *channelGrain) state() *clusterpb.GrainState {
	g.replay.expire(g.cfg.Now())
	st := &clusterpb.GrainState{Identity: g.identity, Seq: g.seq, LowWater: g.replay.lowWater,
		WindowStartUnixNano: g.window.start.UnixNano(), WindowCount: int32(g.window.count)}
	for _, e := range g.replay.live() {
		st.Replay = append(st.Replay, &clusterpb.ReplayEntry{Seq: e.seq, AtUnixNano: e.at.UnixNano(), Message: e.msg})
	}
	for _, r := range g.relays {
		rs := &clusterpb.RelaySubs{Relay: &clusterpb.Ref{Address: r.pid.Address, Id: r.pid.Id}}
		for _, sub := range r.subs {
			rs.Subs = append(rs.Subs, sub)
		}
		st.Relays = append(st.Relays, rs)
	}
	g.answered.each(func(id string, at time.Time, a *clusterpb.ChannelPublished) {
		st.Answered = append(st.Answered, &clusterpb.AnsweredPublish{Id: id, AtUnixNano: at.UnixNano(), Answer: a})
	})
	return st
}

// adopt takes a leaving owner's state. Usually the grain has just started;
// if it has already stamped (a relay found it first), the older messages go
// before its own and seq stays the higher; relays it knows already keep
// what they registered.
func (g *channelGrain) adopt(ctx actor.Context, st *clusterpb.GrainState) {
	g.adopted = true
	older := make([]replayEntry, 0, len(st.Replay))
	for _, e := range st.Replay {
		older = append(older, replayEntry{seq: e.Seq, at: time.Unix(0, e.AtUnixNano), msg: e.Message})
	}
	g.replay.prepend(older, st.LowWater, st.Seq, g.replay.empty() && g.replay.lowWater == g.seq)
	g.seq = max(g.seq, st.Seq)
	g.window.merge(time.Unix(0, st.WindowStartUnixNano), int(st.WindowCount))
	for _, a := range st.Answered {
		if a.Answer != nil {
			g.answered.adopt(a.Id, time.Unix(0, a.AtUnixNano), a.Answer)
		}
	}
	g.answered.resort()
	// Relays register again as they find this grain; once they have, each
	// is sent the roster, so that what the old owner told them meanwhile
	// is set right.
	g.rosterLater(ctx)
	for _, rs := range st.Relays {
		if _, known := g.relays[refKey(rs.Relay)]; known {
			continue
		}
		r := g.relay(ctx, rs.Relay)
		g.addSubs(r, rs.Subs)
		g.subCount += len(r.subs)
	}
	if g.subCount > 0 { // the old owner said so (or its relays' joins will)
		g.occupied = true
	}
}

// addSubs records a relay's subscribers, counting their presence without
// join events (a register or a handoff: the members are not new).
func (g *channelGrain) addSubs(r *grainRelay, subs []*clusterpb.Subscriber) {
	for _, sub := range subs {
		r.subs[sub.Conn] = sub
		if sub.Presence {
			g.members.add(sub.ClientId)
		}
	}
}

// dormant: no relay has subscribers, and the window, the ring and the
// dedupe memory are empty.
func (g *channelGrain) dormant() bool {
	if g.waiting || len(g.resent) > 0 {
		return false
	}
	now := g.cfg.Now()
	g.replay.expire(now)
	g.answered.forget(now)
	for _, r := range g.relays {
		if len(r.subs) > 0 {
			return false
		}
	}
	return g.window.idle(now) && g.replay.empty() && g.answered.len() == 0
}

func budgetToProto(b Budget) *clusterpb.Budget {
	return &clusterpb.Budget{Limit: int32(b.Limit), Remaining: int32(b.Remaining), ResetAtUnixNano: b.ResetAt.UnixNano()}
}

func budgetFromProto(b *clusterpb.Budget) Budget {
	if b == nil {
		return Budget{}
	}
	return Budget{Limit: int(b.Limit), Remaining: int(b.Remaining), ResetAt: time.Unix(0, b.ResetAtUnixNano).UTC()}
}

// splitIdentity splits PROJECT_ID/CHANNEL (a project id has no "/").
func splitIdentity(identity string) (project, channel string) {
	project, channel, _ = strings.Cut(identity, "/")
	return project, channel
}
