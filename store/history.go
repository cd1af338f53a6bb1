package store

import (
	"context"
	"time"

	"github.com/uptrace/bun"
)

// Durable channel history (issue 33), for the projects that turn it on
// (Settings.HistoryRetentionSeconds): every message their channels stamp,
// kept until the retention sweep deletes it.

// HistoryMessage is one stored message: the message object (JSON) the
// channel's subscribers got, without "replay".
type HistoryMessage struct {
	bun.BaseModel `bun:"table:channel_messages"`

	ProjectID string    `bun:"project_id,pk"`
	Channel   string    `bun:"channel,pk"`
	Seq       int64     `bun:"seq,pk"`
	Message   string    `bun:"message,notnull"`
	CreatedAt time.Time `bun:"created_at,notnull"`
}

// AppendHistory stores msgs in one transaction: all of them or none. A seq
// stored already refuses the whole batch (ErrDuplicate).
func (s *Store) AppendHistory(ctx context.Context, msgs []HistoryMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	for i := range msgs {
		msgs[i].CreatedAt = msgs[i].CreatedAt.UTC().Truncate(time.Microsecond)
	}
	// One statement per chunk: SQLite allows 32 766 variables in one, five
	// a row.
	const chunk = 1000
	err := s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		for from := 0; from < len(msgs); from += chunk {
			part := msgs[from:min(from+chunk, len(msgs))]
			if _, err := tx.NewInsert().Model(&part).Exec(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && isDuplicate(err) {
		return ErrDuplicate
	}
	return err
}

// HistoryAfter is a channel's stored messages with seq > after, oldest
// first, at most limit.
func (s *Store) HistoryAfter(ctx context.Context, projectID, channel string, after uint64, limit int) ([]HistoryMessage, error) {
	var out []HistoryMessage
	err := s.db.NewSelect().Model(&out).
		Where("project_id = ? AND channel = ? AND seq > ?", projectID, channel, int64(after)).
		OrderExpr("seq ASC").Limit(int64(limit)).Scan(ctx)
	return out, err
}

// HistoryBefore is a channel's stored messages with above < seq < before,
// newest first, at most limit (above 0: no lower bound).
func (s *Store) HistoryBefore(ctx context.Context, projectID, channel string, before, above uint64, limit int) ([]HistoryMessage, error) {
	var out []HistoryMessage
	err := s.db.NewSelect().Model(&out).
		Where("project_id = ? AND channel = ? AND seq < ? AND seq > ?", projectID, channel, int64(before), int64(above)).
		OrderExpr("seq DESC").Limit(int64(limit)).Scan(ctx)
	return out, err
}

// LastHistorySeq is the greatest seq stored for a channel; 0 when none.
func (s *Store) LastHistorySeq(ctx context.Context, projectID, channel string) (uint64, error) {
	var seq *int64
	err := s.db.NewSelect().Model((*HistoryMessage)(nil)).ColumnExpr("MAX(seq)").
		Where("project_id = ? AND channel = ?", projectID, channel).Scan(ctx, &seq)
	if err != nil || seq == nil { // MAX over no row is one NULL row, never none
		return 0, err
	}
	return uint64(*seq), nil
}

// SweepHistory deletes the stored messages past their project's retention
// at now (every stored message of a project whose history is off now), at
// most batch rows per statement and maxRows in all, oldest first within a
// project. It returns how many it deleted: maxRows means there may be more
// for the next run.
func (s *Store) SweepHistory(ctx context.Context, now time.Time, batch, maxRows int) (int64, error) {
	var projects []struct {
		ProjectID string `bun:"project_id"`
		Retention int    `bun:"history_retention_seconds"`
	}
	// Projects whose history is on, and those that still have rows.
	err := s.db.NewRaw(`SELECT project_id, history_retention_seconds FROM project_settings
		WHERE history_retention_seconds > 0 OR EXISTS (SELECT 1 FROM channel_messages m WHERE m.project_id = project_settings.project_id)`).
		Scan(ctx, &projects)
	if err != nil {
		return 0, err
	}
	var deleted int64
	for _, p := range projects {
		cutoff := now.Add(-time.Duration(p.Retention) * time.Second).UTC().Truncate(time.Microsecond)
		for deleted < int64(maxRows) {
			n := min(batch, maxRows-int(deleted))
			res, err := s.db.NewRaw(`DELETE FROM channel_messages WHERE (project_id, channel, seq) IN
				(SELECT project_id, channel, seq FROM channel_messages WHERE project_id = ? AND created_at < ? ORDER BY created_at LIMIT ?)`,
				p.ProjectID, cutoff, n).Exec(ctx)
			if err != nil {
				return deleted, err
			}
			k, _ := res.RowsAffected()
			deleted += k
			if k < int64(n) {
				break
			}
		}
		if deleted >= int64(maxRows) {
			break
		}
	}
	return deleted, nil
}
