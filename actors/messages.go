package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
)

// Messages are pointers to these structs; a message is never touched again
// after it is sent, and frame bytes are read-only for everyone.

// Publish asks for one emit on a channel (HTTP emit now, client-emit later).
// The edge waits on Reply (capacity 1); the channel actor answers it directly.
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
}

// PublishResult is the answer to Publish: the 200 or 429 body of SPEC.md.
type PublishResult struct {
	Seq         uint64
	Delivered   int
	Subscribers int
	Channel     Budget
	Project     Budget
	Err         *proto.Error // channel_rate_limited or project_rate_limited; nil on success
}

// subscribe adds a connection to a channel; the channel actor sends the ack.
type subscribe struct {
	channel  string
	sink     Sink
	presence bool
	clientID string
	hasSince bool
	since    float64
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
type connOpened struct{ sink Sink }

type connClosed struct {
	connID   uint64
	channels []string
	status   CloseStatus
}

// usageDrain asks a project actor for its usage counters since the last
// drain, which it then resets.
type usageDrain struct{ reply chan Usage }

// Usage is one project's counts since the last drain, and its live
// connections now (SPEC.md › Usage row).
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

// refund gives back a project-budget unit taken for an emit the channel refused.
type refund struct{ at time.Time }

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

// settingsLoaded carries a settings load back into the project actor.
type settingsLoaded struct {
	settings Settings
	gen      uint64 // the project's change generation when the load began
	err      error
}

// Stats is a snapshot of a project actor for the edge (tests, debug).
type Stats struct {
	Connections int
	Channels    int
	Connects    int64 // connects counted since start (usage)
	Emits       int64 // emits counted since start (usage)
}

type statsRequest struct{ reply chan Stats }

// connInit is a connection actor's first message: the socket it owns.
type connInit struct {
	sink    Sink
	project *actor.PID
	maxSubs int
}

// refuseEmit carries a client-emit refusal (rules 1–7) through the channel
// actor, behind the emits of the same channel that are still queued there,
// so that one connection gets the answers to its emits on a channel in the
// order it sent them (the reference clients pair them first in, first out).
type refuseEmit struct {
	sink Sink
	code proto.Code
}
