package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

func open(t testing.TB, url string) *store.Store { return storetest.Open(t, url) }

func TestOpenRejectsUnknownScheme(t *testing.T) {
	_, err := store.Open(context.Background(), "mysql://u:hunter2@h/db")
	if err == nil {
		t.Fatal("want error")
	}
	if got := err.Error(); !contains(got, "postgres://") || contains(got, "hunter2") {
		t.Fatalf("error should explain the choices and hide the password: %q", got)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// SQLiteFile names the database file by its absolute path, even from a
// relative DATABASE_URL, and says whether this Open created it; PostgreSQL
// and :memory: have no file.
func TestSQLiteFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	abs := filepath.Join(dir, "data", "relay.db")
	for i, wantCreated := range []bool{true, false} {
		s := open(t, "sqlite:data/relay.db")
		if path, created := s.SQLiteFile(); path != abs || created != wantCreated {
			t.Fatalf("open %d: SQLiteFile() = %q, %v; want %q, %v", i+1, path, created, abs, wantCreated)
		}
		s.Close()
	}
	for _, url := range []string{"sqlite::memory:", storetest.PostgresURL(t)} {
		if path, created := open(t, url).SQLiteFile(); path != "" || created {
			t.Fatalf("%s: SQLiteFile() = %q, %v; want no file", strings.SplitN(url, ":", 2)[0], path, created)
		}
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		s := open(t, url)
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- s.Migrate(context.Background()) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestUsers(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, err := s.CreateUser(ctx, "Ada@Example.com", "hash")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateUser(ctx, "ada@example.COM", "x"); !errors.Is(err, store.ErrDuplicate) {
			t.Fatalf("duplicate email in another case: got %v, want ErrDuplicate", err)
		}
		got, err := s.UserByEmail(ctx, "ADA@example.com")
		if err != nil || got.ID != u.ID || got.PasswordHash != "hash" || !got.CreatedAt.Equal(u.CreatedAt) || got.CreatedAt.Location() != time.UTC {
			t.Fatalf("UserByEmail = %+v, %v; want %+v in UTC", got, err, u)
		}
		if _, err := s.UserByEmail(ctx, "nobody@example.com"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown email: %v", err)
		}
		if got, err := s.UserByID(ctx, u.ID); err != nil || got.Email != "Ada@Example.com" {
			t.Fatalf("UserByID = %+v, %v", got, err)
		}
		if _, err := s.UserByID(ctx, "not-a-uuid"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("malformed id: %v", err)
		}
	})
}

func newProject(t testing.TB, s *store.Store, owner string) (store.Project, store.APIKey, store.APIKey) {
	t.Helper()
	pub := store.APIKey{KeyType: "public", KeyHash: "hash-pub-" + owner + time.Now().String(), KeyPrefix: "pk_live_abcd************"}
	sec := store.APIKey{KeyType: "secret", KeyHash: "hash-sec-" + owner + time.Now().String(), KeyPrefix: "sk_live_abcd************"}
	p, err := s.CreateProject(context.Background(), owner, "demo", 0, pub, sec)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := s.Keys(context.Background(), p.ID)
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys after create: %v, %v", keys, err)
	}
	return p, keys[0], keys[1]
}

