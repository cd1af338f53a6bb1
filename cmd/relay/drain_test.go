package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestDrainKeepsTheShutdownBound: an emit whose body is still arriving when
// SIGTERM comes (a slow backend upload) does not hold the shutdown: the drain
// waits only for the emits it admitted, which an emit is once its body is in,
// and this one, completed during the shutdown, gets 503. (The drain waited
// for it with no bound, up to the listener's 30 s ReadTimeout, and held every
// new emit meanwhile.)
func TestDrainKeepsTheShutdownBound(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"SHUTDOWN_TIMEOUT_SECONDS": "5"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	if r := owner.Emit(p.SecretKey, `{"channel":"a","payload":1}`); r.Status != 200 {
		t.Fatal(r.Raw)
	}

	// A slow emit: headers and part of the body, the rest later.
	slow, err := net.Dial("tcp", ts.app.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	head := "POST /emit HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer " + p.SecretKey +
		"\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n"
	if _, err := slow.Write([]byte(head + `{"channel":`)); err != nil {
		t.Fatal(err)
	}
	// The handler is now reading the body once the server has taken in
	// everything sent so far (its end of the socket holds nothing unread).
	relaytest.Eventually(t, 5*time.Second, func() bool {
		n, ok := relaytest.Unread(slow.RemoteAddr(), slow.LocalAddr())
		return ok && n == 0
	}, "the server reading the slow emit's headers and the start of its body")

	a := ts.app
	ts.app = nil // this test shuts it down
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // cfg.ShutdownTimeout, as run() does
		defer cancel()
		done <- a.shutdown(ctx)
	}()
	// The shutdown has begun, its drain refusing: /readyz/traffic answers
	// 503, or the listener, closed later in the shutdown, refuses.
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	relaytest.Eventually(t, 5*time.Second, func() bool {
		res, err := probe.Get(ts.Base + "/readyz/traffic")
		if err != nil {
			return errors.Is(err, syscall.ECONNREFUSED)
		}
		res.Body.Close()
		return res.StatusCode == http.StatusServiceUnavailable
	}, "the shutdown begun")
	// The rest of the body, during the shutdown: refused, not published.
	if _, err := slow.Write([]byte(`"a","payload":2}`)); err != nil {
		t.Fatal(err)
	}
	slow.SetReadDeadline(time.Now().Add(3 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil {
		t.Fatalf("the slow emit's answer: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || strings.TrimSpace(string(body)) != `{"error":"service_unavailable"}` {
		t.Fatalf("the slow emit, completed during the shutdown: %d %s", res.StatusCode, body)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Second):
		t.Fatalf("shutdown still running %v after it began", time.Since(began).Round(time.Millisecond))
	}
}
