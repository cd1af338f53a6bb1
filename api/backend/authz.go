package backend

import (
	"errors"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwt"
)

// Rights a connection token grants on a channel (proto/PROTOCOL.md ›
// Channel authorization).
const (
	RightSubscribe = "subscribe"
	RightPresence  = "presence"
)

// ConnectionTokenOptions are what a connection token carries, for a project
// with channel authorization on.
type ConnectionTokenOptions struct {
	Secret string // the project's authorization secret
	UserID string // sub: the connection's presence identity
	TTL    time.Duration
	// Channels grants channels: each key a channel name or a prefix ending
	// in "*", each value its rights (RightSubscribe, RightPresence).
	Channels map[string][]string
	Now      time.Time // for tests; zero means the clock
}

// MintConnectionToken signs a connection token (HS256 with the secret's
// UTF-8 bytes), for GET /ws?publicKey=…&token=….
func MintConnectionToken(o ConnectionTokenOptions) (string, error) {
	if o.Secret == "" || o.UserID == "" || o.TTL <= 0 {
		return "", errors.New("backend: secret, userId and a positive TTL are required")
	}
	now := nowOr(o.Now)
	b := jwt.NewBuilder().Subject(o.UserID).IssuedAt(now).Expiration(now.Add(o.TTL))
	if len(o.Channels) > 0 {
		b = b.Claim("channels", o.Channels)
	}
	return sign(b, o.Secret)
}

// SubscribeTokenOptions are what a subscribe token carries: a grant of one
// channel, sent with that subscribe.
type SubscribeTokenOptions struct {
	Secret   string // the project's authorization secret
	Channel  string // ch
	UserID   string // sub, optional: then only that user's connection may use it
	Presence bool   // grants presence on the channel too
	TTL      time.Duration
	Now      time.Time // for tests; zero means the clock
}

// MintSubscribeToken signs a subscribe token (HS256 with the secret's UTF-8 bytes).
func MintSubscribeToken(o SubscribeTokenOptions) (string, error) {
	if o.Secret == "" || o.Channel == "" || o.TTL <= 0 {
		return "", errors.New("backend: secret, channel and a positive TTL are required")
	}
	now := nowOr(o.Now)
	b := jwt.NewBuilder().Claim("ch", o.Channel).IssuedAt(now).Expiration(now.Add(o.TTL))
	if o.UserID != "" {
		b = b.Subject(o.UserID)
	}
	if o.Presence {
		b = b.Claim("presence", true)
	}
	return sign(b, o.Secret)
}

func nowOr(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now()
	}
	return t
}

func sign(b *jwt.Builder, secret string) (string, error) {
	tok, err := b.Build()
	if err != nil {
		return "", err
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256, []byte(secret)))
	return string(signed), err
}
