package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/driver/sqliteshim"
	"github.com/uptrace/bun/migrate"
)

// Dialect names the database behind a Store.
type Dialect string

const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

var (
	// ErrNotFound: no row matched (including rows owned by someone else).
	ErrNotFound = errors.New("store: not found")
	// ErrDuplicate: a unique constraint refused the row.
	ErrDuplicate = errors.New("store: duplicate")
	// ErrLimitReached: a bound the caller passed (projects per owner) is
	// already reached; nothing was written.
	ErrLimitReached = errors.New("store: limit reached")
)

// sqlitePragmas make SQLite enforce foreign keys and take the write lock at
// BEGIN, so concurrent transactions wait instead of failing with SQLITE_BUSY
// (a deferred transaction that turns into a write gets SQLITE_BUSY at once,
// busy_timeout or not). synchronous(FULL): in WAL mode, NORMAL does not sync
// the WAL at commit, so a power cut or a kernel crash could take back writes
// we had already answered 201 or 200 for; FULL syncs it before the commit
// returns, as PostgreSQL does by default.
const sqlitePragmas = "_pragma=foreign_keys(1)&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate"

// Store is the database handle shared by every request; safe for concurrent use.
type Store struct {
	db      *bun.DB
	dialect Dialect
	file    *sqliteFile // the SQLite file watched; nil on PostgreSQL and for :memory:
}

