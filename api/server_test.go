package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/relayhq/relay/store/storetest"
)

// TestReadyzDoesNotQueueBehindRequests: /readyz and /readyz/traffic neither
// wait for the connection-plane requests in progress nor, while waiting, hold
// up new ones; once Drain begins both answer 503 at once, before those
// requests finish, and Drain still waits for them.
// TestMain stops the throwaway PostgreSQL the tests start (storetest), which
// would otherwise outlive the test binary.
func TestMain(m *testing.M) { storetest.Main(m) }

func TestReadyzDoesNotQueueBehindRequests(t *testing.T) {
	st := storetest.Open(t, "sqlite:"+filepath.Join(t.TempDir(), "relay.db"))
	s := New(Options{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SessionKey: []byte("k")})

	// probe answers within a second, or the test fails naming what.
	probe := func(path, what string) int {
		t.Helper()
		got := make(chan int, 1)
		go func() {
			w := httptest.NewRecorder()
			s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
			got <- w.Code
		}()
		select {
		case code := <-got:
			return code
		case <-time.After(time.Second):
			t.Fatalf("%s: %s waited for a request in progress", what, path)
			return 0
		}
	}
	readyz := func(what string) int { t.Helper(); return probe("/readyz", what) }

	leave, ok := s.enter(httptest.NewRecorder()) // an emit in progress
	if !ok {
		t.Fatal("not admitted before draining")
	}
	if code := readyz("before draining"); code != http.StatusOK {
		t.Fatalf("/readyz before draining: %d", code)
	}
	if code := probe("/readyz/traffic", "before draining"); code != http.StatusOK {
		t.Fatalf("/readyz/traffic before draining: %d", code)
	}
	if leave2, ok := s.enter(httptest.NewRecorder()); !ok {
		t.Fatal("a second request refused after /readyz")
	} else {
		leave2()
	}

	drained := make(chan struct{})
	go func() { s.Drain(context.Background()); close(drained) }()
	// Polls /readyz until it answers 503: Drain's first step (it marks the
	// server draining, then waits for the request in progress) has no event
	// to wait on.
	deadline := time.Now().Add(5 * time.Second)
	for readyz("draining") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 after Drain began")
		}
		time.Sleep(time.Millisecond)
	}
	if code := probe("/readyz/traffic", "draining"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz/traffic while draining: %d, want 503", code)
	}
	select {
	case <-drained:
		t.Fatal("Drain returned with a request in progress")
	default:
	}
	// A request arriving while Drain waits is refused at once (a waiting
	// writer on a read-write lock used to hold it until the drain ended).
	refused := make(chan int, 1)
	go func() {
		w := httptest.NewRecorder()
		if _, ok := s.enter(w); ok {
			t.Error("admitted while draining")
		}
		refused <- w.Code
	}()
	select {
	case code := <-refused:
		if code != http.StatusServiceUnavailable {
			t.Fatalf("a request during the drain: %d", code)
		}
	case <-time.After(time.Second):
		t.Fatal("a request during the drain waited for it")
	}
	leave()
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return once the request finished")
	}
	w := httptest.NewRecorder()
	if _, ok := s.enter(w); ok || w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a new request after Drain: admitted %v, status %d", ok, w.Code)
	}
}
