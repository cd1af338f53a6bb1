package actors

import (
	"context"
	"time"
)

// Test-only entry points: the product calls PublishWithin, OpenAuthorized
// and System.VerifyConnectionToken.

// Publish runs one emit through the project and channel actors and returns
// the channel actor's answer. When ctx ends first the emit is abandoned: it
// is answered ErrTimeout and never delivered later.
func (s *System) Publish(ctx context.Context, projectID, channel string, payload []byte) (PublishResult, error) {
	timeout := time.Duration(-1)
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	return s.PublishWithin(ctx, timeout, projectID, channel, payload)
}

// Open starts the connection actor of a new socket opened with the public
// key whose hash is keyHash, on a slot from Reserve, and returns the session
// the transport feeds. The connect is counted for usage.
func (s *System) Open(l *Lease, keyHash string, sink Sink) *Session {
	return s.OpenAuthorized(l, keyHash, sink, nil, nil)
}

// Cluster is the node's membership, nil on one node.
func (s *System) Cluster() *Cluster { return s.cluster.Load() }

// VerifyConnectionToken checks an HS256 connection token against secrets.
func VerifyConnectionToken(token string, secrets []string, now time.Time) (*Identity, error) {
	c, err := parseHS256(token, secrets, now)
	if err != nil {
		return nil, err
	}
	return identityOf(c)
}

// Stats is a project actor's counts, as its inspection reports them.
type Stats struct {
	Connections, Channels int
	Connects, Emits       int64
}

// ProjectStats reads a running project actor's counts; ok is false when the
// project has no actor.
func (s *System) ProjectStats(ctx context.Context, id string) (Stats, bool, error) {
	in, err := s.Inspect(ctx, id, "", 0, 0)
	if err != nil || len(in.Projects) == 0 {
		return Stats{}, err != nil, err
	}
	p := in.Projects[0]
	return Stats{Connections: p.Connections, Channels: p.Channels, Connects: p.ConnectsUnrolled, Emits: p.EmitsUnrolled}, true, nil
}
