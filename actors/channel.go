package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// channelActor is a channel on one node: it hosts the channel's core (every
// rule) with its own sockets as the only node, and writes to them through
// its fan-out. Every field is owned by Receive.
type channelActor struct {
	core *channelCore
	fan  channelFanout

	cfg       *Config
	usage     *projectUsage // the project's emit count, added to when an emit is accepted
	mailbox   *mailboxState
	processed uint64 // messages had from the project actor (see mayStop)
	dormancy  time.Duration
	quiet     quietPeriod
	hist      channelHistory // history.go
}

func newChannelActor(project, name string, cfg *Config, usage *projectUsage, hooks channelHooks) *channelActor {
	a := &channelActor{fan: newChannelFanout(name, cfg, usage), cfg: cfg, usage: usage, dormancy: cfg.ActorDormancy}
	a.core = newChannelCore(project, name, cfg, &usage.replayBytes, hooks, a)
	return a
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
		if m.history || len(a.hist.held) > 0 {
			a.publishHeld(ctx, m)
			return
		}
		a.publishTaken(ctx, m)
	case *historyStored:
		a.stored(ctx, m)
	case *refuseEmit:
		a.processed++
		if len(a.hist.held) > 0 { // behind the answers still held
			a.hist.held = append(a.hist.held, &heldEmit{sink: m.sink, code: m.code})
			return
		}
		m.sink.Send(errorFrame(&proto.Error{Code: m.code, Channel: a.core.name}))
	case *subscribe:
		a.processed++
		now := a.cfg.Now()
		var stored *storedReplay
		if m.hasSince && m.history != historyOff && a.cfg.History != nil {
			stored = a.storedReplay(m.since, now)
		}
		out := a.core.join(&joinRequest{node: localNode, conn: m.sink.ID(), sub: coreSub{presence: m.presence, clientID: m.clientID},
			hasSince: m.hasSince, since: m.since, stored: stored}, now)
		if out.refused != "" {
			m.refuse(ctx, out.refused, channelSub{presence: out.kept.presence, clientID: out.kept.clientID}, out.subscribed)
			return
		}
		a.fan.subscribed(m, &out)
	case *unsubscribe:
		a.processed++
		a.core.leave(localNode, m.connID)
		a.fan.unsubscribed(m)
	case *hooksChanged:
		a.processed++
		a.core.hooks.set(a.cfg, m.target)
	case *inspectChannel:
		a.inspect(m)
	case *channelAsk:
		a.processed++
		a.answerQuery(m)
	case *actor.Stopping:
		a.dropHeld(ctx)
	case *quietTick:
		scheduleQuietTick(ctx, a.dormancy)
		if a.quiet.dormantAgain(a.core.idle(a.cfg.Now()) && len(a.hist.held) == 0) {
			ctx.Send(ctx.Parent(), &mayStop{channel: a.core.name, processed: a.processed, pid: ctx.Self()})
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
		a.answer(m, a.publish(ctx, m))
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

// publish has the core decide an emit (proto/PROTOCOL.md › POST /emit).
func (a *channelActor) publish(ctx actor.Context, m *Publish) PublishResult {
	e := a.emitRequest(m)
	out := a.core.publish(&e)
	return settleEmit(ctx, m, a.usage, a.cfg.counters, out.err,
		PublishResult{Seq: out.seq, Subscribers: out.subscribers, Delivered: out.delivered, Channel: out.channel})
}

// emitRequest is m as the core decides it (a value: it stays on the stack).
func (a *channelActor) emitRequest(m *Publish) emitRequest {
	e := emitRequest{payload: m.Payload, at: m.At, limit: m.channelLimit, projectDenied: m.projectDenied, accepted: m.At.UnixNano()}
	if m.origin != nil {
		e.client, e.conn, e.clientID, e.msgType = true, m.origin.ID(), m.clientID, m.msgType
	}
	return e
}

// deliver is the core's fan-out on this node: the sockets found closed
// leave the channel now.
func (a *channelActor) deliver(m *stamped) int {
	gone := a.fan.deliver(transport.Seal(m.buf), m.skipConn, m.accepted, a.cfg.Now().UnixNano())
	for _, conn := range gone {
		a.core.leave(localNode, conn)
	}
	return len(gone)
}

func (a *channelActor) presence(_, event, clientID string, except uint64) {
	a.fan.presence(event, clientID, except, false)
}
