package api

import (
	"context"
	"time"

	"github.com/relayhq/relay/store"
)

// Key changes made by another process (README.md › Version and admin
// command line): `relay admin revoke-key` or `rotate-key`, or another node
// that is not in this node's cluster, writes only the store. The store
// numbers every key change in commit order (store.KeyChange); each node
// reads the ones past the last it applied, once a second, and applies each
// as its own API does: it drops the project's cached keys and closes this
// node's sockets opened with a revoked public key (4001). A change this node
// made itself, or heard of from its cluster, is applied again: both steps
// are idempotent.

// keyChangeBatch bounds the changes read at once; a node further behind
// reads on at once.
const keyChangeBatch = 1000

// keyChangeReadTimeout bounds one read, so a store that hangs delays the
// next read rather than stopping them.
const keyChangeReadTimeout = 5 * time.Second

// keyWatchWarnEvery spaces the warnings while the store does not answer.
const keyWatchWarnEvery = time.Minute

// keyWatch is WatchKeyChanges' state, used by one goroutine at a time.
type keyWatch struct {
	last   int64     // the number of the last change applied
	down   bool      // the last read failed
	warned time.Time // of the last warning that it failed, by the wall clock
}

// WatchKeyChanges applies the key changes committed since the last call
// (cmd/relay calls it every second). A store that does not answer is
// logged at most once a minute, and the changes are read when it is back.
func (s *Server) WatchKeyChanges(ctx context.Context) {
	w := &s.watch
	for {
		rctx, cancel := context.WithTimeout(ctx, keyChangeReadTimeout)
		cs, err := s.store.KeyChangesAfter(rctx, w.last, keyChangeBatch)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return // shutting down
			}
			if now := time.Now(); !w.down || now.Sub(w.warned) >= keyWatchWarnEvery {
				s.log.Warn("read key changes: keys revoked by another process are not applied until the store answers", "err", err)
				w.warned = now
			}
			w.down = true
			return
		}
		if w.down {
			s.log.Info("read key changes: the store answers again")
			w.down = false
		}
		if len(cs) > 0 && cs[0].Seq != w.last+1 {
			// Changes this node never read were pruned (it could not read the
			// store for longer than they are kept): which projects they
			// touched is unknown, so every cached key goes.
			s.log.Warn("key changes were pruned before this node read them: every cached key dropped; "+
				"sockets of keys revoked meanwhile stay open", "after", w.last, "next", cs[0].Seq)
			s.keys.invalidateAll()
			if s.actors != nil {
				s.actors.ReloadAllSettings()
			}
		}
		for _, c := range cs {
			s.applyKeyChange(ctx, c)
			w.last = c.Seq
		}
		if len(cs) < keyChangeBatch {
			return
		}
	}
}

// applyKeyChange makes one stored key change take effect on this node.
func (s *Server) applyKeyChange(ctx context.Context, c store.KeyChange) {
	if c.KeysStale {
		s.keys.invalidate(c.ProjectID)
	}
	if c.SettingsStale && s.actors != nil {
		s.actors.ReloadSettings(c.ProjectID) // made elsewhere (relay admin), or here and already applied: loaded again, once
	}
	if len(c.Revoked) > 0 {
		s.closeKeySockets(ctx, c.ProjectID, c.Revoked)
	}
	s.log.Debug("key change applied", "project", c.ProjectID, "seq", c.Seq, "revoked", len(c.Revoked))
}
