package actors

import (
	"context"
	"encoding/json"
	"log/slog"
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

// channelGrain is a channel's single writer in a cluster: it hosts the
// channel's core (seq, the replay ring, the emit window, the presence
// roster and the subscribers of every node, each node's relay one node of
// the core) and sends each stamped message once to every relay with
// subscribers, which writes it to its sockets. Every field is owned by
// Receive.
type channelGrain struct {
	c        *Cluster
	cfg      *Config
	identity string // PROJECT_ID/CHANNEL
	core     *channelCore
	relays   map[string]*actor.PID // the core's nodes: relays by Ref key
	ctx      actor.Context         // the grain's, for the core's output
	limit    int                   // the project's channel emits per minute, from this node's project actor (0: not loaded yet)

	answered answerMemory[*clusterpb.ChannelPublished] // publish id → its answer, for dedupeWindow
	quiet    quietPeriod

	born      time.Time
	rosterDue bool // a ChannelRoster waits for rosterSettle after the start

	// receive is the grain's behaviour: awaiting, owning or frozen.
	receive func(ctx actor.Context, msg any)

	// What awaiting holds, in the order it came, and since when.
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

	hist grainHistory // cluster_channel_history.go
}

// failoverSettle: how long a grain started without state holds resent
// publishes (see adopted). Every node hears of the member list change at
// about the same time, and its relays register as soon as they do.
const failoverSettle = 500 * time.Millisecond

// settleOver: failoverSettle has passed; the resent publishes go on.
type settleOver struct{}

// heldMax bounds the publishes an awaiting or settling grain holds; more are refused
// not_owner (their relays send them again 300 ms later).
const heldMax = 1024

// recheckWait: something an awaiting grain waits for may have changed (an
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

func refKey(r *clusterpb.Ref) string { return r.GetAddress() + "/" + r.GetId() }

func newChannelGrain(c *Cluster) *channelGrain {
	g := &channelGrain{c: c, cfg: c.sys.cfg, relays: map[string]*actor.PID{}, answered: newAnswerMemory[*clusterpb.ChannelPublished]()}
	g.core = newChannelCore("", "", g.cfg, nil, channelHooks{}, g) // named at ClusterInit
	g.receive = g.owning                                           // until ClusterInit says whether to await a state
	return g
}

func (g *channelGrain) Receive(ctx actor.Context) {
	g.ctx = ctx
	msg := ctx.Message()
	if !g.c.refsItsSender(ctx, msg) { // checked as it comes: a held message is handled later, without its sender
		return
	}
	g.receive(ctx, msg)
}

// A grain behaves in one of three ways, each a receive function:
//
//   - awaiting: the channel's previous owner may be handing its state over
//     (this node just joined, see moveOut). Publishes, membership messages
//     and queries wait in held, in order, until the state is here, nothing
//     is to come, or stateWait has passed; then it owns (or, frozen
//     meanwhile, it is frozen).
//   - owning: it stamps publishes and keeps every relay's subscribers.
//   - frozen: handed off (or refused at its start), it refuses to stamp
//     (not_owner) and ignores subscribers until it stops; relays find the
//     next owner. A repeated publish is still answered from memory.

// awaiting holds what must wait for the previous owner's state.
func (g *channelGrain) awaiting(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *clusterpb.GrainState:
		g.adopt(ctx, m)
		g.endWait(ctx, "state", g.owning)
	case *recheckWait:
		if !g.c.stateComing(g.identity) {
			g.endWait(ctx, "nothing to come", g.owning)
		}
	case *waitOver:
		g.endWait(ctx, waitTimedOut, g.owning)
	case *freeze:
		g.freeze(ctx, m.reply)                  // once the held messages land (cluster_channel_history.go)
		g.endWait(ctx, "frozen", g.frozenGrain) // what it held is refused or ignored now
	case *quietTick: // never dormant while it waits
		scheduleQuietTick(ctx, g.cfg.ActorDormancy)
		g.quiet.dormantAgain(false)
	default:
		if !g.hold(ctx, msg) {
			g.owning(ctx, msg)
		}
	}
}

// frozenGrain refuses to stamp and ignores subscribers.
func (g *channelGrain) frozenGrain(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *clusterpb.ChannelPublish:
		if !g.answerRepeat(ctx, m, g.cfg.Now()) {
			g.refuseNotOwner(ctx, m)
		}
	case *clusterpb.ChannelJoin, *clusterpb.ChannelLeave, *clusterpb.ChannelRegister, *actor.Terminated:
		// the next owner has the subscribers; relays send these to it again
	case *strayCheck: // stopping anyway
	default:
		g.owning(ctx, msg)
	}
}

