package relaytest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// RunBinary runs `relay serve` with StartBinary's defaults and env, for a
// start that is expected to fail: it returns the exit code and the output
// once the process has exited. A process still running after timeout is
// killed (by its pid) and fails the test.
func RunBinary(t testing.TB, timeout time.Duration, env ...string) (code int, output string) {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatalf("build relay: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "serve")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{
		"RELAY_ADDR=127.0.0.1:0", "RELAY_DEBUG_ADDR=127.0.0.1:0", "LOG_FORMAT=text",
		"DATABASE_URL=sqlite:" + filepath.Join(dir, "relay.db"), "ALLOWED_SIGNUP_EMAILS=alice@example.com",
	}, env...)...)
	logs := &Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("relay still running after %v:\n%s", timeout, logs)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), logs.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, logs.String()
}
