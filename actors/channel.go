package actors

import (
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// channelSub is one subscriber of a channel.
type channelSub struct {
	sink     Sink
	presence bool
	clientID string
}

// channelActor owns a channel: seq, subscribers, presence members, the replay
// ring and the per-channel emit window. Every field is owned by Receive.
type channelActor struct {
	name    string
	seq     uint64
	subs    []channelSub
	index   map[uint64]int // connection id → position in subs
	members map[string]int // presence clientId → number of its presence subscriptions
	roster  []string       // the members' clientIds, sorted, for sync
	window  fixedWindow
	replay  replayRing

	counters  *Counters
	usage     *projectUsage // the project's emit count, added to when an emit is accepted
	mailbox   *mailboxDepth
	processed uint64 // messages had from the project actor (see mayStop)
	dormancy  time.Duration
	quiet     quietPeriod
	// maxMembers caps distinct presence clientIds (0: no cap), which also
	// bounds the size of a sync frame.
	maxMembers int
	now        func() time.Time
}

func newChannelActor(name string, cfg *Config, usage *projectUsage) *channelActor {
	now := cfg.Now()
	// seq starts from the clock (µs since the epoch, well inside 2^53), so it
	// keeps increasing when a dormant channel is started again and a client's
	// `since` from before is seen as older than anything buffered.
	seq := uint64(now.UnixMicro())
	return &channelActor{
		name:    name,
		seq:     seq,
		index:   map[uint64]int{},
		members: map[string]int{},
		window:  fixedWindow{size: time.Minute},
		replay: replayRing{ttl: cfg.ReplayTTL, maxBytes: cfg.ReplayMaxBytes, lowWater: seq,
			project: &usage.replayBytes, projectMax: int64(cfg.MaxReplayBytesPerProject)},
		maxMembers: cfg.MaxPresenceMembers,
		dormancy:   cfg.ActorDormancy,
		now:        cfg.Now,
		counters:   cfg.counters,
		usage:      usage,
	}
}

func (a *channelActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		scheduleQuietTick(ctx, a.dormancy)
	case *Publish:
		a.processed++
		if !m.take() { // its edge has answered 503: never deliver it now
			if !m.projectDenied {
				ctx.Send(ctx.Parent(), &refund{at: m.At})
			}
			return
		}
		res := a.publish(ctx, m)
		if m.Reply != nil {
			m.Reply <- res
		} else if res.Err != nil {
			m.origin.Send(errorFrame(&proto.Error{Code: res.Err.Code, Channel: a.name}))
		}
	case *refuseEmit:
		a.processed++
		m.sink.Send(errorFrame(&proto.Error{Code: m.code, Channel: a.name}))
	case *subscribe:
		a.processed++
		a.subscribe(ctx, m)
	case *unsubscribe:
		a.processed++
		a.unsubscribe(m)
	case *inspectChannel:
		a.inspect(m)
	case *quietTick:
		scheduleQuietTick(ctx, a.dormancy)
		if a.quiet.dormantAgain(a.dormant()) {
			ctx.Send(ctx.Parent(), &mayStop{channel: a.name, processed: a.processed, pid: ctx.Self()})
		}
	}
}

// publish applies the budgets, stamps seq, encodes the message once and hands
// the same bytes to every subscriber (proto/PROTOCOL.md › POST /emit), or, for a
// client-emit, to every subscriber but the emitter, which gets the emit ack.
func (a *channelActor) publish(ctx actor.Context, m *Publish) PublishResult {
	if m.projectDenied {
		a.counters.RateLimitedProject.Add(1)
		return PublishResult{
			Channel: a.window.peek(m.At, m.channelLimit), Project: m.projectBudget,
			Err: &proto.Error{Code: proto.CodeProjectRateLimited},
		}
	}
	budget, ok := a.window.take(m.At, m.channelLimit)
	if !ok {
		a.counters.RateLimitedChannel.Add(1)
		ctx.Send(ctx.Parent(), &refund{at: m.At})
		project := m.projectBudget
		project.Remaining = min(project.Remaining+1, project.Limit)
		return PublishResult{Channel: budget, Project: project, Err: &proto.Error{Code: proto.CodeChannelRateLimited}}
	}
	a.usage.emits.Add(1)
	a.seq++
	buf := transport.NewFrame(len(m.Payload) + len(a.name) + len(m.clientID) + len(m.msgType) + 64)
	if m.origin == nil {
		buf = proto.AppendMessage(buf, a.name, m.Payload, a.seq)
	} else {
		buf = proto.AppendClientMessage(buf, a.name, m.msgType, m.Payload, a.seq, m.clientID)
	}
	frame := transport.Seal(buf)
	a.replay.add(a.seq, m.At, transport.FramePayload(buf))

	var skip uint64
	if m.origin != nil {
		skip = m.origin.ID()
	}
	res := PublishResult{Seq: a.seq, Subscribers: len(a.subs), Channel: budget, Project: m.projectBudget}
	for i := 0; i < len(a.subs); {
		s := a.subs[i].sink
		if s.ID() == skip {
			i++
			continue
		}
		if s.Send(frame) {
			res.Delivered++
			i++
			continue
		}
		a.removeAt(i) // gone: pruned inline during the fan-out (a gone subscriber is dropped, not retried)
	}
	if m.origin != nil {
		m.origin.Send(transport.TextFrame(proto.AppendEmitAck(nil, a.name, a.seq)))
		a.counters.EmittedClient.Add(1)
	} else {
		a.counters.EmittedHTTP.Add(1)
	}
	a.counters.Deliveries.Add(int64(res.Delivered))
	if dropped := res.Subscribers - res.Delivered - boolInt(m.origin != nil); dropped > 0 {
		a.counters.Drops.Add(int64(dropped))
	}
	return res
}