// owning is the grain's behaviour as the channel's writer, and what the
// other two behaviours do with the messages they leave alone. What it held
// itself (settleOver) goes through receive again: the grain may be frozen
// by then.
func (g *channelGrain) owning(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *actor.Started:
		g.c.grainsLive.Add(1)
		g.c.activations.Add(1)
		scheduleQuietTick(ctx, g.cfg.ActorDormancy)
	case *cluster.ClusterInit:
		g.identity = m.Identity.Identity
		g.born = g.cfg.Now()
		g.core.project, g.core.name = splitIdentity(g.identity)
		if !proto.ValidChannel(g.core.name) { // a peer activated a name no edge accepts: it would break frames
			g.c.refuseContent("channel name", g.identity)
			g.receive = g.frozenGrain
			ctx.Poison(ctx.Self())
			return
		}
		if g.c.leaving.Load() {
			// This node has handed its grains over: one started now would
			// answer with a fresh ring (a replay_gap to the relays that
			// register) while the channel's ring is on its next owner. Its
			// relays get no answer and look it up again after the leave.
			g.receive = g.frozenGrain
			ctx.Poison(ctx.Self())
			return
		}
		g.core.replay.project = g.c.replayBytes(g.core.project)
		// This node's project actor (started if need be) knows the project's
		// webhook settings and tells the grain now and at every change.
		g.c.sys.tell(g.core.project, &watchHooks{grain: ctx.Self()})
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
		if g.core.project != "" {
			g.c.sys.tellRunning(g.core.project, &unwatchHooks{grain: ctx.Self()})
		}
		g.core.replay.release()
		g.c.grainsLive.Add(-1)
		g.c.grains.CompareAndDelete(g.identity, ctx.Self())
		g.c.moves.waiting.CompareAndDelete(g.identity, ctx.Self())
	case *freeze:
		g.receive = g.frozenGrain
		g.freeze(ctx, m.reply) // once the held messages land (cluster_channel_history.go)
	case *freezeOver:
		g.freezeEnded(ctx)
	case *historyStored:
		g.stored(ctx, m)
	case *landAgain:
		g.hist.landDue = false
		g.landHeld(ctx)
	case *actor.Stopping:
		g.dropHeld(ctx)
		for _, pid := range g.relays { // a relay that ends later has no Terminated to send here
			ctx.Unwatch(pid)
		}
	case *clusterpb.GrainState: // late: the older messages go before its own (adopt)
		g.adopt(ctx, m)
	case *strayCheck:
		switch {
		case g.owner(): // the owner after all
		case g.core.replay.empty() && g.answered.len() == 0:
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
		g.lookUpResent(held)
		for _, m := range held {
			g.receive(ctx, m) // frozen meanwhile: its state went to the next owner, which stamps them
		}
		g.hist.found = nil
	case *hooksChanged:
		g.core.hooks.set(g.cfg, m.target)
		g.limit = m.channelLimit
		g.hist.on, g.hist.told = m.history, true
	case *clusterpb.ChannelPublish:
		g.publish(ctx, m)
	case *clusterpb.ChannelQuery:
		g.answerQuery(ctx, m)
	case *clusterpb.ChannelJoin, *clusterpb.ChannelLeave, *clusterpb.ChannelRegister, *actor.Terminated:
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
		for _, conn := range m.Conns {
			g.core.leave(refKey(m.Relay), conn)
		}
	case *clusterpb.ChannelRegister:
		g.register(ctx, m)
	case *actor.Terminated: // a relay stopped, or its node is gone
		key := m.Who.Address + "/" + m.Who.Id
		if _, ok := g.relays[key]; ok {
			g.core.dropNode(key)
			delete(g.relays, key)
		}
	}
}

// await turns to awaiting if the channel's previous owner may be handing
// its state over (see moveOut), for stateWait at most.
func (g *channelGrain) await(ctx actor.Context) {
	g.c.moves.waiting.Store(g.identity, ctx.Self()) // before the check: an end marker arriving meanwhile rechecks
	if !g.c.stateComing(g.identity) {
		g.c.moves.waiting.CompareAndDelete(g.identity, ctx.Self())
		return
	}
	g.receive, g.waitStart = g.awaiting, g.cfg.Now()
	sendLater(ctx, stateWait, &waitOver{})
}

func (g *channelGrain) strayLater(ctx actor.Context) {
	sendLater(ctx, strayAfter, &strayCheck{})
}

