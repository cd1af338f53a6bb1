package store

import (
	"context"
	"time"

	"github.com/uptrace/bun"
)

// SessionEpoch is a user's current session epoch: "log out everywhere"
// increments it, and a session cookie minted in an older epoch is refused.
// A user who never did has no row (epoch 0).
type SessionEpoch struct {
	bun.BaseModel `bun:"table:session_epochs,alias:sep"`

	UserID    string    `bun:"user_id,pk"`
	Epoch     int64     `bun:"epoch"`
	UpdatedAt time.Time `bun:"updated_at"`
}

// SessionRevocation is one session ended by a logout. It can be dropped after
// ExpiresAt, when the cookie is refused for its age anyway.
type SessionRevocation struct {
	bun.BaseModel `bun:"table:session_revocations,alias:srev"`

	SessionID string    `bun:"session_id,pk"`
	RevokedAt time.Time `bun:"revoked_at"`
	ExpiresAt time.Time `bun:"expires_at"`
}

// SessionEpoch returns a user's session epoch: 0 for a user who never logged
// out everywhere, or an id that names no user.
func (s *Store) SessionEpoch(ctx context.Context, userID string) (int64, error) {
	id, ok := canonicalID(userID)
	if !ok {
		return 0, nil
	}
	e := SessionEpoch{UserID: id}
	err := s.db.NewSelect().Model(&e).WherePK().Scan(ctx)
	if err = notFound(err); err == ErrNotFound {
		return 0, nil
	}
	return e.Epoch, err
}

// NextSessionEpoch starts a new session epoch for a user and returns it:
// every session minted before is then refused. ErrNotFound if the user does
// not exist.
func (s *Store) NextSessionEpoch(ctx context.Context, userID string) (int64, error) {
	id, ok := canonicalID(userID)
	if !ok {
		return 0, ErrNotFound
	}
	e := SessionEpoch{UserID: id, Epoch: 1, UpdatedAt: now()}
	_, err := s.db.NewInsert().Model(&e).
		On("CONFLICT (user_id) DO UPDATE").
		Set("epoch = ?TableAlias.epoch + 1").
		Set("updated_at = EXCLUDED.updated_at").
		Returning("epoch").
		Exec(ctx)
	if isForeignKey(err) {
		return 0, ErrNotFound
	}
	return e.Epoch, err
}

// RevokeSession records that the session id has ended, until expires.
// Revoking it again keeps the first record.
func (s *Store) RevokeSession(ctx context.Context, sessionID string, expires time.Time) error {
	r := SessionRevocation{SessionID: sessionID, RevokedAt: now(), ExpiresAt: expires.UTC().Truncate(time.Microsecond)}
	_, err := s.db.NewInsert().Model(&r).On("CONFLICT (session_id) DO NOTHING").Exec(ctx)
	return err
}

// SessionRevoked reports whether a logout ended the session id.
func (s *Store) SessionRevoked(ctx context.Context, sessionID string) (bool, error) {
	return s.db.NewSelect().Model((*SessionRevocation)(nil)).Where("session_id = ?", sessionID).Exists(ctx)
}

// PruneSessionRevocations deletes session revocations expired at t and
// reports how many.
func (s *Store) PruneSessionRevocations(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.NewDelete().Model((*SessionRevocation)(nil)).Where("expires_at <= ?", t.UTC()).Exec(ctx)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
