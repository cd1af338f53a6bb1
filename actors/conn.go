package actors

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/gobwas/ws"

	"github.com/relayhq/relay/proto"
)

// CloseProjectDeleted is the close code sent when a connection's project is
// deleted; clients should not reconnect with the same key.
const CloseProjectDeleted ws.StatusCode = 4004

// subState is what a connection knows of one of its subscriptions.
type subState struct {
	presence bool
	clientID string
}

// connActor owns one socket's subscriptions and turns decoded client frames
// into messages for its project. Every field is owned by Receive.
type connActor struct {
	sink    Sink
	project *actor.PID
	subs    map[string]subState
	maxSubs int
}

func (a *connActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *clientFrame:
		a.handleFrame(ctx, &m.msg)
	case *socketClosed:
		channels := make([]string, 0, len(a.subs))
		for ch := range a.subs {
			channels = append(channels, ch)
		}
		a.subs = nil
		ctx.Send(a.project, &connClosed{connID: a.sink.ID(), channels: channels, status: m.status})
		ctx.Stop(ctx.Self())
	}
}

func (a *connActor) handleFrame(ctx actor.Context, m *proto.ClientMessage) {
	switch m.Action {
	case proto.ActionSubscribe:
		if a.subs == nil {
			a.subs = map[string]subState{}
		}
		if _, again := a.subs[m.Channel]; !again && a.maxSubs > 0 && len(a.subs) >= a.maxSubs {
			a.sink.Send(errorFrame(&proto.Error{Code: proto.CodeTooManySubscriptions, Channel: m.Channel}))
			return
		}
		a.subs[m.Channel] = subState{presence: m.Presence, clientID: m.ClientID}
		ctx.Send(a.project, &subscribe{channel: m.Channel, sink: a.sink, presence: m.Presence, clientID: m.ClientID,
			hasSince: m.HasSince, since: m.Since})
	case proto.ActionUnsubscribe:
		if _, ok := a.subs[m.Channel]; !ok {
			// Not subscribed: nothing to remove, but the client still gets its ack.
			a.sink.Send(textFrame(proto.AppendAck(nil, proto.ActionUnsubscribe, m.Channel)))
			return
		}
		delete(a.subs, m.Channel)
		ctx.Send(a.project, &unsubscribe{channel: m.Channel, connID: a.sink.ID(), sink: a.sink})
	case proto.ActionEmit:
		sub := a.subs[m.Channel]
		ctx.Send(a.project, &clientEmit{msg: *m, sink: a.sink, presence: sub.presence, subClientID: sub.clientID})
	}
}

func errorFrame(e *proto.Error) []byte { return textFrame(proto.AppendError(nil, e)) }

// pongFrame is compiled once: a pong goes out without touching any actor.
var pongFrame = textFrame(proto.Pong)

// Session is the actors' side of one socket. The transport calls
// HandleMessage from a read worker (one call at a time per socket) and
// HandleClose once when the socket is gone.
type Session struct {
	sys       *System
	sink      Sink
	pid       *actor.PID
	projectID string
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

// HandleClose removes the connection from all its channels at once; status
// is what the client's close frame said, if it sent one.
func (s *Session) HandleClose(status CloseStatus) {
	s.sys.Release(s.projectID)
	s.sys.root.Send(s.pid, &socketClosed{status: status})
}
