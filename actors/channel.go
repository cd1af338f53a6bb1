package actors

import (
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
	project string
	seq     uint64
	subs    subscribers
	members roster
	window  fixedWindow
	replay  replayRing
	hooks   channelHooks // the project's channel and presence webhooks

	cfg       *Config
	counters  *Counters
	usage     *projectUsage // the project's emit count, added to when an emit is accepted
	mailbox   *mailboxState
	processed uint64 // messages had from the project actor (see mayStop)
	dormancy  time.Duration
	quiet     quietPeriod
	// maxMembers caps distinct presence clientIds (0: no cap), which also
	// bounds the size of a sync frame.
	maxMembers int
	now        func() time.Time
}

func newChannelActor(project, name string, cfg *Config, usage *projectUsage, hooks channelHooks) *channelActor {
	now := cfg.Now()
	// seq starts from the clock (µs since the epoch, well inside 2^53), so it
	// keeps increasing when a dormant channel is started again and a client's
	// `since` from before is seen as older than anything buffered.
	seq := uint64(now.UnixMicro())
	return &channelActor{
		name:    name,
		project: project,
		hooks:   hooks,
		cfg:     cfg,
		seq:     seq,
		subs:    newSubscribers(),
		members: newRoster(),
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
			refundProject(ctx, m)
			return
		}
		a.publishTaken(ctx, m)
	case *refuseEmit:
		a.processed++
		m.sink.Send(errorFrame(&proto.Error{Code: m.code, Channel: a.name}))
	case *subscribe:
		a.processed++
		a.subscribe(ctx, m)
	case *unsubscribe:
		a.processed++
		a.unsubscribe(m)
	case *hooksChanged:
		a.processed++
		a.hooks.set(a.cfg, m.target)
	case *inspectChannel:
		a.inspect(m)
	case *channelAsk:
		a.processed++
		a.answerQuery(m)
	case *quietTick:
		scheduleQuietTick(ctx, a.dormancy)
		if a.quiet.dormantAgain(a.dormant()) {
			ctx.Send(ctx.Parent(), &mayStop{channel: a.name, processed: a.processed, pid: ctx.Self()})
		}
	}
}

// publishTaken publishes an emit its edge can no longer abandon and answers
// it. An HTTP edge stops counting its timeout once the emit is taken, so a
// panic in publish (a bug, resumed by the supervisor) must still answer it:
// service_unavailable, sent as the panic goes on to the supervisor. Such an
// emit may have been stamped, buffered for replay and handed to some
// subscribers before the panic: the 503 says it failed, not that nobody got it.
func (a *channelActor) publishTaken(ctx actor.Context, m *Publish) {
	if m.Reply == nil {
		if res := a.publish(ctx, m); res.Err != nil {
			m.origin.Send(errorFrame(&proto.Error{Code: res.Err.Code, Channel: a.name}))
		}
		return
	}
	answered := false
	defer func() {
		if !answered {
			m.Reply <- PublishResult{Err: &proto.Error{Code: proto.CodeUnavailable}}
		}
	}()
	m.Reply <- a.publish(ctx, m)
	answered = true
}

