package store_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestAuthorizationSetting: channel authorization is off with no secret on a
// new project; turning it on makes the first secret and keeps it after; off
// keeps it too; every change is a key change; another project is untouched.
func TestAuthorizationSetting(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		other, _, _ := newProject(t, s, u.ID)
		now := time.Now()

		got, err := s.Project(ctx, p.ID)
		if err != nil || got.Authorization || got.AuthSecret != "" || got.AuthSecretPrevious != "" || got.AuthSecretPreviousUntil != nil {
			t.Fatalf("a new project: %+v, %v", got, err)
		}
		if secrets := got.AuthSecretsAt(now); secrets != nil {
			t.Fatalf("a new project's secrets: %q", secrets)
		}

		seq := func() int64 {
			t.Helper()
			n, err := s.LastKeyChange(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := seq()
		on, err := s.SetAuthorization(ctx, p.ID, true, "first")
		if err != nil || !on.Authorization || on.AuthSecret != "first" || on.ID != p.ID || on.Name != p.Name || !on.CreatedAt.Equal(p.CreatedAt) {
			t.Fatalf("turned on: %+v, %v", on, err)
		}
		if n := seq(); n != before+1 {
			t.Fatalf("key changes %d → %d, want one more", before, n)
		}
		// On again, off, on: the first secret stays.
		for _, step := range []bool{true, false, true, false} {
			q, err := s.SetAuthorization(ctx, p.ID, step, "second")
			if err != nil || q.Authorization != step || q.AuthSecret != "first" {
				t.Fatalf("set %v: %+v, %v", step, q, err)
			}
			if stored, _ := s.Project(ctx, p.ID); stored.Authorization != step || stored.AuthSecret != "first" {
				t.Fatalf("stored after set %v: %+v", step, stored)
			}
		}
		if n := seq(); n != before+5 {
			t.Fatalf("key changes %d → %d, want five more", before, n)
		}
		if _, err := s.SetAuthorization(ctx, p.ID, true, ""); err == nil {
			t.Fatal("turned on with no candidate secret")
		}
		for _, id := range []string{"00000000-0000-0000-0000-000000000000"} {
			if _, err := s.SetAuthorization(ctx, id, true, "x"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("SetAuthorization(%q): %v", id, err)
			}
			if _, err := s.RotateAuthSecret(ctx, id, "x", time.Time{}); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("RotateAuthSecret(%q): %v", id, err)
			}
		}
		if n := seq(); n != before+5 {
			t.Fatalf("refused changes were recorded: %d → %d", before, n)
		}
		if o, _ := s.Project(ctx, other.ID); o.Authorization || o.AuthSecret != "" {
			t.Fatalf("another project changed: %+v", o)
		}
		// Listed and renamed projects carry the fields too.
		ps, _ := s.ProjectsByOwner(ctx, u.ID)
		if len(ps) != 2 || ps[0].ID != p.ID || ps[0].AuthSecret != "first" || ps[1].AuthSecret != "" {
			t.Fatalf("ProjectsByOwner: %+v", ps)
		}
		if r, err := s.RenameProject(ctx, p.ID, u.ID, "renamed"); err != nil || r.AuthSecret != "first" {
			t.Fatalf("RenameProject: %+v, %v", r, err)
		}
	})
}

