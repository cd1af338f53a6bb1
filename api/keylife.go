package api

import (
	"context"
	"time"

	"github.com/relayhq/relay/store"
)

// The background side of the keys (api/README.md › Keys: rotation with an
// overlap, last used): nothing here runs on an emit or a handshake. Each
// node calls KeyTick every second and FlushKeyUse once at shutdown.

// keyUseFlushEvery is how often a node writes the keys' last uses: a key's
// last_used_at moves at most once per this, by the server's clock.
const keyUseFlushEvery = time.Minute

// expiryBatch bounds the overlap windows a node holds in memory at once; it
// asks for the next ones when these have ended.
const expiryBatch = 1000

// expiryRetry is how soon a node asks again for the windows when the store
// did not answer.
const expiryRetry = 5 * time.Second

// keyLife is the state of KeyTick, used by one goroutine at a time.
type keyLife struct {
	lastFlush time.Time // of the uses, by the server's clock

	// The unrevoked keys whose window ends after checked, soonest first
	// (pending), as last read from the store; full when the read hit
	// expiryBatch, so more may follow.
	pending  []store.ExpiringKey
	checked  time.Time
	full     bool
	reloadAt time.Time
}

// KeyTick does the keys' periodic work at the server's now: it moves the
// clock uses are stamped with, writes the last uses once a minute, and
// closes the sockets opened with a public key whose overlap window ended
// (4001, as for a revoked key). A key change seen on this node (its API, or
// another member's through ForgetKeys) makes it read the windows again, so
// a window ending within seconds is closed on time.
func (s *Server) KeyTick(ctx context.Context) {
	now := s.now()
	s.keys.tick(now)
	if now.Sub(s.life.lastFlush) >= keyUseFlushEvery {
		s.life.lastFlush = now
		s.flushKeyUse(ctx)
	}
	s.expireKeys(ctx, now)
}

// FlushKeyUse writes the last uses not written yet (at shutdown, after the
// last request).
func (s *Server) FlushKeyUse(ctx context.Context) { s.flushKeyUse(ctx) }

func (s *Server) flushKeyUse(ctx context.Context) {
	uses := s.keys.takeUses()
	if len(uses) == 0 {
		return
	}
	if err := s.store.RecordKeyUse(ctx, uses); err != nil {
		s.log.Warn("record key use", "keys", len(uses), "err", err)
		s.keys.giveBack(uses) // the next flush tries again
	}
}

// expireKeys closes, on this node, the sockets of the public keys whose
// window ended by now.
func (s *Server) expireKeys(ctx context.Context, now time.Time) {
	l := &s.life
	if s.keys.changed.Swap(false) || !now.Before(l.reloadAt) || (l.full && len(l.pending) == 0) {
		ks, err := s.store.KeysExpiringAfter(ctx, l.checked, expiryBatch)
		if err != nil {
			// Tried again in a few seconds (not every tick: one warning
			// per try while the store is away).
			s.log.Warn("list expiring keys", "err", err)
			l.reloadAt = now.Add(expiryRetry)
		} else {
			l.pending, l.full, l.reloadAt = ks, len(ks) == expiryBatch, now.Add(time.Minute)
		}
	}
	n := 0
	for n < len(l.pending) && !l.pending[n].ExpiresAt.After(now) {
		n++
	}
	if n == 0 {
		return
	}
	due := l.pending[:n]
	l.pending = l.pending[n:]
	l.checked = due[n-1].ExpiresAt
	byProject := map[string][]string{}
	for _, k := range due {
		if k.KeyType == "public" { // a secret key has no socket
			byProject[k.ProjectID] = append(byProject[k.ProjectID], k.KeyHash)
		}
	}
	for id, hashes := range byProject {
		s.closeKeySockets(ctx, id, hashes)
	}
}

// closeKeySockets closes this node's sockets opened with these keys; every
// node does the same for its own at the window's end, with no message
// between nodes.
func (s *Server) closeKeySockets(_ context.Context, projectID string, hashes []string) {
	if s.actors != nil {
		s.actors.CloseKeySockets(projectID, hashes)
	}
}
