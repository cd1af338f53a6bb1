package store

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
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
	Size      int64     `bun:"size,notnull"` // len(Message), set by AppendHistory
	CreatedAt time.Time `bun:"created_at,notnull"`
	// PublishID is the cluster publish that stamped it ("": none, one node):
	// one row at most per publish (AppendHistory refuses a second).
	PublishID string `bun:"publish_id,nullzero"`
}

// historyUsage is the channel history a project holds, in bytes (the sum
// of its rows' Size), kept by AppendHistory and SweepHistory.
type historyUsage struct {
	bun.BaseModel `bun:"table:history_usage"`

	ProjectID string `bun:"project_id,pk"`
	Bytes     int64  `bun:"bytes,notnull"`
}

// AppendHistory stores msgs in one transaction, with the bytes their
// projects hold, all of them but those whose seq (on their channel) or
// publish is stored already, or whose project is gone (deleted while its
// messages waited): it returns those indexes, in order. A refused row is
// not stored and not counted; the others are, whatever other tenants'
// rows of the batch are.
func (s *Store) AppendHistory(ctx context.Context, msgs []HistoryMessage) (refused []int, err error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	for i := range msgs {
		m := &msgs[i]
		m.CreatedAt = m.CreatedAt.UTC().Truncate(time.Microsecond)
		m.Size = int64(len(m.Message))
	}
	if s.dialect == Postgres {
		return s.appendHistoryPostgres(ctx, msgs)
	}
	// One statement per chunk: SQLite allows 32 766 variables in one, five
	// a row. A row that meets a stored one (its key or its publish) is left
	// out, and the rows stored come back.
	const chunk = 1000
	err = s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		// The rows of projects that still exist (the transaction holds
		// SQLite's write lock: none is deleted meanwhile).
		rows, err := ofLiveProjects(ctx, tx, msgs)
		if err != nil {
			return err
		}
		var stored []historyKey
		for from := 0; from < len(rows); from += chunk {
			part := rows[from:min(from+chunk, len(rows))]
			var got []historyKey
			if _, err := tx.NewInsert().Model(&part).On("CONFLICT DO NOTHING").Returning("project_id, channel, seq, publish_id").Exec(ctx, &got); err != nil {
				return err
			}
			stored = append(stored, got...)
		}
		var added []historyUsage // per project
		refused, added = storedOf(msgs, stored)
		if len(added) == 0 {
			return nil
		}
		// Counted in project order, so that two writers' transactions take
		// the projects' rows in one order (no deadlock).
		slices.SortFunc(added, func(a, b historyUsage) int { return strings.Compare(a.ProjectID, b.ProjectID) })
		_, err = tx.NewInsert().Model(&added).
			On("CONFLICT (project_id) DO UPDATE").Set("bytes = history_usage.bytes + EXCLUDED.bytes").Exec(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return refused, nil
}

// appendHistoryPostgres is AppendHistory in one statement, so one round
// trip and no BEGIN or COMMIT of its own: the rows go in as one array per
// column, and the projects' bytes are counted from what the insert returns
// (in project order: two writers take the rows in one order). A project
// deleted while its messages waited fails the statement (its foreign key):
// it runs once more taking only the rows of projects that exist, so that
// the other tenants' rows are stored (a filter the usual statement does
// without: it costs about 15 % of a commit).
func (s *Store) appendHistoryPostgres(ctx context.Context, msgs []HistoryMessage) ([]int, error) {
	n := len(msgs)
	projects, channels, messages, publishes := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	seqs, sizes, ats := make([]int64, n), make([]int64, n), make([]time.Time, n)
	for i, m := range msgs {
		projects[i], channels[i], messages[i], publishes[i] = m.ProjectID, m.Channel, m.Message, m.PublishID
		seqs[i], sizes[i], ats[i] = m.Seq, m.Size, m.CreatedAt
	}
	args := []any{pgdialect.Array(projects), pgdialect.Array(channels), pgdialect.Array(seqs), pgdialect.Array(messages),
		pgdialect.Array(sizes), pgdialect.Array(ats), pgdialect.Array(publishes)}
	var stored []historyKey
	err := s.db.NewRaw(appendHistoryStatement(""), args...).Scan(ctx, &stored)
	if isForeignKeyViolation(err) {
		stored = stored[:0]
		err = s.db.NewRaw(appendHistoryStatement("WHERE EXISTS (SELECT 1 FROM projects p WHERE p.id = r.project_id)"), args...).Scan(ctx, &stored)
	}
	if err != nil {
		return nil, err
	}
	refused, _ := storedOf(msgs, stored)
	return refused, nil
}

// appendHistoryStatement is appendHistoryPostgres's statement, with where
// filtering the rows.
func appendHistoryStatement(where string) string {
	return `WITH ins AS (
		INSERT INTO channel_messages (project_id, channel, seq, message, size, created_at, publish_id)
		SELECT r.project_id, r.channel, r.seq, r.message, r.size, r.created_at, NULLIF(r.publish_id, '')
		FROM unnest(?::uuid[], ?::text[], ?::bigint[], ?::text[], ?::bigint[], ?::timestamptz[], ?::text[])
			AS r(project_id, channel, seq, message, size, created_at, publish_id)
		` + where + `
		ON CONFLICT DO NOTHING
		RETURNING project_id, channel, seq, publish_id, size
	), counted AS (
		INSERT INTO history_usage (project_id, bytes)
		SELECT project_id, SUM(size) FROM ins GROUP BY project_id ORDER BY project_id
		ON CONFLICT (project_id) DO UPDATE SET bytes = history_usage.bytes + EXCLUDED.bytes
	)
	SELECT project_id, channel, seq, publish_id FROM ins`
}

// ofLiveProjects is msgs without the rows of projects that no longer exist.
func ofLiveProjects(ctx context.Context, tx bun.Tx, msgs []HistoryMessage) ([]HistoryMessage, error) {
	var ids []string
	for _, m := range msgs {
		if !slices.Contains(ids, m.ProjectID) {
			ids = append(ids, m.ProjectID)
		}
	}
	var live []string
	if err := tx.NewSelect().Model((*Project)(nil)).Column("id").Where("id IN (?)", bun.In(ids)).Scan(ctx, &live); err != nil {
		return nil, err
	}
	if len(live) == len(ids) {
		return msgs, nil
	}
	var out []HistoryMessage
	for _, m := range msgs {
		if slices.Contains(live, m.ProjectID) {
			out = append(out, m)
		}
	}
	return out, nil
}

// historyKey is a stored row as RETURNING names it (two rows of one seq in
// a batch differ by their publish).
type historyKey struct {
	ProjectID string `bun:"project_id"`
	Channel   string `bun:"channel"`
	Seq       int64  `bun:"seq"`
	PublishID string `bun:"publish_id"`
}

// storedOf is which of msgs the insert refused (their indexes) given the
// rows it stored, and the bytes it stored per project.
func storedOf(msgs []HistoryMessage, stored []historyKey) (refused []int, added []historyUsage) {
	in := make(map[historyKey]bool, len(stored))
	for _, k := range stored {
		in[k] = true
	}
	for i, m := range msgs {
		k := historyKey{m.ProjectID, m.Channel, m.Seq, m.PublishID}
		if !in[k] {
			refused = append(refused, i)
			continue
		}
		delete(in, k) // a second row of one key in msgs is refused too
		if n := len(added); n > 0 && added[n-1].ProjectID == m.ProjectID {
			added[n-1].Bytes += m.Size
		} else if j := slices.IndexFunc(added, func(u historyUsage) bool { return u.ProjectID == m.ProjectID }); j >= 0 {
			added[j].Bytes += m.Size
		} else {
			added = append(added, historyUsage{ProjectID: m.ProjectID, Bytes: m.Size})
		}
	}
	return refused, added
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
// at now (every stored message of a project whose history is off now),
// then a project's oldest while it holds more than capBytes (0: no cap), at
// most batch rows per statement and maxRows in all, oldest first within a
// project. It returns how many it deleted: maxRows means there may be more
// for the next run. Sweeps may run at once on several nodes: a row is
// counted off its project's bytes by the one that deleted it.
func (s *Store) SweepHistory(ctx context.Context, now time.Time, capBytes int64, batch, maxRows int) (int64, error) {
	var projects []struct {
		ProjectID string `bun:"project_id"`
		Retention int    `bun:"history_retention_seconds"`
		Bytes     int64  `bun:"bytes"`
	}
	// Projects whose history is on, and those that still have rows.
	err := s.db.NewRaw(`SELECT s.project_id, s.history_retention_seconds, COALESCE(h.bytes, 0) AS bytes
		FROM project_settings s LEFT JOIN history_usage h ON h.project_id = s.project_id
		WHERE s.history_retention_seconds > 0 OR EXISTS (SELECT 1 FROM channel_messages m WHERE m.project_id = s.project_id)`).
		Scan(ctx, &projects)
	if err != nil {
		return 0, err
	}
	var deleted int64
	for _, p := range projects {
		cutoff := now.Add(-time.Duration(p.Retention) * time.Second).UTC().Truncate(time.Microsecond)
		for deleted < int64(maxRows) {
			n := min(batch, maxRows-int(deleted))
			k, freed, err := s.deleteOldest(ctx, p.ProjectID, &cutoff, n)
			if err != nil {
				return deleted, err
			}
			deleted += k
			p.Bytes -= freed
			if k < int64(n) {
				break
			}
		}
		// The cap, a step at a time: each step deletes about what the
		// project holds over it, in rows of the size the last step found
		// (the first takes one row to find out).
		rowBytes := int64(0)
		for capBytes > 0 && p.Bytes > capBytes && deleted < int64(maxRows) {
			k, freed, left, err := s.capStep(ctx, p.ProjectID, capBytes, rowBytes, min(batch, maxRows-int(deleted)))
			if err != nil {
				return deleted, err
			}
			deleted += k
			p.Bytes = left
			if k == 0 {
				break // under the cap after all (another node's sweep), or nothing left
			}
			rowBytes = max(1, freed/k)
		}
		if deleted >= int64(maxRows) {
			break
		}
	}
	return deleted, nil
}

// capStep deletes a project's oldest rows while it holds more than
// capBytes: as many as rowBytes says cover what it holds over the cap
// (rounded down: never more than needed for rows of that size; 1 when
// rowBytes is 0), at most n. It reads what the project holds in the same
// transaction, its row locked on PostgreSQL, so sweeps on several nodes
// take turns and none deletes what another already brought under the cap.
// It returns the rows and bytes deleted and what the project holds after.
func (s *Store) capStep(ctx context.Context, projectID string, capBytes, rowBytes int64, n int) (rows, freed, left int64, err error) {
	err = s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		u := historyUsage{ProjectID: projectID}
		q := tx.NewSelect().Model(&u).WherePK()
		if s.dialect == Postgres {
			q = q.For("UPDATE")
		}
		if err := q.Scan(ctx); err != nil {
			return err
		}
		left = u.Bytes
		over := u.Bytes - capBytes
		if over <= 0 {
			return nil
		}
		k := 1
		if rowBytes > 0 {
			k = int(min(max(over/rowBytes, 1), int64(n)))
		}
		var err error
		rows, freed, err = deleteRows(ctx, tx, projectID, nil, k)
		left -= freed
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, 0, nil // no usage row: nothing stored
	}
	return rows, freed, left, err
}

// deleteOldest deletes up to n of a project's oldest rows created before
// cutoff and counts their bytes off its history_usage, in one transaction:
// how many rows and bytes.
func (s *Store) deleteOldest(ctx context.Context, projectID string, cutoff *time.Time, n int) (rows, bytes int64, err error) {
	err = s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var err error
		rows, bytes, err = deleteRows(ctx, tx, projectID, cutoff, n)
		return err
	})
	return rows, bytes, err
}

