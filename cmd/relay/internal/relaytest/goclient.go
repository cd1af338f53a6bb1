package relaytest

// Helpers for tests of the Go client (api/client) against a relay.

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	relay "github.com/relayhq/relay/api/client"
)

// NextEvent is the subscription's next event; none within 10 s fails the test.
func NextEvent(t testing.TB, s *relay.Subscription) relay.Event {
	t.Helper()
	select {
	case ev := <-s.Events():
		return ev
	case <-s.Done():
		t.Fatal("subscription ended")
	case <-time.After(10 * time.Second):
		t.Fatal("no event in 10s")
	}
	return relay.Event{}
}

// NextMessage is the subscription's next message, skipping other events.
func NextMessage(t testing.TB, s *relay.Subscription) *relay.Message {
	t.Helper()
	for {
		ev := NextEvent(t, s)
		if ev.Message != nil {
			return ev.Message
		}
	}
}

// ExpectNoEvent fails if the subscription has an event ready.
func ExpectNoEvent(t testing.TB, s *relay.Subscription) {
	t.Helper()
	select {
	case ev := <-s.Events():
		t.Fatalf("unexpected event %+v (message %+v)", ev, ev.Message)
	default:
	}
}

// GoroutineBaseline warms up what the test's process keeps for good (a
// keep-alive HTTP connection of owner; with a relay in the process, its
// actors' pool of turn goroutines) with one emit, and returns the process's
// goroutine count once it holds still.
func GoroutineBaseline(t testing.TB, owner *Client, p Project) int {
	t.Helper()
	if r := owner.Emit(p.SecretKey, `{"channel":"warm-up","payload":0}`); r.Status != 200 {
		t.Fatalf("warm-up emit: %s", r.Raw)
	}
	// Still: the same count at six polls in a row (10 ms apart).
	last, same := -1, 0
	Eventually(t, 10*time.Second, func() bool {
		if n := runtime.NumGoroutine(); n == last {
			same++
		} else {
			last, same = n, 0
		}
		return same >= 5
	}, "the goroutine count holding still")
	return last
}

// SettleGoroutines waits until the test's process is back to at most before
// goroutines, with no slack, and dumps every stack if it is not.
func SettleGoroutines(t testing.TB, before int) {
	t.Helper()
	EventuallyNil(t, 10*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return WithStacks(fmt.Sprintf("goroutines: %d before, %d after", before, n))
		}
		return nil
	})
}

// WaitState waits until the client is in state want.
func WaitState(t testing.TB, c *relay.Client, want relay.State) {
	t.Helper()
	EventuallyNil(t, 10*time.Second, func() error {
		if got := c.State(); got != want {
			return fmt.Errorf("state %s, want %s", got, want)
		}
		return nil
	})
}

// StepClock is a client Clock the test drives: every wait the client starts
// (backoff, the healthy-connection timer) is handed to the test, which fires
// it when it wants; a wait never fired never ends.
type StepClock struct{ waits chan *ClockWait }

// ClockWait is one wait the client started: its length, and Fire to end it.
type ClockWait struct {
	D time.Duration
	c chan time.Time
}

// NewStepClock is a StepClock with no wait started.
func NewStepClock() *StepClock { return &StepClock{waits: make(chan *ClockWait, 1024)} }

// After is the client's Clock: a wait handed to the test.
func (s *StepClock) After(d time.Duration) <-chan time.Time {
	w := &ClockWait{D: d, c: make(chan time.Time, 1)}
	s.waits <- w
	return w.c
}

// Fire ends the wait.
func (w *ClockWait) Fire() {
	select {
	case w.c <- time.Time{}:
	default:
	}
}

// Next is the next wait the client starts; none within 10 s fails the test.
func (s *StepClock) Next(t testing.TB) *ClockWait {
	t.Helper()
	select {
	case w := <-s.waits:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("the client started no wait in 10s")
	}
	return nil
}

// Backoff returns the client's next reconnect wait, passing over the
// healthy-connection timers (never fired: the connections are not healthy).
func (s *StepClock) Backoff(t testing.TB) *ClockWait {
	t.Helper()
	for {
		if w := s.Next(t); w.D != relay.HealthyConnection {
			return w
		}
	}
}

// Health returns the healthy-connection timer of the next connection.
func (s *StepClock) Health(t testing.TB) *ClockWait {
	t.Helper()
	w := s.Next(t)
	if w.D != relay.HealthyConnection {
		t.Fatalf("wait of %v, want the healthy-connection timer", w.D)
	}
	return w
}

// ExactSeq is the seq of an emit answer, read from the body as a uint64 (not
// through a float64).
func ExactSeq(t testing.TB, r Response) uint64 {
	t.Helper()
	var v struct {
		Seq *uint64 `json:"seq"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &v); err != nil || v.Seq == nil || r.Status != 200 {
		t.Fatalf("emit answer %d %s: no seq (%v)", r.Status, r.Raw, err)
	}
	return *v.Seq
}
