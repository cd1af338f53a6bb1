package store_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestSQLiteFilesPrivateAndSynced: a database the relay creates, with its
// directory, -wal and -shm, is readable by its user only, and commits are
// synced (synchronous=FULL, 2).
func TestSQLiteFilesPrivateAndSynced(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "sub")
	path := filepath.Join(dir, "relay.db")
	s := open(t, "sqlite:"+path)
	for p, want := range map[string]os.FileMode{
		dir: os.ModeDir | 0o700, filepath.Dir(dir): os.ModeDir | 0o700,
		path: 0o600, path + "-wal": 0o600, path + "-shm": 0o600,
	} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	var sync int
	if err := s.DB().QueryRowContext(context.Background(), "PRAGMA synchronous").Scan(&sync); err != nil || sync != 2 {
		t.Fatalf("PRAGMA synchronous = %d, %v; want 2 (FULL)", sync, err)
	}
}

// TestSQLiteFileGone: once the database file is moved away (its directory
// renamed, removed, or the -wal deleted) no statement runs, on any
// connection, old or new, and nothing is created in its place; the errors
// read as "unavailable". Moved back, it works again.
func TestSQLiteFileGone(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "relay.db")
	s := open(t, "sqlite:"+path)
	if _, err := s.CreateUser(ctx, "a@example.com", "h"); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckWrite(ctx); err != nil {
		t.Fatal(err)
	}
	gone := func(what string) {
		t.Helper()
		if _, err := s.CreateUser(ctx, "b@example.com", "h"); !store.IsUnavailable(err) {
			t.Fatalf("%s: create user: %v, want an unavailable error", what, err)
		}
		if err := s.CheckWrite(ctx); !store.IsUnavailable(err) {
			t.Fatalf("%s: CheckWrite: %v", what, err)
		}
		if _, err := s.UserByEmail(ctx, "a@example.com"); !store.IsUnavailable(err) {
			t.Fatalf("%s: read: %v", what, err)
		}
	}

	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	gone("directory renamed")
	s.DB().SetMaxIdleConns(0) // every statement on a new connection from here
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	gone("an empty directory in its place")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a new database file was created in place of the old one: %v", err)
	}
	os.Remove(dir)
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateUser(ctx, "b@example.com", "h"); err != nil {
		t.Fatalf("moved back: %v", err)
	}
	// With no connection open SQLite removes its -wal; the next one makes it
	// again, and keeps it while idle.
	s.DB().SetMaxIdleConns(8)
	if _, err := s.UserByEmail(ctx, "b@example.com"); err != nil {
		t.Fatal(err)
	}

	if err := os.Remove(path + "-wal"); err != nil {
		t.Fatal(err)
	}
	gone("-wal removed")

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	gone("directory removed")
}

// TestCheckWrite commits on both stores, again and again.
func TestCheckWrite(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		s := open(t, url)
		for range 3 {
			if err := s.CheckWrite(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
