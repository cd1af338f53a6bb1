package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestStartLogNamesTheDatabaseFile: the start log names the SQLite file by its
// absolute path (a relative DATABASE_URL included) and says at Info when the
// file is new; a second start on it does not.
func TestStartLogNamesTheDatabaseFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	abs := filepath.Join(dir, "data", "relay.db")
	migrate := func() string {
		var logs bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := runCommandTo(ctx, []string{"migrate"}, cfgEnv(map[string]string{"DATABASE_URL": "sqlite:data/relay.db"}), &bytes.Buffer{}, &logs); err != nil {
			t.Fatalf("migrate: %v\n%s", err, logs.String())
		}
		return logs.String()
	}
	first := migrate()
	if !strings.Contains(first, `level=INFO msg="created a new, empty SQLite database" path=`+abs+"\n") {
		t.Fatalf("the first start does not say it created %s:\n%s", abs, first)
	}
	if !strings.Contains(first, `msg="store ready" database=sqlite:data/relay.db path=`+abs+"\n") {
		t.Fatalf("the start log does not name %s:\n%s", abs, first)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatal(err)
	}
	if second := migrate(); strings.Contains(second, "created a new") || !strings.Contains(second, "path="+abs) {
		t.Fatalf("the second start:\n%s", second)
	}
}

// TestStartLogDashboardURL: one line names the dashboard's URL after the
// public "listening" line, whose format relaytest parses.
func TestStartLogDashboardURL(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	logs := ts.Logs.String()
	want := "msg=dashboard url=http://" + ts.app.addr.String() + "/\n"
	listening := "msg=listening listener=public addr=" + ts.app.addr.String() + "\n"
	if !strings.Contains(logs, want) || !strings.Contains(logs, listening) || strings.Index(logs, listening) > strings.Index(logs, want) {
		t.Fatalf("start log, want %q after %q:\n%s", want, listening, logs)
	}
	for addr, url := range map[string]string{"[::]:8080": "http://localhost:8080/", "0.0.0.0:80": "http://localhost:80/", "10.0.0.5:8080": "http://10.0.0.5:8080/", "[::1]:8080": "http://[::1]:8080/"} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := dashboardURL(a); got != url {
			t.Fatalf("dashboardURL(%s) = %s, want %s", addr, got, url)
		}
	}
}

// TestJSONLogDurations: with LOG_FORMAT=json a duration is a Go duration
// string, as in the text log, not nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	t.Parallel()
	cfg, err := LoadConfig(cfgEnv(map[string]string{"LOG_FORMAT": "json", "REPLAY_BUFFER_TTL_SECONDS": "90"}))
	if err != nil {
		t.Fatal(err)
	}
	logs := &relaytest.Buffer{}
	log := newLogger(cfg, logs)
	log.Info("starting", cfg.redacted()...)
	log.With("component", "x").WithGroup("g").Info("took", "elapsed", 1500*time.Millisecond)
	out := logs.String()
	for _, want := range []string{`"replay_ttl":"1m30s"`, `"idle_timeout":"10m0s"`, `"g":{"elapsed":"1.5s"}`} {
		if !strings.Contains(out, want) {
			t.Fatalf("JSON log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "90000000000") {
		t.Fatalf("JSON log has nanoseconds:\n%s", out)
	}
}