// Open connects to the database named by url ("postgres://…" or
// "sqlite:PATH") and checks that it answers. It does not migrate.
func Open(ctx context.Context, url string) (*Store, error) {
	var (
		db      *bun.DB
		dialect Dialect
		file    *sqliteFile
	)
	switch {
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		connector := pgdriver.NewConnector(pgdriver.WithDSN(url), idleTransactionTimeout)
		sqldb := sql.OpenDB(connector)
		sqldb.SetMaxOpenConns(20)
		sqldb.SetMaxIdleConns(20)
		sqldb.SetConnMaxIdleTime(5 * time.Minute)
		db, dialect = bun.NewDB(sqldb, pgdialect.New()), Postgres
	case strings.HasPrefix(url, "sqlite:"):
		dsn, path, created, err := sqliteDSN(strings.TrimPrefix(url, "sqlite:"))
		if err != nil {
			return nil, err
		}
		var sqldb *sql.DB
		if path == "" {
			sqldb, err = sql.Open(sqliteshim.ShimName, dsn)
			if err != nil {
				return nil, err
			}
		} else {
			file = &sqliteFile{path: path, created: created}
			sqldb = sql.OpenDB(fileConnector{drv: sqliteshim.Driver(), dsn: dsn, file: file})
		}
		sqldb.SetMaxOpenConns(8)
		sqldb.SetMaxIdleConns(8)
		db, dialect = bun.NewDB(sqldb, sqlitedialect.New()), SQLite
	default:
		return nil, fmt.Errorf("unsupported database URL %q: want postgres://… or sqlite:PATH", redactURL(url))
	}
	s := &Store{db: db, dialect: dialect, file: file}
	if err := s.Ping(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if file != nil {
		if err := file.record(); err != nil {
			db.Close()
			return nil, err
		}
	}
	return s, nil
}

// sqliteDSN turns "PATH" or "PATH?params" into a modernc DSN with our pragmas,
// creating the file and its directory so that a fresh checkout just runs:
// private to this user (cmd/relay/README.md › Operators). It returns the file's absolute
// path too ("" for :memory:), and whether it created the file.
func sqliteDSN(path string) (dsn, file string, created bool, err error) {
	file, params, _ := strings.Cut(path, "?")
	if file == "" {
		return "", "", false, errors.New("sqlite: empty path in DATABASE_URL")
	}
	if params != "" {
		params += "&"
	}
	if file == ":memory:" {
		return "file:" + file + "?" + params + sqlitePragmas, "", false, nil
	}
	if file, err = filepath.Abs(file); err != nil {
		return "", "", false, fmt.Errorf("sqlite: %w", err)
	}
	if created, err = createPrivate(file); err != nil {
		return "", "", false, fmt.Errorf("sqlite: %w", err)
	}
	return "file:" + file + "?" + params + sqlitePragmas, file, created, nil
}

// redactURL hides a password in a database URL for error messages.
func redactURL(url string) string {
	if at := strings.LastIndex(url, "@"); at > 0 {
		if scheme := strings.Index(url, "://"); scheme > 0 && scheme < at {
			return url[:scheme+3] + "…" + url[at:]
		}
	}
	return url
}

// SQLiteFile is the absolute path of the SQLite database file and whether
// Open created it (a new, empty database); "" on PostgreSQL and :memory:.
func (s *Store) SQLiteFile() (path string, created bool) {
	if s.file == nil {
		return "", false
	}
	return s.file.path, s.file.created
}

// Dialect reports which database backs the store.
func (s *Store) Dialect() Dialect { return s.dialect }

// DB exposes the bun handle to tests and tools in this module.
func (s *Store) DB() *bun.DB { return s.db }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// healthKey is the meta row CheckWrite rewrites.
const healthKey = "health_check"

// CheckWrite commits a small write (one meta row, rewritten) and reports
// whether it went through: a database that answers reads but cannot commit
// (a SQLite file deleted or made read-only, a full disk, a PostgreSQL
// standby after a failover) is not ready.
func (s *Store) CheckWrite(ctx context.Context) error {
	m := meta{Key: healthKey, Value: now().Format(time.RFC3339Nano)}
	_, err := s.db.NewInsert().Model(&m).On("CONFLICT (key) DO UPDATE").Set("value = EXCLUDED.value").Exec(ctx)
	return err
}

// Close releases the connection pool.
func (s *Store) Close() error { return s.db.Close() }

//go:embed migrations/*.sql
var migrationFiles embed.FS

// idleTransactionTimeout has PostgreSQL end a session that sits inside a
// transaction for 2 s (unless the URL sets idle_in_transaction_session_timeout
// itself). Every transaction of the relay runs its statements back to back:
// one left idle is a node that froze (SIGSTOP, a paused VM) mid-commit, and
// its locks (a channel history row's unique publish id, a project's
// history_usage row) would hold every other node's commits back until it ran
// again; and its commit, were it to come after the channel's next owner has
// taken over (its etcd lease lasts 3 s), would store what nobody delivers.
func idleTransactionTimeout(c *pgdriver.Config) {
	if c.ConnParams == nil {
		c.ConnParams = map[string]any{}
	}
	if _, set := c.ConnParams["idle_in_transaction_session_timeout"]; !set {
		c.ConnParams["idle_in_transaction_session_timeout"] = "2000"
	}
}

// migrationLockID keys the PostgreSQL advisory lock that serialises
// migrations across nodes; unlike bun's lock table it dies with the session.
const migrationLockID = 0x72656c6179 // "relay"

// Migrate applies every migration not yet applied.
func (s *Store) Migrate(ctx context.Context) error {
	migrations := migrate.NewMigrations()
	if err := migrations.Discover(migrationFiles); err != nil {
		return err
	}
	// MessageOctets: a channel_messages row's message in bytes (LENGTH
	// counts characters on both).
	types := map[string]string{"UUID": "TEXT", "TS": "TIMESTAMP", "MessageOctets": "LENGTH(CAST(message AS BLOB))"}
	if s.dialect == Postgres {
		types = map[string]string{"UUID": "UUID", "TS": "TIMESTAMPTZ", "MessageOctets": "OCTET_LENGTH(message)"}
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(?)", migrationLockID); err != nil {
			return fmt.Errorf("migration lock: %w", err)
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(?)", migrationLockID)
	}
	m := migrate.NewMigrator(s.db, migrations,
		migrate.WithTemplateData(types),
		migrate.WithMarkAppliedOnSuccess(true))
	if err := m.Init(ctx); err != nil {
		return err
	}
	_, err := m.Migrate(ctx)
	return err
}

// now is the timestamp every row is stamped with: UTC, microseconds, so both
// stores hold and return the same instant.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// isDuplicate reports a unique-constraint violation on either database.
func isDuplicate(err error) bool {
	var pgErr pgdriver.Error
	if errors.As(err, &pgErr) {
		return pgErr.Field('C') == "23505"
	}
	msg := err.Error()
	return strings.Contains(msg, "UNIQUE constraint failed") || strings.Contains(msg, "(2067)") || strings.Contains(msg, "(1555)")
}

// isForeignKeyViolation reports a PostgreSQL foreign-key violation (a row
// naming a project that is gone).
func isForeignKeyViolation(err error) bool {
	var pgErr pgdriver.Error
	return errors.As(err, &pgErr) && pgErr.Field('C') == "23503"
}

// notFound maps sql.ErrNoRows to ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// isForeignKey reports a foreign-key violation on either database.
func isForeignKey(err error) bool {
	if err == nil {
		return false
	}
	var pgErr pgdriver.Error
	if errors.As(err, &pgErr) {
		return pgErr.Field('C') == "23503"
	}
	return strings.Contains(err.Error(), "FOREIGN KEY constraint failed")
}

// ObserveQueries calls observe after every query with its operation
// (SELECT, INSERT, …), duration and error, for metrics.
func (s *Store) ObserveQueries(observe func(op string, d time.Duration, err error)) {
	s.db.AddQueryHook(queryHook{observe})
}

type queryHook struct {
	observe func(op string, d time.Duration, err error)
}

func (h queryHook) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context { return ctx }

func (h queryHook) AfterQuery(_ context.Context, ev *bun.QueryEvent) {
	err := ev.Err
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	h.observe(ev.Operation(), time.Since(ev.StartTime), err)
}

// IsUnavailable reports an error that means the database could not be
// reached or answered too late, as opposed to a bad query: callers answer
// 503 rather than 500.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, sql.ErrConnDone) {
		return true
	}
	if errors.Is(err, errDatabaseFile) {
		return true
	}
	msg := err.Error()
	// SQLite: the file cannot be opened, written or grown (a deleted or
	// read-only directory, a full disk).
	if strings.Contains(msg, "unable to open database file") || strings.Contains(msg, "attempt to write a readonly database") ||
		strings.Contains(msg, "disk I/O error") || strings.Contains(msg, "database or disk is full") {
		return true
	}
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "database system is shutting down") ||
		strings.Contains(msg, "no such file or directory") && strings.Contains(msg, ".s.PGSQL") ||
		strings.Contains(msg, "database is locked")
}
