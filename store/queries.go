package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
)

// fixTimes normalises times read back from SQLite (which returns time.Local).
func fixTime(t time.Time) time.Time { return t.UTC() }

func fixProject(p *Project) {
	p.CreatedAt = fixTime(p.CreatedAt)
	if p.AuthSecretPreviousUntil != nil {
		u := fixTime(*p.AuthSecretPreviousUntil)
		p.AuthSecretPreviousUntil = &u
	}
}

func fixKey(k *APIKey) {
	k.CreatedAt = fixTime(k.CreatedAt)
	for _, t := range []**time.Time{&k.RevokedAt, &k.ExpiresAt, &k.LastUsedAt} {
		if *t != nil {
			u := fixTime(**t)
			*t = &u
		}
	}
}

// CreateUser inserts a user; ErrDuplicate when the email (any case) exists.
func (s *Store) CreateUser(ctx context.Context, email, passwordHash string) (User, error) {
	u := User{ID: uuid.NewString(), Email: email, PasswordHash: passwordHash, CreatedAt: now()}
	if _, err := s.db.NewInsert().Model(&u).Exec(ctx); err != nil {
		if isDuplicate(err) {
			return User{}, ErrDuplicate
		}
		return User{}, err
	}
	return u, nil
}

// UserByEmail finds a user by email, case-insensitively.
func (s *Store) UserByEmail(ctx context.Context, email string) (User, error) {
	var u User
	err := s.db.NewSelect().Model(&u).Where("lower(email) = lower(?)", email).Scan(ctx)
	u.CreatedAt = fixTime(u.CreatedAt)
	return u, notFound(err)
}

// UserByID finds a user by id.
func (s *Store) UserByID(ctx context.Context, id string) (User, error) {
	id, ok := canonicalID(id)
	if !ok {
		return User{}, ErrNotFound
	}
	var u User
	err := s.db.NewSelect().Model(&u).Where("id = ?", id).Scan(ctx)
	u.CreatedAt = fixTime(u.CreatedAt)
	return u, notFound(err)
}

// canonicalID screens ids from URLs and lower-cases them, as we store them:
// PostgreSQL rejects a malformed uuid with an error, compares uuids without
// regard to case, and SQLite compares text exactly, so both must see one form.
func canonicalID(id string) (string, bool) {
	u, err := uuid.Parse(id)
	return u.String(), err == nil && len(id) == 36
}

