package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

func TestSessionEpochsAndRevocations(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, err := s.CreateUser(ctx, "ada@example.com", "hash")
		if err != nil {
			t.Fatal(err)
		}

		// Epochs start at 0, rise by one per call, and belong to one user.
		for _, id := range []string{u.ID, "00000000-0000-4000-8000-000000000000", "not-a-uuid"} {
			if e, err := s.SessionEpoch(ctx, id); err != nil || e != 0 {
				t.Fatalf("SessionEpoch(%q) = %d, %v; want 0", id, e, err)
			}
		}
		for want := int64(1); want <= 3; want++ {
			if e, err := s.NextSessionEpoch(ctx, u.ID); err != nil || e != want {
				t.Fatalf("NextSessionEpoch = %d, %v; want %d", e, err, want)
			}
			if e, err := s.SessionEpoch(ctx, u.ID); err != nil || e != want {
				t.Fatalf("SessionEpoch = %d, %v; want %d", e, err, want)
			}
		}
		for _, id := range []string{"00000000-0000-4000-8000-000000000000", "not-a-uuid"} {
			if _, err := s.NextSessionEpoch(ctx, id); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("NextSessionEpoch(%q): %v, want ErrNotFound", id, err)
			}
		}

		// Revocations: idempotent, pruned once expired.
		at := time.Now()
		if ok, err := s.SessionRevoked(ctx, "sid-1"); err != nil || ok {
			t.Fatalf("SessionRevoked before: %v, %v", ok, err)
		}
		for range 2 {
			if err := s.RevokeSession(ctx, "sid-1", at.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.RevokeSession(ctx, "sid-2", at.Add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.SessionRevoked(ctx, "sid-1"); err != nil || !ok {
			t.Fatalf("SessionRevoked after: %v, %v", ok, err)
		}
		if n, err := s.PruneSessionRevocations(ctx, at.Add(90*time.Minute)); err != nil || n != 1 {
			t.Fatalf("prune: %d, %v; want 1", n, err)
		}
		if ok, _ := s.SessionRevoked(ctx, "sid-1"); ok {
			t.Fatal("sid-1 survived its pruning")
		}
		if ok, _ := s.SessionRevoked(ctx, "sid-2"); !ok {
			t.Fatal("sid-2 was pruned before it expired")
		}
	})
}
