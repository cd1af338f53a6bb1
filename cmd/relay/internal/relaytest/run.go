package relaytest

import (
	"errors"
	"os/exec"
	"testing"
	"time"
)

// RunBinary runs `relay serve` with StartBinary's defaults and env, for a
// start that is expected to fail: it returns the exit code and the output
// once the process has exited. A process still running after timeout is
// killed (by its pid) and fails the test.
func RunBinary(t testing.TB, timeout time.Duration, env ...string) (code int, output string) {
	t.Helper()
	cmd := serveCommand(t, env)
	logs := &Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
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
