package api

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/relayhq/relay/store"
)

// Readiness of the store (GET /readyz) is a committed write, not a ping: a
// database that answers reads but cannot commit (a SQLite file deleted or
// made read-only, a full disk, a PostgreSQL standby) must answer 503, for
// whoever pages on it. Load balancers check GET /readyz/traffic instead
// (Server.handleReadyzTraffic): with the store down the node still serves
// known keys, and taking every node out at once would be a total outage.
const (
	readyTimeout  = time.Second // a slower commit counts as a failure
	readyCacheFor = time.Second // one write per second at most, however often /readyz is polled
)

// readiness caches the last write check.
type readiness struct {
	mu      sync.Mutex // held during a check: concurrent probes wait for its answer
	checked bool
	at      time.Time // when err was found (wall clock: this is about real time passing)
	err     error
}

// check answers the cached result while it is fresh, else commits a write
// to st, and logs each change between ready and not ready once.
func (rd *readiness) check(ctx context.Context, st *store.Store, log *slog.Logger) error {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.checked && time.Since(rd.at) < readyCacheFor {
		return rd.err
	}
	// Not cut short by a prober that hangs up: the answer is shared.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	err := st.CheckWrite(cctx)
	cancel()
	switch {
	case err != nil && (rd.err == nil || !rd.checked):
		log.Warn("not ready: the store cannot commit a write", "err", err)
	case err == nil && rd.err != nil:
		log.Info("ready again: the store commits writes")
	}
	rd.checked, rd.at, rd.err = true, time.Now(), err
	return err
}
