package api

import (
	"context"
	"sync"
	"testing"
	"time"
)

// testClock is a clock a test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestKeyIndexExpiry: a cached key with an overlap window is refused, as
// revoked, once the index's clock reaches its end, with no reload and no
// invalidation; a key without a window never reads the clock.
func TestKeyIndexExpiry(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)}
	f := newFakeKeys()
	f.put("sk_old", indexedKey{ProjectID: "A", Type: "secret", ExpiresAt: clock.Now().Add(time.Minute)})
	f.put("sk_new", indexedKey{ProjectID: "A", Type: "secret"})
	x := newKeyIndex(f.load, 10)
	x.now = clock.Now
	for _, raw := range []string{"sk_old", "sk_new"} {
		if k, ok := lookup(t, x, raw); !ok || k.Revoked {
			t.Fatalf("%s in the window: %+v %v", raw, k, ok)
		}
	}
	clock.add(59 * time.Second)
	if k, _ := lookup(t, x, "sk_old"); k.Revoked {
		t.Fatal("refused before the end of its window")
	}
	clock.add(time.Second)
	if k, _ := lookup(t, x, "sk_old"); !k.Revoked {
		t.Fatal("accepted at the end of its window")
	}
	if k, _ := lookup(t, x, "sk_new"); k.Revoked {
		t.Fatal("the new key is refused")
	}
	if n := f.loadsOf("sk_old"); n != 1 {
		t.Fatalf("%d loads of the old key, want 1 (the end is cached with it)", n)
	}
	// A fresh load of an already expired key is refused too.
	x.invalidate("A")
	if k, _ := lookup(t, x, "sk_old"); !k.Revoked {
		t.Fatal("an expired key loaded again is accepted")
	}
}

// TestKeyIndexUses: uses are stamped with the tick's clock, handed to the
// store once each with the latest time, and kept when the key leaves the
// index before the flush.
func TestKeyIndexUses(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)}
	f := newFakeKeys()
	f.put("pk_a", indexedKey{ProjectID: "A", Type: "public"})
	f.put("sk_a", indexedKey{ProjectID: "A", Type: "secret"})
	f.put("sk_b", indexedKey{ProjectID: "B", Type: "secret"})
	x := newKeyIndex(f.load, 10)
	x.now = clock.Now
	x.tick(clock.Now())
	t0 := clock.Now()

	if uses := x.takeUses(); len(uses) != 0 {
		t.Fatalf("uses before any: %+v", uses)
	}
	use := func(raw string) {
		k, _ := lookup(t, x, raw)
		x.used(k)
	}
	use("sk_a")
	use("sk_b")
	clock.add(10 * time.Second)
	x.tick(clock.Now())
	use("sk_b")
	use("sk_b")
	uses := x.takeUses()
	got := map[string]time.Time{}
	for _, u := range uses {
		got[u.KeyHash] = u.At
	}
	if len(uses) != 2 || !got[HashKey("sk_a")].Equal(t0) || !got[HashKey("sk_b")].Equal(t0.Add(10*time.Second)) {
		t.Fatalf("uses %+v", uses)
	}
	if uses := x.takeUses(); len(uses) != 0 {
		t.Fatalf("uses handed twice: %+v", uses)
	}

	// Used, then dropped from the index (a rotation), then flushed.
	clock.add(time.Minute)
	x.tick(clock.Now())
	use("pk_a")
	x.invalidate("A")
	uses = x.takeUses()
	if len(uses) != 1 || uses[0].KeyHash != HashKey("pk_a") || !uses[0].At.Equal(clock.Now()) {
		t.Fatalf("uses after invalidate: %+v", uses)
	}
	// Given back after a failed write: handed again.
	x.giveBack(uses)
	if again := x.takeUses(); len(again) != 1 || again[0] != uses[0] {
		t.Fatalf("given back %+v, taken %+v", uses, again)
	}
}

func BenchmarkKeyLookupUsed(b *testing.B) {
	f := newFakeKeys()
	f.put("sk_a", indexedKey{ProjectID: "A", Type: "secret"})
	x := newKeyIndex(f.load, 10)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k, _, _ := x.Lookup(context.Background(), "sk_a")
			x.used(k)
		}
	})
}
