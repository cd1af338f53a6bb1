package store

import (
	"context"
	"errors"
	"time"

	"github.com/uptrace/bun"
)

// Channel authorization (proto/PROTOCOL.md › Channel authorization): a
// project setting, off by default, and the secret the project's backend signs
// connection and subscribe tokens with. Each change is also recorded as a key
// change (recordKeyChange, no key revoked): the WebSocket handshake reads the
// project's authorization with its keys, so every node sharing the store,
// including one that learns of changes only from the store (a change made by
// `relay admin`), drops the project's cached keys and reads it again.

// errNoSecret: SetAuthorization was asked to turn authorization on without
// a secret to make.
var errNoSecret = errors.New("store: turning authorization on needs a candidate secret")

// AuthorizationUpdate is a change of a project's channel authorization;
// a nil field is left as it is.
type AuthorizationUpdate struct {
	// On turns it on or off. Turning it on makes Candidate the project's
	// authorization secret unless it has one already (two first calls at
	// once end with one secret); turning it off keeps the secret, which
	// holds again when it is turned back on.
	On        *bool
	Candidate string
	// JWKSURL sets the URL of the project's JWKS ("" removes it).
	JWKSURL *string
	// PrivateChannels sets the channels marked private (Project.PrivateChannels).
	PrivateChannels *string
}

// SetAuthorization turns the project's channel authorization on or off and
// returns the project as stored (UpdateAuthorization with On alone).
// ErrNotFound when there is no such project.
func (s *Store) SetAuthorization(ctx context.Context, projectID string, on bool, candidate string) (Project, error) {
	return s.UpdateAuthorization(ctx, projectID, AuthorizationUpdate{On: &on, Candidate: candidate})
}

// SetAuthJWKSURL sets (or, with "", removes) the URL of the project's JWKS
// and returns the project as stored. ErrNotFound when there is no such
// project.
func (s *Store) SetAuthJWKSURL(ctx context.Context, projectID, url string) (Project, error) {
	return s.UpdateAuthorization(ctx, projectID, AuthorizationUpdate{JWKSURL: &url})
}

// UpdateAuthorization applies u in one transaction and returns the project
// as stored; an update that changes nothing still reads the project and
// records a key change. ErrNotFound when there is no such project.
func (s *Store) UpdateAuthorization(ctx context.Context, projectID string, u AuthorizationUpdate) (Project, error) {
	on := u.On != nil && *u.On
	if on && u.Candidate == "" {
		return Project{}, errNoSecret
	}
	var p Project
	err := s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		q := tx.NewUpdate().Model(&p).Set("id = id")
		if u.On != nil {
			q = q.Set(`"authorization" = ?`, on)
		}
		if on {
			q = q.Set("auth_secret = CASE WHEN auth_secret = '' THEN ? ELSE auth_secret END", u.Candidate)
		}
		if u.JWKSURL != nil {
			q = q.Set("auth_jwks_url = ?", *u.JWKSURL)
		}
		if u.PrivateChannels != nil {
			q = q.Set("private_channels = ?", *u.PrivateChannels)
		}
		if err := q.Where("id = ?", projectID).Returning("*").Scan(ctx); err != nil {
			return notFound(err)
		}
		return recordKeyChange(ctx, tx, projectID, nil, staleKeys|staleSettings)
	})
	if err != nil {
		return Project{}, err
	}
	fixProject(&p)
	return p, nil
}

// RotateAuthSecret makes secret the project's authorization secret and
// returns the project as stored; whether authorization is on does not
// change. With a zero until the secret it replaces stops at once; with an
// until it stays valid beside the new one until then (callers bound the
// overlap as a key rotation's: api.MaxKeyOverlap). One previous secret is
// kept: one still in the overlap of an earlier rotation stops now.
// ErrNotFound when there is no such project.
func (s *Store) RotateAuthSecret(ctx context.Context, projectID, secret string, until time.Time) (Project, error) {
	if secret == "" {
		return Project{}, errors.New("store: RotateAuthSecret: empty secret")
	}
	var p Project
	err := s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		// Serialise rotations of one project: on PostgreSQL by locking its row
		// (SQLite transactions already take the write lock at BEGIN).
		if s.dialect == Postgres {
			if _, err := tx.ExecContext(ctx, "SELECT 1 FROM projects WHERE id = ? FOR UPDATE", projectID); err != nil {
				return err
			}
		}
		var cur Project
		if err := tx.NewSelect().Model(&cur).Column("auth_secret").Where("id = ?", projectID).Scan(ctx); err != nil {
			return notFound(err)
		}
		previous, previousUntil := "", (*time.Time)(nil)
		if !until.IsZero() && cur.AuthSecret != "" {
			end := until.UTC().Truncate(time.Microsecond)
			previous, previousUntil = cur.AuthSecret, &end
		}
		err := tx.NewUpdate().Model(&p).
			Set("auth_secret = ?", secret).
			Set("auth_secret_previous = ?", previous).
			Set("auth_secret_previous_until = ?", previousUntil).
			Where("id = ?", projectID).Returning("*").Scan(ctx)
		if err != nil {
			return notFound(err)
		}
		return recordKeyChange(ctx, tx, projectID, nil, staleKeys|staleSettings)
	})
	if err != nil {
		return Project{}, err
	}
	fixProject(&p)
	return p, nil
}