// hold keeps a message while the grain awaits; false: owning handles it now.
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

// waitTimedOut: a grain's wait for its previous owner's state ended at stateWait.
const waitTimedOut = "timed out"

// endWait ends awaiting: the grain turns to next, which handles what it
// held, in the order it came.
func (g *channelGrain) endWait(ctx actor.Context, why string, next func(actor.Context, any)) {
	g.receive = next
	g.c.moves.waiting.CompareAndDelete(g.identity, ctx.Self())
	level := slog.LevelDebug
	if why == waitTimedOut { // its subscribers that resume get replay_gap
		level = slog.LevelWarn
	}
	g.c.log.Log(context.Background(), level, "channel grain waited for its previous owner's state", "channel", g.identity, "end", why,
		"waited", g.cfg.Now().Sub(g.waitStart), "held", len(g.held))
	held := g.held
	g.held, g.heldPubs = nil, 0
	for _, m := range held {
		next(ctx, m)
	}
}

// owner: this node is the channel's owner in the latest member list. A
// grain whose node no longer is (a member joined or left) refuses to stamp;
// the placement actor stops it, and the relays find the new owner.
func (g *channelGrain) owner() bool { return g.c.owns(ChannelKind, g.identity) }

// answerRepeat answers a publish the grain has seen (a relay's retry):
// from memory, or, held for its commit, when it lands. False: a new one.
func (g *channelGrain) answerRepeat(ctx actor.Context, m *clusterpb.ChannelPublish, now time.Time) bool {
	g.answered.forget(now)
	if g.hist.pending[m.Id] {
		g.c.duplicates.Add(1)
		return true // held for its commit: answered when it lands
	}
	prev, ok := g.answered.get(m.Id)
	if !ok {
		return false
	}
	g.c.duplicates.Add(1)
	if prev.Channel == nil && prev.Error == "" {
		// Stamped by a predecessor that died, known from a relay's
		// register (catchUp).
		prev = g.predecessorAnswer(m, prev.Seq, now)
	}
	ctx.Send(actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId()), prev)
	return true
}

func (g *channelGrain) publish(ctx actor.Context, m *clusterpb.ChannelPublish) {
	now := g.cfg.Now()
	if g.answerRepeat(ctx, m, now) {
		return
	}
	replyTo := actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId())
	answer := func(a *clusterpb.ChannelPublished) {
		a.Id = m.Id
		ctx.Send(replyTo, a)
	}
	if !g.owner() || g.c.fenced() {
		g.refuseNotOwner(ctx, m)
		return
	}
	if g.holdResent(ctx, m, now) {
		return
	}
	if !json.Valid(m.Payload) { // every subscriber's frame holds it: a peer's bytes must not break one
		g.c.refuseContent("payload", string(m.Payload))
		answer(&clusterpb.ChannelPublished{Error: string(proto.CodeInvalidJSON)})
		return
	}
	if m.NotAfterUnixNano != 0 && now.UnixNano() > m.NotAfterUnixNano {
		answer(&clusterpb.ChannelPublished{Error: errExpired})
		return
	}
	if g.keepsHistory(m) && g.storedPublish(ctx, m, replyTo, now) {
		return
	}
	e := emitRequest{payload: m.Payload, at: now, limit: g.channelLimit(m), projectDenied: m.ProjectDenied,
		client: m.Client, conn: m.OriginConn, clientID: m.ClientId, msgType: m.MsgType, accepted: m.AtUnixNano, publishID: m.Id}
	if e.client { // the emitter's node: only a client emit is checked against, and skips, its emitter
		e.node = refKey(m.ReplyTo)
	}
	if g.keepsHistory(m) || len(g.hist.held) > 0 {
		g.publishHeld(ctx, m, replyTo, &e)
		return
	}
	o := g.core.publish(&e)
	res := publishedOf(m.Id, o)
	g.answered.remember(m.Id, now, res)
	answer(res)
}

// publishedOf is the answer to publish id that the core decided as o.
func publishedOf(id string, o emitOutcome) *clusterpb.ChannelPublished {
	res := &clusterpb.ChannelPublished{Id: id, Seq: o.seq, Subscribers: int32(o.subscribers), Delivered: int32(o.delivered), Error: string(o.err)}
	if o.err != proto.CodeEmitIdentityMismatch {
		res.Channel = budgetToProto(o.channel)
	}
	return res
}

