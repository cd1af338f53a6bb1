package relaytest

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// RunBinary runs `relay serve` with StartBinary's defaults and env, for a
// start that is expected to fail: it returns the exit code and the output
// once the process has exited. A process still running after timeout is
// killed (by its pid) and fails the test.
func RunBinary(t testing.TB, timeout time.Duration, env ...string) (code int, output string) {
	t.Helper()
	cmd := serveCommand(t, relayBinary, env)
	logs := &Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	code, err := run(cmd, timeout)
	if err != nil {
		t.Fatalf("relay serve: %v:\n%s", err, logs)
	}
	return code, logs.String()
}

// Command runs `relay args…` (cert, admin, …) with env (KEY=VALUE), not this
// process's settings (hostEnv), in a fresh temp dir, and returns its exit code,
// its stdout and its stderr. One still running after a minute is killed (by
// its pid) and fails the test.
func Command(t testing.TB, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(hostEnv(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	code, err := run(cmd, time.Minute)
	if err != nil {
		t.Fatalf("relay %q: %v:\n%s", args, err, errOut.String())
	}
	return code, out.String(), errOut.String()
}

// CommandOK is Command that must exit 0; it returns the stdout.
func CommandOK(t testing.TB, env []string, args ...string) string {
	t.Helper()
	code, out, errOut := Command(t, env, args...)
	if code != 0 {
		t.Fatalf("relay %q exited %d:\n%s", args, code, errOut)
	}
	return out
}

// run starts cmd and returns its exit code once it has exited; one still
// running after timeout is killed, and that is an error.
func run(cmd *exec.Cmd, timeout time.Duration) (int, error) {
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return 0, fmt.Errorf("still running after %v", timeout)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	return 0, err
}
