package main

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/store/storetest"
)

// TestDrainKeepsTheShutdownBound: an emit whose body is still arriving when
// SIGTERM comes (a slow backend upload) is waited for only up to
// SHUTDOWN_TIMEOUT_SECONDS, and emits arriving meanwhile get 503 at once.
// (Drain waited for it with no bound, up to the listener's 30 s ReadTimeout,
// and held every new emit meanwhile.)
func TestDrainKeepsTheShutdownBound(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"SHUTDOWN_TIMEOUT_SECONDS": "1"})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	if r := owner.emit(p.secretKey, `{"channel":"a","payload":1}`); r.status != 200 {
		t.Fatal(r.raw)
	}

	// A slow emit: headers and part of the body, the rest never comes.
	slow, err := net.Dial("tcp", ts.app.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := slow.Write([]byte("POST /emit HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer " + p.secretKey +
		"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"channel\":")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the handler is now reading the body

	a := ts.app
	ts.app = nil // this test shuts it down
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // cfg.ShutdownTimeout, as run() does
		defer cancel()
		done <- a.shutdown(ctx)
	}()
	time.Sleep(200 * time.Millisecond)

	// A new emit during the drain must be refused at once with 503.
	hc := &http.Client{Timeout: 2 * time.Second}
	req, _ := http.NewRequest("POST", ts.base+"/emit", strings.NewReader(`{"channel":"a","payload":2}`))
	req.Header.Set("Authorization", "Bearer "+p.secretKey)
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	res, err := hc.Do(req)
	var newEmit string
	if err != nil {
		newEmit = "new emit during the drain: " + err.Error() + " after " + time.Since(sent).Round(time.Millisecond).String()
	} else {
		res.Body.Close()
		if res.StatusCode != 503 {
			newEmit = "new emit during the drain: status " + res.Status
		}
	}

	var shutdownErr string
	select {
	case <-done:
	case <-time.After(4 * time.Second):
		shutdownErr = "shutdown still running " + time.Since(began).Round(time.Millisecond).String() + " after SIGTERM with SHUTDOWN_TIMEOUT_SECONDS=1"
		slow.Close() // let it finish
		<-done
	}
	if newEmit != "" || shutdownErr != "" {
		t.Fatalf("%s\n%s", newEmit, shutdownErr)
	}
}