// subscribe replays what the client missed (before the ack), adds or updates
// the subscription, acks, and runs presence: sync to the newcomer, join to
// the other presence subscribers.
func (a *channelActor) subscribe(ctx actor.Context, m *subscribe) {
	if m.hasSince {
		a.sendReplay(m.sink, m.since)
	}
	id := m.sink.ID()
	sub := channelSub{sink: m.sink, presence: m.presence, clientID: m.clientID}
	i, existed := a.index[id]
	if a.membersFull(sub, existed, i) {
		m.refuse(ctx, proto.CodeTooManyPresenceMembers)
		return
	}
	wasMember := existed && a.subs[i].presence
	same := wasMember && sub.presence && a.subs[i].clientID == sub.clientID // a repeated subscribe
	if wasMember && !same {
		a.removeMember(a.subs[i].clientID, id) // presence switched off, or a new clientId
	}
	if existed {
		a.subs[i] = sub
	} else {
		a.index[id] = len(a.subs)
		a.subs = append(a.subs, sub)
	}
	m.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionSubscribe, a.name)))
	if !sub.presence {
		return
	}
	m.sink.Send(transport.TextFrame(proto.AppendPresenceSync(nil, a.name, a.otherMembers(sub.clientID, same))))
	if !same {
		a.addMember(sub.clientID, id)
	}
}

// membersFull: sub would be a new presence member and the channel has
// maxMembers already (counting a member this connection is about to leave).
func (a *channelActor) membersFull(sub channelSub, existed bool, i int) bool {
	if a.maxMembers <= 0 || !sub.presence || a.members[sub.clientID] > 0 {
		return false
	}
	n := len(a.members)
	if existed && a.subs[i].presence && a.members[a.subs[i].clientID] == 1 {
		n-- // switching clientId: its old one leaves
	}
	return n >= a.maxMembers
}

// otherMembers lists the clientIds of the other presence subscribers, sorted;
// self says whether the subscriber itself is already counted under clientID.
func (a *channelActor) otherMembers(clientID string, self bool) []string {
	if !self || a.members[clientID] > 1 {
		return a.roster
	}
	i, _ := slices.BinarySearch(a.roster, clientID)
	return append(a.roster[:i:i], a.roster[i+1:]...)
}

// addMember counts a presence subscription; the clientId's first one is a join.
func (a *channelActor) addMember(clientID string, connID uint64) {
	a.members[clientID]++
	if a.members[clientID] == 1 {
		i, _ := slices.BinarySearch(a.roster, clientID)
		a.roster = slices.Insert(a.roster, i, clientID)
		a.presenceEvent(proto.PresenceJoin, clientID, connID)
	}
}

// removeMember uncounts one; the clientId's last one is a leave.
func (a *channelActor) removeMember(clientID string, connID uint64) {
	a.members[clientID]--
	if a.members[clientID] <= 0 {
		delete(a.members, clientID)
		if i, ok := slices.BinarySearch(a.roster, clientID); ok {
			a.roster = slices.Delete(a.roster, i, i+1)
		}
		a.presenceEvent(proto.PresenceLeave, clientID, connID)
	}
}

// presenceEvent sends one encoded join or leave to every presence subscriber
// but the one it is about. A failed send is left to that connection's own
// close, so no subscriber is removed while presence is being updated.
func (a *channelActor) presenceEvent(event, clientID string, except uint64) {
	var frame []byte
	for _, s := range a.subs {
		if !s.presence || s.sink.ID() == except {
			continue
		}
		if frame == nil {
			frame = transport.TextFrame(proto.AppendPresenceEvent(nil, a.name, event, clientID))
		}
		s.sink.Send(frame)
	}
}

// sendReplay sends the buffered messages newer than since, flagged replay,
// after a replay_gap when some of what followed since is no longer buffered.
func (a *channelActor) sendReplay(sink Sink, since float64) {
	a.counters.ReplayRequests.Add(1)
	a.replay.expire(a.now())
	if a.replay.gapAfter(since) {
		a.counters.ReplayGaps.Add(1)
		sink.Send(transport.TextFrame(proto.AppendReplayGap(nil, a.name, since)))
	}
	a.replay.each(since, func(msg []byte) {
		sink.Send(transport.TextFrame(proto.AppendReplayed(nil, msg)))
	})
}

func (a *channelActor) unsubscribe(m *unsubscribe) {
	if i, ok := a.index[m.connID]; ok {
		a.removeAt(i)
	}
	if !m.silent {
		m.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionUnsubscribe, a.name)))
	}
}

// removeAt drops subs[i] by moving the last subscriber into its place, and
// sends its presence leave.
func (a *channelActor) removeAt(i int) {
	gone := a.subs[i]
	id := gone.sink.ID()
	delete(a.index, id)
	last := len(a.subs) - 1
	if i != last {
		a.subs[i] = a.subs[last]
		a.index[a.subs[i].sink.ID()] = i
	}
	a.subs[last] = channelSub{}
	a.subs = a.subs[:last]
	if gone.presence {
		a.removeMember(gone.clientID, id)
	}
}

// dormant: nobody listens and nothing is held that a fresh actor would forget
// (the emit window has run out, the replay ring is empty).
func (a *channelActor) dormant() bool {
	now := a.now()
	a.replay.expire(now)
	return len(a.subs) == 0 && a.window.idle(now) && a.replay.empty()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
