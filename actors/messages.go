package actors

import (
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// Messages are pointers to these structs; a message is never touched again
// after it is sent, and frame bytes are read-only for everyone.

// edgeMessage marks the messages the edge (System) sends to a project actor,
// which projectRef counts so that an actor only stops with none in flight.
type edgeMessage interface{ fromEdge() }

func (*Publish) fromEdge()          {}
func (*connOpened) fromEdge()       {}
func (*authzChanged) fromEdge()     {}
func (*usageDrain) fromEdge()       {}
func (*historyModeAsk) fromEdge()   {}
func (*inspectProject) fromEdge()   {}
func (*revoked) fromEdge()          {}
func (*clientEmitSecret) fromEdge() {}
func (*settingsChanged) fromEdge()  {}
func (*projectDeleted) fromEdge()   {}
func (*keysRevoked) fromEdge()      {}

// Publish asks for one emit on a channel: an HTTP emit, whose edge waits on
// Reply (capacity 1) for the channel actor's answer, or a client's emit,
// which the channel actor answers on the emitter's socket.
type Publish struct {
	Channel string
	Payload []byte // compact JSON, size already checked
	At      time.Time
	Reply   chan PublishResult // nil for a client-emit, which answers its origin

	// Client-emit only: who sent it, under which clientId and type.
	origin   Sink
	clientID string
	msgType  string

	// Filled in by the project actor before it forwards to the channel.
	projectBudget Budget
	projectDenied bool
	channelLimit  int

	// posterRuns asks the actor's mailbox to run the turn on the posting
	// goroutine if the actor is idle (mailbox.runHere); the mailbox clears it.
	posterRuns bool

	// history: the project keeps history (set by the project actor): the
	// channel answers once the message is stored (history.go).
	history bool

	// notAfter: in a cluster, the channel grain does not stamp the emit
	// after this (its edge has stopped waiting by then); zero for none.
	notAfter time.Time

	// claim settles the race between an HTTP edge that stops waiting and the
	// channel actor that applies the emit: 0 open, 1 taken, 2 abandoned.
	// An abandoned emit (the client got a 503) is never delivered.
	claim atomic.Int32
}

// take marks an emit as being applied; false if its edge gave up on it.
func (m *Publish) take() bool { return m.Reply == nil || m.claim.CompareAndSwap(0, 1) }

// abandoned reports whether the edge gave up on the emit.
func (m *Publish) abandoned() bool { return m.claim.Load() == 2 }

// abandon is the edge giving up; false when the emit was taken already (its
// answer is on its way).
func (m *Publish) abandon() bool { return m.claim.CompareAndSwap(0, 2) }

// PublishResult is the answer to Publish: the 200 or 429 body of proto/PROTOCOL.md › POST /emit.
type PublishResult struct {
	Seq         uint64
	Delivered   int
	Subscribers int
	Channel     Budget
	Project     Budget
	// Err is channel_rate_limited or project_rate_limited (a 429 with both
	// budgets), or service_unavailable while the project's settings load; nil on success.
	Err *proto.Error
}

// subscribe adds a connection to a channel; the channel actor sends the ack.
type subscribe struct {
	channel  string
	sink     Sink
	conn     *actor.PID // the connection actor, told when the subscribe is refused
	n        uint32     // its number among the connection's subscribes
	presence bool
	clientID string
	hasSince bool
	since    float64
	history  historyMode // the project's, set by the project actor
}

// subscribeRefused tells a connection actor that its project or channel
// refused a subscribe (a cap), and what the channel kept for the connection
// instead (a refused re-subscribe leaves the earlier subscription as it
// was), so that the connection's record matches it again.
type subscribeRefused struct {
	channel    string
	n          uint32 // the refused subscribe's number (connActor.subscribes)
	subscribed bool   // the channel still holds an earlier subscription…
	presence   bool   // …with presence…
	clientID   string // …under this clientId
}

// unsubscribe removes a connection from a channel; silent skips the ack (the
// connection is gone).
type unsubscribe struct {
	channel string
	connID  uint64
	sink    Sink
	silent  bool
}

// connOpened and connClosed tell the project actor about its connections.
type connOpened struct {
	sink    Sink
	keyHash string    // the public key it was opened with
	ident   *Identity // its connection token's (channel authorization); nil: none
}

// authzChanged is a project's new channel authorization, applied by its
// actor (a settings load under way predates it) before done is closed.
type authzChanged struct {
	az   *ProjectAuthz
	done chan struct{}
}

// tokenRefreshed tells the project actor a connection's new token.
type tokenRefreshed struct {
	sink  Sink
	ident *Identity
}

// keysRevoked closes the connections opened with these public keys.
type keysRevoked struct{ hashes []string }

type connClosed struct {
	connID   uint64
	channels []string
	status   CloseStatus
}

// usageDrain asks a project actor for its usage counters since the last
// drain, which it then resets.
type usageDrain struct{ reply chan Usage }

// Usage is one project's counts since the last drain, and its live
// connections now (README.md › Webhooks and usage).
type Usage struct {
	ProjectID   string
	Connects    int64
	Emits       int64
	Connections int
}

// clientFrame is a decoded client message for the connection actor.
type clientFrame struct{ msg proto.ClientMessage }

// socketClosed tells the connection actor that its socket is gone, with the
// close status the client sent, if it sent one.
type socketClosed struct{ status CloseStatus }

// refund gives back a project-budget unit taken for an emit the channel
// refused: window is the end of the backstop window it took the unit in.
type refund struct{ window time.Time }

// refundProject, from a channel actor or relay, gives the project backstop
// back the unit m took for an emit that was not stamped (none if the
// backstop itself refused it).
func refundProject(ctx actor.Context, m *Publish) {
	if !m.projectDenied {
		ctx.Send(ctx.Parent(), &refund{window: m.projectBudget.ResetAt})
	}
}

// settleEmit counts an emit its channel has decided (code "": stamped) for
// the project, and gives the backstop its unit back when the channel did
// not stamp it: the one account of an answer, for the channel actor and for
// a cluster's relay. res is the channel's answer; it comes back with the
// project budget (and that unit, for channel_rate_limited) and the error.
func settleEmit(ctx actor.Context, m *Publish, usage *projectUsage, counters *Counters, code proto.Code, res PublishResult) PublishResult {
	at, client := m.At.UnixNano(), m.origin != nil
	res.Project = m.projectBudget
	switch code {
	case "":
		usage.emits.Add(1)
		usage.health.add(emitKind(client), 1, at) // its deliveries count where they are made (channelFanout)
		if client {
			counters.EmittedClient.Add(1)
		} else {
			counters.EmittedHTTP.Add(1)
		}
		return res
	case proto.CodeChannelRateLimited:
		usage.health.add(hLimitedChannel, 1, at)
		res.Project.Remaining = min(res.Project.Remaining+1, res.Project.Limit)
	case proto.CodeProjectRateLimited:
		usage.health.add(hLimitedProject, 1, at)
	}
	refundProject(ctx, m)
	res.Err = &proto.Error{Code: code}
	return res
}

// mayStop is a dormant channel asking its project to stop it. processed is the
// number of messages the channel has had from its project: if the project sent
// more, one is in flight and the channel is not stopped.
type mayStop struct {
	channel   string
	processed uint64
	pid       *actor.PID
}

// clientEmit is a WebSocket emit on its way to the project actor, with what
// the connection knows of its subscription to the channel (rule 4).
type clientEmit struct {
	msg         proto.ClientMessage
	sink        Sink
	presence    bool   // subscribed to msg.Channel with presence
	subClientID string // under this clientId
}

// revoked carries revocations just stored.
type revoked struct{ revs []Revocation }

// clientEmitSecret carries a client-emit secret just stored.
type clientEmitSecret struct{ secret string }

// projectDeleted closes every connection of the project and stops its actors.
type projectDeleted struct{}

// settingsChanged makes the project actor reload its settings.
type settingsChanged struct{}

// retryLoad tries a failed settings load again.
type retryLoad struct{}

// settingsLoaded carries a settings load back into the project actor.
type settingsLoaded struct {
	settings Settings
	gen      uint64 // the project's change generation when the load began
	err      error
}

// historyModeAsk asks a project actor whether it keeps channel history.
type historyModeAsk struct{ reply chan historyMode }

// connInit is a connection actor's first message: the socket it owns.
type connInit struct {
	sink    Sink
	project *actor.PID
	cfg     *Config
	authz   *authzHolder // the project's channel authorization
	ident   *Identity    // the connection token's, if any
}

// refuseEmit carries a client-emit refusal (rules 1–7) through the channel
// actor, behind the emits of the same channel that are still queued there,
// so that one connection gets the answers to its emits on a channel in the
// order it sent them (the reference clients pair them first in, first out).
type refuseEmit struct {
	sink Sink
	code proto.Code
}

// quietTick is a dormancy check an actor schedules for itself every
// ActorDormancy. (protoactor's ReceiveTimeout would do, but its timer
// goroutine writes the actor context while Receive reads it: a data race.)
type quietTick struct{}

var theQuietTick = &quietTick{}

func scheduleQuietTick(ctx actor.Context, after time.Duration) { sendLater(ctx, after, theQuietTick) }

// sendLater sends msg to the actor itself after d. Every timer an actor
// sets for itself is one of these: its state is touched only in Receive,
// when the message comes.
func sendLater(ctx actor.Context, d time.Duration, msg any) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	time.AfterFunc(d, func() { root.Send(self, msg) })
}