func TestProjectsAndOwnership(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		alice, _ := s.CreateUser(ctx, "alice@example.com", "h")
		bob, _ := s.CreateUser(ctx, "bob@example.com", "h")
		p, _, _ := newProject(t, s, alice.ID)

		if ps, err := s.ProjectsByOwner(ctx, alice.ID); err != nil || len(ps) != 1 || ps[0].ID != p.ID {
			t.Fatalf("alice's projects = %v, %v", ps, err)
		}
		if ps, err := s.ProjectsByOwner(ctx, bob.ID); err != nil || len(ps) != 0 {
			t.Fatalf("bob's projects = %v, %v", ps, err)
		}
		if _, err := s.ProjectOfOwner(ctx, p.ID, bob.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("bob reads alice's project: %v", err)
		}
		if _, err := s.RenameProject(ctx, p.ID, bob.ID, "x"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("bob renames alice's project: %v", err)
		}
		if err := s.DeleteProject(ctx, p.ID, bob.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("bob deletes alice's project: %v", err)
		}
		r, err := s.RenameProject(ctx, p.ID, alice.ID, "renamed")
		if err != nil || r.Name != "renamed" || r.ID != p.ID || !r.CreatedAt.Equal(p.CreatedAt) {
			t.Fatalf("rename = %+v, %v", r, err)
		}
		if err := s.SetClientEmitSecret(ctx, p.ID, "s3cret"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Project(ctx, p.ID); got.ClientEmitSecret != "s3cret" || got.Name != "renamed" {
			t.Fatalf("project = %+v", got)
		}
		for _, id := range []string{"nope", "00000000-0000-0000-0000-000000000000"} {
			if _, err := s.Project(ctx, id); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Project(%q): %v", id, err)
			}
		}
	})
}

func TestKeysRotateRevoke(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, pub, _ := newProject(t, s, u.ID)
		other, _, otherSec := newProject(t, s, u.ID)

		if k, err := s.KeyByHash(ctx, pub.KeyHash); err != nil || k.ID != pub.ID || !k.Active() || k.ProjectID != p.ID {
			t.Fatalf("KeyByHash = %+v, %v", k, err)
		}
		if _, err := s.KeyByHash(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown hash: %v", err)
		}
		nk, revoked, err := s.RotateKey(ctx, p.ID, store.APIKey{KeyType: "public", KeyHash: "rotated", KeyPrefix: "pk_live_zzzz************"})
		if err != nil {
			t.Fatal(err)
		}
		if len(revoked) != 1 || revoked[0] != pub.KeyHash {
			t.Fatalf("rotation reports it revoked %q, want [%q]", revoked, pub.KeyHash)
		}
		old, _ := s.KeyByHash(ctx, pub.KeyHash)
		if old.Active() || old.RevokedAt.Location() != time.UTC {
			t.Fatalf("rotation left the old key active: %+v", old)
		}
		keys, _ := s.Keys(ctx, p.ID)
		active := 0
		for _, k := range keys {
			if k.Active() {
				active++
			}
		}
		if len(keys) != 3 || active != 2 {
			t.Fatalf("after rotate: %d keys, %d active; want 3, 2", len(keys), active)
		}
		if _, err := s.RevokeKey(ctx, p.ID, otherSec.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("revoking another project's key: %v", err)
		}
		k, err := s.RevokeKey(ctx, p.ID, nk.ID)
		if err != nil || k.Active() {
			t.Fatalf("revoke = %+v, %v", k, err)
		}
		again, err := s.RevokeKey(ctx, p.ID, nk.ID)
		if err != nil || !again.RevokedAt.Equal(*k.RevokedAt) {
			t.Fatalf("second revoke should keep the first time: %+v, %v", again, err)
		}
		if _, err := s.RevokeKey(ctx, p.ID, "bad-id"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("malformed key id: %v", err)
		}
		// Duplicate hashes are refused by the unique index.
		if _, _, err := s.RotateKey(ctx, other.ID, store.APIKey{KeyType: "secret", KeyHash: "rotated", KeyPrefix: "x"}); err == nil {
			t.Fatal("duplicate key hash accepted")
		}
		if keys, _ := s.Keys(ctx, other.ID); len(keys) != 2 || !keys[1].Active() {
			t.Fatalf("failed rotation must roll back: %+v", keys)
		}
	})
}