// predecessorAnswer answers publish m that a predecessor stamped as seq
// (and died before answering): its counts and budget are this grain's now.
func (g *channelGrain) predecessorAnswer(m *clusterpb.ChannelPublish, seq uint64, now time.Time) *clusterpb.ChannelPublished {
	n := int32(g.core.subCount)
	return &clusterpb.ChannelPublished{Id: m.Id, Seq: seq, Subscribers: n, Delivered: n,
		Channel: budgetToProto(g.core.window.peek(now, g.channelLimit(m)))}
}

// channelLimit is the project's limit as this node loaded it; until it has
// (a grain's first moments, or a store that does not answer a node that
// never had the project), the one the emitting node read.
func (g *channelGrain) channelLimit(m *clusterpb.ChannelPublish) int {
	if g.limit > 0 {
		return g.limit
	}
	return int(m.ChannelLimit)
}

// deliver is the core's output: one message, the same for every relay with
// subscribers but a client emit's, which skips the emitter.
func (g *channelGrain) deliver(m *stamped) int {
	d := &clusterpb.ChannelDeliver{Seq: m.seq, Message: transport.FramePayload(m.buf), AcceptedUnixNano: m.accepted, PublishId: m.publishID}
	for node, subs := range g.core.nodes {
		if len(subs) == 0 {
			continue
		}
		if m.client && node == m.skipNode {
			g.c.send(g.ctx, g.relays[node], &clusterpb.ChannelDeliver{Seq: d.Seq, Message: d.Message, SkipConn: m.skipConn,
				AcceptedUnixNano: d.AcceptedUnixNano, PublishId: d.PublishId})
			continue
		}
		g.c.send(g.ctx, g.relays[node], d)
	}
	return 0 // each node writes its sockets after the answer
}