// TestRotateAuthSecret: a rotation without overlap drops the secret it
// replaces; one with an overlap keeps it valid until its end; one previous
// secret is kept; a project without a secret gets one and no previous.
func TestRotateAuthSecret(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		t0 := time.Now().UTC().Truncate(time.Microsecond)

		// No secret yet, with an overlap: the new one alone; still off.
		r, err := s.RotateAuthSecret(ctx, p.ID, "s1", t0.Add(time.Hour))
		if err != nil || r.Authorization || r.AuthSecret != "s1" || r.AuthSecretPrevious != "" || r.AuthSecretPreviousUntil != nil {
			t.Fatalf("first rotation: %+v, %v", r, err)
		}
		if _, err := s.SetAuthorization(ctx, p.ID, true, "unused"); err != nil {
			t.Fatal(err)
		}
		// Without overlap.
		r, err = s.RotateAuthSecret(ctx, p.ID, "s2", time.Time{})
		if err != nil || !r.Authorization || r.AuthSecret != "s2" || r.AuthSecretPrevious != "" || r.AuthSecretPreviousUntil != nil {
			t.Fatalf("rotation without overlap: %+v, %v", r, err)
		}
		if got := r.AuthSecretsAt(t0); !slices.Equal(got, []string{"s2"}) {
			t.Fatalf("secrets %q", got)
		}
		// With an overlap: s2 valid until its end.
		until := t0.Add(time.Hour)
		r, err = s.RotateAuthSecret(ctx, p.ID, "s3", until)
		if err != nil || r.AuthSecret != "s3" || r.AuthSecretPrevious != "s2" || r.AuthSecretPreviousUntil == nil || !r.AuthSecretPreviousUntil.Equal(until) {
			t.Fatalf("rotation with overlap: %+v, %v", r, err)
		}
		stored, _ := s.Project(ctx, p.ID)
		if stored.AuthSecretPreviousUntil == nil || !stored.AuthSecretPreviousUntil.Equal(until) || stored.AuthSecretPreviousUntil.Location() != time.UTC {
			t.Fatalf("stored previous until: %v", stored.AuthSecretPreviousUntil)
		}
		if got := stored.AuthSecretsAt(until.Add(-time.Microsecond)); !slices.Equal(got, []string{"s3", "s2"}) {
			t.Fatalf("secrets inside the overlap: %q", got)
		}
		if got := stored.AuthSecretsAt(until); !slices.Equal(got, []string{"s3"}) {
			t.Fatalf("secrets at the overlap's end: %q", got)
		}
		// Again inside the window: s3 becomes the previous one, s2 stops.
		until2 := t0.Add(time.Minute)
		r, err = s.RotateAuthSecret(ctx, p.ID, "s4", until2)
		if err != nil || r.AuthSecret != "s4" || r.AuthSecretPrevious != "s3" || !r.AuthSecretPreviousUntil.Equal(until2) {
			t.Fatalf("second rotation with overlap: %+v, %v", r, err)
		}
		// Without overlap: the previous one goes at once.
		r, err = s.RotateAuthSecret(ctx, p.ID, "s5", time.Time{})
		if err != nil || r.AuthSecretPrevious != "" || r.AuthSecretPreviousUntil != nil || !slices.Equal(r.AuthSecretsAt(t0), []string{"s5"}) {
			t.Fatalf("rotation without overlap after one with: %+v, %v", r, err)
		}
		if _, err := s.RotateAuthSecret(ctx, p.ID, "", time.Time{}); err == nil {
			t.Fatal("rotated to an empty secret")
		}
		// Turning off and on keeps the rotated secret.
		s.SetAuthorization(ctx, p.ID, false, "")
		if q, _ := s.SetAuthorization(ctx, p.ID, true, "other"); q.AuthSecret != "s5" {
			t.Fatalf("after off and on: %+v", q)
		}
	})
}

// TestSetAuthorizationConcurrent: first enables at once agree on one secret.
func TestSetAuthorizationConcurrent(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		const n = 8
		var wg sync.WaitGroup
		got := make([]string, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q, err := s.SetAuthorization(ctx, p.ID, true, "candidate-"+string(rune('a'+i)))
				got[i], errs[i] = q.AuthSecret, err
			}()
		}
		wg.Wait()
		stored, _ := s.Project(ctx, p.ID)
		for i := range n {
			if errs[i] != nil || got[i] != stored.AuthSecret {
				t.Fatalf("call %d: %q, %v; stored %q", i, got[i], errs[i], stored.AuthSecret)
			}
		}
	})
}