// deleteRows deletes up to n of a project's oldest rows (those created
// before cutoff; nil: any), by creation time then seq (messages of one
// instant go in seq order, whatever order the store keeps them in), and
// counts their bytes off its history_usage, in tx: how many rows and bytes.
func deleteRows(ctx context.Context, tx bun.Tx, projectID string, cutoff *time.Time, n int) (rows, bytes int64, err error) {
	q := `DELETE FROM channel_messages WHERE (project_id, channel, seq) IN
		(SELECT project_id, channel, seq FROM channel_messages WHERE project_id = ? ORDER BY created_at, seq LIMIT ?) RETURNING size`
	args := []any{projectID, n}
	if cutoff != nil {
		q = `DELETE FROM channel_messages WHERE (project_id, channel, seq) IN
		(SELECT project_id, channel, seq FROM channel_messages WHERE project_id = ? AND created_at < ? ORDER BY created_at, seq LIMIT ?) RETURNING size`
		args = []any{projectID, *cutoff, n}
	}
	var sizes []int64
	if err := tx.NewRaw(q, args...).Scan(ctx, &sizes); err != nil {
		return 0, 0, err
	}
	for _, z := range sizes {
		bytes += z
	}
	if bytes > 0 {
		_, err = tx.NewUpdate().Model((*historyUsage)(nil)).Set("bytes = bytes - ?", bytes).Where("project_id = ?", projectID).Exec(ctx)
	}
	return int64(len(sizes)), bytes, err
}

