package api

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// fakeKeys is a key store for the index: raw keys by hash, with a count of loads.
type fakeKeys struct {
	mu    sync.Mutex
	keys  map[string]indexedKey // by HashKey
	loads map[string]int
	down  bool // every load fails
	// afterRead, when set, is called by each load after it has read the keys.
	afterRead func()
}

func newFakeKeys() *fakeKeys {
	return &fakeKeys{keys: map[string]indexedKey{}, loads: map[string]int{}}
}

func (f *fakeKeys) put(raw string, k indexedKey) {
	f.mu.Lock()
	f.keys[HashKey(raw)] = k
	f.mu.Unlock()
}

func (f *fakeKeys) loadsOf(raw string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads[HashKey(raw)]
}

func (f *fakeKeys) load(_ context.Context, hash string) (indexedKey, error) {
	f.mu.Lock()
	f.loads[hash]++
	k, ok := f.keys[hash]
	down := f.down
	f.mu.Unlock()
	if f.afterRead != nil {
		f.afterRead()
	}
	switch {
	case down:
		return indexedKey{}, errors.New("store down")
	case !ok:
		return indexedKey{}, errUnknownKey
	}
	return k, nil
}

func lookup(t *testing.T, x *keyIndex, raw string) (indexedKey, bool) {
	t.Helper()
	k, ok, err := x.Lookup(context.Background(), raw)
	if err != nil {
		t.Fatalf("Lookup(%s): %v", raw, err)
	}
	return k, ok
}

// checkConsistent fails unless byProject lists exactly the digests of byHash,
// each under its own project, once.
func checkConsistent(t *testing.T, x *keyIndex) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	seen := map[keyDigest]bool{}
	for p, ds := range x.byProject {
		if len(ds) == 0 {
			t.Errorf("project %s kept with no keys", p)
		}
		for _, d := range ds {
			k, ok := x.byHash[d]
			switch {
			case !ok:
				t.Errorf("project %s lists a digest the index does not hold", p)
			case k.ProjectID != p:
				t.Errorf("a key of %s listed under %s", k.ProjectID, p)
			case seen[d]:
				t.Errorf("a digest listed twice under %s", p)
			}
			seen[d] = true
		}
	}
	if len(seen) != len(x.byHash) {
		t.Errorf("byProject lists %d keys, byHash holds %d", len(seen), len(x.byHash))
	}
}

func TestKeyIndexCachesUntilInvalidated(t *testing.T) {
	f := newFakeKeys()
	f.put("pk_a", indexedKey{ProjectID: "A", Type: "public"})
	f.put("sk_a", indexedKey{ProjectID: "A", Type: "secret"})
	f.put("pk_b", indexedKey{ProjectID: "B", Type: "public"})
	x := newKeyIndex(f.load, 10)

	for range 3 {
		for _, raw := range []string{"pk_a", "sk_a", "pk_b"} {
			if _, ok := lookup(t, x, raw); !ok {
				t.Fatalf("%s unknown", raw)
			}
		}
	}
	for _, raw := range []string{"pk_a", "sk_a", "pk_b"} {
		if n := f.loadsOf(raw); n != 1 {
			t.Fatalf("%s loaded %d times, want once", raw, n)
		}
	}

	// The store changes first, then the index is told (as projectOps does):
	// the very next lookup sees the change.
	f.put("pk_a", indexedKey{ProjectID: "A", Type: "public", Revoked: true})
	x.invalidate("A")
	if k, _ := lookup(t, x, "pk_a"); !k.Revoked {
		t.Fatal("revoked key still served from the index after invalidate")
	}
	lookup(t, x, "pk_b")
	if n := f.loadsOf("pk_b"); n != 1 {
		t.Fatalf("another project's key loaded %d times, want once", n)
	}
	checkConsistent(t, x)
}

func TestKeyIndexUnknownAndFailedLoadsNotCached(t *testing.T) {
	f := newFakeKeys()
	x := newKeyIndex(f.load, 10)
	for range 2 {
		if _, ok := lookup(t, x, "sk_nope"); ok {
			t.Fatal("unknown key found")
		}
	}
	if n := f.loadsOf("sk_nope"); n != 2 {
		t.Fatalf("unknown key loaded %d times, want 2 (never cached)", n)
	}

	f.put("sk_a", indexedKey{ProjectID: "A", Type: "secret"})
	f.down = true
	if _, _, err := x.Lookup(context.Background(), "sk_a"); err == nil {
		t.Fatal("a failed load returned no error")
	}
	f.down = false
	if k, ok := lookup(t, x, "sk_a"); !ok || k.ProjectID != "A" {
		t.Fatalf("after the store came back: %+v, %v", k, ok)
	}
	if x.size() != 1 {
		t.Fatalf("size %d, want 1", x.size())
	}
}

