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
// daily usage rows (README.md › Webhooks and usage) every USAGE_ROLLUP_SECONDS, and once
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
		k := usageKey{d.ProjectID, day}
		row := u.pending[k]
		row.ProjectID, row.Day = d.ProjectID, day
		row.ConnectionCount += d.Connects
		row.MessageCount += d.Emits
		row.PeakConcurrentConnections = max(row.PeakConcurrentConnections, int64(d.Connections))
		u.pending[k] = row
	}
	for _, d := range u.actors.DrainHealth() {
		k := usageKey{d.ProjectID, day}
		row := u.pending[k]
		row.ProjectID, row.Day = d.ProjectID, day
		f := d.Window.Figures()
		row.Deliveries += f.Deliveries
		row.Dropped += f.Dropped
		row.SlowConsumersClosed += f.SlowClosed
		row.ChannelRateLimited += f.ChannelRateLimited
		row.ProjectRateLimited += f.ProjectRateLimited
		row.ClientEmitRateLimited += f.ClientEmitRateLimited
		if f.P99Ms != nil {
			row.LatencyP99Ms = max(row.LatencyP99Ms, *f.P99Ms)
		}
		u.pending[k] = row
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
