package api

import (
	"context"
	"encoding/hex"
	"errors"
	"sync"

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
	Revoked   bool
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
		return indexedKey{ProjectID: k.ProjectID, Type: k.KeyType, Revoked: !k.Active()}, nil
	}
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

	mu        sync.RWMutex
	byHash    map[keyDigest]indexedKey
	byProject map[string][]keyDigest // the digests of byHash, by project
	gen       uint64                 // bumped by every invalidate; a load that raced one is not cached
}

// newKeyIndex returns an empty index over load holding at most max keys.
func newKeyIndex(load keyLoader, max int) *keyIndex {
	if max < 1 {
		max = 1
	}
	return &keyIndex{load: load, max: max, byHash: map[keyDigest]indexedKey{}, byProject: map[string][]keyDigest{}}
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
	if _, dup := x.byHash[d]; x.gen != gen || dup {
		return k, true, nil
	}
	if len(x.byHash) >= x.max {
		x.evictOne()
	}
	x.byHash[d] = k
	x.byProject[k.ProjectID] = append(x.byProject[k.ProjectID], d)
	return k, true, nil
}

// evictOne forgets one key, whichever the map yields first. x.mu is held.
func (x *keyIndex) evictOne() {
	for d, k := range x.byHash {
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
		delete(x.byHash, d)
	}
	delete(x.byProject, projectID)
	x.gen++
	x.mu.Unlock()
}

// size is the number of cached keys.
func (x *keyIndex) size() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byHash)
}
