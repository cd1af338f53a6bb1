package relaytest

import (
	"strings"
	"testing"
)

// TestEnv is what the harness's relays run with, under what a test sets:
// signup open to the addresses tests use, debug logs, and the brute-force
// throttles and per-address caps far above what tests send (each has a test
// of its own).
var TestEnv = map[string]string{
	"ALLOWED_SIGNUP_EMAILS":      "alice@example.com,bob@example.com,carol@example.com",
	"LOG_LEVEL":                  "debug",
	"LOGIN_ATTEMPTS_PER_MINUTE":  "100000",
	"SIGNUP_ATTEMPTS_PER_MINUTE": "100000",
	// Every test socket comes from 127.0.0.1.
	"MAX_CONNECTIONS_PER_ADDRESS": "100000",
	// Nor may the share of HTTP slots refuse a test's burst of handshakes.
	"MAX_HTTP_CONNECTIONS_PER_ADDRESS": "4096",
}

// Start starts the relay binary on the database dbURL with TestEnv, then
// env, both listeners on free loopback ports, and returns it behind the
// Server's helpers, on the wall clock; it is killed when t ends. Under -race
// the relay is built with the race detector too, and a race it reports
// fails the test.
func Start(t testing.TB, dbURL string, env map[string]string) *Server {
	t.Helper()
	vars := []string{"DATABASE_URL=" + dbURL}
	for _, m := range []map[string]string{TestEnv, env} {
		for k, v := range m {
			vars = append(vars, k+"="+v)
		}
	}
	if !raceEnabled {
		return ServerOf(t, startProcess(t, relayBinary, vars))
	}
	var proc *Process
	t.Cleanup(func() { // after the kill: cleanups run last first
		if proc != nil && strings.Contains(proc.Logs.String(), "WARNING: DATA RACE") {
			t.Errorf("the relay reported a data race:\n%s", proc.Logs)
		}
	})
	proc = startProcess(t, raceBinary, vars)
	return ServerOf(t, proc)
}
