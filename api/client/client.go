// Package client is the Go reference client of a Relay (api/client/README.md; the protocol is proto/PROTOCOL.md): subscribe, receive, presence, client-emit with a token,
// heartbeat, and automatic reconnect with backoff that resubscribes and asks
// for replay from the last seq seen on each channel, dropping duplicates.
//
// A Client is safe for concurrent use; Close stops every goroutine it started.
package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/relayhq/relay/proto"
)

// Options are the reference client's options (api/client/README.md); zero
// values take their defaults.
type Options struct {
	// NoReconnect turns automatic reconnection off (the browser client's reconnect: false).
	NoReconnect         bool
	MaxReconnectDelay   time.Duration // default 30 s
	HeartbeatInterval   time.Duration // default 240 s; negative disables
	HeartbeatAckTimeout time.Duration // default 15 s

	// Clock and Jitter are for tests: Clock replaces time.After for every wait
	// of the client (reconnect backoff, HealthyConnection, heartbeat interval
	// and ack timeout), Jitter returns a number in [0, 1) (default math/rand).
	Clock  func(d time.Duration) <-chan time.Time
	Jitter func() float64
	// OnState is called (in order, from one goroutine) on every state change.
	OnState func(State)

	// Token, for a project with channel authorization (proto/PROTOCOL.md),
	// gives a connection token (a JWT from the application's backend). It
	// is called on every connect and reconnect (sent as ?token=), and to
	// refresh the token on the socket 30 s before its exp or when the
	// server sends token_expiring; after a close 4011 or a refused refresh
	// (an *Error invalid_token on Errors) the client reconnects at once
	// with a fresh one. An error it returns fails Dial, or on a reconnect
	// goes to Errors and the client retries with backoff. nil: no token.
	Token func(ctx context.Context) (string, error)

	// Seqs keeps each channel's last seq across runs of the application
	// (a file, a database row), as the browser client's resume keeps it in
	// localStorage. nil: none.
	Seqs SeqStore
}

// SeqStore is where a client keeps each channel's last seq (Options.Seqs).
// A Subscribe without SubscribeOptions.Since to a channel the client is not
// subscribed to (the first, or one after Unsubscribe) starts from LoadSeq's
// seq, if it has one: what the channel sent after it is
// replayed first (or a Gap says what no longer can be), as after a
// reconnect. SaveSeq gets the seq of every message the client hands to
// Events, and of every own emit's ack, once the client's lock is released,
// from its reading goroutine: keep it quick (buffer, and write later or at
// exit). An application that must not skip a message it has not handled
// yet saves Message.Seq itself once handled, and passes it as Since.
type SeqStore interface {
	LoadSeq(channel string) (seq uint64, ok bool)
	SaveSeq(channel string, seq uint64)
}

