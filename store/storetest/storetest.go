// Package storetest gives tests real databases: a throwaway PostgreSQL
// cluster per test binary (initdb in a temp dir, unix socket only, run as the
// postgres user when the tests run as root) with a fresh schema per test, and
// a fresh SQLite file per test.
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/relayhq/relay/store"
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

// pgBin finds the newest installed PostgreSQL binaries (Debian layout first).
func pgBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) < pgVersion(dirs[j]) })
	if len(dirs) > 0 {
		return dirs[len(dirs)-1], nil
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL binaries in /usr/lib/postgresql/*/bin or PATH")
	}
	return filepath.Dir(p), nil
}

func pgVersion(dir string) int {
	var v int
	fmt.Sscanf(filepath.Base(filepath.Dir(dir)), "%d", &v)
	return v
}

// runPG executes a PostgreSQL tool, as the postgres user when we are root
// (PostgreSQL refuses to run as root).
func runPG(args ...string) ([]byte, error) {
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres", "--"}, args...)
		return exec.Command("runuser", args...).CombinedOutput()
	}
	return exec.Command(args[0], args[1:]...).CombinedOutput()
}

// stopStalePostgres stops the throwaway cluster of an earlier test process
// that is gone without stopping it (a panic ends a test binary before
// Main's stop), found by the pid in its directory's name, and removes the
// directory.
func stopStalePostgres(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-pg-*-*"))
	for _, d := range dirs {
		owner, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), "relay-pg-"), "-", 2)[0])
		if err != nil || owner == os.Getpid() || syscall.Kill(owner, 0) != syscall.ESRCH {
			continue
		}
		data := filepath.Join(d, "data")
		if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
			runPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-w", "-t", "30", "-m", "immediate", "stop")
		}
		os.RemoveAll(d)
	}
}

// startPostgres initdb's a cluster in a temp dir and starts it listening only
// on a unix socket there, tuned for tests (no fsync).
func startPostgres() (url string, stop func(), err error) {
	bin, err := pgBin()
	if err != nil {
		return "", nil, err
	}
	stopStalePostgres(bin)
	dir, err := os.MkdirTemp("", fmt.Sprintf("relay-pg-%d-", os.Getpid()))
	if err != nil {
		return "", nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", nil, fmt.Errorf("running as root needs a postgres user: %w", err)
		}
		var uid, gid int
		fmt.Sscanf(u.Uid, "%d", &uid)
		fmt.Sscanf(u.Gid, "%d", &gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := runPG(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-c listen_addresses='' -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", dir)
	if out, err := runPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "pg.log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "pg.log"))
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	stop = func() {
		runPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-w", "-m", "immediate", "stop")
		os.RemoveAll(dir)
	}
	pgctl = func(args ...string) ([]byte, error) {
		return runPG(append([]string{filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "pg.log"), "-w", "-t", "60", "-o", opts}, args...)...)
	}
	url = fmt.Sprintf("postgres://postgres@/postgres?host=%s&sslmode=disable", filepath.Join(dir, ".s.PGSQL.5432"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(url)))
	defer db.Close()
	for {
		if err = db.PingContext(ctx); err == nil {
			return url, stop, nil
		}
		if ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("PostgreSQL did not answer: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
