package relaytest

import (
	"strings"
	"testing"
)

// TestEnv is what the harness's relays run with, under what a test sets:
// signup open to the addresses tests use, debug logs, and the brute-force
// throttles and per-address caps far above what tests send (each has a test
// of its own). Each call makes a new map: parallel tests may change theirs.
func TestEnv() map[string]string {
	return map[string]string{
		"ALLOWED_SIGNUP_EMAILS":      "alice@example.com,bob@example.com,carol@example.com",
		"LOG_LEVEL":                  "debug",
		"LOGIN_ATTEMPTS_PER_MINUTE":  "100000",
		"SIGNUP_ATTEMPTS_PER_MINUTE": "100000",
		// Every test socket comes from 127.0.0.1.
		"MAX_CONNECTIONS_PER_ADDRESS": "100000",
		// Nor may the share of HTTP slots refuse a test's burst of handshakes.
		"MAX_HTTP_CONNECTIONS_PER_ADDRESS": "4096",
	}
}

// Start starts the relay binary on the database dbURL with TestEnv, then
// env, both listeners on free loopback ports, and returns it behind the
// Server's helpers, on the wall clock. When t ends it is stopped as Stop
// does, unless the test stopped it: a shutdown that fails or exits non-zero
// fails the test. Under -race the relay is built with the race detector
// too, and a race it reports fails the test.
func Start(t testing.TB, dbURL string, env map[string]string) *Server {
	t.Helper()
	vars := []string{"DATABASE_URL=" + dbURL}
	for _, m := range []map[string]string{TestEnv(), env} {
		for k, v := range m {
			vars = append(vars, k+"="+v)
		}
	}
	build := relayBinary
	if raceEnabled {
		// The race detector waits a second at exit by default, for other
		// goroutines to report: a tenth is plenty for a relay that has
		// stopped its own.
		build, vars = raceBinary, append(vars, "GORACE=atexit_sleep_ms=100")
	}
	var proc *Process
	t.Cleanup(func() { // after the exit: cleanups run last first
		if proc != nil && strings.Contains(proc.Logs.String(), "WARNING: DATA RACE") {
			t.Errorf("the relay reported a data race:\n%s", proc.Logs)
		}
	})
	proc = startProcess(t, build, vars)
	s := ServerOf(t, proc)
	t.Cleanup(func() {
		if s.stopped { // Stop checked the exit (or gave up: the kill follows)
			return
		}
		select {
		case <-proc.Exited:
			t.Errorf("the relay exited during the test (%v):\n%s", proc.Cmd.ProcessState, proc.Logs)
		default:
			if err := s.stop(); err != nil {
				t.Error(err)
			}
		}
	})
	return s
}