func (o *Options) defaults() {
	if o.MaxReconnectDelay <= 0 {
		o.MaxReconnectDelay = 30 * time.Second
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 240 * time.Second
	}
	if o.HeartbeatAckTimeout <= 0 {
		o.HeartbeatAckTimeout = 15 * time.Second
	}
	if o.Clock == nil {
		o.Clock = time.After
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
}

// State is the connection state.
type State string

const (
	Connecting   State = "connecting"
	Open         State = "open"
	Reconnecting State = "reconnecting"
	Closed       State = "closed"
)

// HealthyConnection is how long a connection must stay open for the next
// reconnect to start again from the shortest delay. It is measured with
// Options.Clock.
const HealthyConnection = 5 * time.Second

// Backoff is the delay before reconnect attempt n (0-based): 500 ms × 2^n,
// capped at max, then ±50 % jitter (jitter in [0, 1)).
func Backoff(attempt int, max time.Duration, jitter float64) time.Duration {
	d := 500 * time.Millisecond
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	return time.Duration(float64(d) * (0.5 + jitter))
}

// Message is an emitted or client-emitted message.
type Message struct {
	Channel  string          `json:"channel"`
	Payload  json.RawMessage `json:"payload"`
	Seq      uint64          `json:"seq"`
	Type     string          `json:"type,omitempty"`     // client-emit only
	ClientID string          `json:"clientId,omitempty"` // client-emit only
	Replay   bool            `json:"replay,omitempty"`
}

// Event is what a subscription delivers: a message, a presence change, or a
// replay gap (messages after Since were lost; the application should
// resynchronise).
type Event struct {
	Message  *Message
	Presence *PresenceEvent
	Gap      *Gap
}

// PresenceEvent is a sync, join or leave; Members is the member list after it.
type PresenceEvent struct {
	Event    string // sync, join, leave
	ClientID string // join and leave
	Members  []string
}

// Gap reports that messages after Since may be missing: Since is the seq the
// subscription asked to resume from (its SubscribeOptions.Since, or after a
// reconnect the last seq it had delivered), as the server echoes it.
type Gap struct{ Since uint64 }

// Error is an error frame of the service.
type Error struct {
	Code    string `json:"error"`
	Channel string `json:"channel,omitempty"`
}

func (e *Error) Error() string {
	if e.Channel != "" {
		return "relay: " + e.Code + " (" + e.Channel + ")"
	}
	return "relay: " + e.Code
}

// ErrClosed is returned after Close.
var ErrClosed = errors.New("relay client: closed")

// SubscribeOptions: Presence needs a ClientID.
type SubscribeOptions struct {
	Presence bool
	ClientID string
	// Since, when set, asks for replay from this seq: the server first sends
	// the messages it still buffers with a greater seq (Message.Replay), after
	// a Gap when some of them are no longer buffered. It is where the
	// subscription starts: messages with a seq at or below it are not
	// delivered, and until one arrives, a reconnect resumes from it. Keep
	// LastSeq of an earlier subscription (or of a Message) and pass
	// new(seq) here to resume it. nil subscribes from now on. On a
	// Subscribe to a channel already subscribed, a non-nil Since restarts
	// the subscription from there (replayed messages included), a nil one
	// keeps its place.
	Since *uint64
	// Token gives a subscribe token for this channel (channel
	// authorization), called on every subscribe and resubscribe of it and
	// sent with the subscribe. An error it returns fails Subscribe; on a
	// reconnect it ends the subscription and goes to Errors.
	Token func(ctx context.Context) (string, error)
}

// Subscription is one channel's stream of events.
type Subscription struct {
	c       *Client
	channel string
	opts    SubscribeOptions
	events  chan Event
	done    chan struct{}
	ended   sync.Once

	// Guarded by c.mu. lastSeq is where a resubscribe resumes: the last seq
	// delivered, or the starting Since until a message arrives.
	lastSeq uint64
	hasSeq  bool
	members []string
	acked   bool // the server has held it (a refused re-subscribe leaves it as it was)
}

// Events delivers the subscription's events in order. A consumer that falls
// more than 1024 events behind holds up the connection's reader, like a slow
// socket would. The channel is never closed: select on Done too.
func (s *Subscription) Events() <-chan Event { return s.events }

// Done is closed when the subscription ends (Unsubscribe, Close, or the
// client giving up reconnecting).
func (s *Subscription) Done() <-chan struct{} { return s.done }

func (s *Subscription) end() { s.ended.Do(func() { close(s.done) }) }

// Members is the current presence member list (other members, sorted as the
// server sent them, updated by join and leave).
func (s *Subscription) Members() []string {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return append([]string(nil), s.members...)
}

// LastSeq is the last seq delivered on this channel (the client's own
// client-emits included), or SubscribeOptions.Since until a message is
// delivered; false when there is neither. It is the since a reconnect resumes
// from.
func (s *Subscription) LastSeq() (uint64, bool) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.lastSeq, s.hasSeq
}

// wsURL builds the connect address from a ws:// or http:// base.
func wsURL(base, publicKey string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	if !strings.HasSuffix(u.Path, "/ws") {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/ws"
	}
	q := u.Query()
	q.Set("publicKey", publicKey)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Channel authorization's error codes (proto/PROTOCOL.md › Channel
// authorization): a refused subscribe, a refused refresh or handshake.
const (
	CodeTokenRequired         = "token_required"
	CodeClientIDMismatch      = "client_id_mismatch"
	CodeChannelForbidden      = "channel_forbidden"
	CodeInvalidSubscribeToken = "invalid_subscribe_token"
	CodeInvalidToken          = "invalid_token"
	CodeTokenExpired          = "token_expired"
)

// CloseTokenExpired is the close code of a connection whose token expired
// without a refresh: the client reconnects at once with a fresh token.
const CloseTokenExpired = 4011

// CloseTokenRevoked closes the connections of a user whose tokens the
// backend revoked (a disconnect with revokeTokens): the client does not
// reconnect.
const CloseTokenRevoked = 4012

// tokenExp reads a JWT's exp without verifying it (only to know when to
// refresh); zero when it has none.
func tokenExp(token string) time.Time {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(raw, &claims) != nil || claims.Exp == nil {
		return time.Time{}
	}
	return time.Unix(int64(*claims.Exp), 0)
}

// validate checks what the server would refuse anyway, so that every error
// frame the client gets is about an operation it is waiting for.
func validate(channel string, opts SubscribeOptions) error {
	if !proto.ValidChannel(channel) {
		return &Error{Code: string(proto.CodeInvalidChannel), Channel: channel}
	}
	if opts.Presence && opts.ClientID == "" {
		return &Error{Code: string(proto.CodeClientIDRequired), Channel: channel}
	}
	return nil
}

// pending is an operation waiting for its answer.
type pending struct {
	done chan error
	seq  uint64            // emit ack
	prev *SubscribeOptions // a re-subscribe: what the server keeps if it refuses this one
}

func newPending() *pending { return &pending{done: make(chan error, 1)} }
