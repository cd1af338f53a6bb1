package store

import (
	"time"

	"github.com/uptrace/bun"
)

// User is an account that owns projects.
type User struct {
	bun.BaseModel `bun:"table:users"`

	ID           string    `bun:"id,pk"`
	Email        string    `bun:"email"`
	PasswordHash string    `bun:"password_hash"`
	CreatedAt    time.Time `bun:"created_at"`
}

// Project is a tenant: its keys, connections and channels belong to it.
type Project struct {
	bun.BaseModel `bun:"table:projects"`

	ID               string    `bun:"id,pk"`
	OwnerUserID      string    `bun:"owner_user_id"`
	Name             string    `bun:"name"`
	ClientEmitSecret string    `bun:"client_emit_secret"` // "" until first generated
	CreatedAt        time.Time `bun:"created_at"`

	// Channel authorization (proto/PROTOCOL.md › Channel authorization), an
	// extension off by default. AuthSecret signs the connection and
	// subscribe tokens ("" until first made: SetAuthorization makes it);
	// after RotateAuthSecret with an overlap, AuthSecretPrevious stays valid
	// until AuthSecretPreviousUntil. AuthJWKSURL ("" for none) is the JWKS
	// that tokens signed with the project's own keys (RS256, ES256, EdDSA)
	// are verified against. PrivateChannels are the channels the project
	// marks private beyond the private- prefix: comma-separated patterns (a
	// name, or a prefix ending in *), "" for none.
	Authorization           bool       `bun:"authorization,notnull"`
	AuthSecret              string     `bun:"auth_secret"`
	AuthSecretPrevious      string     `bun:"auth_secret_previous"`
	AuthSecretPreviousUntil *time.Time `bun:"auth_secret_previous_until"`
	AuthJWKSURL             string     `bun:"auth_jwks_url,notnull"`
	PrivateChannels         string     `bun:"private_channels,notnull"`
}

// AuthSecretsAt is the authorization secrets a token may be signed with at
// t: the current one first, then the previous one while its overlap lasts
// (t before AuthSecretPreviousUntil); nil when no secret was ever made.
func (p Project) AuthSecretsAt(t time.Time) []string {
	if p.AuthSecret == "" {
		return nil
	}
	out := []string{p.AuthSecret}
	if p.PreviousAuthSecretValidAt(t) {
		out = append(out, p.AuthSecretPrevious)
	}
	return out
}

// PreviousAuthSecretValidAt reports whether the secret a rotation replaced
// is still valid at t (its overlap has not ended).
func (p Project) PreviousAuthSecretValidAt(t time.Time) bool {
	return p.AuthSecretPrevious != "" && p.AuthSecretPreviousUntil != nil && t.Before(*p.AuthSecretPreviousUntil)
}

// APIKey is a project's public or secret key; only its SHA-256 hash is kept.
type APIKey struct {
	bun.BaseModel `bun:"table:api_keys"`

	ID        string     `bun:"id,pk"`
	ProjectID string     `bun:"project_id"`
	KeyType   string     `bun:"key_type"` // "public" or "secret"
	KeyHash   string     `bun:"key_hash"`
	KeyPrefix string     `bun:"key_prefix"` // masked, safe to show
	CreatedAt time.Time  `bun:"created_at"`
	RevokedAt *time.Time `bun:"revoked_at"`
	// ExpiresAt is set on a key replaced by a rotation with an overlap: it
	// authenticates until then, beside the new active key.
	ExpiresAt *time.Time `bun:"expires_at"`
	// LastUsedAt is when an emit or handshake last used the key, as the
	// nodes write it (at most once a minute); nil when never used.
	LastUsedAt *time.Time `bun:"last_used_at"`
}

// Active reports whether the key is not revoked: it authenticates unless it
// has also expired (ValidAt).
func (k APIKey) Active() bool { return k.RevokedAt == nil }

// ValidAt reports whether the key authenticates at t: not revoked, and not
// past the end of its overlap window.
func (k APIKey) ValidAt(t time.Time) bool {
	return k.RevokedAt == nil && (k.ExpiresAt == nil || t.Before(*k.ExpiresAt))
}