func TestKeyIndexCap(t *testing.T) {
	const max = 3
	f := newFakeKeys()
	raw := func(i int) string { return fmt.Sprintf("pk_%d", i) }
	project := func(i int) string { return fmt.Sprintf("P%d", i%4) }
	for i := range 10 {
		f.put(raw(i), indexedKey{ProjectID: project(i), Type: "public"})
	}
	x := newKeyIndex(f.load, max)
	for round := range 3 {
		for i := range 10 {
			k, ok := lookup(t, x, raw(i))
			if !ok || k.ProjectID != project(i) {
				t.Fatalf("round %d: %s = %+v, %v", round, raw(i), k, ok)
			}
			if x.size() > max {
				t.Fatalf("round %d: %d keys held, cap %d", round, x.size(), max)
			}
			checkConsistent(t, x)
		}
	}
	if x.size() != max {
		t.Fatalf("%d keys held, want the cap %d", x.size(), max)
	}

	// Invalidation still finds every held key of a project.
	for i := range 4 {
		x.invalidate(project(i))
		checkConsistent(t, x)
	}
	if x.size() != 0 || len(x.byProject) != 0 {
		t.Fatalf("after invalidating every project: %d keys, %d projects", x.size(), len(x.byProject))
	}
}

// A load that read the store before a change and finishes after the
// change's invalidate must not put its stale answer in the index: the next
// lookup loads again and sees the change.
func TestKeyIndexInvalidateRacingLoad(t *testing.T) {
	f := newFakeKeys()
	f.put("sk_a", indexedKey{ProjectID: "A", Type: "secret"})
	read, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.afterRead = func() {
		once.Do(func() { // only the first load waits
			close(read)
			<-release
		})
	}
	x := newKeyIndex(f.load, 10)

	stale := make(chan indexedKey)
	go func() {
		k, _, err := x.Lookup(context.Background(), "sk_a")
		if err != nil {
			t.Error(err)
		}
		stale <- k
	}()
	<-read // the load holds the active key
	f.put("sk_a", indexedKey{ProjectID: "A", Type: "secret", Revoked: true})
	x.invalidate("A")
	close(release)
	if k := <-stale; k.Revoked {
		t.Fatal("the racing load did not read before the revoke; the test is void")
	}
	if x.size() != 0 {
		t.Fatalf("a load that raced an invalidate was cached (%d keys)", x.size())
	}
	if k, _ := lookup(t, x, "sk_a"); !k.Revoked {
		t.Fatal("the lookup after the invalidate did not see the revoke")
	}
	if n := f.loadsOf("sk_a"); n != 2 {
		t.Fatalf("loaded %d times, want 2", n)
	}
	lookup(t, x, "sk_a")
	if n := f.loadsOf("sk_a"); n != 2 {
		t.Fatalf("not cached after the race: loaded %d times, want 2", n)
	}
}

func TestKeyIndexConcurrent(t *testing.T) {
	const keys, projects, max = 64, 8, 16
	f := newFakeKeys()
	raw := func(i int) string { return fmt.Sprintf("sk_%d", i) }
	for i := range keys {
		f.put(raw(i), indexedKey{ProjectID: fmt.Sprint(i % projects), Type: "secret"})
	}
	x := newKeyIndex(f.load, max)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				n := (i*7 + g*13) % keys
				k, ok, err := x.Lookup(context.Background(), raw(n))
				if err != nil || !ok || k.ProjectID != fmt.Sprint(n%projects) {
					t.Errorf("%s = %+v, %v, %v", raw(n), k, ok, err)
					return
				}
				if g%4 == 0 && i%10 == 0 {
					x.invalidate(fmt.Sprint(i % projects))
				}
			}
		})
	}
	wg.Wait()
	if x.size() > max {
		t.Fatalf("%d keys held, cap %d", x.size(), max)
	}
	checkConsistent(t, x)
}
