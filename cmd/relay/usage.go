package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/store"
)

// usageRollup moves the project actors' connect and emit counters into the
// daily usage rows (api/README.md › Webhooks and usage) every USAGE_ROLLUP_SECONDS, and once
// more at shutdown. Counts the store refused wait in memory for the next try.
type usageRollup struct {
	store   *store.Store
	actors  *actors.System
	log     *slog.Logger
	now     func() time.Time
	pending map[usageKey]store.Usage
}

type usageKey struct{ project, day string }

func newUsageRollup(st *store.Store, sys *actors.System, log *slog.Logger) *usageRollup {
	return &usageRollup{store: st, actors: sys, log: log, now: time.Now, pending: map[usageKey]store.Usage{}}
}

// add merges counts into the day's pending row of their project.
func (u *usageRollup) add(day string, counts store.Usage) {
	k := usageKey{counts.ProjectID, day}
	row := u.pending[k]
	row.ProjectID, row.Day = counts.ProjectID, day
	row.Merge(counts)
	u.pending[k] = row
}

// flush drains the counters into rows for today (UTC) and writes every
// pending row; the live connection count is the peak sample. The delivery
// health columns come from the live figures' undrained counts; the latency
// column keeps the worst p99 of one interval.
func (u *usageRollup) flush(ctx context.Context) {
	day := u.now().UTC().Format(time.DateOnly)
	for _, d := range u.actors.DrainUsage(ctx) {
		if d.Connects == 0 && d.Emits == 0 && d.Connections == 0 {
			continue
		}
		u.add(day, store.Usage{ProjectID: d.ProjectID, ConnectionCount: d.Connects, MessageCount: d.Emits,
			PeakConcurrentConnections: int64(d.Connections)})
	}
	for _, d := range u.actors.DrainHealth() {
		f := d.Window.Figures()
		row := store.Usage{ProjectID: d.ProjectID, Deliveries: f.Deliveries, Dropped: f.Dropped, SlowConsumersClosed: f.SlowClosed,
			ChannelRateLimited: f.ChannelRateLimited, ProjectRateLimited: f.ProjectRateLimited, ClientEmitRateLimited: f.ClientEmitRateLimited}
		if f.P99Ms != nil {
			row.LatencyP99Ms = *f.P99Ms
		}
		u.add(day, row)
	}
	failed := 0
	var lastErr error
	for k, row := range u.pending {
		err := u.store.AddUsage(ctx, row)
		switch {
		case err == nil, errors.Is(err, store.ErrNotFound): // written, or the project is gone
			delete(u.pending, k)
		default:
			failed++
			lastErr = err
		}
	}
	if failed > 0 {
		u.log.Warn("usage rollup: rows kept for the next try", "rows", failed, "err", lastErr)
	}
}
