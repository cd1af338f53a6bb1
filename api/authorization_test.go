package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/store/storetest"
)

// recordingLive records what the operations tell the connection plane.
type recordingLive struct {
	noLive
	mu       sync.Mutex
	told     []string
	revoked  [][]string
	settings []string
	authz    []actors.ProjectAuthz
}

func (l *recordingLive) AuthorizationChanged(_ context.Context, id string, az actors.ProjectAuthz) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.told = append(l.told, "authorization:"+id)
	l.authz = append(l.authz, az)
}

func (l *recordingLive) SettingsChanged(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.told = append(l.told, "settings")
	l.settings = append(l.settings, id)
}

func (l *recordingLive) KeysRevoked(id string, hashes []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.told = append(l.told, "keys:"+id)
	l.revoked = append(l.revoked, hashes)
}

var _ liveProjects = (*recordingLive)(nil)

// TestAuthorizationChangeTellsTheLivePlane: every change of the setting or
// its secret drops the project's cached keys on this node (the handshake
// reads the authorization with them), tells the other nodes to drop theirs
// with no key revoked, and makes the project actors reload their settings;
// a change made through another store handle (`relay admin`) drops them at
// the next WatchKeyChanges. A refused change tells nothing.
func TestAuthorizationChangeTellsTheLivePlane(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		st, other := storetest.Open(t, dbURL), storetest.Open(t, dbURL)
		s := New(Options{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SessionKey: []byte("k")})
		live := &recordingLive{}
		s.ops.live = live
		var loads int
		var mu sync.Mutex
		load := s.keys.load
		s.keys.load = func(ctx context.Context, hash string) (indexedKey, error) {
			mu.Lock()
			loads++
			mu.Unlock()
			return load(ctx, hash)
		}
		loaded := func() int { mu.Lock(); defer mu.Unlock(); return loads }

		u, err := st.CreateUser(ctx, "a@example.com", "h")
		if err != nil {
			t.Fatal(err)
		}
		pub := newRawKey(PublicKeyPrefix)
		p, err := st.CreateProject(ctx, u.ID, "demo", 0, storedKey("public", pub), storedKey("secret", newRawKey(SecretKeyPrefix)))
		if err != nil {
			t.Fatal(err)
		}
		s.WatchKeyChanges(ctx) // past the project's creation
		op, err := s.ops.owned(ctx, u.ID, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		// reloads reports whether the next lookup of the public key went to
		// the store (the project's keys had been dropped).
		reloads := func() bool {
			t.Helper()
			before := loaded()
			if _, ok, err := s.keys.Lookup(ctx, pub); !ok || err != nil {
				t.Fatalf("Lookup: %v, %v", ok, err)
			}
			return loaded() != before
		}
		reloads()
		if reloads() {
			t.Fatal("the key is not cached: the test proves nothing")
		}

		for _, tc := range []struct {
			name   string
			change func() error
		}{
			{"on", func() error { _, err := op.setAuthorization(ctx, true); return err }},
			{"on again", func() error { _, err := op.setAuthorization(ctx, true); return err }},
			{"rotate", func() error { _, err := op.rotateAuthSecret(ctx, 0); return err }},
			{"rotate with overlap", func() error { _, err := op.rotateAuthSecret(ctx, time.Hour); return err }},
			{"off", func() error { _, err := op.setAuthorization(ctx, false); return err }},
			{"jwks url", func() error {
				u := " https://example.com/jwks.json "
				_, err := op.updateAuthorization(ctx, AuthorizationChange{JWKSURL: &u})
				return err
			}},
			{"on with a jwks url", func() error {
				on, u := true, "http://example.com/other.json"
				_, err := op.updateAuthorization(ctx, AuthorizationChange{On: &on, JWKSURL: &u})
				return err
			}},
			{"jwks url removed", func() error {
				u := ""
				_, err := op.updateAuthorization(ctx, AuthorizationChange{JWKSURL: &u})
				return err
			}},
		} {
			live.told = nil
			if err := tc.change(); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if !slices.Equal(live.told, []string{"keys:" + p.ID, "authorization:" + p.ID}) || live.revoked[len(live.revoked)-1] != nil {
				t.Fatalf("%s told %q (revoked %q), want the project's keys dropped with none revoked, then its authorization", tc.name, live.told, live.revoked)
			}
			stored, _ := st.Project(ctx, p.ID)
			if az := live.authz[len(live.authz)-1]; az.On != stored.Authorization || len(az.Secrets) == 0 || az.Secrets[0] != stored.AuthSecret ||
				az.JWKSURL != stored.AuthJWKSURL {
				t.Fatalf("%s told %+v, want the stored setting (on %v, JWKS %q)", tc.name, az, stored.Authorization, stored.AuthJWKSURL)
			}
			if want := map[string]string{"jwks url": "https://example.com/jwks.json", "on with a jwks url": "http://example.com/other.json"}[tc.name]; stored.AuthJWKSURL != want {
				t.Fatalf("%s stored JWKS URL %q, want %q", tc.name, stored.AuthJWKSURL, want)
			}
			if !reloads() {
				t.Fatalf("%s: the project's cached keys were not dropped", tc.name)
			}
			s.WatchKeyChanges(ctx) // this node's own change, applied again
		}

		// Refused: an overlap over MaxKeyOverlap (or negative) changes and tells nothing.
		live.told = nil
		reloads() // cached again after WatchKeyChanges
		before, _ := st.Project(ctx, p.ID)
		for _, overlap := range []time.Duration{-time.Second, MaxKeyOverlap + time.Second} {
			if _, err := op.rotateAuthSecret(ctx, overlap); !errors.Is(err, errInvalidOverlap) {
				t.Fatalf("overlap %v: %v, want invalid_overlap", overlap, err)
			}
		}
		// So does a JWKS URL that is not an absolute http(s) URL (the webhook URL's rule).
		for _, u := range []string{"ftp://example.com/jwks", "example.com/jwks", "https://user:pw@example.com/jwks", "https://", "https://example.com/" + strings.Repeat("a", maxWebhookURL)} {
			on := true
			if _, err := op.updateAuthorization(ctx, AuthorizationChange{On: &on, JWKSURL: &u}); !errors.Is(err, errInvalidJWKSURL) {
				t.Fatalf("JWKS URL %.40q: %v, want invalid_jwks_url", u, err)
			}
		}
		if after, _ := st.Project(ctx, p.ID); after.AuthSecret != before.AuthSecret || after.Authorization != before.Authorization || after.AuthJWKSURL != before.AuthJWKSURL ||
			len(live.told) != 0 || reloads() {
			t.Fatalf("a refused rotation or JWKS URL changed the setting or told the live plane: %q", live.told)
		}
		if _, err := op.rotateAuthSecret(ctx, MaxKeyOverlap); err != nil {
			t.Fatalf("the longest overlap: %v", err)
		}
		reloads()

		// Another process (relay admin): the key change it records drops the
		// keys at the next read of the store's key changes.
		s.WatchKeyChanges(ctx)
		reloads()
		if _, err := other.SetAuthorization(ctx, p.ID, true, newSecret()); err != nil {
			t.Fatal(err)
		}
		if reloads() {
			t.Fatal("the keys were dropped before WatchKeyChanges: the test proves nothing")
		}
		s.WatchKeyChanges(ctx)
		if !reloads() {
			t.Fatal("a change made through another store handle did not drop the project's cached keys")
		}

		// A project deleted meanwhile: project_not_found.
		if err := st.DeleteProject(ctx, p.ID, u.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := op.setAuthorization(ctx, true); !errors.Is(err, errProjectNotFound) {
			t.Fatalf("on a deleted project: %v", err)
		}
		if _, err := op.rotateAuthSecret(ctx, 0); !errors.Is(err, errProjectNotFound) {
			t.Fatalf("rotate on a deleted project: %v", err)
		}
	})
}
