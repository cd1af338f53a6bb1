package main

// The public listener's HTTP connections (cmd/relay/OPERATING.md › Abuse limits): an idle
// keep-alive connection is closed after HTTP_IDLE_TIMEOUT_SECONDS; at most
// MAX_HTTP_CONNECTIONS are open at once, the longest idle closed to make way
// when they are all taken; one TCP peer address holds at most
// MAX_HTTP_CONNECTIONS_PER_ADDRESS of them; upgraded WebSockets leave these
// counts, so they are bounded by MAX_CONNECTIONS_PER_PROJECT only.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
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
	return ts.dialHTTPFrom(t, "127.0.0.1")
}

// dialHTTPFrom connects from the loopback address from (127.0.0.2 …: every
// 127/8 address is this host's), so that the server sees that peer address.
func (ts *testServer) dialHTTPFrom(t *testing.T, from string) *rawHTTP {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := d.Dial("tcp", ts.Addr())
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
	status, _, err := c.answerBody(timeout)
	return status, err
}

// answerBody is answer with the response's body.
func (c *rawHTTP) answerBody(timeout time.Duration) (int, string, error) {
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	return res.StatusCode, string(b), err
}

// write sends raw bytes of a request.
func (c *rawHTTP) write(raw string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, raw); err != nil {
		c.t.Fatal(err)
	}
}

// startSlowEmit sends an emit's headers and the first byte of a 100-byte
// body, and no more: the connection stays busy in its request (not idle)
// until the server's ReadTimeout (30 s) or the test's end.
func (c *rawHTTP) startSlowEmit(secretKey string) {
	c.t.Helper()
	c.write("POST /emit HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer " + secretKey +
		"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
}

// closedUnanswered fails unless the server closes the connection within
// timeout without sending a byte.
func (c *rawHTTP) closedUnanswered(timeout time.Duration, what string) {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	n, err := c.br.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		c.t.Fatalf("%s: read %d bytes, %v; want the server to close it unanswered", what, n, err)
	}
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
	t.Parallel()
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

// httpCounts polls until the listener's count, the count of its idle
// connections and the count of each address listed are as wanted.
func (ts *testServer) httpCounts(t *testing.T, open, idle int, byAddr map[string]int) {
	t.Helper()
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		if got, gotIdle, _ := ts.app.httpConns.counts("127.0.0.1"); got != open || gotIdle != idle {
			return fmt.Errorf("%d HTTP connections held, %d idle; want %d, %d idle", got, gotIdle, open, idle)
		}
		for addr, want := range byAddr {
			if _, _, got := ts.app.httpConns.counts(addr); got != want {
				return fmt.Errorf("%d HTTP connections held by %s, want %d", got, addr, want)
			}
		}
		return nil
	})
}

