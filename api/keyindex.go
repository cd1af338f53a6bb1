package api

import (
	"context"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/store"
)

// maxIndexedKeys bounds the key index. A key is cached on its first use and
// stays until its project changes or room is needed, so without a bound every
// key ever used since start would stay in memory. 100 000 keys (a few hundred
// bytes each) hold the public and secret key of 50 000 busy projects; a
// larger working set costs one store query per miss, not unbounded memory.
const maxIndexedKeys = 100_000

// indexedKey is what the key index knows of one API key.
type indexedKey struct {
	Hash      string // SHA-256 hex of the raw key, as stored; one string for every lookup of a cached key
	ProjectID string
	Type      string // "public" or "secret"
	Revoked   bool   // revoked, or (as Lookup answers it) past ExpiresAt
	// ExpiresAt ends the overlap window of a key replaced by a rotation
	// (zero: none). Cached with the key, so that every node refuses it from
	// then on, as revoked, with no message at that time.
	ExpiresAt time.Time
	// Authz is the project's channel authorization, read with a public key
	// (nil for a secret key): the handshake checks connection tokens with
	// it. A change of it drops the project's keys (invalidate).
	Authz *actors.ProjectAuthz

	use *keyUse // the cached entry's last use, shared by the copies Lookup returns; nil if not cached
}

// keyUse is when a cached key was last used, in seconds of the server's
// clock, and the last of those handed to the store.
type keyUse struct {
	last, flushed atomic.Int64
}

// errUnknownKey is returned by a keyLoader for a hash no key has.
var errUnknownKey = errors.New("unknown key")

// keyLoader finds a key by the SHA-256 hex of its raw value.
type keyLoader func(ctx context.Context, hash string) (indexedKey, error)

// storeKeys loads keys from the store.
func storeKeys(st *store.Store) keyLoader {
	return func(ctx context.Context, hash string) (indexedKey, error) {
		k, err := st.KeyByHash(ctx, hash)
		if errors.Is(err, store.ErrNotFound) {
			return indexedKey{}, errUnknownKey
		}
		if err != nil {
			return indexedKey{}, err
		}
		ik := indexedKey{ProjectID: k.ProjectID, Type: k.KeyType, Revoked: !k.Active()}
		if k.ExpiresAt != nil {
			ik.ExpiresAt = *k.ExpiresAt
		}
		if k.KeyType == "public" {
			p, err := st.Project(ctx, k.ProjectID)
			if err != nil && !errors.Is(err, store.ErrNotFound) { // not found: the key is refused for its project anyway
				return indexedKey{}, err
			}
			az := ProjectAuthz(p, time.Now())
			ik.Authz = &az
		}
		return ik, nil
	}
}

// ProjectAuthz is p's channel authorization as the handshake and the
// project actor read it at now: the previous secret while its overlap
// lasts (PreviousUntil ends it later for a reading kept that long).
func ProjectAuthz(p store.Project, now time.Time) actors.ProjectAuthz {
	az := actors.ProjectAuthz{On: p.Authorization, JWKSURL: p.AuthJWKSURL, Private: privateChannelsOf(p.PrivateChannels),
		Secrets: p.AuthSecretsAt(now)}
	if len(az.Secrets) > 1 {
		az.PreviousUntil = *p.AuthSecretPreviousUntil
	}
	return az
}

// keyIndex caches keys by hash at the edge so that no emit or handshake
// queries the store once a key is known. invalidate drops a project's entries
// at once, so a revoked or rotated key fails on the very next request.
//
// It holds at most max keys. When it is full, a new key replaces a random one
// (Go's map iteration starts at a random place): no bookkeeping on a hit, so
// lookups of known keys share a read lock, and an evicted key that is still in
// use costs one store query to come back.
type keyIndex struct {
	load keyLoader
	max  int
	now  func() time.Time // the server's clock: overlap windows end by it

	// clock is now() in Unix seconds as of the last tick: what a use is
	// stamped with, read on the hot path without a clock call.
	clock atomic.Int64
	// changed is set by every invalidate: the expiry watcher reloads.
	changed atomic.Bool

	mu        sync.RWMutex
	byHash    map[keyDigest]indexedKey
	byProject map[string][]keyDigest // the digests of byHash, by project
	gen       uint64                 // bumped by every invalidate; a load that raced one is not cached
	// unflushed holds the last uses of keys dropped from the index before
	// they were handed to the store (at most max of them).
	unflushed map[string]int64
}

// newKeyIndex returns an empty index over load holding at most max keys.
func newKeyIndex(load keyLoader, max int) *keyIndex {
	if max < 1 {
		max = 1
	}
	x := &keyIndex{load: load, max: max, now: time.Now, byHash: map[keyDigest]indexedKey{}, byProject: map[string][]keyDigest{}, unflushed: map[string]int64{}}
	x.clock.Store(x.now().Unix())
	return x
}

// expired marks k revoked when its overlap window has ended.
func (x *keyIndex) expired(k indexedKey) indexedKey {
	if !k.ExpiresAt.IsZero() && !x.now().Before(k.ExpiresAt) {
		k.Revoked = true
	}
	return k
}

