package relaytest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// WS is a real WebSocket client on a real socket, built on an independent
// library (gorilla/websocket), not the server's own framing code.
type WS struct {
	T      testing.TB
	Conn   *websocket.Conn
	Frames chan Frame // what the server sent, in order; closed once the connection is over
}

// Frame is what the server sent: a text message, or a close.
type Frame struct {
	Text      string
	Closed    bool
	CloseCode int
	Reason    string
	Err       error // the connection failed without a close frame
}

// WSURL is the WebSocket address of the server for publicKey ("" for none).
func (s *Server) WSURL(publicKey string) string {
	u := "ws://" + s.Addr() + "/ws"
	if publicKey != "" {
		u += "?publicKey=" + url.QueryEscape(publicKey)
	}
	return u
}

// DialWS connects with publicKey; it fails the test unless the upgrade succeeds.
func (s *Server) DialWS(publicKey string) *WS {
	s.T.Helper()
	c, status, err := s.TryDialWS(publicKey)
	if err != nil {
		s.T.Fatalf("dial: status %d: %v", status, err)
	}
	return c
}

// TryDialWS returns the HTTP status of a refused handshake.
func (s *Server) TryDialWS(publicKey string) (*WS, int, error) {
	return s.DialWSWith(publicKey, true)
}

// DialWSWith connects; with read false nothing ever reads the socket (a peer
// that stopped reading).
func (s *Server) DialWSWith(publicKey string, read bool) (*WS, int, error) {
	return s.dial(s.WSURL(publicKey), read)
}

// DialWithToken connects with a connection token (channel authorization).
func (s *Server) DialWithToken(publicKey, token string) *WS {
	s.T.Helper()
	c, _, err := s.dial(s.WSURL(publicKey)+"&token="+url.QueryEscape(token), true)
	if err != nil {
		s.T.Fatalf("dial with a token: %v", err)
	}
	return c
}

func (s *Server) dial(u string, read bool) (*WS, int, error) {
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	conn, res, err := d.Dial(u, nil)
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		return nil, status, err
	}
	c := WSOn(s.T, conn)
	if read {
		c.Read()
	}
	return c, http.StatusSwitchingProtocols, nil
}

// WSOn is a connection the test dialed itself, closed when t ends; nothing
// reads it until Read.
func WSOn(t testing.TB, conn *websocket.Conn) *WS {
	t.Cleanup(func() { conn.Close() })
	return &WS{T: t, Conn: conn, Frames: make(chan Frame, 1024)}
}

// Read starts turning what the server sends into Frames.
func (c *WS) Read() { go c.readLoop() }

// Handshake tries a real WebSocket handshake on pathAndQuery and returns the
// answer: a refusal with its headers and JSON body, or 101 with the
// upgrade's headers (the connection is then closed at once).
func (s *Server) Handshake(pathAndQuery string) Response {
	s.T.Helper()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	conn, res, err := d.Dial("ws://"+s.Addr()+pathAndQuery, nil)
	if err == nil {
		conn.Close()
		return Response{Status: res.StatusCode, Header: res.Header}
	}
	if res == nil {
		s.T.Fatalf("handshake %s: %v", pathAndQuery, err)
	}
	raw, _ := io.ReadAll(res.Body) // what the dialer kept of a refusal's body
	r := Response{Status: res.StatusCode, Header: res.Header, Raw: string(raw)}
	json.Unmarshal(raw, &r.JSON)
	return r
}

// Subscribed is a socket subscribed to channel, the answer checked.
func (s *Server) Subscribed(t testing.TB, publicKey, channel string) *WS {
	t.Helper()
	return s.subscribed(t, publicKey, channel, `{"action":"subscribe","channel":"`+channel+`"}`)
}

// PresenceSub is a socket subscribed to channel with presence as clientID,
// the answer checked.
func (s *Server) PresenceSub(t testing.TB, key, channel, clientID string) *WS {
	t.Helper()
	return s.subscribed(t, key, channel, `{"action":"subscribe","channel":"`+channel+`","presence":true,"clientId":"`+clientID+`"}`)
}