// CreateProject inserts a project and its first keys in one transaction.
// With maxPerOwner > 0 it refuses with ErrLimitReached when the owner
// already has that many projects: counted in the same transaction, which
// is serialised per owner, so concurrent creations (on any node sharing
// the database) cannot pass the count together.
func (s *Store) CreateProject(ctx context.Context, ownerID, name string, maxPerOwner int, keys ...APIKey) (Project, error) {
	p := Project{ID: uuid.NewString(), OwnerUserID: ownerID, Name: name, CreatedAt: now()}
	err := s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if maxPerOwner > 0 {
			// On PostgreSQL by locking the owner's row (SQLite transactions
			// already take the write lock at BEGIN).
			if s.dialect == Postgres {
				if _, err := tx.ExecContext(ctx, "SELECT 1 FROM users WHERE id = ? FOR UPDATE", ownerID); err != nil {
					return err
				}
			}
			n, err := tx.NewSelect().Model((*Project)(nil)).Where("owner_user_id = ?", ownerID).Count(ctx)
			if err != nil {
				return err
			}
			if n >= int64(maxPerOwner) {
				return ErrLimitReached
			}
		}
		if _, err := tx.NewInsert().Model(&p).Exec(ctx); err != nil {
			return err
		}
		for i := range keys {
			keys[i].ID, keys[i].ProjectID, keys[i].CreatedAt = uuid.NewString(), p.ID, p.CreatedAt
		}
		if len(keys) > 0 {
			if _, err := tx.NewInsert().Model(&keys).Exec(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Project{}, err
	}
	return p, nil
}

// ProjectsByOwner lists a user's projects, oldest first.
func (s *Store) ProjectsByOwner(ctx context.Context, ownerID string) ([]Project, error) {
	var ps []Project
	err := s.db.NewSelect().Model(&ps).Where("owner_user_id = ?", ownerID).Order("created_at", "id").Scan(ctx)
	for i := range ps {
		fixProject(&ps[i])
	}
	return ps, err
}

// Project loads a project by id, whoever owns it.
func (s *Store) Project(ctx context.Context, id string) (Project, error) {
	id, ok := canonicalID(id)
	if !ok {
		return Project{}, ErrNotFound
	}
	var p Project
	err := s.db.NewSelect().Model(&p).Where("id = ?", id).Scan(ctx)
	fixProject(&p)
	return p, notFound(err)
}

// ProjectOfOwner loads a project only if ownerID owns it; ErrNotFound otherwise.
func (s *Store) ProjectOfOwner(ctx context.Context, id, ownerID string) (Project, error) {
	id, ok := canonicalID(id)
	if !ok {
		return Project{}, ErrNotFound
	}
	var p Project
	err := s.db.NewSelect().Model(&p).Where("id = ? AND owner_user_id = ?", id, ownerID).Scan(ctx)
	fixProject(&p)
	return p, notFound(err)
}

// RenameProject renames an owned project.
func (s *Store) RenameProject(ctx context.Context, id, ownerID, name string) (Project, error) {
	id, ok := canonicalID(id)
	if !ok {
		return Project{}, ErrNotFound
	}
	var p Project
	err := s.db.NewUpdate().Model(&p).Set("name = ?", name).
		Where("id = ? AND owner_user_id = ?", id, ownerID).Returning("*").Scan(ctx)
	fixProject(&p)
	return p, notFound(err)
}

// DeleteProject deletes an owned project; keys, settings, usage rows and
// revocations go with it (ON DELETE CASCADE).
func (s *Store) DeleteProject(ctx context.Context, id, ownerID string) error {
	id, ok := canonicalID(id)
	if !ok {
		return ErrNotFound
	}
	return s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		res, err := tx.NewDelete().Model((*Project)(nil)).Where("id = ? AND owner_user_id = ?", id, ownerID).Exec(ctx)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return recordKeyChange(ctx, tx, id, nil, staleKeys|staleSettings) // its keys went with it; a reload of it stops its actor
	})
}