// Lookup returns the key for raw. ok is false for an unknown key; err is set
// only when the store could not answer.
func (x *keyIndex) Lookup(ctx context.Context, raw string) (k indexedKey, ok bool, err error) {
	d := digestKey(raw)
	x.mu.RLock()
	k, ok = x.byHash[d]
	gen := x.gen
	x.mu.RUnlock()
	if ok {
		if !k.ExpiresAt.IsZero() { // a key in its overlap window: only these read the clock
			k = x.expired(k)
		}
		return k, true, nil
	}
	hash := hex.EncodeToString(d[:])
	k, err = x.load(ctx, hash)
	if errors.Is(err, errUnknownKey) {
		return indexedKey{}, false, nil // not cached: unknown hashes are unbounded
	}
	if err != nil {
		return indexedKey{}, false, err
	}
	k.Hash = hash
	x.mu.Lock()
	defer x.mu.Unlock()
	if cached, dup := x.byHash[d]; dup {
		return x.expired(cached), true, nil
	}
	if x.gen != gen {
		return x.expired(k), true, nil
	}
	if len(x.byHash) >= x.max {
		x.evictOne()
	}
	k.use = &keyUse{}
	x.byHash[d] = k
	x.byProject[k.ProjectID] = append(x.byProject[k.ProjectID], d)
	return x.expired(k), true, nil
}

// used records that k authenticated a request: on the hot path, one atomic
// load, and a store at most once a second per key. The store hears of it
// at the next flushUses.
func (x *keyIndex) used(k indexedKey) {
	if k.use == nil {
		return // not cached (a load that raced an invalidation): rare, the next use counts
	}
	if now := x.clock.Load(); k.use.last.Load() < now {
		k.use.last.Store(now)
	}
}

// tick moves the clock uses are stamped with to now.
func (x *keyIndex) tick(now time.Time) { x.clock.Store(now.Unix()) }

// keepUnflushed keeps k's last use for the next flush when k leaves the
// index. x.mu is held.
func (x *keyIndex) keepUnflushed(k indexedKey) {
	if k.use == nil {
		return
	}
	last := k.use.last.Load()
	if last <= k.use.flushed.Load() {
		return
	}
	if prev, ok := x.unflushed[k.Hash]; ok || len(x.unflushed) < x.max {
		x.unflushed[k.Hash] = max(prev, last)
	}
}

// takeUses returns the uses not yet handed to the store, and counts them as
// handed: each key at most once, with its latest use.
func (x *keyIndex) takeUses() []store.KeyUse {
	var out []store.KeyUse
	x.mu.RLock() // lookups go on meanwhile: the uses are atomics
	for _, k := range x.byHash {
		if last := k.use.last.Load(); last > k.use.flushed.Load() {
			k.use.flushed.Store(last)
			out = append(out, store.KeyUse{KeyHash: k.Hash, At: time.Unix(last, 0).UTC()})
		}
	}
	x.mu.RUnlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, u := range out {
		if prev, ok := x.unflushed[u.KeyHash]; ok {
			if prev > u.At.Unix() {
				out[i].At = time.Unix(prev, 0).UTC()
			}
			delete(x.unflushed, u.KeyHash)
		}
	}
	for hash, last := range x.unflushed {
		out = append(out, store.KeyUse{KeyHash: hash, At: time.Unix(last, 0).UTC()})
	}
	clear(x.unflushed)
	return out
}

// giveBack keeps uses the store did not take for the next flush.
func (x *keyIndex) giveBack(uses []store.KeyUse) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, u := range uses {
		last := u.At.Unix()
		if prev, ok := x.unflushed[u.KeyHash]; ok || len(x.unflushed) < x.max {
			x.unflushed[u.KeyHash] = max(prev, last)
		}
	}
}

// evictOne forgets one key, whichever the map yields first. x.mu is held.
func (x *keyIndex) evictOne() {
	for d, k := range x.byHash {
		x.keepUnflushed(k)
		delete(x.byHash, d)
		ds := x.byProject[k.ProjectID]
		for i := range ds {
			if ds[i] == d {
				ds[i] = ds[len(ds)-1]
				ds = ds[:len(ds)-1]
				break
			}
		}
		if len(ds) == 0 {
			delete(x.byProject, k.ProjectID)
		} else {
			x.byProject[k.ProjectID] = ds
		}
		return
	}
}

// invalidate forgets every key of a project.
func (x *keyIndex) invalidate(projectID string) {
	x.mu.Lock()
	for _, d := range x.byProject[projectID] {
		x.keepUnflushed(x.byHash[d])
		delete(x.byHash, d)
	}
	delete(x.byProject, projectID)
	x.gen++
	x.mu.Unlock()
	x.changed.Store(true)
}

// invalidateAll forgets every key, as if each project had changed.
func (x *keyIndex) invalidateAll() {
	x.mu.Lock()
	for _, k := range x.byHash {
		x.keepUnflushed(k)
	}
	clear(x.byHash)
	clear(x.byProject)
	x.gen++
	x.mu.Unlock()
	x.changed.Store(true)
}

// size is the number of cached keys.
func (x *keyIndex) size() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byHash)
}
