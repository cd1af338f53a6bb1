package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// wsClient is a real WebSocket client on a real socket.
type wsClient struct {
	t    testing.TB
	conn net.Conn
	br   *bufio.Reader
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
	u := "ws://" + strings.TrimPrefix(ts.base, "http://") + "/ws"
	if publicKey != "" {
		u += "?publicKey=" + url.QueryEscape(publicKey)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, br, _, err := ws.Dial(ctx, u)
	if err != nil {
		var se ws.StatusError
		if errors.As(err, &se) {
			return nil, int(se), err
		}
		return nil, 0, err
	}
	if br == nil {
		br = bufio.NewReader(conn)
	}
	c := &wsClient{t: ts.t, conn: conn, br: br}
	ts.t.Cleanup(func() { conn.Close() })
	return c, 101, nil
}

func (c *wsClient) send(v string) {
	c.t.Helper()
	c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := wsutil.WriteClientText(c.conn, []byte(v)); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// frame is what the server sent: a text message, or a close.
type frame struct {
	text      string
	closed    bool
	closeCode ws.StatusCode
	reason    string
}

// next reads the next server frame within timeout (answering pings).
func (c *wsClient) next(timeout time.Duration) (frame, error) {
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	for {
		h, err := ws.ReadHeader(c.br)
		if err != nil {
			return frame{}, err
		}
		if h.Masked {
			c.t.Errorf("server frame is masked")
		}
		payload := make([]byte, h.Length)
		if _, err := io.ReadFull(c.br, payload); err != nil {
			return frame{}, err
		}
		switch h.OpCode {
		case ws.OpClose:
			code, reason := ws.ParseCloseFrameData(payload)
			return frame{closed: true, closeCode: code, reason: reason}, nil
		case ws.OpText:
			return frame{text: string(payload)}, nil
		case ws.OpPong, ws.OpPing:
			return frame{text: fmt.Sprintf("<op %d>%s", h.OpCode, payload)}, nil
		}
	}
}

// expect reads the next message and compares it as JSON with want.
func (c *wsClient) expect(want string) map[string]any {
	c.t.Helper()
	f, err := c.next(5 * time.Second)
	if err != nil {
		c.t.Fatalf("waiting for %s: %v", want, err)
	}
	if f.closed {
		c.t.Fatalf("waiting for %s: closed %d %q", want, f.closeCode, f.reason)
	}
	var got, exp any
	if err := json.Unmarshal([]byte(f.text), &got); err != nil {
		c.t.Fatalf("not JSON: %q", f.text)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		c.t.Fatalf("bad expectation %q", want)
	}
	if canonical(got) != canonical(exp) {
		c.t.Fatalf("got %s, want %s", canonical(got), canonical(exp))
	}
	m, _ := got.(map[string]any)
	return m
}

// expectClose reads until the server's close frame and checks its code.
func (c *wsClient) expectClose(code ws.StatusCode, timeout time.Duration) frame {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		f, err := c.next(time.Until(deadline))
		if err != nil {
			c.t.Fatalf("waiting for close %d: %v", code, err)
		}
		if f.closed {
			if f.closeCode != code {
				c.t.Fatalf("closed with %d %q, want %d", f.closeCode, f.reason, code)
			}
			return f
		}
	}
}

// expectSilence fails if a message arrives within d.
func (c *wsClient) expectSilence(d time.Duration) {
	c.t.Helper()
	if f, err := c.next(d); err == nil {
		c.t.Fatalf("unexpected frame %+v", f)
	}
}