// SetClientEmitSecret stores a project's client-emit secret.
func (s *Store) SetClientEmitSecret(ctx context.Context, projectID, secret string) error {
	res, err := s.db.NewUpdate().Model((*Project)(nil)).Set("client_emit_secret = ?", secret).Where("id = ?", projectID).Exec(ctx)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// Keys lists a project's keys, active and revoked, oldest first.
func (s *Store) Keys(ctx context.Context, projectID string) ([]APIKey, error) {
	var ks []APIKey
	err := s.db.NewSelect().Model(&ks).Where("project_id = ?", projectID).Order("created_at", "key_type", "id").Scan(ctx)
	for i := range ks {
		fixKey(&ks[i])
	}
	return ks, err
}

// KeyByHash finds a key, active or revoked, by the SHA-256 hash of its raw value.
func (s *Store) KeyByHash(ctx context.Context, hash string) (APIKey, error) {
	var k APIKey
	err := s.db.NewSelect().Model(&k).Where("key_hash = ?", hash).Scan(ctx)
	fixKey(&k)
	return k, notFound(err)
}

// RotateKey revokes the project's valid keys of k.KeyType and inserts k as
// the new active one, atomically; revoked is the hashes of the keys it revoked.
func (s *Store) RotateKey(ctx context.Context, projectID string, k APIKey) (_ APIKey, revoked []string, err error) {
	return s.rotateKey(ctx, projectID, k, time.Time{})
}

// RotateKeyUntil inserts k as the new active key of its type and leaves the
// project's valid keys of that type authenticating until until (an overlap
// window), atomically: a key whose window already ends sooner keeps its
// end. expiring is the hashes of the keys that now end at until. A zero
// until is RotateKey.
func (s *Store) RotateKeyUntil(ctx context.Context, projectID string, k APIKey, until time.Time) (_ APIKey, expiring []string, err error) {
	return s.rotateKey(ctx, projectID, k, until)
}

func (s *Store) rotateKey(ctx context.Context, projectID string, k APIKey, until time.Time) (_ APIKey, changed []string, err error) {
	at := now()
	k.ID, k.ProjectID, k.CreatedAt, k.RevokedAt, k.ExpiresAt, k.LastUsedAt = uuid.NewString(), projectID, at, nil, nil, nil
	err = s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		// Serialise rotations of one project: on PostgreSQL by locking its row
		// (SQLite transactions already take the write lock at BEGIN).
		if s.dialect == Postgres {
			if _, err := tx.ExecContext(ctx, "SELECT 1 FROM projects WHERE id = ? FOR UPDATE", projectID); err != nil {
				return err
			}
		}
		changed = nil // a retried transaction starts again
		q := tx.NewUpdate().Model((*APIKey)(nil))
		if until.IsZero() {
			// Keys already past their overlap window stay as they ended.
			q = q.Set("revoked_at = ?", at).
				Where("project_id = ? AND key_type = ? AND revoked_at IS NULL", projectID, k.KeyType).
				Where("(expires_at IS NULL OR expires_at > ?)", at)
		} else {
			until = until.UTC().Truncate(time.Microsecond)
			q = q.Set("expires_at = ?", until).
				Where("project_id = ? AND key_type = ? AND revoked_at IS NULL", projectID, k.KeyType).
				Where("(expires_at IS NULL OR expires_at > ?)", until)
		}
		if _, err := q.Returning("key_hash").Exec(ctx, &changed); err != nil {
			return err
		}
		if _, err := tx.NewInsert().Model(&k).Exec(ctx); err != nil {
			return err
		}
		var revoked []string
		if until.IsZero() {
			revoked = changed
		}
		return recordKeyChange(ctx, tx, projectID, revoked, staleKeys)
	})
	if err != nil {
		return APIKey{}, nil, err
	}
	return k, changed, nil
}

// ExpiringKey is a key in its overlap window, as KeysExpiringAfter lists it.
type ExpiringKey struct {
	ProjectID string    `bun:"project_id"`
	KeyType   string    `bun:"key_type"`
	KeyHash   string    `bun:"key_hash"`
	ExpiresAt time.Time `bun:"expires_at"`
}

// KeysExpiringAfter lists up to limit unrevoked keys whose overlap window
// ends after t, soonest first.
func (s *Store) KeysExpiringAfter(ctx context.Context, t time.Time, limit int) ([]ExpiringKey, error) {
	var ks []ExpiringKey
	err := s.db.NewSelect().Model((*APIKey)(nil)).Column("project_id", "key_type", "key_hash", "expires_at").
		Where("expires_at IS NOT NULL AND revoked_at IS NULL AND expires_at > ?", t.UTC()).
		Order("expires_at", "key_hash").Limit(int64(limit)).Scan(ctx, &ks)
	for i := range ks {
		ks[i].ExpiresAt = fixTime(ks[i].ExpiresAt)
	}
	return ks, err
}

// KeyUse is when a key, named by its hash, was last used.
type KeyUse struct {
	KeyHash string
	At      time.Time
}