func TestDeleteCascades(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, pub, _ := newProject(t, s, u.ID)
		limit := 42
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID, ChannelRateLimit: &limit, WebhookURL: "https://example.com/h", WebhookSecret: "w"}))
		must(t, s.AddUsage(ctx, store.Usage{ProjectID: p.ID, Day: "2026-11-22", ConnectionCount: 1}))
		must(t, s.AddRevocations(ctx, p.ID, time.Time{}, 0, store.Revocation{Kind: store.RevokeJTI, Value: "j", RevokedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}))

		must(t, s.DeleteProject(ctx, p.ID, u.ID))
		if err := s.DeleteProject(ctx, p.ID, u.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if _, err := s.KeyByHash(ctx, pub.KeyHash); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("key survived delete: %v", err)
		}
		for table, n := range map[string]int64{"api_keys": 0, "usage_daily": 0, "project_settings": 0, "emit_token_revocations": 0} {
			got, err := s.DB().NewSelect().Table(table).Where("project_id = ?", p.ID).Count(ctx)
			if err != nil || got != n {
				t.Fatalf("%s rows after delete = %d, %v", table, got, err)
			}
		}
		if err := s.AddUsage(ctx, store.Usage{ProjectID: p.ID, Day: "2026-11-22", MessageCount: 1}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("usage for a deleted project: %v", err)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestSettings(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		st, err := s.Settings(ctx, p.ID)
		if err != nil || st.ChannelRateLimit != nil || st.WebhookURL != "" {
			t.Fatalf("default settings = %+v, %v", st, err)
		}
		limit := 10
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID, ChannelRateLimit: &limit}))
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID, ChannelRateLimit: &limit, WebhookURL: "https://h", WebhookSecret: "sec",
			WebhookPresenceEvents: true}))
		st, err = s.Settings(ctx, p.ID)
		if err != nil || st.ChannelRateLimit == nil || *st.ChannelRateLimit != 10 || st.WebhookURL != "https://h" || st.WebhookSecret != "sec" ||
			st.WebhookChannelEvents || !st.WebhookPresenceEvents {
			t.Fatalf("settings = %+v, %v", st, err)
		}
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID, WebhookChannelEvents: true, HistoryRetentionSeconds: 3600}))
		if st, _ = s.Settings(ctx, p.ID); !st.WebhookChannelEvents || st.WebhookPresenceEvents || st.HistoryRetentionSeconds != 3600 {
			t.Fatalf("event flags = %+v", st)
		}
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID}))
		if st, _ = s.Settings(ctx, p.ID); st.ChannelRateLimit != nil || st.WebhookURL != "" || st.WebhookChannelEvents || st.HistoryRetentionSeconds != 0 {
			t.Fatalf("cleared settings = %+v", st)
		}
	})
}

func TestUsageUpsert(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		must(t, s.AddUsage(ctx, store.Usage{ProjectID: p.ID, Day: "2026-11-21", ConnectionCount: 5, MessageCount: 7, PeakConcurrentConnections: 3}))
		must(t, s.AddUsage(ctx, store.Usage{ProjectID: p.ID, Day: "2026-11-22", ConnectionCount: 2, MessageCount: 10, PeakConcurrentConnections: 9}))
		must(t, s.AddUsage(ctx, store.Usage{ProjectID: p.ID, Day: "2026-11-22", ConnectionCount: 1, MessageCount: 5, PeakConcurrentConnections: 4}))
		rows, err := s.Usage(ctx, p.ID, "2026-11-22")
		if err != nil || len(rows) != 1 {
			t.Fatalf("usage = %+v, %v", rows, err)
		}
		if r := rows[0]; r.ConnectionCount != 3 || r.MessageCount != 15 || r.PeakConcurrentConnections != 9 {
			t.Fatalf("row = %+v; want 3 connects, 15 messages, peak 9", r)
		}
		if rows, _ := s.Usage(ctx, p.ID, "2026-01-01"); len(rows) != 2 || rows[0].Day != "2026-11-21" {
			t.Fatalf("all rows = %+v", rows)
		}
	})
}