// publish applies the budgets, stamps seq, encodes the message once and hands
// the same bytes to every subscriber (proto/PROTOCOL.md › POST /emit), or, for a
// client-emit, to every subscriber but the emitter, which gets the emit ack.
func (a *channelActor) publish(ctx actor.Context, m *Publish) PublishResult {
	if m.origin != nil && !a.emitterSubscribed(m) {
		refundProject(ctx, m)
		return PublishResult{Err: &proto.Error{Code: proto.CodeEmitIdentityMismatch}}
	}
	if m.projectDenied {
		a.counters.RateLimitedProject.Add(1)
		a.usage.health.add(hLimitedProject, 1, m.At.UnixNano())
		return PublishResult{
			Channel: a.window.peek(m.At, m.channelLimit), Project: m.projectBudget,
			Err: &proto.Error{Code: proto.CodeProjectRateLimited},
		}
	}
	budget, ok := a.window.take(m.At, m.channelLimit)
	if !ok {
		a.counters.RateLimitedChannel.Add(1)
		a.usage.health.add(hLimitedChannel, 1, m.At.UnixNano())
		refundProject(ctx, m)
		project := m.projectBudget
		project.Remaining = min(project.Remaining+1, project.Limit)
		return PublishResult{Channel: budget, Project: project, Err: &proto.Error{Code: proto.CodeChannelRateLimited}}
	}
	a.usage.emits.Add(1)
	a.seq++
	buf := encodeMessage(a.name, m.Payload, a.seq, m.origin != nil, m.msgType, m.clientID)
	frame := transport.Seal(buf)
	a.replay.add(a.seq, m.At, transport.FramePayload(buf))

	var skip uint64
	if m.origin != nil {
		skip = m.origin.ID()
	}
	res := PublishResult{Seq: a.seq, Subscribers: len(a.subs.list), Channel: budget, Project: m.projectBudget}
	at := m.At.UnixNano()
	for i := 0; i < len(a.subs.list); {
		s := a.subs.list[i].sink
		if s.ID() == skip {
			i++
			continue
		}
		if s.SendAt(frame, at) {
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
	dropped := res.Subscribers - res.Delivered - boolInt(m.origin != nil)
	if dropped > 0 {
		a.counters.Drops.Add(int64(dropped))
	}
	a.usage.health.fanout(emitKind(m.origin != nil), res.Delivered, dropped, at)
	return res
}

// emitterSubscribed is client-emit rule 4 again, where subscriptions are
// decided: the connection checked its own record, which holds a presence
// subscribe from the moment it is sent, so one this channel refused a moment
// ago still passed there. (The emit's per-clientId unit stays spent.)
func (a *channelActor) emitterSubscribed(m *Publish) bool {
	s, ok := a.subs.get(m.origin.ID())
	return ok && s.presence && s.clientID == m.clientID
}

// subscribe replays what the client missed (before the ack), adds or updates
// the subscription, acks, and runs presence: sync to the newcomer, join to
// the other presence subscribers.
func (a *channelActor) subscribe(ctx actor.Context, m *subscribe) {
	id := m.sink.ID()
	sub := channelSub{sink: m.sink, presence: m.presence, clientID: m.clientID}
	old, existed := a.subs.get(id)
	wasMember := existed && old.presence
	same := wasMember && sub.presence && old.clientID == sub.clientID // a repeated subscribe
	if sub.presence && !same && a.members.full(sub.clientID, wasMember && a.members.only(old.clientID), a.maxMembers) {
		m.refuse(ctx, proto.CodeTooManyPresenceMembers, old, existed) // no replay: it is not subscribed by this
		return
	}
	if m.hasSince {
		a.sendReplay(m.sink, m.since)
	}
	if wasMember && !same && a.members.remove(old.clientID) { // presence switched off, or a new clientId
		a.presenceEvent(proto.PresenceLeave, old.clientID, id)
	}
	a.subs.put(sub)
	if !existed && len(a.subs.list) == 1 {
		a.hooks.occupancy(a.cfg, a.project, a.name, true)
	}
	m.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionSubscribe, a.name)))
	if !sub.presence {
		return
	}
	m.sink.Send(transport.TextFrame(proto.AppendPresenceSync(nil, a.name, a.members.others(sub.clientID, same))))
	if !same && a.members.add(sub.clientID) {
		a.presenceEvent(proto.PresenceJoin, sub.clientID, id)
	}
}

// presenceEvent sends one encoded join or leave to every presence subscriber
// but the one it is about, and its webhook. A failed send is left to that
// connection's own close, so no subscriber is removed while presence is
// being updated.
func (a *channelActor) presenceEvent(event, clientID string, except uint64) {
	a.hooks.member(a.cfg, a.project, a.name, clientID, event == proto.PresenceJoin)
	var frame []byte
	for _, s := range a.subs.list {
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
	if a.replay.request(since, a.now(), a.counters) {
		sink.Send(transport.TextFrame(proto.AppendReplayGap(nil, a.name, since)))
	}
	a.replay.each(since, func(_ uint64, msg []byte) {
		sink.Send(transport.TextFrame(proto.AppendReplayed(nil, msg)))
	})
}

func (a *channelActor) unsubscribe(m *unsubscribe) {
	if i, ok := a.subs.index[m.connID]; ok {
		a.removeAt(i)
	}
	if !m.silent {
		m.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionUnsubscribe, a.name)))
	}
}

// removeAt drops subs.list[i] and sends its presence leave, and the
// channel_vacated webhook when it was the last subscriber.
func (a *channelActor) removeAt(i int) {
	if gone := a.subs.removeAt(i); gone.presence && a.members.remove(gone.clientID) {
		a.presenceEvent(proto.PresenceLeave, gone.clientID, gone.sink.ID())
	}
	if len(a.subs.list) == 0 {
		a.hooks.occupancy(a.cfg, a.project, a.name, false)
	}
}

// dormant: nobody listens and nothing is held that a fresh actor would forget
// (the emit window has run out, the replay ring is empty).
func (a *channelActor) dormant() bool {
	now := a.now()
	a.replay.expire(now)
	return len(a.subs.list) == 0 && a.window.idle(now) && a.replay.empty()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