// RecordKeyUse moves the keys' last_used_at forward to the times given (a
// time older than the stored one changes nothing, so nodes writing at once
// cannot move it back), in one transaction. Unknown hashes are skipped.
func (s *Store) RecordKeyUse(ctx context.Context, uses []KeyUse) error {
	if len(uses) == 0 {
		return nil
	}
	return s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		for _, u := range uses {
			at := u.At.UTC().Truncate(time.Microsecond)
			if _, err := tx.NewUpdate().Model((*APIKey)(nil)).Set("last_used_at = ?", at).
				Where("key_hash = ? AND (last_used_at IS NULL OR last_used_at < ?)", u.KeyHash, at).
				Exec(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// RevokeKey revokes one key of a project. Revoking a revoked key is a no-op
// that keeps the first revocation time; ErrNotFound if the key is not the project's.
func (s *Store) RevokeKey(ctx context.Context, projectID, keyID string) (APIKey, error) {
	keyID, ok := canonicalID(keyID)
	if !ok {
		return APIKey{}, ErrNotFound
	}
	var k APIKey
	err := s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := tx.NewSelect().Model(&k).Where("id = ? AND project_id = ?", keyID, projectID).Scan(ctx); err != nil {
			return notFound(err)
		}
		if k.RevokedAt != nil {
			return nil
		}
		at := now()
		k.RevokedAt = &at
		if _, err := tx.NewUpdate().Model(&k).Column("revoked_at").WherePK().Exec(ctx); err != nil {
			return err
		}
		return recordKeyChange(ctx, tx, k.ProjectID, []string{k.KeyHash}, staleKeys)
	})
	fixKey(&k)
	return k, err
}

// Settings loads a project's settings; a project never configured gets the
// zero Settings (no override, no webhook).
func (s *Store) Settings(ctx context.Context, projectID string) (Settings, error) {
	st := Settings{ProjectID: projectID}
	err := s.db.NewSelect().Model(&st).WherePK().Scan(ctx)
	if err = notFound(err); err == ErrNotFound {
		return Settings{ProjectID: projectID}, nil
	}
	st.UpdatedAt = fixTime(st.UpdatedAt)
	return st, err
}

// SaveSettings writes a project's settings whole.
func (s *Store) SaveSettings(ctx context.Context, st Settings) error {
	return saveSettings(ctx, s.db, st)
}

func saveSettings(ctx context.Context, db bun.IDB, st Settings) error {
	st.UpdatedAt = now()
	_, err := db.NewInsert().Model(&st).
		On("CONFLICT (project_id) DO UPDATE").
		Set("channel_rate_limit = EXCLUDED.channel_rate_limit").
		Set("webhook_url = EXCLUDED.webhook_url").
		Set("webhook_secret = EXCLUDED.webhook_secret").
		Set("webhook_channel_events = EXCLUDED.webhook_channel_events").
		Set("webhook_presence_events = EXCLUDED.webhook_presence_events").
		Set("history_retention_seconds = EXCLUDED.history_retention_seconds").
		Set("updated_at = EXCLUDED.updated_at").
		Exec(ctx)
	return err
}

// UpdateSettings reads a project's settings (the defaults when it has no
// row), applies change and writes them back, in one transaction serialised
// per project: two changes at once, on any node sharing the database, cannot
// overwrite each other's fields. When change returns an error nothing is
// written and UpdateSettings returns that error. The change is also recorded
// as a key change (no key revoked), as a change of channel authorization
// is: every node sharing the store, including one that learns of changes
// only from the store (a change made by `relay admin`), reloads the
// project's settings. Turning channel history on (from off) deletes what
// the project still stores from before (clearStaleHistory).
func (s *Store) UpdateSettings(ctx context.Context, projectID string, change func(*Settings) error) error {
	return s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		// On PostgreSQL by locking the project's row (SQLite transactions
		// already take the write lock at BEGIN); the settings row may not
		// exist yet, so it cannot be the one locked.
		if s.dialect == Postgres {
			if _, err := tx.ExecContext(ctx, "SELECT 1 FROM projects WHERE id = ? FOR UPDATE", projectID); err != nil {
				return err
			}
		}
		st := Settings{ProjectID: projectID}
		err := tx.NewSelect().Model(&st).WherePK().Scan(ctx)
		switch err = notFound(err); {
		case err == ErrNotFound:
			st = Settings{ProjectID: projectID}
		case err != nil:
			return err
		}
		wasOn := st.HistoryRetentionSeconds > 0
		if err := change(&st); err != nil {
			return err
		}
		if !wasOn && st.HistoryRetentionSeconds > 0 {
			if err := clearStaleHistory(ctx, tx, projectID); err != nil {
				return err
			}
		}
		if err := saveSettings(ctx, tx, st); err != nil {
			return err
		}
		return recordKeyChange(ctx, tx, projectID, nil, staleSettings)
	})
}