func TestRevocations(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
		must(t, s.AddRevocations(ctx, p.ID, time.Time{}, 0, store.Revocation{Kind: store.RevokeClient, Value: "c1", RevokedAt: t0, ExpiresAt: t0.Add(time.Hour)}))
		must(t, s.AddRevocations(ctx, p.ID, time.Time{}, 0, store.Revocation{Kind: store.RevokeClient, Value: "c1", RevokedAt: t0.Add(time.Minute), ExpiresAt: t0.Add(2 * time.Hour)}))
		must(t, s.AddRevocations(ctx, p.ID, time.Time{}, 0, store.Revocation{Kind: store.RevokeJTI, Value: "j1", RevokedAt: t0, ExpiresAt: t0.Add(10 * time.Minute)}))
		rs, err := s.Revocations(ctx, p.ID, t0)
		if err != nil || len(rs) != 2 {
			t.Fatalf("revocations = %+v, %v", rs, err)
		}
		if rs[0].Kind != store.RevokeClient || !rs[0].RevokedAt.Equal(t0.Add(time.Minute)) || rs[0].RevokedAt.Location() != time.UTC {
			t.Fatalf("later clientId revocation must win: %+v", rs[0])
		}
		// A later, shorter one moves the cut-off but keeps the longer end.
		must(t, s.AddRevocations(ctx, p.ID, time.Time{}, 0, store.Revocation{Kind: store.RevokeClient, Value: "c1", RevokedAt: t0.Add(2 * time.Minute), ExpiresAt: t0.Add(20 * time.Minute)}))
		if rs, _ := s.Revocations(ctx, p.ID, t0); !rs[0].RevokedAt.Equal(t0.Add(2*time.Minute)) || !rs[0].ExpiresAt.Equal(t0.Add(2*time.Hour)) {
			t.Fatalf("a shorter revocation after a longer one: %+v, want revoked at +2m, expiring at +2h", rs[0])
		}
		if rs, _ := s.Revocations(ctx, p.ID, t0.Add(30*time.Minute)); len(rs) != 1 {
			t.Fatalf("expired jti revocation still listed: %+v", rs)
		}
		n, err := s.PruneRevocations(ctx, t0.Add(30*time.Minute))
		if err != nil || n != 1 {
			t.Fatalf("prune = %d, %v", n, err)
		}
	})
}

func TestMeta(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		if _, err := s.Meta(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("missing meta: %v", err)
		}
		v, err := s.MetaSetIfAbsent(ctx, "k", "first")
		if err != nil || v != "first" {
			t.Fatalf("first set = %q, %v", v, err)
		}
		if v, _ := s.MetaSetIfAbsent(ctx, "k", "second"); v != "first" {
			t.Fatalf("second set = %q, want the first value", v)
		}
	})
}

// TestProjectsPerOwnerCap: CreateProject's bound holds against concurrent
// creations through two handles on one database (two nodes), and is per
// owner.
func TestProjectsPerOwnerCap(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		nodes := []*store.Store{open(t, url), open(t, url)}
		u, _ := nodes[0].CreateUser(ctx, "a@example.com", "h")
		other, _ := nodes[0].CreateUser(ctx, "b@example.com", "h")
		created, refused := raceCap(t, 48, func(i int) error {
			_, err := nodes[i%2].CreateProject(ctx, u.ID, "p", 5,
				store.APIKey{KeyType: "public", KeyHash: fmt.Sprint("cap-", i), KeyPrefix: "x"})
			return err
		})
		if ps, _ := nodes[1].ProjectsByOwner(ctx, u.ID); len(ps) != 5 || created != 5 || refused != 43 {
			t.Fatalf("%d projects stored, %d created, %d refused; want 5, 5, 43", len(ps), created, refused)
		}
		if _, err := nodes[0].CreateProject(ctx, other.ID, "theirs", 5); err != nil {
			t.Fatalf("another owner refused: %v", err)
		}
		if _, err := nodes[0].CreateProject(ctx, u.ID, "uncapped", 0); err != nil {
			t.Fatalf("no cap: %v", err)
		}
	})
}