// TestHTTPConnectionCap: with MAX_HTTP_CONNECTIONS held by busy connections
// (requests whose bodies are still arriving), a new connection waits (it is
// not refused) and is served as soon as one closes. WebSockets give their
// slot back when they are upgraded: many more than the cap stay open, up to
// MAX_CONNECTIONS_PER_PROJECT, and HTTP requests are still served beside them.
func TestHTTPConnectionCap(t *testing.T) {
	t.Parallel()
	const maxHTTP, perProject = 3, 8
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		// The sockets come from one address, one after the other, each while
		// the server may not yet have seen the previous one go.
		"MAX_HTTP_CONNECTIONS": "3", "MAX_HTTP_CONNECTIONS_PER_ADDRESS": "3", "MAX_CONNECTIONS_PER_PROJECT": "8",
	})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	owner.HTTP.CloseIdleConnections()

	for range perProject {
		ts.DialWS(p.PublicKey)
	}
	ts.Handshake("/ws?publicKey="+p.PublicKey).Expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`)
	ts.httpCounts(t, 0, 0, nil) // the slots free up as the server sees the closes

	// Each from its own address, every one within its share.
	var held []*rawHTTP
	for _, from := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		c := ts.dialHTTPFrom(t, from)
		c.startSlowEmit(p.SecretKey)
		held = append(held, c)
	}
	ts.httpCounts(t, maxHTTP, 0, nil)
	waiting := ts.dialHTTPFrom(t, "127.0.0.5") // the kernel accepts it; the server does not yet
	waiting.send("/healthz")
	if status, err := waiting.answer(500 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection past MAX_HTTP_CONNECTIONS was answered (%d, %v) while the others were busy", status, err)
	}
	held[0].conn.Close()
	if status, err := waiting.answer(5 * time.Second); err != nil || status != http.StatusOK {
		t.Fatalf("the waiting connection once a slot was free: %d %v", status, err)
	}
	ts.httpCounts(t, maxHTTP, 1, map[string]int{"127.0.0.2": 0, "127.0.0.5": 1})
}

// TestHTTPShareOfAddress: one address holding its share of busy connections
// (MAX_HTTP_CONNECTIONS_PER_ADDRESS) gets no more, while another address's
// /healthz, emit and WebSocket handshake are each answered within a second;
// when the listener is full, the connection idle the longest makes way, and
// an address at its share gives up its own idle one first.
func TestHTTPShareOfAddress(t *testing.T) {
	// Not parallel: answers within 1 s.
	const a, b, c = "127.0.0.2", "127.0.0.3", "127.0.0.4"
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"MAX_HTTP_CONNECTIONS": "4", "MAX_HTTP_CONNECTIONS_PER_ADDRESS": "2",
	})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	owner.HTTP.CloseIdleConnections()
	ts.httpCounts(t, 0, 0, nil)

	// a holds its share with two requests whose bodies never finish.
	a1, a2 := ts.dialHTTPFrom(t, a), ts.dialHTTPFrom(t, a)
	a1.startSlowEmit(p.SecretKey)
	a2.startSlowEmit(p.SecretKey)
	ts.httpCounts(t, 2, 0, map[string]int{a: 2})
	// Its next connection is closed at once, unanswered: it has nothing idle
	// to give up.
	a3 := ts.dialHTTPFrom(t, a)
	a3.closedUnanswered(time.Second, "a third connection of an address at its share, the others busy")
	ts.httpCounts(t, 2, 0, map[string]int{a: 2})

	// b fills the listener with two idle keep-alive connections, b1 idle
	// first.
	b1, b2 := ts.dialHTTPFrom(t, b), ts.dialHTTPFrom(t, b)
	b1.get("/healthz")
	ts.httpCounts(t, 4, 1, map[string]int{a: 2, b: 2})
	b2.get("/healthz")
	ts.httpCounts(t, 4, 2, map[string]int{a: 2, b: 2})

	within := func(what string, conn *rawHTTP, wantStatus int) string {
		t.Helper()
		began := time.Now()
		status, body, err := conn.answerBody(time.Second)
		if err != nil || status != wantStatus {
			t.Fatalf("%s from another address: %d %q %v after %v, want %d within 1 s", what, status, body, err, time.Since(began), wantStatus)
		}
		return body
	}

	// c's /healthz: b1, idle the longest, makes way.
	c1 := ts.dialHTTPFrom(t, c)
	c1.send("/healthz")
	if body := within("GET /healthz", c1, http.StatusOK); body != `{"status":"ok"}`+"\n" {
		t.Fatalf("GET /healthz: body %q", body)
	}
	b1.closedUnanswered(time.Second, "b's connection idle the longest, the listener full")
	ts.httpCounts(t, 4, 2, map[string]int{a: 2, b: 1, c: 1}) // b2 and c1 idle

	// c's emit on a new connection: b2 is now the longest idle.
	c2 := ts.dialHTTPFrom(t, c)
	const emit = `{"channel":"room","payload":1}`
	c2.write(fmt.Sprintf("POST /emit HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", p.SecretKey, len(emit), emit))
	var res struct {
		OK              bool   `json:"ok"`
		Channel         string `json:"channel"`
		Seq, Delivered  int
		SubscriberCount int `json:"subscriberCount"`
	}
	if err := json.Unmarshal([]byte(within("POST /emit", c2, http.StatusOK)), &res); err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Channel != "room" || res.Seq <= 0 || res.Delivered != 0 || res.SubscriberCount != 0 {
		t.Fatalf("emit answered %+v, want ok on room with a seq and no subscribers", res)
	}
	b2.closedUnanswered(time.Second, "b's other idle connection, the listener full")
	ts.httpCounts(t, 4, 2, map[string]int{a: 2, b: 0, c: 2}) // c1 and c2 idle, c1 first

	// c's handshake: c is at its share, so its own idle c1 makes way (not
	// one of a's busy ones); once upgraded, the socket leaves the count.
	c3 := ts.dialHTTPFrom(t, c)
	c3.write("GET /ws?publicKey=" + p.PublicKey + " HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	within("WebSocket handshake", c3, http.StatusSwitchingProtocols)
	c1.closedUnanswered(time.Second, "c's own idle connection, c at its share")
	ts.httpCounts(t, 3, 1, map[string]int{a: 2, c: 1}) // c2 idle

	// a's busy requests were never cut.
	a1.write(strings.Repeat(" ", 99))
	if status, body, err := a1.answerBody(5 * time.Second); err != nil || status != http.StatusBadRequest || body != `{"error":"invalid_json"}`+"\n" {
		t.Fatalf("a's slow emit, finished: %d %q %v; want 400 invalid_json", status, body, err)
	}
}

// TestHTTPShareTrustedProxy: a peer in TRUSTED_PROXIES carries every client
// of a reverse proxy, so it has no share of its own, only the total.
func TestHTTPShareTrustedProxy(t *testing.T) {
	// Not parallel: answers within 1 s.
	const proxy = "127.0.0.5"
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"MAX_HTTP_CONNECTIONS": "4", "MAX_HTTP_CONNECTIONS_PER_ADDRESS": "1", "TRUSTED_PROXIES": proxy,
	})
	var conns []*rawHTTP
	for range 3 {
		c := ts.dialHTTPFrom(t, proxy)
		c.get("/healthz")
		conns = append(conns, c)
	}
	ts.httpCounts(t, 3, 3, map[string]int{proxy: 3})
	for _, c := range conns {
		c.get("/healthz") // each still open
	}
}