// AddRevocations stores revocations of one project in one transaction; a
// later one for the same key replaces the earlier (a clientId revocation
// moves its cut-off forward). With maxHeld > 0 it refuses with
// ErrLimitReached, storing none, when the project already holds that many
// other revocations unexpired at at (a value it holds already is revoked
// again whatever the count): counted in the same transaction, serialised
// per project, so concurrent calls (on any node) cannot pass it together.
func (s *Store) AddRevocations(ctx context.Context, projectID string, at time.Time, maxHeld int, rs ...Revocation) error {
	for i := range rs {
		rs[i].ProjectID = projectID
		rs[i].RevokedAt = rs[i].RevokedAt.UTC().Truncate(time.Microsecond)
		rs[i].ExpiresAt = rs[i].ExpiresAt.UTC().Truncate(time.Microsecond)
	}
	return s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if maxHeld > 0 {
			// On PostgreSQL by locking the project's row (SQLite
			// transactions already take the write lock at BEGIN).
			if s.dialect == Postgres {
				if _, err := tx.ExecContext(ctx, "SELECT 1 FROM projects WHERE id = ? FOR UPDATE", projectID); err != nil {
					return err
				}
			}
			n, err := tx.NewSelect().Model((*Revocation)(nil)).Where("project_id = ? AND expires_at > ?", projectID, at.UTC()).Count(ctx)
			if err != nil {
				return err
			}
			if n >= int64(maxHeld) {
				// Values the project holds already only replace their rows
				// (revoking is idempotent): they take no further room.
				again, err := tx.NewSelect().Model((*Revocation)(nil)).
					Where("project_id = ? AND expires_at > ?", projectID, at.UTC()).
					WhereGroup(" AND ", func(q *bun.SelectQuery) *bun.SelectQuery {
						for _, r := range rs {
							q = q.WhereOr("kind = ? AND value = ?", r.Kind, r.Value)
						}
						return q
					}).Count(ctx)
				if err != nil {
					return err
				}
				if again < int64(len(rs)) { // a new value among them: no room for it
					return ErrLimitReached
				}
			}
		}
		for i := range rs {
			_, err := tx.NewInsert().Model(&rs[i]).
				On("CONFLICT (project_id, kind, value) DO UPDATE").
				Set("revoked_at = EXCLUDED.revoked_at").
				// Kept as long as the longer of the two needs: a user's tokens
				// revoked for a day stay revoked when a client-emit revoke of
				// that clientId (kept minutes) follows.
				Set("expires_at = CASE WHEN EXCLUDED.expires_at > ?TableAlias.expires_at THEN EXCLUDED.expires_at ELSE ?TableAlias.expires_at END").
				Exec(ctx)
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// Revocations lists a project's revocations that have not expired at t.
func (s *Store) Revocations(ctx context.Context, projectID string, t time.Time) ([]Revocation, error) {
	var rs []Revocation
	err := s.db.NewSelect().Model(&rs).Where("project_id = ? AND expires_at > ?", projectID, t.UTC()).Order("kind", "value").Scan(ctx)
	for i := range rs {
		rs[i].RevokedAt, rs[i].ExpiresAt = fixTime(rs[i].RevokedAt), fixTime(rs[i].ExpiresAt)
	}
	return rs, err
}

// PruneRevocations deletes revocations expired at t and reports how many.
func (s *Store) PruneRevocations(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.NewDelete().Model((*Revocation)(nil)).Where("expires_at <= ?", t.UTC()).Exec(ctx)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// AddUsage adds counts to a project's row for day (YYYY-MM-DD, UTC), creating
// it if needed; peak keeps the highest value seen.
func (s *Store) AddUsage(ctx context.Context, u Usage) error {
	greatest := s.greatest()
	_, err := s.db.NewInsert().Model(&u).
		On("CONFLICT (project_id, day) DO UPDATE").
		Set("connection_count = ?TableAlias.connection_count + EXCLUDED.connection_count").
		Set("message_count = ?TableAlias.message_count + EXCLUDED.message_count").
		Set("peak_concurrent_connections = " + greatest + "(?TableAlias.peak_concurrent_connections, EXCLUDED.peak_concurrent_connections)").
		Set("deliveries = ?TableAlias.deliveries + EXCLUDED.deliveries").
		Set("dropped = ?TableAlias.dropped + EXCLUDED.dropped").
		Set("slow_consumers_closed = ?TableAlias.slow_consumers_closed + EXCLUDED.slow_consumers_closed").
		Set("channel_rate_limited = ?TableAlias.channel_rate_limited + EXCLUDED.channel_rate_limited").
		Set("project_rate_limited = ?TableAlias.project_rate_limited + EXCLUDED.project_rate_limited").
		Set("client_emit_rate_limited = ?TableAlias.client_emit_rate_limited + EXCLUDED.client_emit_rate_limited").
		Set("latency_p99_ms = " + greatest + "(?TableAlias.latency_p99_ms, EXCLUDED.latency_p99_ms)").
		Set("history_bytes = " + greatest + "(?TableAlias.history_bytes, EXCLUDED.history_bytes)").
		Exec(ctx)
	if isForeignKey(err) {
		return ErrNotFound // the project was deleted meanwhile; its counts go with it
	}
	return err
}

// greatest is the dialect's two-argument maximum: SQLite's scalar max.
func (s *Store) greatest() string {
	if s.dialect == SQLite {
		return "MAX"
	}
	return "GREATEST"
}

// Usage lists a project's daily rows from day from (inclusive), oldest first.
func (s *Store) Usage(ctx context.Context, projectID, from string) ([]Usage, error) {
	var us []Usage
	err := s.db.NewSelect().Model(&us).Where("project_id = ? AND day >= ?", projectID, from).Order("day").Scan(ctx)
	return us, err
}

// Meta reads a process-wide value.
func (s *Store) Meta(ctx context.Context, key string) (string, error) {
	m := meta{Key: key}
	err := s.db.NewSelect().Model(&m).WherePK().Scan(ctx)
	return m.Value, notFound(err)
}

// MetaSetIfAbsent stores value under key unless a value is there already, and
// returns the value that won, so concurrent nodes agree on one.
func (s *Store) MetaSetIfAbsent(ctx context.Context, key, value string) (string, error) {
	m := meta{Key: key, Value: value}
	if _, err := s.db.NewInsert().Model(&m).On("CONFLICT (key) DO NOTHING").Exec(ctx); err != nil {
		return "", err
	}
	return s.Meta(ctx, key)
}

// EnsureClientEmitSecret sets candidate as the project's client-emit secret
// unless it has one, and returns the secret that holds: concurrent first
// calls agree on one.
func (s *Store) EnsureClientEmitSecret(ctx context.Context, projectID, candidate string) (string, error) {
	if _, err := s.db.NewUpdate().Model((*Project)(nil)).Set("client_emit_secret = ?", candidate).
		Where("id = ? AND client_emit_secret = ''", projectID).Exec(ctx); err != nil {
		return "", err
	}
	p, err := s.Project(ctx, projectID)
	return p.ClientEmitSecret, err
}