// quietPeriod: an actor stops once it was dormant at two ticks in a row, so
// it has had nothing to keep for at least one whole period.
type quietPeriod struct{ dormantTicks int }

func (q *quietPeriod) dormantAgain(dormant bool) bool {
	if !dormant {
		q.dormantTicks = 0
		return false
	}
	q.dormantTicks++
	return q.dormantTicks >= 2
}

// refuse answers a refused subscribe with the error frame and tells the
// connection actor what the channel holds for it instead: kept, when
// subscribed.
func (m *subscribe) refuse(ctx actor.Context, code proto.Code, kept channelSub, subscribed bool) {
	m.sink.Send(errorFrame(&proto.Error{Code: code, Channel: m.channel}))
	if m.conn != nil {
		ctx.Send(m.conn, &subscribeRefused{channel: m.channel, n: m.n, subscribed: subscribed, presence: kept.presence, clientID: kept.clientID})
	}
}

// encodeMessage builds a stamped message (proto/PROTOCOL.md › Server frames) in a
// frame buffer: transport.Seal makes it the frame every subscriber gets, and
// transport.FramePayload is the message object the replay ring keeps. A
// client emit names its emitter's clientId and type.
func encodeMessage(channel string, payload []byte, seq uint64, client bool, msgType, clientID string) []byte {
	buf := transport.NewFrame(len(payload) + len(channel) + len(clientID) + len(msgType) + 64)
	if !client {
		return proto.AppendMessage(buf, channel, payload, seq)
	}
	return proto.AppendClientMessage(buf, channel, msgType, payload, seq, clientID)
}
