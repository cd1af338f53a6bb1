package relaytest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Eventually calls cond every 10 ms until it holds, and fails the test if
// timeout passes first, saying what did not happen (format and args).
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("%s: not within %v", fmt.Sprintf(format, args...), timeout)
	}
}

// Within calls cond every 10 ms until it holds (true), or until timeout
// passes (false), for a test that goes on either way.
func Within(timeout time.Duration, cond func() bool) bool {
	return poll(timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) == nil
}

// EventuallyNil calls check every 10 ms until it returns nil, and fails the
// test with its last error if timeout passes first.
func EventuallyNil(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	if err := poll(timeout, check); err != nil {
		t.Fatalf("not within %v: %v", timeout, err)
	}
}

var errNotYet = errors.New("not yet")

func poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WithStacks is an error whose text ends with every goroutine's stack,
// taken only when it is printed (a failing poll would take it every time).
type WithStacks string

// Error is the text, then every goroutine's stack.
func (e WithStacks) Error() string {
	buf := make([]byte, 1<<20)
	return string(e) + "\n" + string(buf[:runtime.Stack(buf, true)])
}