// raceCap makes n calls at once (call(i), alternating between handles is
// the caller's) and counts those that succeeded and those refused with
// ErrLimitReached; any other error fails the test.
func raceCap(t *testing.T, n int, call func(i int) error) (ok, refused int64) {
	t.Helper()
	var wg sync.WaitGroup
	var oks, refusals atomic.Int64
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			switch err := call(i); {
			case err == nil:
				oks.Add(1)
			case errors.Is(err, store.ErrLimitReached):
				refusals.Add(1)
			default:
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return oks.Load(), refusals.Load()
}

// TestRevocationsPerProjectCap: AddRevocations' bound counts unexpired
// revocations only, holds against concurrent calls through two handles (two
// nodes), and a refused call stores none of its revocations.
func TestRevocationsPerProjectCap(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		nodes := []*store.Store{open(t, url), open(t, url)}
		u, _ := nodes[0].CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, nodes[0], u.ID)
		t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
		rev := func(kind, value string, expires time.Time) store.Revocation {
			return store.Revocation{Kind: kind, Value: value, RevokedAt: t0, ExpiresAt: expires}
		}
		must(t, nodes[0].AddRevocations(ctx, p.ID, t0, 4, rev(store.RevokeJTI, "expired", t0.Add(-time.Second))))
		stored, refused := raceCap(t, 16, func(i int) error {
			return nodes[i%2].AddRevocations(ctx, p.ID, t0, 4, rev(store.RevokeJTI, fmt.Sprint("j", i), t0.Add(time.Hour)))
		})
		if rs, _ := nodes[1].Revocations(ctx, p.ID, t0); len(rs) != 4 || stored != 4 || refused != 12 {
			t.Fatalf("%d unexpired stored, %d calls stored, %d refused; want 4, 4, 12", len(rs), stored, refused)
		}
		err := nodes[0].AddRevocations(ctx, p.ID, t0, 4, rev(store.RevokeJTI, "x", t0.Add(time.Hour)), rev(store.RevokeClient, "c", t0.Add(time.Hour)))
		if !errors.Is(err, store.ErrLimitReached) {
			t.Fatalf("over the cap: %v", err)
		}
		must(t, nodes[0].AddRevocations(ctx, p.ID, t0, 6, rev(store.RevokeJTI, "y", t0.Add(time.Hour)), rev(store.RevokeClient, "c", t0.Add(time.Hour))))
		if rs, _ := nodes[0].Revocations(ctx, p.ID, t0); len(rs) != 6 {
			t.Fatalf("%d unexpired after a refused and an accepted pair, want 6: %+v", len(rs), rs)
		}
	})
}

// TestUpdateSettingsConcurrent: read-modify-writes of one project's
// settings through two handles (two nodes), each changing its own field,
// lose none of each other's changes; a change that refuses writes nothing.
func TestUpdateSettingsConcurrent(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		nodes := []*store.Store{open(t, url), open(t, url)}
		u, _ := nodes[0].CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, nodes[0], u.ID)
		const rounds = 20
		var wg sync.WaitGroup
		errs := make(chan error, 2*rounds)
		wg.Go(func() { // node 0 counts the budget up
			for range rounds {
				errs <- nodes[0].UpdateSettings(ctx, p.ID, func(st *store.Settings) error {
					n := 1
					if st.ChannelRateLimit != nil {
						n = *st.ChannelRateLimit + 1
					}
					st.ChannelRateLimit = &n
					return nil
				})
			}
		})
		wg.Go(func() { // node 1 appends to the webhook secret
			for range rounds {
				errs <- nodes[1].UpdateSettings(ctx, p.ID, func(st *store.Settings) error {
					st.WebhookURL, st.WebhookSecret = "https://h", st.WebhookSecret+"x"
					return nil
				})
			}
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			must(t, err)
		}
		st, err := nodes[0].Settings(ctx, p.ID)
		if err != nil || st.ChannelRateLimit == nil || *st.ChannelRateLimit != rounds || st.WebhookSecret != strings.Repeat("x", rounds) {
			t.Fatalf("settings after %d changes on each node: %+v, %v", rounds, st, err)
		}
		no := errors.New("refused")
		err = nodes[1].UpdateSettings(ctx, p.ID, func(st *store.Settings) error { st.WebhookURL = ""; return no })
		if !errors.Is(err, no) {
			t.Fatalf("refused change: %v", err)
		}
		if st, _ := nodes[0].Settings(ctx, p.ID); st.WebhookURL != "https://h" {
			t.Fatalf("a refused change was written: %+v", st)
		}
	})
}

