package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
)

// channelSub is one subscriber of a channel.
type channelSub struct {
	sink     Sink
	presence bool
	clientID string
}

// channelActor owns a channel: seq, subscribers and the per-channel emit
// window. Every field is owned by Receive.
type channelActor struct {
	name   string
	seq    uint64
	subs   []channelSub
	index  map[uint64]int // connection id → position in subs
	window fixedWindow

	processed uint64 // messages had from the project actor (see mayStop)
	dormancy  time.Duration
	now       func() time.Time
}

func newChannelActor(name string, cfg *Config) *channelActor {
	now := cfg.Now()
	return &channelActor{
		name: name,
		// seq starts from the clock (µs since the epoch, well inside 2^53), so
		// it keeps increasing when a dormant channel is started again and a
		// client's `since` from before is seen as older than anything buffered.
		seq:      uint64(now.UnixMicro()),
		index:    map[uint64]int{},
		window:   fixedWindow{size: time.Minute},
		dormancy: cfg.ChannelDormancy,
		now:      cfg.Now,
	}
}

func (a *channelActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		ctx.SetReceiveTimeout(a.dormancy)
	case *Publish:
		a.processed++
		m.Reply <- a.publish(ctx, m)
	case *subscribe:
		a.processed++
		a.subscribe(m)
	case *unsubscribe:
		a.processed++
		a.unsubscribe(m)
	case *actor.ReceiveTimeout:
		ctx.SetReceiveTimeout(a.dormancy) // a fired timeout is cancelled; arm it again
		if a.dormant() {
			ctx.Send(ctx.Parent(), &mayStop{channel: a.name, processed: a.processed, pid: ctx.Self()})
		}
	}
}

// publish applies the budgets, stamps seq, encodes the message once and hands
// the same bytes to every subscriber (SPEC.md › Emit endpoint).
func (a *channelActor) publish(ctx actor.Context, m *Publish) PublishResult {
	if m.projectDenied {
		return PublishResult{
			Channel: a.window.peek(m.At, m.channelLimit), Project: m.projectBudget,
			Err: &proto.Error{Code: proto.CodeProjectRateLimited},
		}
	}
	budget, ok := a.window.take(m.At, m.channelLimit)
	if !ok {
		ctx.Send(ctx.Parent(), &refund{at: m.At})
		project := m.projectBudget
		project.Remaining = min(project.Remaining+1, project.Limit)
		return PublishResult{Channel: budget, Project: project, Err: &proto.Error{Code: proto.CodeChannelRateLimited}}
	}
	a.seq++
	buf := newFrameBuf(len(m.Payload) + len(a.name) + 48)
	frame := sealFrame(proto.AppendMessage(buf, a.name, m.Payload, a.seq))
	res := PublishResult{Seq: a.seq, Subscribers: len(a.subs), Channel: budget, Project: m.projectBudget}
	for i := 0; i < len(a.subs); {
		if a.subs[i].sink.Send(frame) {
			res.Delivered++
			i++
			continue
		}
		a.removeAt(i) // gone: pruned inline during the fan-out (SPEC.md › Connection)
	}
	return res
}

func (a *channelActor) subscribe(m *subscribe) {
	id := m.sink.ID()
	sub := channelSub{sink: m.sink, presence: m.presence, clientID: m.clientID}
	if i, ok := a.index[id]; ok {
		a.subs[i] = sub
	} else {
		a.index[id] = len(a.subs)
		a.subs = append(a.subs, sub)
	}
	m.sink.Send(textFrame(proto.AppendAck(nil, proto.ActionSubscribe, a.name)))
}

func (a *channelActor) unsubscribe(m *unsubscribe) {
	if i, ok := a.index[m.connID]; ok {
		a.removeAt(i)
	}
	if !m.silent {
		m.sink.Send(textFrame(proto.AppendAck(nil, proto.ActionUnsubscribe, a.name)))
	}
}

// removeAt drops subs[i] by moving the last subscriber into its place.
func (a *channelActor) removeAt(i int) {
	delete(a.index, a.subs[i].sink.ID())
	last := len(a.subs) - 1
	if i != last {
		a.subs[i] = a.subs[last]
		a.index[a.subs[i].sink.ID()] = i
	}
	a.subs[last] = channelSub{}
	a.subs = a.subs[:last]
}

// dormant: nobody listens and nothing is held that a fresh actor would forget
// (the emit window has run out).
func (a *channelActor) dormant() bool {
	return len(a.subs) == 0 && a.window.idle(a.now())
}
