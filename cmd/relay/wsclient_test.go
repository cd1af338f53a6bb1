package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// wsClient is a real WebSocket client on a real socket, built on an
// independent library (gorilla/websocket), not the server's own framing code.
type wsClient struct {
	t      testing.TB
	conn   *websocket.Conn
	frames chan frame
}

// frame is what the server sent: a text message, or a close.
type frame struct {
	text      string
	closed    bool
	closeCode int
	reason    string
	err       error // the connection failed without a close frame
}

func (ts *testServer) wsURL(publicKey string) string {
	u := "ws://" + strings.TrimPrefix(ts.base, "http://") + "/ws"
	if publicKey != "" {
		u += "?publicKey=" + url.QueryEscape(publicKey)
	}
	return u
}

// dialWS connects with publicKey; it fails the test unless the upgrade succeeds.
func (ts *testServer) dialWS(publicKey string) *wsClient {
	ts.t.Helper()
	c, status, err := ts.tryDialWS(publicKey)
	if err != nil {
		ts.t.Fatalf("dial: status %d: %v", status, err)
	}
	return c
}

// tryDialWS returns the HTTP status of a refused handshake.
func (ts *testServer) tryDialWS(publicKey string) (*wsClient, int, error) {
	return ts.dialWSWith(publicKey, true)
}

// dialWSWith connects; with read false nothing ever reads the socket (a peer
// that stopped reading).
func (ts *testServer) dialWSWith(publicKey string, read bool) (*wsClient, int, error) {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	conn, res, err := d.Dial(ts.wsURL(publicKey), nil)
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		return nil, status, err
	}
	c := &wsClient{t: ts.t, conn: conn, frames: make(chan frame, 1024)}
	ts.t.Cleanup(func() { conn.Close() })
	if read {
		go c.readLoop()
	}
	return c, http.StatusSwitchingProtocols, nil
}

// handshake tries a real WebSocket handshake on pathAndQuery and returns the
// answer: a refusal with its headers and JSON body, or 101 with the
// upgrade's headers (the connection is then closed at once).
func (ts *testServer) handshake(pathAndQuery string) response {
	ts.t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	conn, res, err := d.Dial("ws://"+strings.TrimPrefix(ts.base, "http://")+pathAndQuery, nil)
	if err == nil {
		conn.Close()
		return response{status: res.StatusCode, header: res.Header}
	}
	if res == nil {
		ts.t.Fatalf("handshake %s: %v", pathAndQuery, err)
	}
	raw, _ := io.ReadAll(res.Body) // what the dialer kept of a refusal's body
	r := response{status: res.StatusCode, header: res.Header, raw: string(raw)}
	json.Unmarshal(raw, &r.json)
	return r
}

// readLoop turns everything the server sends into frames, so that a test
// can wait with a timeout without breaking the connection.
func (c *wsClient) readLoop() {
	defer close(c.frames)
	for {
		_, msg, err := c.conn.ReadMessage()
		var ce *websocket.CloseError
		switch {
		case errors.As(err, &ce):
			c.frames <- frame{closed: true, closeCode: ce.Code, reason: ce.Text}
			return
		case err != nil:
			c.frames <- frame{err: err}
			return
		}
		c.frames <- frame{text: string(msg)}
	}
}

func (c *wsClient) send(v string) {
	c.t.Helper()
	c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.conn.WriteMessage(websocket.TextMessage, []byte(v)); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// sendRaw writes bytes straight to the socket, under the library.
func (c *wsClient) sendRaw(b []byte) {
	c.t.Helper()
	if _, err := c.conn.UnderlyingConn().Write(b); err != nil {
		c.t.Fatalf("raw write: %v", err)
	}
}

// next waits up to timeout for the next frame.
func (c *wsClient) next(timeout time.Duration) (frame, bool) {
	select {
	case f, ok := <-c.frames:
		if !ok {
			return frame{err: errors.New("connection over")}, true
		}
		return f, true
	case <-time.After(timeout):
		return frame{}, false
	}
}

// expect reads the next message and compares it as JSON with want.
func (c *wsClient) expect(want string) map[string]any {
	c.t.Helper()
	return c.expectExcept(want)
}

// expectExcept is expect, ignoring the named keys of the message (values
// such as seq that the test cannot know); it returns the whole message.
func (c *wsClient) expectExcept(want string, ignore ...string) map[string]any {
	c.t.Helper()
	f, ok := c.next(5 * time.Second)
	switch {
	case !ok:
		c.t.Fatalf("waiting for %s: timeout", want)
	case f.closed:
		c.t.Fatalf("waiting for %s: closed %d %q", want, f.closeCode, f.reason)
	case f.err != nil:
		c.t.Fatalf("waiting for %s: %v", want, f.err)
	}
	var got, exp any
	if err := json.Unmarshal([]byte(f.text), &got); err != nil {
		c.t.Fatalf("not JSON: %q", f.text)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		c.t.Fatalf("bad expectation %q", want)
	}
	m, _ := got.(map[string]any)
	trimmed := map[string]any{}
	for k, v := range m {
		trimmed[k] = v
	}
	for _, k := range ignore {
		delete(trimmed, k)
	}
	if m == nil || canonical(trimmed) != canonical(exp) {
		c.t.Fatalf("got %s, want %s (ignoring %v)", canonical(got), canonical(exp), ignore)
	}
	return m
}

// expectClose skips messages until the server's close frame and checks its code.
func (c *wsClient) expectClose(code int, timeout time.Duration) frame {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		f, ok := c.next(time.Until(deadline))
		switch {
		case !ok:
			c.t.Fatalf("waiting for close %d: timeout", code)
		case f.err != nil:
			c.t.Fatalf("waiting for close %d: %v", code, f.err)
		case f.closed:
			if f.closeCode != code {
				c.t.Fatalf("closed with %d %q, want %d", f.closeCode, f.reason, code)
			}
			return f
		}
	}
}

// expectSilence fails if anything arrives within d.
func (c *wsClient) expectSilence(d time.Duration) {
	c.t.Helper()
	if f, ok := c.next(d); ok {
		c.t.Fatalf("unexpected frame %+v", f)
	}
}

// clientFrame builds one masked client frame by hand (RFC 6455 §5.2), so raw
// tests depend on neither library.
func clientFrame(opcode byte, fin bool, payload []byte) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n <= 0xFFFF:
		out = append(out, 0x80|126, byte(n>>8), byte(n))
	default:
		out = append(out, 0x80|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	mask := [4]byte{0x12, 0x34, 0x56, 0x78}
	out = append(out, mask[:]...)
	for i, c := range payload {
		out = append(out, c^mask[i%4])
	}
	return out
}