// subscribed dials with key, sends the subscribe frame and checks its ok.
func (s *Server) subscribed(t testing.TB, key, channel, frame string) *WS {
	t.Helper()
	c := s.DialWS(key)
	c.Send(frame)
	c.Expect(`{"action":"subscribe","channel":"` + channel + `","ok":true}`)
	return c
}

// readLoop turns everything the server sends into frames, so that a test
// can wait with a timeout without breaking the connection.
func (c *WS) readLoop() {
	defer close(c.Frames)
	for {
		_, msg, err := c.Conn.ReadMessage()
		var ce *websocket.CloseError
		switch {
		case errors.As(err, &ce):
			c.Frames <- Frame{Closed: true, CloseCode: ce.Code, Reason: ce.Text}
			return
		case err != nil:
			c.Frames <- Frame{Err: err}
			return
		}
		c.Frames <- Frame{Text: string(msg)}
	}
}

// Send writes one text message.
func (c *WS) Send(v string) {
	c.T.Helper()
	c.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.Conn.WriteMessage(websocket.TextMessage, []byte(v)); err != nil {
		c.T.Fatalf("send: %v", err)
	}
}

// SendRaw writes bytes straight to the socket, under the library.
func (c *WS) SendRaw(b []byte) {
	c.T.Helper()
	if _, err := c.Conn.UnderlyingConn().Write(b); err != nil {
		c.T.Fatalf("raw write: %v", err)
	}
}

// Next waits up to timeout for the next frame.
func (c *WS) Next(timeout time.Duration) (Frame, bool) {
	select {
	case f, ok := <-c.Frames:
		if !ok {
			return Frame{Err: errors.New("connection over")}, true
		}
		return f, true
	case <-time.After(timeout):
		return Frame{}, false
	}
}

// Expect reads the next message and compares it as JSON with want.
func (c *WS) Expect(want string) map[string]any {
	c.T.Helper()
	return c.ExpectExcept(want)
}

// ExpectExcept is Expect, ignoring the named keys of the message (values
// such as seq that the test cannot know); it returns the whole message.
func (c *WS) ExpectExcept(want string, ignore ...string) map[string]any {
	c.T.Helper()
	f, ok := c.Next(5 * time.Second)
	switch {
	case !ok:
		c.T.Fatalf("waiting for %s: timeout", want)
	case f.Closed:
		c.T.Fatalf("waiting for %s: closed %d %q", want, f.CloseCode, f.Reason)
	case f.Err != nil:
		c.T.Fatalf("waiting for %s: %v", want, f.Err)
	}
	var got, exp any
	if err := json.Unmarshal([]byte(f.Text), &got); err != nil {
		c.T.Fatalf("not JSON: %q", f.Text)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		c.T.Fatalf("bad expectation %q", want)
	}
	m, _ := got.(map[string]any)
	trimmed := map[string]any{}
	for k, v := range m {
		trimmed[k] = v
	}
	for _, k := range ignore {
		delete(trimmed, k)
	}
	if m == nil || Canonical(trimmed) != Canonical(exp) {
		c.T.Fatalf("got %s, want %s (ignoring %v)", Canonical(got), Canonical(exp), ignore)
	}
	return m
}

// ExpectClose skips messages until the server's close frame and checks its code.
func (c *WS) ExpectClose(code int, timeout time.Duration) Frame {
	c.T.Helper()
	deadline := time.Now().Add(timeout)
	for {
		f, ok := c.Next(time.Until(deadline))
		switch {
		case !ok:
			c.T.Fatalf("waiting for close %d: timeout", code)
		case f.Err != nil:
			c.T.Fatalf("waiting for close %d: %v", code, f.Err)
		case f.Closed:
			if f.CloseCode != code {
				c.T.Fatalf("closed with %d %q, want %d", f.CloseCode, f.Reason, code)
			}
			return f
		}
	}
}

// ExpectSilence fails if anything arrives within d.
func (c *WS) ExpectSilence(d time.Duration) {
	c.T.Helper()
	if f, ok := c.Next(d); ok {
		c.T.Fatalf("unexpected frame %+v", f)
	}
}

// ClientFrame builds one masked client frame by hand (RFC 6455 §5.2), so raw
// tests depend on neither library.
func ClientFrame(opcode byte, fin bool, payload []byte) []byte {
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
