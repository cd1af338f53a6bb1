package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/uptrace/bun"
)

// KeyChange is one committed change to a project's keys, numbered in commit
// order (Seq from 1, with no gaps but those pruned).
type KeyChange struct {
	Seq       int64
	ProjectID string
	// Revoked is the hashes of the keys the change revoked at once; empty
	// for one that revoked none (a rotation with an overlap, a deletion).
	Revoked []string
	// What the change makes stale on a node: its cached keys of the
	// project, and/or the project's live settings.
	KeysStale, SettingsStale bool
}

// What a recorded change makes stale (recordKeyChange).
type staleness uint8

const (
	staleKeys     staleness = 1 << iota // cached keys: revoked, rotated, the project deleted, its authorization
	staleSettings                       // the project's live settings: changed, its authorization, the project deleted
)

// keyChange is a row of key_changes.
type keyChange struct {
	bun.BaseModel `bun:"table:key_changes"`

	Seq           int64     `bun:"seq,pk"`
	ProjectID     string    `bun:"project_id"`
	Revoked       string    `bun:"revoked"` // comma-separated hashes (hex: no commas inside)
	ChangedAt     time.Time `bun:"changed_at"`
	KeysStale     bool      `bun:"keys_stale,notnull"`
	SettingsStale bool      `bun:"settings_stale,notnull"`
}

// recordKeyChange numbers a change to projectID's keys inside the
// transaction that makes it. Taking the number locks key_change_seq's row
// until tx ends, so the changes commit in number order.
func recordKeyChange(ctx context.Context, tx bun.Tx, projectID string, revoked []string, stale staleness) error {
	var seq int64
	if err := tx.NewRaw("UPDATE key_change_seq SET seq = seq + 1 WHERE id = 1 RETURNING seq").Scan(ctx, &seq); err != nil {
		return fmt.Errorf("number key change: %w", err)
	}
	row := keyChange{Seq: seq, ProjectID: projectID, Revoked: strings.Join(revoked, ","), ChangedAt: now(),
		KeysStale: stale&staleKeys != 0, SettingsStale: stale&staleSettings != 0}
	if _, err := tx.NewInsert().Model(&row).Exec(ctx); err != nil {
		return fmt.Errorf("record key change: %w", err)
	}
	return nil
}

// LastKeyChange is the number of the last committed key change (0: none
// yet).
func (s *Store) LastKeyChange(ctx context.Context) (int64, error) {
	var seq int64
	err := s.db.NewRaw("SELECT seq FROM key_change_seq WHERE id = 1").Scan(ctx, &seq)
	return seq, err
}

// KeyChangesAfter lists up to limit key changes numbered after seq, in
// order.
func (s *Store) KeyChangesAfter(ctx context.Context, seq int64, limit int) ([]KeyChange, error) {
	var rows []keyChange
	if err := s.db.NewSelect().Model(&rows).Where("seq > ?", seq).Order("seq").Limit(int64(limit)).Scan(ctx); err != nil {
		return nil, err
	}
	out := make([]KeyChange, len(rows))
	for i, r := range rows {
		out[i] = KeyChange{Seq: r.Seq, ProjectID: r.ProjectID, KeysStale: r.KeysStale, SettingsStale: r.SettingsStale}
		if r.Revoked != "" {
			out[i].Revoked = strings.Split(r.Revoked, ",")
		}
	}
	return out, nil
}

// PruneKeyChanges deletes the key changes made before t.
func (s *Store) PruneKeyChanges(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.NewDelete().Model((*keyChange)(nil)).Where("changed_at < ?", t.UTC()).Exec(ctx)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
