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
		a.publishTaken(ctx, m)
	case *refuseEmit:
		a.processed++
		m.sink.Send(errorFrame(&proto.Error{Code: m.code, Channel: a.core.name}))
	case *subscribe:
		a.processed++
		out := a.core.join(&joinRequest{node: localNode, conn: m.sink.ID(), sub: coreSub{presence: m.presence, clientID: m.clientID},
			hasSince: m.hasSince, since: m.since}, a.cfg.Now())
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
	case *quietTick:
		scheduleQuietTick(ctx, a.dormancy)
		if a.quiet.dormantAgain(a.core.idle(a.cfg.Now())) {
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
		if res := a.publish(ctx, m); res.Err != nil {
			m.origin.Send(errorFrame(&proto.Error{Code: res.Err.Code, Channel: a.core.name}))
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

// publish has the core decide an emit (proto/PROTOCOL.md › POST /emit); a
// client emit's emitter gets the emit ack.
func (a *channelActor) publish(ctx actor.Context, m *Publish) PublishResult {
	e := &emitRequest{payload: m.Payload, at: m.At, limit: m.channelLimit, projectDenied: m.projectDenied, accepted: m.At.UnixNano()}
	if m.origin != nil {
		e.client, e.conn, e.clientID, e.msgType = true, m.origin.ID(), m.clientID, m.msgType
	}
	out := a.core.publish(e)
	res := settleEmit(ctx, m, a.usage, a.cfg.counters, out.err,
		PublishResult{Seq: out.seq, Subscribers: out.subscribers, Delivered: out.delivered, Channel: out.channel})
	if out.err == "" && e.client {
		m.origin.Send(transport.TextFrame(proto.AppendEmitAck(nil, a.core.name, out.seq)))
	}
	return res
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
