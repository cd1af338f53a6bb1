package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestWatchKeyChangesStoreAway: a key revoked through another store handle
// is applied by the next WatchKeyChanges; while the store cannot answer,
// the reads fail without a panic and with one warning however often they
// are tried (within a minute), and once it answers again, what was missed is
// applied.
func TestWatchKeyChangesStoreAway(t *testing.T) {
	ctx := context.Background()
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "relay.db")
	st, other := storetest.Open(t, dbURL), storetest.Open(t, dbURL) // other: as `relay admin` would
	var logs bytes.Buffer
	s := New(Options{Store: st, Logger: slog.New(slog.NewTextHandler(&logs, nil)), SessionKey: []byte("k")})

	u, err := st.CreateUser(ctx, "a@example.com", "h")
	if err != nil {
		t.Fatal(err)
	}
	raw1, raw2 := newRawKey(SecretKeyPrefix), newRawKey(PublicKeyPrefix)
	p, err := st.CreateProject(ctx, u.ID, "demo", 0, storedKey("secret", raw1), storedKey("public", raw2))
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(raw string) indexedKey {
		t.Helper()
		k, ok, err := s.keys.Lookup(ctx, raw)
		if err != nil || !ok {
			t.Fatalf("Lookup: %v, %v", ok, err)
		}
		return k
	}
	lookup(raw1) // cached
	revoke := func(keyType string) {
		t.Helper()
		ks, err := other.Keys(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			if k.KeyType == keyType {
				if _, err := other.RevokeKey(ctx, p.ID, k.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	revoke("secret")
	if lookup(raw1).Revoked {
		t.Fatal("the cached key was refused before WatchKeyChanges ran: the test proves nothing")
	}
	s.WatchKeyChanges(ctx)
	if !lookup(raw1).Revoked {
		t.Fatal("a key revoked through another handle still authenticates after WatchKeyChanges")
	}

	// The store stops answering the query (the table away), after another
	// revocation was stored.
	lookup(raw2) // cached again (the change dropped the project's keys)
	revoke("public")
	if _, err := other.DB().ExecContext(ctx, "ALTER TABLE key_changes RENAME TO key_changes_away"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		s.WatchKeyChanges(ctx)
	}
	const warned = `level=WARN msg="read key changes: keys revoked by another process are not applied until the store answers"`
	if n := strings.Count(logs.String(), warned); n != 1 {
		t.Fatalf("%d warnings over 5 failed reads, want 1:\n%s", n, logs.String())
	}
	if lookup(raw2).Revoked {
		t.Fatal("the public key was refused while the store did not answer: the test proves nothing")
	}
	if _, err := other.DB().ExecContext(ctx, "ALTER TABLE key_changes_away RENAME TO key_changes"); err != nil {
		t.Fatal(err)
	}
	s.WatchKeyChanges(ctx)
	if !lookup(raw2).Revoked {
		t.Fatal("the revocation stored while the store did not answer was not applied once it did")
	}
	const back = `level=INFO msg="read key changes: the store answers again"`
	if n := strings.Count(logs.String(), back); n != 1 {
		t.Fatalf("%d recovery lines, want 1:\n%s", n, logs.String())
	}
}

// TestWatchKeyChangesPruned: when changes this node never read were pruned
// (it could not read the store for longer than they are kept), it cannot
// know which projects they touched, so every cached key goes, with a
// warning.
func TestWatchKeyChangesPruned(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, "sqlite:"+filepath.Join(t.TempDir(), "relay.db"))
	var logs bytes.Buffer
	s := New(Options{Store: st, Logger: slog.New(slog.NewTextHandler(&logs, nil)), SessionKey: []byte("k")})
	u, err := st.CreateUser(ctx, "a@example.com", "h")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 3 {
		raw := newRawKey(SecretKeyPrefix)
		p, err := st.CreateProject(ctx, u.ID, "demo", 0, storedKey("secret", raw), storedKey("public", newRawKey(PublicKeyPrefix)))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.keys.Lookup(ctx, raw); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.ID)
	}
	// A change to the first project, pruned unread; then one to the second.
	if _, _, err := st.RotateKeyUntil(ctx, ids[0], storedKey("secret", newRawKey(SecretKeyPrefix)), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PruneKeyChanges(ctx, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.RotateKeyUntil(ctx, ids[1], storedKey("secret", newRawKey(SecretKeyPrefix)), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := s.keys.size(); n != 3 {
		t.Fatalf("%d keys cached, want 3", n)
	}
	s.WatchKeyChanges(ctx)
	if n := s.keys.size(); n != 0 {
		t.Fatalf("%d keys cached after a gap in the changes, want 0", n)
	}
	const warned = `level=WARN msg="key changes were pruned before this node read them: every cached key dropped; sockets of keys revoked meanwhile stay open" after=0 next=2`
	if n := strings.Count(logs.String(), warned); n != 1 {
		t.Fatalf("%d warnings of the gap, want 1:\n%s", n, logs.String())
	}
	if s.watch.last != 2 {
		t.Fatalf("last change applied %d, want 2", s.watch.last)
	}
}

// A settings change read from the store (another process: relay admin)
// leaves the project's cached keys as they are: only its settings are
// stale; a key change drops them.
func TestWatchKeyChangesSettingsKeepKeys(t *testing.T) {
	ctx := context.Background()
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "relay.db")
	st, other := storetest.Open(t, dbURL), storetest.Open(t, dbURL)
	s := New(Options{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SessionKey: []byte("k")})
	u, err := st.CreateUser(ctx, "a@example.com", "h")
	if err != nil {
		t.Fatal(err)
	}
	raw := newRawKey(PublicKeyPrefix)
	p, err := st.CreateProject(ctx, u.ID, "demo", 0, storedKey("public", raw), storedKey("secret", newRawKey(SecretKeyPrefix)))
	if err != nil {
		t.Fatal(err)
	}
	loads := 0
	load := s.keys.load
	s.keys.load = func(ctx context.Context, hash string) (indexedKey, error) { loads++; return load(ctx, hash) }
	lookup := func() {
		t.Helper()
		if _, ok, err := s.keys.Lookup(ctx, raw); !ok || err != nil {
			t.Fatalf("Lookup: %v, %v", ok, err)
		}
	}
	s.WatchKeyChanges(ctx) // past the project's creation
	lookup()
	limit := 5
	if err := other.UpdateSettings(ctx, p.ID, func(st *store.Settings) error { st.ChannelRateLimit = &limit; return nil }); err != nil {
		t.Fatal(err)
	}
	s.WatchKeyChanges(ctx)
	lookup()
	if loads != 1 {
		t.Fatalf("the key was loaded %d times across a settings change, want once (cached)", loads)
	}
	if _, _, err := other.RotateKeyUntil(ctx, p.ID, store.APIKey{KeyType: "secret", KeyHash: "rotated", KeyPrefix: "sk"}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	s.WatchKeyChanges(ctx)
	lookup()
	if loads != 2 {
		t.Fatalf("the key was loaded %d times after a key change, want again (2)", loads)
	}
}
