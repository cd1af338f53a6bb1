package main

// The public listener's HTTP connections (README › Abuse limits): an idle
// keep-alive connection is closed after HTTP_IDLE_TIMEOUT_SECONDS, and at
// most MAX_HTTP_CONNECTIONS are open at once; upgraded WebSockets leave that
// count, so they are bounded by MAX_CONNECTIONS_PER_PROJECT only.

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// rawHTTP is one client TCP connection speaking HTTP/1.1 by hand, so the
// test decides when it is idle.
type rawHTTP struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func (ts *testServer) dialHTTP(t *testing.T) *rawHTTP {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(ts.base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawHTTP{t: t, conn: conn, br: bufio.NewReader(conn)}
}

// send writes a keep-alive GET of path.
func (c *rawHTTP) send(path string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, "GET "+path+" HTTP/1.1\r\nHost: relay\r\n\r\n"); err != nil {
		c.t.Fatal(err)
	}
}

// answer reads one response within timeout; err is a timeout when none came.
func (c *rawHTTP) answer(timeout time.Duration) (int, error) {
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, nil
}

func (c *rawHTTP) get(path string) {
	c.t.Helper()
	c.send(path)
	if status, err := c.answer(5 * time.Second); err != nil || status != http.StatusOK {
		c.t.Fatalf("GET %s: %d %v", path, status, err)
	}
}

// TestHTTPIdleConnectionClosed: a keep-alive connection that sends nothing
// after its answer is closed by the server after HTTP_IDLE_TIMEOUT_SECONDS,
// well before ReadHeaderTimeout (5 s) could have done it; one that keeps
// sending requests is served.
func TestHTTPIdleConnectionClosed(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"HTTP_IDLE_TIMEOUT_SECONDS": "1"})
	c := ts.dialHTTP(t)
	c.get("/healthz")
	c.get("/healthz") // still open: the same connection serves a second request
	idle := time.Now()
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.br.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %d bytes, %v; want the server to close it", n, err)
	}
	if took := time.Since(idle); took > 4*time.Second {
		t.Fatalf("idle connection closed after %v, want about 1 s", took)
	}
}

// TestHTTPConnectionCap: with MAX_HTTP_CONNECTIONS held by idle keep-alive
// connections, a new connection waits (it is not refused) and is served as
// soon as one closes. WebSockets give their slot back when they are
// upgraded: many more than the cap stay open, up to
// MAX_CONNECTIONS_PER_PROJECT, and HTTP requests are still served beside them.
func TestHTTPConnectionCap(t *testing.T) {
	const maxHTTP, perProject = 3, 8
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"MAX_HTTP_CONNECTIONS": "3", "MAX_CONNECTIONS_PER_PROJECT": "8",
	})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	owner.http.CloseIdleConnections()

	for range perProject {
		ts.dialWS(p.publicKey)
	}
	ts.handshake("/ws?publicKey="+p.publicKey).expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`)

	// The slots free up as the server sees the closes.
	var held []*rawHTTP
	for range maxHTTP {
		c := ts.dialHTTP(t)
		c.get("/healthz")
		held = append(held, c)
	}
	waiting := ts.dialHTTP(t) // the kernel accepts it; the server does not yet
	waiting.send("/healthz")
	if status, err := waiting.answer(500 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection past MAX_HTTP_CONNECTIONS was answered (%d, %v) while the others were open", status, err)
	}
	held[0].conn.Close()
	if status, err := waiting.answer(5 * time.Second); err != nil || status != http.StatusOK {
		t.Fatalf("the waiting connection once a slot was free: %d %v", status, err)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return ts.app.httpConns.open() == maxHTTP }, "the cap's count back to %d", maxHTTP)
}