// clearStaleHistory deletes every message a project still stores from
// before its history was turned off (the sweep deletes them, in time), as
// the history is turned on again. A channel continues seq from its stored
// last message, which must then be one stored since: while the history was
// off its channels delivered messages with higher seqs, stored nowhere.
func clearStaleHistory(ctx context.Context, tx bun.Tx, projectID string) error {
	const batch = 10000
	for {
		n, _, err := deleteRows(ctx, tx, projectID, nil, batch)
		if err != nil || n < batch {
			return err
		}
	}
}

// HistorySeqsOf is the seqs of a channel's stored messages that the given
// publishes stamped (at most a few thousand ids, in one query), by publish
// id; an id with none stored is absent.
func (s *Store) HistorySeqsOf(ctx context.Context, projectID, channel string, publishIDs []string) (map[string]uint64, error) {
	var rows []struct {
		PublishID string `bun:"publish_id"`
		Seq       int64  `bun:"seq"`
	}
	err := s.db.NewSelect().Model((*HistoryMessage)(nil)).Column("publish_id", "seq").
		Where("project_id = ? AND channel = ? AND publish_id IN (?)", projectID, channel, bun.In(publishIDs)).Scan(ctx, &rows)
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(rows))
	for _, r := range rows {
		out[r.PublishID] = uint64(r.Seq)
	}
	return out, nil
}

