package actors

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// connSub is what a connection knows of one of its subscriptions. The
// connection records a subscribe when it sends it; the channel may refuse
// it (a cap), and the refusal brings back what the channel kept.
type connSub struct {
	channel  string
	presence bool
	n        uint32 // the number of the subscribe that recorded it
	clientID string
}

// connActor owns one socket's subscriptions and turns decoded client frames
// into messages for its project. Every field is owned by Receive.
type connActor struct {
	sink    Sink
	project *actor.PID
	// subs is a slice, not a map: most connections hold one or a few
	// channels (at most MAX_SUBSCRIPTIONS_PER_CONNECTION), and a one-entry
	// map costs about 300 bytes more per idle connection.
	subs       []connSub
	subscribes uint32 // subscribes sent, numbering them
	cfg        *Config
	authz      *authzHolder // the project's channel authorization (off: SPEC.md exactly)
	ident      *Identity    // the connection token's (channel authorization); nil: none
}

// removeSub drops subs[i], moving the last one into its place.
func (a *connActor) removeSub(i int) {
	last := len(a.subs) - 1
	a.subs[i], a.subs[last] = a.subs[last], connSub{}
	a.subs = a.subs[:last]
}

// find returns the index of channel in subs, or -1.
func (a *connActor) find(channel string) int {
	for i := range a.subs {
		if a.subs[i].channel == channel {
			return i
		}
	}
	return -1
}

func (a *connActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *connInit:
		a.sink, a.project, a.cfg, a.authz, a.ident = m.sink, m.project, m.cfg, m.authz, m.ident
	case *clientFrame:
		a.handleFrame(ctx, &m.msg)
	case *subscribeRefused:
		// Back to what the channel kept, unless the client has subscribed
		// again since (that subscribe's outcome decides) or unsubscribed.
		if i := a.find(m.channel); i >= 0 && a.subs[i].n == m.n {
			if m.subscribed {
				a.subs[i].presence, a.subs[i].clientID = m.presence, m.clientID
			} else {
				a.removeSub(i)
			}
		}
	case *socketClosed:
		channels := make([]string, 0, len(a.subs))
		for _, sub := range a.subs {
			channels = append(channels, sub.channel)
		}
		a.subs = nil
		ctx.Send(a.project, &connClosed{connID: a.sink.ID(), channels: channels, status: m.status})
		ctx.Stop(ctx.Self())
	}
}

func (a *connActor) handleFrame(ctx actor.Context, m *proto.ClientMessage) {
	switch m.Action {
	case proto.ActionRefresh:
		a.refresh(ctx, m.Token)
	case proto.ActionSubscribe:
		if az := a.authz.on(); az != nil {
			if code := authorizeSubscribe(context.Background(), a.cfg.jwks, az, a.ident, m, a.cfg.Now()); code != "" {
				a.sink.Send(errorFrame(&proto.Error{Code: code, Channel: m.Channel}))
				return
			}
		}
		a.subscribes++
		sub := connSub{channel: m.Channel, presence: m.Presence, clientID: m.ClientID, n: a.subscribes}
		if max := a.cfg.MaxClientIDBytes; max > 0 && len(m.ClientID) > max {
			a.sink.Send(errorFrame(&proto.Error{Code: proto.CodeClientIDTooLong, Channel: m.Channel}))
			return
		}
		if i := a.find(m.Channel); i >= 0 {
			a.subs[i] = sub // a repeated subscribe updates presence and clientId
		} else if a.cfg.MaxSubscriptions > 0 && len(a.subs) >= a.cfg.MaxSubscriptions {
			a.sink.Send(errorFrame(&proto.Error{Code: proto.CodeTooManySubscriptions, Channel: m.Channel}))
			return
		} else {
			a.subs = append(a.subs, sub)
		}
		ctx.Send(a.project, &subscribe{channel: m.Channel, sink: a.sink, conn: ctx.Self(), n: sub.n, presence: m.Presence, clientID: m.ClientID,
			hasSince: m.HasSince, since: m.Since})
	case proto.ActionUnsubscribe:
		i := a.find(m.Channel)
		if i < 0 {
			// Not subscribed: nothing to remove, but the client still gets its ack.
			a.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionUnsubscribe, m.Channel)))
			return
		}
		a.removeSub(i)
		ctx.Send(a.project, &unsubscribe{channel: m.Channel, connID: a.sink.ID(), sink: a.sink})
	case proto.ActionEmit:
		var sub connSub
		if i := a.find(m.Channel); i >= 0 {
			sub = a.subs[i]
		}
		ctx.Send(a.project, &clientEmit{msg: *m, sink: a.sink, presence: sub.presence, subClientID: sub.clientID})
	}
}

// refresh takes a fresh connection token for the same user (any user, on
// an anonymous connection); on a project without channel authorization the
// action does not exist.
func (a *connActor) refresh(ctx actor.Context, token string) {
	az := a.authz.on()
	if az == nil {
		a.sink.Send(errorFrame(&proto.Error{Code: proto.CodeUnknownAction}))
		return
	}
	now := a.cfg.Now()
	id, err := verifyConnection(context.Background(), a.cfg.jwks, az, token, now)
	if err != nil || a.ident != nil && id.Sub != a.ident.Sub {
		a.sink.Send(errorFrame(&proto.Error{Code: proto.CodeInvalidToken}))
		return
	}
	a.ident = id
	ctx.Send(a.project, &tokenRefreshed{sink: a.sink, ident: id}) // it answers: ok, or 4012 for a revoked token
}

// emitAnswerFrame is a client emit's answer on its socket: the emit ack,
// or its refusal naming the channel.
func emitAnswerFrame(channel string, res PublishResult) []byte {
	if res.Err != nil {
		return errorFrame(&proto.Error{Code: res.Err.Code, Channel: channel})
	}
	return transport.TextFrame(proto.AppendEmitAck(nil, channel, res.Seq))
}

func errorFrame(e *proto.Error) []byte { return transport.TextFrame(proto.AppendError(nil, e)) }

// pongFrame is compiled once: a pong goes out without touching any actor.
var pongFrame = transport.TextFrame(proto.Pong)

// Session is the actors' side of one socket. The transport calls
// HandleMessage from a read worker (one call at a time per socket) and
// HandleClose once when the socket is gone.
type Session struct {
	sys    *System
	sink   Sink
	pid    *actor.PID
	lease  *Lease
	health *projectHealth // the project's live figures (health.go)
}

// HandleMessage decodes one client frame at the edge; pings and malformed
// frames are answered here, the rest goes to the connection actor.
func (s *Session) HandleMessage(payload []byte) {
	m, err := proto.DecodeClientMessage(payload)
	if err != nil {
		s.sink.Send(errorFrame(err))
		return
	}
	if m.Action == proto.ActionPing {
		s.sink.Send(pongFrame)
		return
	}
	s.sys.root.Send(s.pid, &clientFrame{msg: m})
}

// HandleWritten takes the transport's report of a write that sent a
// message accepted at accepted (unix nanos) by written: the fan-out latency.
func (s *Session) HandleWritten(accepted, written int64) {
	s.health.written(accepted, written)
}

// ClosedSlow counts the socket as closed for not reading fast enough; the
// transport's adapter calls it before HandleClose.
func (s *Session) ClosedSlow() {
	s.health.add(hSlowClosed, 1, s.sys.cfg.Now().UnixNano())
}

// HandleClose removes the connection from all its channels at once; status
// is what the client's close frame said, if it sent one.
func (s *Session) HandleClose(status CloseStatus) {
	s.sys.Release(s.lease)
	s.sys.root.Send(s.pid, &socketClosed{status: status})
}
