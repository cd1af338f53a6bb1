// Package storetest gives tests real databases: a throwaway PostgreSQL
// cluster per test binary (store/tempdb: initdb in a temp dir, unix socket
// only, run as the postgres user when the tests run as root) with a fresh
// schema per test, and a fresh SQLite file per test.
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/tempdb"
)

// EnvURL, when set, names an existing PostgreSQL server to use instead of
// starting one (each test still gets its own schema).
const EnvURL = "RELAY_TEST_POSTGRES_URL"

var (
	mu      sync.Mutex
	baseURL string
	stopPG  func()
	// pgctl runs pg_ctl on the throwaway cluster (nil with EnvURL).
	pgctl func(args ...string) ([]byte, error)
)

// Main runs the package's tests and stops the throwaway PostgreSQL, if one was
// started, afterwards. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	mu.Lock()
	if stopPG != nil {
		stopPG()
	}
	mu.Unlock()
	os.Exit(code)
}

// PostgresURL returns a DATABASE_URL for a new, empty schema on the test
// PostgreSQL, starting the server on first use.
func PostgresURL(t testing.TB) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if baseURL == "" {
		if url := os.Getenv(EnvURL); url != "" {
			baseURL = url
		} else {
			url, stop, err := startPostgres()
			if err != nil {
				t.Fatalf("start throwaway PostgreSQL (install PostgreSQL, or set %s): %v", EnvURL, err)
			}
			baseURL, stopPG = url, stop
		}
	}
	schema := "t_" + randomHex(6)
	db := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(baseURL)))
	defer db.Close()
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	sep := "?"
	if strings.Contains(baseURL, "?") {
		sep = "&"
	}
	return baseURL + sep + "search_path=" + schema
}

// SQLiteURL returns a DATABASE_URL for a new SQLite file in the test's temp dir.
func SQLiteURL(t testing.TB) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "relay.db")
}

// Open opens the store at url and migrates it; it is closed when t ends.
func Open(t testing.TB, url string) *store.Store {
	t.Helper()
	ctx := context.Background()
	s, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// EachDB runs fn as a subtest once per store, with a fresh database each.
func EachDB(t *testing.T, fn func(t *testing.T, url string)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, SQLiteURL(t)) })
	t.Run("postgres", func(t *testing.T) { fn(t, PostgresURL(t)) })
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startPostgres starts the throwaway cluster (store/tempdb).
func startPostgres() (url string, stop func(), err error) {
	s, err := tempdb.Start(context.Background(), "relay-pg")
	if err != nil {
		return "", nil, err
	}
	pgctl = s.Ctl
	return s.URL("postgres"), s.Stop, nil
}

// OwnPostgres starts a PostgreSQL server of the test's own, stopped when the
// test ends, and returns its DATABASE_URL and its control: stop (a fast
// shutdown: sessions are cut) and start again on the same socket. A fault
// test stops it without touching the server the other tests share.
func OwnPostgres(t testing.TB) (url string, stop, start func()) {
	t.Helper()
	s, err := tempdb.Start(context.Background(), "relay-pg")
	if err != nil {
		t.Fatalf("start a throwaway PostgreSQL: %v", err)
	}
	t.Cleanup(s.Stop)
	ctl := func(args ...string) {
		if out, err := s.Ctl(args...); err != nil {
			t.Errorf("pg_ctl %v: %v: %s", args, err, out)
		}
	}
	return s.URL("postgres"), func() { ctl("-m", "fast", "stop") }, func() { ctl("start") }
}

// StopPostgres stops the throwaway cluster (fast shutdown: sessions are cut)
// and StartPostgres brings it back on the same socket, for fault tests.
func StopPostgres(t testing.TB) {
	t.Helper()
	pgControl(t, "-m", "fast", "stop")
}

// StartPostgres restarts a cluster stopped by StopPostgres.
func StartPostgres(t testing.TB) {
	t.Helper()
	pgControl(t, "start")
}

func pgControl(t testing.TB, args ...string) {
	mu.Lock()
	ctl := pgctl
	mu.Unlock()
	if ctl == nil {
		t.Fatalf("no throwaway PostgreSQL to control (call PostgresURL first; not possible with %s)", EnvURL)
	}
	if out, err := ctl(args...); err != nil {
		t.Fatalf("pg_ctl %v: %v: %s", args, err, out)
	}
}
