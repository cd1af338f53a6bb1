package api

import (
	"context"
	"sync"
	"time"

	"github.com/relayhq/relay/store"
)

// sessionState is the server side of service_session cookies, which stay
// signed JWTs (cmd/relay/OPERATING.md › Abuse limits and faults › Sessions). A cookie is refused once
//
//   - a logout ended it: its session id (jti) is in session_revocations until
//     the cookie could no longer be valid anyway (at most SessionLifetime
//     after its iat), then pruned; or
//   - its user logged out everywhere since it was minted: each user has a
//     session epoch, which that bumps, and a cookie carries the epoch it was
//     minted in. An epoch rather than a "valid after" time, so that a login
//     in the same second as a log-out-everywhere is not caught by it.
//
// Both answers are cached for sessionCacheTTL, so a control-plane request
// costs two map lookups and the store sees about one query per live session
// and user per TTL. Both values only ever grow (revoked stays revoked, epochs
// rise), so the cache keeps the larger of what it holds and what it reads: a
// read that raced a logout on this node cannot bring the old answer back, and
// a logout takes effect here at once. Other nodes see it within the TTL.
type sessionState struct {
	store *store.Store
	now   func() time.Time

	mu      sync.Mutex
	epochs  map[string]cachedValue // user id → current epoch; guarded by mu
	revoked map[string]cachedValue // session id → 1 ended, 0 not; guarded by mu
}

type cachedValue struct {
	v  int64
	at time.Time // when it was read from (or written to) the store
}

const (
	// sessionCacheTTL is how long another node's logout can go unseen here.
	sessionCacheTTL = 10 * time.Second
	// maxSessionCache bounds each map. When it is full, stale entries go,
	// then those holding the default answer (not ended, epoch 0), then all,
	// until a quarter is free (the store still has every answer).
	maxSessionCache = 100_000
)

func newSessionState(st *store.Store, now func() time.Time) *sessionState {
	return &sessionState{store: st, now: now, epochs: map[string]cachedValue{}, revoked: map[string]cachedValue{}}
}

// ended reports whether the server ended sess.
func (st *sessionState) ended(ctx context.Context, sess session) (bool, error) {
	rev, err := st.lookup(ctx, st.revoked, sess.id, func(ctx context.Context) (int64, error) {
		ok, err := st.store.SessionRevoked(ctx, sess.id)
		if ok {
			return 1, err
		}
		return 0, err
	})
	if err != nil || rev != 0 {
		return rev != 0, err
	}
	cur, err := st.epoch(ctx, sess.userID)
	return sess.epoch < cur, err
}

// epoch is the user's current session epoch.
func (st *sessionState) epoch(ctx context.Context, userID string) (int64, error) {
	return st.lookup(ctx, st.epochs, userID, func(ctx context.Context) (int64, error) {
		return st.store.SessionEpoch(ctx, userID)
	})
}

// revoke stores the end of one session, then caches it.
func (st *sessionState) revoke(ctx context.Context, sess session) error {
	err := st.store.RevokeSession(ctx, sess.id, sess.ends)
	st.put(st.revoked, sess.id, 1) // unstored, this node still refuses it while it caches it
	return err
}

// nextEpoch starts a new epoch for the user in the store, then caches it.
func (st *sessionState) nextEpoch(ctx context.Context, userID string) error {
	e, err := st.store.NextSessionEpoch(ctx, userID)
	if err != nil {
		return err
	}
	st.put(st.epochs, userID, e)
	return nil
}

// lookup answers from m while fresh, else from load (errors are not cached).
func (st *sessionState) lookup(ctx context.Context, m map[string]cachedValue, key string, load func(context.Context) (int64, error)) (int64, error) {
	st.mu.Lock()
	c, ok := m[key]
	st.mu.Unlock()
	if ok && st.now().Sub(c.at) < sessionCacheTTL {
		return c.v, nil
	}
	v, err := load(ctx)
	if err != nil {
		return 0, err
	}
	return st.put(m, key, v), nil
}

// put caches v for key, or keeps the larger value already there, and returns
// the value kept.
func (st *sessionState) put(m map[string]cachedValue, key string, v int64) int64 {
	now := st.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	if old, ok := m[key]; ok && old.v > v {
		v = old.v
	}
	if _, ok := m[key]; !ok && len(m) >= maxSessionCache {
		evict(m, func(c cachedValue) bool { return now.Sub(c.at) >= sessionCacheTTL })
		evict(m, func(c cachedValue) bool { return c.v == 0 })
		evict(m, func(cachedValue) bool { return true })
	}
	m[key] = cachedValue{v: v, at: now}
	return v
}

// evict deletes the entries of m that drop says, while m is over three
// quarters of maxSessionCache.
func evict(m map[string]cachedValue, drop func(cachedValue) bool) {
	for k, c := range m {
		if len(m) <= maxSessionCache*3/4 {
			return
		}
		if drop(c) {
			delete(m, k)
		}
	}
}
