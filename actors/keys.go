package actors

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
)

// KeyIndex caches keys by hash at the edge so that no emit or handshake queries
// the store once a key is known. Invalidate drops a project's entries at once,
// so a revoked or rotated key fails on the very next request.
type KeyIndex struct {
	load KeyLoader

	mu        sync.RWMutex
	byHash    map[string]Key
	byProject map[string][]string
	gen       uint64 // bumped by every Invalidate; a load that raced one is not cached
}

// NewKeyIndex returns an empty index over load.
func NewKeyIndex(load KeyLoader) *KeyIndex {
	return &KeyIndex{load: load, byHash: map[string]Key{}, byProject: map[string][]string{}}
}

// HashKey is the SHA-256 hex under which a raw key is stored.
func HashKey(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:])
}

// Lookup returns the key for raw. ok is false for an unknown key; err is set
// only when the store could not answer.
func (x *KeyIndex) Lookup(ctx context.Context, raw string) (k Key, ok bool, err error) {
	hash := HashKey(raw)
	x.mu.RLock()
	k, ok = x.byHash[hash]
	gen := x.gen
	x.mu.RUnlock()
	if ok {
		return k, true, nil
	}
	k, err = x.load(ctx, hash)
	if err == ErrUnknownKey {
		return Key{}, false, nil // not cached: unknown hashes are unbounded
	}
	if err != nil {
		return Key{}, false, err
	}
	x.mu.Lock()
	if x.gen == gen {
		if _, dup := x.byHash[hash]; !dup {
			x.byHash[hash] = k
			x.byProject[k.ProjectID] = append(x.byProject[k.ProjectID], hash)
		}
	}
	x.mu.Unlock()
	return k, true, nil
}

// Invalidate forgets every key of a project.
func (x *KeyIndex) Invalidate(projectID string) {
	x.mu.Lock()
	for _, h := range x.byProject[projectID] {
		delete(x.byHash, h)
	}
	delete(x.byProject, projectID)
	x.gen++
	x.mu.Unlock()
}

// Len is the number of cached keys.
func (x *KeyIndex) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byHash)
}