// TestConcurrentWrites guards the SQLite pragmas: concurrent transactions
// must wait for the write lock, not fail with SQLITE_BUSY.
func TestConcurrentWrites(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		var wg sync.WaitGroup
		errs := make(chan error, 80)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 10 {
					_, err := s.CreateProject(ctx, u.ID, "p", 0,
						store.APIKey{KeyType: "public", KeyHash: time.Now().String() + string(rune('a'+i)) + string(rune('a'+j)), KeyPrefix: "x"})
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if ps, _ := s.ProjectsByOwner(ctx, u.ID); len(ps) != 80 {
			t.Fatalf("projects = %d, want 80", len(ps))
		}
	})
}

// TestRotateKeyUntil: a rotation with an overlap leaves the old key valid
// until its end beside the new active one; a second rotation inside the
// window only shortens it; one without overlap revokes every key still valid
// and leaves an already expired one as it ended; last use only moves forward.
func TestRotateKeyUntil(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, pub, sec := newProject(t, s, u.ID)
		t0 := time.Now().UTC().Truncate(time.Microsecond)
		until := t0.Add(time.Hour)

		k1, expiring, err := s.RotateKeyUntil(ctx, p.ID, store.APIKey{KeyType: "public", KeyHash: "k1", KeyPrefix: "pk_live_k1**"}, until)
		if err != nil {
			t.Fatal(err)
		}
		if len(expiring) != 1 || expiring[0] != pub.KeyHash {
			t.Fatalf("expiring = %q, want [%q]", expiring, pub.KeyHash)
		}
		old, _ := s.KeyByHash(ctx, pub.KeyHash)
		if !old.Active() || old.ExpiresAt == nil || !old.ExpiresAt.Equal(until) || old.ExpiresAt.Location() != time.UTC {
			t.Fatalf("old key after an overlap rotation: %+v", old)
		}
		if !old.ValidAt(until.Add(-time.Second)) || old.ValidAt(until) {
			t.Fatalf("old key valid before its end and not at it: %+v", old)
		}
		if nk, _ := s.KeyByHash(ctx, "k1"); nk.ExpiresAt != nil || !nk.ValidAt(until.Add(time.Hour)) || nk.ID != k1.ID {
			t.Fatalf("new key: %+v", nk)
		}

		// A second rotation with a longer window keeps the first end; the
		// key it replaces gets the new one.
		_, expiring, err = s.RotateKeyUntil(ctx, p.ID, store.APIKey{KeyType: "public", KeyHash: "k2", KeyPrefix: "pk_live_k2**"}, t0.Add(2*time.Hour))
		if err != nil || len(expiring) != 1 || expiring[0] != "k1" {
			t.Fatalf("second rotation: %q, %v", expiring, err)
		}
		if old, _ := s.KeyByHash(ctx, pub.KeyHash); !old.ExpiresAt.Equal(until) {
			t.Fatalf("a longer window moved the first end: %+v", old)
		}
		// A shorter one shortens both.
		short := t0.Add(time.Minute)
		_, expiring, err = s.RotateKeyUntil(ctx, p.ID, store.APIKey{KeyType: "public", KeyHash: "k3", KeyPrefix: "pk_live_k3**"}, short)
		if err != nil || len(expiring) != 3 {
			t.Fatalf("shorter rotation: %q, %v", expiring, err)
		}
		ks, err := s.KeysExpiringAfter(ctx, t0, 10)
		if err != nil || len(ks) != 3 {
			t.Fatalf("KeysExpiringAfter = %+v, %v", ks, err)
		}
		for _, k := range ks {
			if !k.ExpiresAt.Equal(short) || k.ProjectID != p.ID || k.KeyType != "public" {
				t.Fatalf("expiring key %+v", k)
			}
		}
		if ks, _ := s.KeysExpiringAfter(ctx, short, 10); len(ks) != 0 {
			t.Fatalf("nothing ends after %v: %+v", short, ks)
		}
		if ks, _ := s.KeysExpiringAfter(ctx, t0, 2); len(ks) != 2 {
			t.Fatalf("limit 2: %+v", ks)
		}

		// The secret key's rotation is separate.
		if k, _ := s.KeyByHash(ctx, sec.KeyHash); k.ExpiresAt != nil || !k.Active() {
			t.Fatalf("secret key touched: %+v", k)
		}

		// A revoked key in its window is no longer listed as expiring.
		if _, err := s.RevokeKey(ctx, p.ID, k1.ID); err != nil {
			t.Fatal(err)
		}
		if ks, _ := s.KeysExpiringAfter(ctx, t0, 10); len(ks) != 2 {
			t.Fatalf("after revoking one: %+v", ks)
		}

		// Without overlap: the keys still valid are revoked now (k3 and the
		// keys whose window has not ended); an ended window stays as it ended.
		past := t0.Add(-time.Minute)
		q, _, err := s.RotateKeyUntil(ctx, p.ID, store.APIKey{KeyType: "secret", KeyHash: "s1", KeyPrefix: "sk_live_s1**"}, past)
		if err != nil {
			t.Fatal(err)
		}
		_, revoked, err := s.RotateKey(ctx, p.ID, store.APIKey{KeyType: "secret", KeyHash: "s2", KeyPrefix: "sk_live_s2**"})
		if err != nil || len(revoked) != 1 || revoked[0] != "s1" {
			t.Fatalf("rotation after an ended window revoked %q, %v; want [s1]", revoked, err)
		}
		if k, _ := s.KeyByHash(ctx, sec.KeyHash); k.RevokedAt != nil || !k.ExpiresAt.Equal(past) || k.ValidAt(t0) {
			t.Fatalf("expired key: %+v", k)
		}
		if k, _ := s.KeyByHash(ctx, q.KeyHash); k.Active() {
			t.Fatalf("s1 still active: %+v", k)
		}

		// Last use: moves forward only; unknown hashes are skipped.
		if k, _ := s.KeyByHash(ctx, "k3"); k.LastUsedAt != nil {
			t.Fatalf("never used: %+v", k)
		}
		used := t0.Add(5 * time.Second)
		if err := s.RecordKeyUse(ctx, []store.KeyUse{{KeyHash: "k3", At: used}, {KeyHash: "nope", At: used}}); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordKeyUse(ctx, []store.KeyUse{{KeyHash: "k3", At: t0}}); err != nil {
			t.Fatal(err)
		}
		k, _ := s.KeyByHash(ctx, "k3")
		if k.LastUsedAt == nil || !k.LastUsedAt.Equal(used) || k.LastUsedAt.Location() != time.UTC {
			t.Fatalf("last used %v, want %v", k.LastUsedAt, used)
		}
		keys, _ := s.Keys(ctx, p.ID)
		for _, k := range keys {
			if k.KeyHash == "k3" && (k.LastUsedAt == nil || !k.LastUsedAt.Equal(used)) {
				t.Fatalf("Keys: %+v", k)
			}
		}
	})
}