// Settings are the per-project options the dashboard edits.
type Settings struct {
	bun.BaseModel `bun:"table:project_settings"`

	ProjectID string `bun:"project_id,pk"`
	// ChannelRateLimit overrides EMIT_RATE_LIMIT_PER_MINUTE when set.
	ChannelRateLimit *int   `bun:"channel_rate_limit"`
	WebhookURL       string `bun:"webhook_url"`
	WebhookSecret    string `bun:"webhook_secret"`
	// WebhookChannelEvents and WebhookPresenceEvents opt in to
	// channel_occupied/channel_vacated and member_added/member_removed.
	WebhookChannelEvents  bool `bun:"webhook_channel_events,notnull"`
	WebhookPresenceEvents bool `bun:"webhook_presence_events,notnull"`
	// HistoryRetentionSeconds keeps the project's channel messages in the
	// store (channel_messages) that long; 0: none kept (the default).
	HistoryRetentionSeconds int       `bun:"history_retention_seconds,notnull"`
	UpdatedAt               time.Time `bun:"updated_at"`
}

// Usage is one project's counters for one UTC day.
type Usage struct {
	bun.BaseModel `bun:"table:usage_daily,alias:usage"`

	ProjectID                 string `bun:"project_id,pk"`
	Day                       string `bun:"day,pk"` // YYYY-MM-DD, UTC
	ConnectionCount           int64  `bun:"connection_count"`
	MessageCount              int64  `bun:"message_count"`
	PeakConcurrentConnections int64  `bun:"peak_concurrent_connections"`

	// Delivery health (summed over the day, each node's counts added).
	Deliveries            int64 `bun:"deliveries"`
	Dropped               int64 `bun:"dropped"`
	SlowConsumersClosed   int64 `bun:"slow_consumers_closed"`
	ChannelRateLimited    int64 `bun:"channel_rate_limited"`
	ProjectRateLimited    int64 `bun:"project_rate_limited"`
	ClientEmitRateLimited int64 `bun:"client_emit_rate_limited"`
	// LatencyP99Ms is the day's worst fan-out latency p99 of one rollup
	// interval on one node, in ms (0: no sample).
	LatencyP99Ms float64 `bun:"latency_p99_ms"`
	// HistoryBytes is the most channel history the project held in the
	// store that day, sampled at each sweep (RecordHistoryUsage).
	HistoryBytes int64 `bun:"history_bytes"`
}

// Merge adds o's counts to u's and keeps the larger peak and p99, as
// AddUsage does in the database.
func (u *Usage) Merge(o Usage) {
	u.ConnectionCount += o.ConnectionCount
	u.MessageCount += o.MessageCount
	u.PeakConcurrentConnections = max(u.PeakConcurrentConnections, o.PeakConcurrentConnections)
	u.Deliveries += o.Deliveries
	u.Dropped += o.Dropped
	u.SlowConsumersClosed += o.SlowConsumersClosed
	u.ChannelRateLimited += o.ChannelRateLimited
	u.ProjectRateLimited += o.ProjectRateLimited
	u.ClientEmitRateLimited += o.ClientEmitRateLimited
	u.LatencyP99Ms = max(u.LatencyP99Ms, o.LatencyP99Ms)
	u.HistoryBytes = max(u.HistoryBytes, o.HistoryBytes)
}

// Revocation kinds.
const (
	RevokeJTI    = "jti"
	RevokeClient = "client"
)

// Revocation revokes client-emit tokens by jti, or every token of a clientId
// issued at or before RevokedAt. It can be dropped after ExpiresAt.
type Revocation struct {
	bun.BaseModel `bun:"table:emit_token_revocations,alias:rev"`

	ProjectID string    `bun:"project_id,pk"`
	Kind      string    `bun:"kind,pk"`
	Value     string    `bun:"value,pk"`
	RevokedAt time.Time `bun:"revoked_at"`
	ExpiresAt time.Time `bun:"expires_at"`
}

type meta struct {
	bun.BaseModel `bun:"table:meta"`

	Key   string `bun:"key,pk"`
	Value string `bun:"value"`
}
