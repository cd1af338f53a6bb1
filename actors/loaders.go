package actors

import (
	"context"
	"errors"
	"time"

	"github.com/relayhq/relay/transport"
)

// Sink is the transport's handle on one socket. Send never blocks: it queues a
// complete frame (shared, read-only bytes) and reports false when the socket is
// gone or its queue overflowed (the transport then closes it as a slow consumer).
type Sink interface {
	ID() uint64
	Send(frame []byte) bool
	// SendAt is Send for a message accepted at the given time (unix nanos):
	// its age when written counts in the project's fan-out latency.
	SendAt(frame []byte, accepted int64) bool
	Close(code transport.CloseCode, reason string)
}

// CloseStatus is how a client ended its connection: the code and reason of
// its close frame when it sent one (Supplied), as webhooks report them.
type CloseStatus struct {
	Supplied bool
	Code     int
	Reason   string
}

// WebhookEvent is one event for the project's webhook: a connect or
// disconnect (ConnectionID, Status), a channel_occupied or channel_vacated
// (Channel), a member_added or member_removed (Channel, ClientID).
type WebhookEvent struct {
	Kind         string // "connect", "disconnect" or one of the Hook… kinds
	ProjectID    string
	ConnectionID string
	Channel      string
	ClientID     string
	At           time.Time
	Status       CloseStatus // disconnect only
}

// WebhookSender hands an event to whatever delivers webhooks; it must not block.
type WebhookSender func(url, secret string, ev WebhookEvent)

// Settings are the per-project values the project actor applies.
type Settings struct {
	ChannelRateLimit int    // per-channel budget override; 0 means the default
	ClientEmitSecret string // "" until generated
	WebhookURL       string // "" when none
	WebhookSecret    string
	// The webhook events sent beyond connect and disconnect (opt-in):
	// channel_occupied/channel_vacated and member_added/member_removed.
	WebhookChannelEvents  bool
	WebhookPresenceEvents bool
	Revocations           []Revocation
	// Authz is the project's channel authorization (proto/PROTOCOL.md ›
	// Channel authorization), an extension off by default.
	Authz ProjectAuthz
	// HistoryRetention keeps the project's channel messages in the store
	// that long (history.go); zero: no history, the replay ring alone.
	HistoryRetention time.Duration
}

// Revocation kinds.
const (
	RevokeJTI    = "jti"
	RevokeClient = "client"
)

// Revocation revokes client-emit tokens: one jti, or every token of a
// clientId issued at or before RevokedAt (whole seconds). It matters until
// ExpiresAt, when every token it could match has expired.
type Revocation struct {
	Kind      string
	Value     string
	RevokedAt time.Time
	ExpiresAt time.Time
}

// ErrProjectNotFound is returned by a SettingsLoader for a project that does
// not exist (deleted, or never created).
var ErrProjectNotFound = errors.New("project not found")

// SettingsLoader loads a project's settings; it runs beside the actor, never in Receive.
type SettingsLoader func(ctx context.Context, projectID string) (Settings, error)
