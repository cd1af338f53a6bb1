package store_test

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestKeyChanges: every revoke, rotation and project deletion is numbered in
// commit order, with the keys it revoked; a no-op revoke and a failed
// rotation number nothing; another handle on the same database reads them.
func TestKeyChanges(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		reader := open(t, url) // as another process would
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		if n, err := reader.LastKeyChange(ctx); err != nil || n != 0 {
			t.Fatalf("LastKeyChange on a new store = %d, %v; want 0", n, err)
		}
		p, pub, sec := newProject(t, s, u.ID)
		other, _, _ := newProject(t, s, u.ID)

		must(t, func() error { _, err := s.RevokeKey(ctx, p.ID, sec.ID); return err }())
		must(t, func() error { _, err := s.RevokeKey(ctx, p.ID, sec.ID); return err }()) // again: no change
		_, _, err := s.RotateKey(ctx, p.ID, store.APIKey{KeyType: "public", KeyHash: "new-public", KeyPrefix: "pk"})
		must(t, err)
		_, _, err = s.RotateKeyUntil(ctx, p.ID, store.APIKey{KeyType: "public", KeyHash: "newer-public", KeyPrefix: "pk"}, time.Now().Add(time.Hour))
		must(t, err)
		if _, _, err := s.RotateKey(ctx, other.ID, store.APIKey{KeyType: "secret", KeyHash: "new-public", KeyPrefix: "x"}); err == nil {
			t.Fatal("duplicate key hash accepted")
		}
		must(t, s.DeleteProject(ctx, other.ID, u.ID))

		want := []store.KeyChange{
			{Seq: 1, ProjectID: p.ID, Revoked: []string{sec.KeyHash}, KeysStale: true},
			{Seq: 2, ProjectID: p.ID, Revoked: []string{pub.KeyHash}, KeysStale: true},
			{Seq: 3, ProjectID: p.ID, KeysStale: true},
			{Seq: 4, ProjectID: other.ID, KeysStale: true, SettingsStale: true},
		}
		got, err := reader.KeyChangesAfter(ctx, 0, 10)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("KeyChangesAfter(0) = %+v, %v; want %+v", got, err, want)
		}
		if got, err := reader.KeyChangesAfter(ctx, 2, 1); err != nil || !reflect.DeepEqual(got, want[2:3]) {
			t.Fatalf("KeyChangesAfter(2, limit 1) = %+v, %v; want %+v", got, err, want[2:3])
		}
		if n, err := reader.LastKeyChange(ctx); err != nil || n != 4 {
			t.Fatalf("LastKeyChange = %d, %v; want 4", n, err)
		}

		if n, err := s.PruneKeyChanges(ctx, time.Now().Add(-time.Minute)); err != nil || n != 0 {
			t.Fatalf("pruning before the changes: %d, %v; want 0", n, err)
		}
		if n, err := s.PruneKeyChanges(ctx, time.Now().Add(time.Minute)); err != nil || n != 4 {
			t.Fatalf("pruning after the changes: %d, %v; want 4", n, err)
		}
		// The numbers go on from where they were.
		must(t, func() error { _, err := s.RevokeKey(ctx, p.ID, pub.ID); return err }())
		if got, err := reader.KeyChangesAfter(ctx, 0, 10); err != nil || len(got) != 0 {
			t.Fatalf("after pruning, a revoke of an already revoked key: %+v, %v; want nothing", got, err)
		}
		if n, err := reader.LastKeyChange(ctx); err != nil || n != 4 {
			t.Fatalf("LastKeyChange after pruning = %d, %v; want 4", n, err)
		}
	})
}

// TestKeyChangesConcurrent: changes made at once from two handles get
// distinct numbers, 1 to n, and a reader that has seen a number has seen
// every smaller one: polling "after the last seen" misses none.
func TestKeyChangesConcurrent(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s1, s2 := open(t, url), open(t, url)
		u, _ := s1.CreateUser(ctx, "a@example.com", "h")
		const n = 20
		var ps []store.Project
		for range n {
			p, _, _ := newProject(t, s1, u.ID)
			ps = append(ps, p)
		}
		seen := map[int64]string{}
		var last int64
		stop := make(chan struct{})
		polled := make(chan error, 1)
		go func() { // a poller, as a node runs it
			defer close(polled)
			for {
				// Whether the changes were all made, asked before the read: a
				// read that began before the last commit may miss it.
				stopping := false
				select {
				case <-stop:
					stopping = true
				default:
				}
				cs, err := s2.KeyChangesAfter(ctx, last, 1000)
				if err != nil {
					polled <- err
					return
				}
				for _, c := range cs {
					if c.Seq != last+1 {
						polled <- fmt.Errorf("read change %d after %d: one was skipped", c.Seq, last)
						return
					}
					seen[c.Seq], last = c.ProjectID, c.Seq
				}
				if stopping && len(cs) == 0 {
					return
				}
			}
		}()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := s1
				if i%2 == 1 {
					st = s2
				}
				_, _, err := st.RotateKey(ctx, p.ID, store.APIKey{KeyType: "secret", KeyHash: "rotated-" + p.ID, KeyPrefix: "sk"})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			must(t, err)
		}
		close(stop)
		if err := <-polled; err != nil {
			t.Fatal(err)
		}
		if len(seen) != n || last != n {
			t.Fatalf("the poller saw %d changes, the last %d; want %d", len(seen), last, n)
		}
		byProject := map[string]bool{}
		for _, id := range seen {
			byProject[id] = true
		}
		if len(byProject) != n {
			t.Fatalf("changes of %d projects, want %d", len(byProject), n)
		}
	})
}