// HistoryBytes is the channel history a project holds in the store, in
// bytes (0 when none).
func (s *Store) HistoryBytes(ctx context.Context, projectID string) (int64, error) {
	u := historyUsage{ProjectID: projectID}
	err := s.db.NewSelect().Model(&u).WherePK().Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return u.Bytes, err
}

// RecordHistoryUsage writes each project's history bytes now into its usage
// row of day (YYYY-MM-DD, UTC), keeping the day's largest: a row already as
// large is not written again (every node samples every 30 s).
func (s *Store) RecordHistoryUsage(ctx context.Context, day string) error {
	// WHERE in the SELECT: SQLite reads an ON after a bare SELECT as a join's.
	_, err := s.db.NewRaw(`INSERT INTO usage_daily (project_id, day, connection_count, message_count, peak_concurrent_connections,
			deliveries, dropped, slow_consumers_closed, channel_rate_limited, project_rate_limited, client_emit_rate_limited,
			latency_p99_ms, history_bytes)
		SELECT project_id, ?, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, bytes FROM history_usage WHERE bytes > 0
		ON CONFLICT (project_id, day) DO UPDATE SET history_bytes = EXCLUDED.history_bytes
		WHERE usage_daily.history_bytes < EXCLUDED.history_bytes`, day).Exec(ctx)
	return err
}
