package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// connLimit bounds the connections net/http holds on the public listener
// (MAX_HTTP_CONNECTIONS): new, active and idle keep-alive ones. When all
// slots are taken, Accept waits for one, so new connections queue in the
// kernel's backlog instead of being refused, and are served as soon as a
// connection closes (an idle one is closed after HTTP_IDLE_TIMEOUT_SECONDS,
// one still sending its headers after ReadHeaderTimeout).
//
// A WebSocket leaves net/http when it is upgraded (hijacked): its slot is
// given back then (ConnState), so WebSockets are bounded by
// MAX_CONNECTIONS_PER_PROJECT and never by this cap, and a handshake holds a
// slot only while it is an HTTP request.
type connLimit struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	close sync.Once
	log   *slog.Logger

	warned atomic.Int64 // unix nanos of the last "full" warning
}

func newConnLimit(ln net.Listener, max int, log *slog.Logger) *connLimit {
	return &connLimit{Listener: ln, slots: make(chan struct{}, max), done: make(chan struct{}), log: log}
}

// fullWarnEvery spaces the warnings that the cap is reached.
const fullWarnEvery = time.Minute

// Accept waits for a free slot, then for a connection.
func (l *connLimit) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		if now, last := time.Now().UnixNano(), l.warned.Load(); now-last >= int64(fullWarnEvery) && l.warned.CompareAndSwap(last, now) {
			l.log.Warn("public listener at MAX_HTTP_CONNECTIONS: new connections wait", "max", cap(l.slots))
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, limit: l}, nil
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *connLimit) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// open is the number of slots taken.
func (l *connLimit) open() int { return len(l.slots) }

// connState is the http.Server's ConnState hook: a connection hijacked (a
// WebSocket upgrade) or closed gives its slot back.
func (l *connLimit) connState(c net.Conn, s http.ConnState) {
	if s != http.StateHijacked && s != http.StateClosed {
		return
	}
	if lc, ok := c.(*limitedConn); ok {
		lc.releaseSlot()
	}
}

// limitedConn is an accepted connection holding a slot until it is closed or
// hijacked. It passes on what net/http looks for in the connection it is
// given (CloseWrite, ReadFrom), and the socket itself to the transport
// (NetConn), which takes a duplicate of its descriptor into its epoll set
// and closes the rest.
type limitedConn struct {
	net.Conn
	limit    *connLimit
	released atomic.Bool
}

func (c *limitedConn) releaseSlot() {
	if c.released.CompareAndSwap(false, true) {
		<-c.limit.slots
	}
}

func (c *limitedConn) Close() error {
	c.releaseSlot()
	return c.Conn.Close()
}

// NetConn is the connection itself, whose descriptor the transport takes
// over once a WebSocket upgrade has given the slot back.
func (c *limitedConn) NetConn() net.Conn { return c.Conn }

// ReadFrom is the underlying connection's, so static files still go out by
// sendfile.
func (c *limitedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(c.Conn, r)
}

// CloseWrite is the underlying TCP connection's: net/http half-closes before
// closing a connection whose request it refused.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