// presence goes to every relay, so that each keeps the roster its presence
// subscribers have been told (see ChannelRoster).
func (g *channelGrain) presence(node, event, clientID string, except uint64) {
	g.c.send(g.ctx, g.relays[node], &clusterpb.ChannelPresence{Event: event, ClientId: clientID, ExceptConn: except})
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
		sendLater(ctx, max(failoverSettle-now.Sub(g.born), 0), &settleOver{})
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

const (
	errNotOwner = "not_owner"
	errExpired  = "expired"
)

// relay returns the key of a relay as the core's node, watching it when
// new: its Terminated (it stopped, or its node went away) removes its
// subscribers.
func (g *channelGrain) relay(ctx actor.Context, ref *clusterpb.Ref) string {
	key := refKey(ref)
	if g.relays[key] == nil {
		pid := actor.NewPID(ref.Address, ref.Id)
		g.relays[key] = pid
		g.core.node(key)
		ctx.Watch(pid)
	}
	return key
}

// join subscribes one socket: the core's answer goes back to its relay.
func (g *channelGrain) join(ctx actor.Context, m *clusterpb.ChannelJoin) {
	node := g.relay(ctx, m.Relay)
	now := g.cfg.Now()
	var stored *storedReplay
	if m.HasSince {
		stored = g.storedReplay(m.Since, now)
	} else if g.mayKeepHistory() {
		g.loadSeq() // the join's seq is then the stored last one (joinSeq)
	}
	o := g.core.join(&joinRequest{node: node, conn: m.Sub.Conn, sub: coreSub{presence: m.Sub.Presence, clientID: m.Sub.ClientId},
		hasSince: m.HasSince, since: m.Since, stored: stored}, now)
	g.c.send(ctx, g.relays[node], &clusterpb.ChannelJoined{Conn: m.Sub.Conn, Refused: string(o.refused), Seq: g.joinSeq(),
		Gap: o.gap, GapSince: o.gapSince, Replay: o.replay, Members: o.members})
}

// register replaces what the grain held for a relay with its whole state,
// without join or leave events (channelCore.replaceNode); if the member
// list changed, every relay gets the new roster and tells its presence
// subscribers the difference.
func (g *channelGrain) register(ctx actor.Context, m *clusterpb.ChannelRegister) {
	g.core.raise(m.LastSeq)
	node := g.relay(ctx, m.Relay)
	g.catchUp(ctx, node, m)
	if !g.core.replaceNode(node, subsOf(m.Subs)) {
		if !g.rosterDue && !g.settling() { // the relay may hold members that left while it was away
			g.c.send(ctx, g.relays[node], &clusterpb.ChannelRoster{Members: g.core.members.list()})
		}
		return
	}
	if g.rosterDue {
		return // sent to every relay when the settle ends
	}
	if g.settling() {
		g.rosterLater(ctx)
		return
	}
	g.sendRoster(ctx)
}

func subsOf(subs []*clusterpb.Subscriber) map[uint64]coreSub {
	out := make(map[uint64]coreSub, len(subs))
	for _, s := range subs {
		out[s.Conn] = coreSub{presence: s.Presence, clientID: s.ClientId}
	}
	return out
}

// catchUp sends a registering relay what the grain stamped after the last
// seq the relay saw, after a gap when the ring no longer holds all of it, and
// remembers what the relay delivered lately: a retry of one of those is
// answered, not stamped again (a grain that started after a crash).
func (g *channelGrain) catchUp(ctx actor.Context, node string, m *clusterpb.ChannelRegister) {
	now := g.cfg.Now()
	for _, p := range m.Recent { // without counts or budget: publish fills them in
		g.answered.adopt(p.Id, now, &clusterpb.ChannelPublished{Id: p.Id, Seq: p.Seq})
	}
	if m.LastSeq == 0 || len(m.Subs) == 0 {
		return // nobody to give anything to
	}
	stored := g.storedReplay(float64(m.LastSeq), now) // first: it raises seq above the stored last one
	if m.LastSeq >= g.core.seq {
		return // nothing it missed
	}
	up := &clusterpb.ChannelCatchUp{}
	after := m.LastSeq
	if stored != nil { // the ring does not reach back: the store before it
		up.Gap = stored.gap
		for i, msg := range stored.msgs {
			up.Messages = append(up.Messages, &clusterpb.ChannelDeliver{Seq: stored.seqs[i], Message: msg})
		}
		after = g.core.replay.lowWater
	}
	gap, msgs := g.core.after(after, now)
	up.Gap = up.Gap || gap
	if up.Gap {
		up.GapSince = m.LastSeq
	}
	for _, b := range msgs {
		up.Messages = append(up.Messages, &clusterpb.ChannelDeliver{Seq: b.seq, Message: b.msg})
	}
	g.c.send(ctx, g.relays[node], up)
}

// settling: the grain started less than rosterSettle ago.
func (g *channelGrain) settling() bool { return g.cfg.Now().Sub(g.born) < rosterSettle }

// rosterLater sends the roster to every relay once the settle is over.
func (g *channelGrain) rosterLater(ctx actor.Context) {
	if g.rosterDue {
		return
	}
	g.rosterDue = true
	sendLater(ctx, max(rosterSettle-g.cfg.Now().Sub(g.born), 0), &rosterTick{})
}

func (g *channelGrain) sendRoster(ctx actor.Context) {
	roster := &clusterpb.ChannelRoster{Members: g.core.members.list()}
	for _, pid := range g.relays {
		g.c.send(ctx, pid, roster)
	}
}

// state is what a grain hands to the channel's next owner.
func (g *channelGrain) state() *clusterpb.GrainState {
	c := g.core
	c.replay.expire(g.cfg.Now())
	// Nothing landed since the low water: that, as nothing was delivered
	// above it (unless fresh: then the low water is the clock's start).
	landed := c.landed
	if !c.fresh {
		landed = max(landed, c.replay.lowWater)
	}
	st := &clusterpb.GrainState{Identity: g.identity, Seq: c.handedSeq(), LowWater: c.replay.lowWater, Landed: landed,
		WindowStartUnixNano: c.window.start.UnixNano(), WindowCount: int32(c.window.count)}
	for _, e := range c.replay.live() {
		st.Replay = append(st.Replay, &clusterpb.ReplayEntry{Seq: e.seq, AtUnixNano: e.at.UnixNano(), Message: e.msg})
	}
	for key, pid := range g.relays {
		rs := &clusterpb.RelaySubs{Relay: &clusterpb.Ref{Address: pid.Address, Id: pid.Id}}
		for conn, sub := range c.nodes[key] {
			rs.Subs = append(rs.Subs, &clusterpb.Subscriber{Conn: conn, Presence: sub.presence, ClientId: sub.clientID})
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
	g.core.merge(older, st.LowWater, st.Seq, st.Landed, time.Unix(0, st.WindowStartUnixNano), int(st.WindowCount))
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
		if _, known := g.relays[refKey(rs.Relay)]; !known {
			g.core.addNode(g.relay(ctx, rs.Relay), subsOf(rs.Subs)) // the old owner said occupied (or its relays' joins will)
		}
	}
}

// dormant: no relay has subscribers, and the window, the ring and the
// dedupe memory are empty.
func (g *channelGrain) dormant() bool {
	if len(g.resent) > 0 || len(g.hist.held) > 0 {
		return false
	}
	now := g.cfg.Now()
	g.answered.forget(now)
	return g.core.idle(now) && g.answered.len() == 0
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
