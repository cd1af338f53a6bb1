package main

import (
	"context"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// The in-process side of the harness: starting the relay's core in this
// process, on a test clock. Everything a test does to a running relay from
// outside (HTTP and WebSocket clients, the dashboard, the real binary and its
// commands, polling, /metrics, webhook and JWKS endpoints) is the one harness
// in internal/relaytest, which the suites under e2e/ use as well.

// Most tests here are t.Parallel: each has its own server and database, and
// most wait on real time. Those that are not run first, alone: they stop the
// shared PostgreSQL (faults_test.go, storehealth_test.go), take or flood the
// process-wide password-hash slots or set a process-wide test bound
// (throttle_test.go, proxy_test.go), change directory (startlog_test.go),
// count the process's goroutines, or check a bound of a second or two on
// real time (each of those says so).
func TestMain(m *testing.M) { storetest.Main(m) }

// testServer is a relay on a loopback port, stopped when the test ends: a
// process core started in this process (app set) or the real binary (app
// nil), behind the harness's helpers (relaytest.Server).
type testServer struct {
	*relaytest.Server
	app *app
}

// The harness's types under this package's short names.
type (
	client   = relaytest.Client
	response = relaytest.Response
	project  = relaytest.Project
	wsClient = relaytest.WS
	frame    = relaytest.Frame
)

// startServer starts a relay on dbURL with env overriding the defaults
// (RELAY_ADDR on a free loopback port, debug listener off, then
// relaytest.TestEnv()), on the wall clock.
func startServer(t testing.TB, dbURL string, env map[string]string) *testServer {
	t.Helper()
	return startServerAt(t, dbURL, env, time.Now)
}

// startServerAt is startServer on the clock now (a relaytest.Clock's Now):
// budgets, throttles, replay, tokens and usage days follow it.
func startServerAt(t testing.TB, dbURL string, env map[string]string, now func() time.Time) *testServer {
	t.Helper()
	vars := map[string]string{"RELAY_ADDR": "127.0.0.1:0", "RELAY_DEBUG_ADDR": "", "DATABASE_URL": dbURL}
	for k, v := range relaytest.TestEnv() {
		vars[k] = v
	}
	for k, v := range env {
		vars[k] = v
	}
	cfg, err := LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	logs := &relaytest.Buffer{}
	a, err := start(context.Background(), cfg, newLogger(cfg, logs), now)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: &relaytest.Server{T: t, Base: "http://" + a.addr.String(), Logs: logs, Now: now}, app: a}
	if a.debugAddr != nil {
		ts.Debug = "http://" + a.debugAddr.String()
	}
	// Stop (the harness's) shuts it down through here; ts.app is nil after.
	ts.Shutdown = func(ctx context.Context) error {
		a := ts.app
		if a == nil { // a test shut it down itself
			return nil
		}
		ts.app = nil
		return a.shutdown(ctx)
	}
	t.Cleanup(func() {
		if ts.app != nil { // else the test shut it down itself
			ts.Stop()
		}
	})
	return ts
}

// newClock is a test clock standing half-way through the current wall-clock
// minute: a test can step it by seconds and stay in one budget window, and
// what the server stamps with it stays within a minute of the wall clock.
func newClock() *relaytest.Clock {
	return relaytest.NewClock(time.Now().Truncate(time.Minute).Add(30 * time.Second))
}

// debugServer starts a relay on SQLite with the operator listener on.
func debugServer(t testing.TB, env map[string]string) *testServer {
	t.Helper()
	return debugServerAt(t, env, time.Now)
}

// debugServerAt is debugServer on the clock now.
func debugServerAt(t testing.TB, env map[string]string, now func() time.Time) *testServer {
	t.Helper()
	vars := map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:0"}
	for k, v := range env {
		vars[k] = v
	}
	return startServerAt(t, storetest.SQLiteURL(t), vars, now)
}

// binaryServer is the real binary (relaytest.StartBinary) behind the same
// helpers.
func binaryServer(t testing.TB, proc *relaytest.Process) *testServer {
	return &testServer{Server: relaytest.ServerOf(t, proc)}
}
