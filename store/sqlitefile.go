package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// errDatabaseFile: the SQLite database file is no longer where it was opened,
// or cannot be written any more. IsUnavailable reports it, so callers answer
// 503 rather than 500.
var errDatabaseFile = errors.New("sqlite database file unavailable")

// sqliteFile watches the SQLite database on disk. An open SQLite connection
// keeps writing into its file descriptors whatever happens to the path: with
// the directory removed, every commit succeeds into files nobody will ever
// find again, and a new connection would create a fresh, empty database in
// a recreated directory. So before a connection is opened and before every
// statement, the path must still name the file opened at the start (same
// device and inode), its -wal and -shm must still be there once they have
// been (SQLite removes them only when its last connection closes, and a
// statement runs on an open one), and the directory and the file must be
// writable. Each check is a few stat(2) and access(2) calls, next to a
// statement that costs far more.
type sqliteFile struct {
	path    string // the database file, absolute
	created bool   // Open created it: a new, empty database

	mu     sync.Mutex
	opened os.FileInfo     // the file as first seen; nil until then
	seen   map[string]bool // -wal and -shm paths seen since
}

// sidecars are the files SQLite keeps beside the database in WAL mode.
var sidecars = []string{"-wal", "-shm"}

// createPrivate creates path and its missing directories readable by this
// user only (directories 0700, the file 0600), unless they exist; created
// says it made the file. SQLite gives the -wal and -shm files the database
// file's mode.
func createPrivate(path string) (created bool, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, f.Close()
}

// record notes the file as it is now: the one every later check compares with.
func (f *sqliteFile) record() error {
	fi, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("%w: %v", errDatabaseFile, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened, f.seen = fi, map[string]bool{}
	return nil
}

// check reports errDatabaseFile when the database must not be used.
// onConn is false before a connection opens: with no connection open SQLite
// may have removed its -wal and -shm, and the opening recreates them.
func (f *sqliteFile) check(onConn bool) error {
	// The system calls run outside mu: statements on other connections do
	// not queue behind them; mu guards only opened and seen.
	f.mu.Lock()
	opened := f.opened
	f.mu.Unlock()
	if opened == nil {
		return nil // not opened yet
	}
	fi, err := os.Stat(f.path)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s: %v", errDatabaseFile, f.path, err)
	case !os.SameFile(fi, opened):
		return fmt.Errorf("%w: %s was replaced since it was opened", errDatabaseFile, f.path)
	}
	if onConn {
		for _, s := range sidecars {
			_, err := os.Stat(f.path + s)
			f.mu.Lock()
			gone := err != nil && f.seen[s]
			f.seen[s] = f.seen[s] || err == nil
			f.mu.Unlock()
			if gone {
				return fmt.Errorf("%w: %v", errDatabaseFile, err)
			}
		}
	}
	// access(2) with W_OK: a directory or file made read-only, or a file
	// system remounted read-only (EROFS, which holds for root as well).
	for _, p := range []string{filepath.Dir(f.path), f.path} {
		if err := unix.Access(p, unix.W_OK); err != nil {
			return fmt.Errorf("%w: %s is not writable: %v", errDatabaseFile, p, err)
		}
	}
	return nil
}

// fileConnector opens SQLite connections that check the file first.
type fileConnector struct {
	drv  driver.Driver
	dsn  string
	file *sqliteFile
}

func (c fileConnector) Connect(context.Context) (driver.Conn, error) {
	if err := c.file.check(false); err != nil {
		return nil, err // never create a fresh database where the old one was
	}
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &fileConn{Conn: conn, file: c.file}, nil
}

func (c fileConnector) Driver() driver.Driver { return c.drv }

// fileConn is a driver connection whose statements and transactions begin
// only while the file checks out. It implements the optional interfaces the
// SQLite drivers implement, forwarding each (database/sql falls back when
// the driver lacks one, as it would without the wrapper).
type fileConn struct {
	driver.Conn
	file *sqliteFile
}

var (
	_ driver.ConnBeginTx        = (*fileConn)(nil)
	_ driver.ConnPrepareContext = (*fileConn)(nil)
	_ driver.ExecerContext      = (*fileConn)(nil)
	_ driver.QueryerContext     = (*fileConn)(nil)
	_ driver.Pinger             = (*fileConn)(nil)
	_ driver.SessionResetter    = (*fileConn)(nil)
	_ driver.Validator          = (*fileConn)(nil)
)

func (c *fileConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := c.file.check(true); err != nil {
		return nil, err
	}
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	return c.Conn.Begin() //nolint:staticcheck // the fallback database/sql itself uses
}

func (c *fileConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.file.check(true); err != nil {
		return nil, err
	}
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

func (c *fileConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip // database/sql prepares instead (checked there)
	}
	if err := c.file.check(true); err != nil {
		return nil, err
	}
	return e.ExecContext(ctx, query, args)
}

func (c *fileConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if err := c.file.check(true); err != nil {
		return nil, err
	}
	return q.QueryContext(ctx, query, args)
}

func (c *fileConn) Ping(ctx context.Context) error {
	if err := c.file.check(true); err != nil {
		return err
	}
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *fileConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *fileConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}
