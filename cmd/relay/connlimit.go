package main

import (
	"container/list"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// connLimit bounds the connections net/http holds on the public listener:
// new, active and idle keep-alive ones.
//
//   - At most max in all (MAX_HTTP_CONNECTIONS). When they are all taken, the
//     connection idle the longest between requests is closed to make way for a
//     new one; when none is idle, Accept waits for a slot, so new connections
//     queue (in the kernel's backlog beyond the one in hand) instead of being
//     refused, and are served as soon as a connection closes or goes idle (a
//     connection still sending its first headers is cut after
//     ReadHeaderTimeout, a request after ReadTimeout).
//   - At most perAddr from one TCP peer address, an IPv6 one by its /64
//     (MAX_HTTP_CONNECTIONS_PER_ADDRESS), so one address cannot hold the
//     listener and leave no slot to anyone else. A peer past it loses its own
//     longest-idle connection to the new one, or, with none idle, the new one
//     is closed at once unanswered. The limit is on the TCP peer, not on the
//     client X-Forwarded-For names: the headers are not read yet. A peer in
//     TRUSTED_PROXIES (a reverse proxy carrying everyone) has no share of its
//     own, only the total.
//
// A WebSocket leaves net/http when it is upgraded (hijacked): its slot is
// given back then (ConnState), so WebSockets are bounded by
// MAX_CONNECTIONS_PER_PROJECT and MAX_CONNECTIONS_PER_ADDRESS, never by these
// caps, and a handshake holds a slot only while it is an HTTP request.
type connLimit struct {
	net.Listener
	max, perAddr int
	trusted      []netip.Prefix
	log          *slog.Logger
	done         chan struct{}
	close        sync.Once
	// wake tells a waiting Accept that a slot was freed or a connection went
	// idle (capacity 1: net/http runs one Accept at a time).
	wake chan struct{}

	mu     sync.Mutex
	open   int                // slots taken; guarded by mu
	byAddr map[netip.Addr]int // slots taken by peer address (addrKey); guarded by mu
	idle   list.List          // of *limitedConn idle between requests, longest idle first; guarded by mu
	warned [2]atomic.Int64    // unix nanos of the last warning of each kind (warnFull, warnAddr)
}

func newConnLimit(ln net.Listener, max, perAddr int, trusted []netip.Prefix, log *slog.Logger) *connLimit {
	return &connLimit{
		Listener: ln, max: max, perAddr: perAddr, trusted: trusted, log: log,
		done: make(chan struct{}), wake: make(chan struct{}, 1), byAddr: map[netip.Addr]int{},
	}
}

// The warnings, each at most once per fullWarnEvery.
const (
	warnFull = iota
	warnAddr
)

// fullWarnEvery spaces the warnings that a cap is reached.
const fullWarnEvery = time.Minute

func (l *connLimit) warn(kind int, msg string, args ...any) {
	if now, last := time.Now().UnixNano(), l.warned[kind].Load(); now-last >= int64(fullWarnEvery) && l.warned[kind].CompareAndSwap(last, now) {
		l.log.Warn(msg, args...)
	}
}

// Accept takes the next connection that gets a slot; one from an address
// past its share with nothing idle to give up is closed, and the next taken.
func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc, err := l.admit(c)
		if err != nil {
			c.Close()
			return nil, err
		}
		if lc != nil {
			return lc, nil
		}
		c.Close() // its address is at its share, every one of them busy
	}
}

// admit gives c a slot, waiting for one if need be: nil when c's address is
// at its share with none of its connections idle; an error when the
// listener is closed meanwhile.
func (l *connLimit) admit(c net.Conn) (*limitedConn, error) {
	addr := peerAddr(c.RemoteAddr())
	shared := !l.isTrusted(addr)
	for {
		l.mu.Lock()
		var evicted *limitedConn
		if shared && l.byAddr[addr] >= l.perAddr {
			evicted = l.oldestIdle(func(ic *limitedConn) bool { return ic.addr == addr })
			if evicted == nil {
				l.mu.Unlock()
				l.warn(warnAddr, "an address holds MAX_HTTP_CONNECTIONS_PER_ADDRESS busy HTTP connections: its new ones are closed", "addr", addr, "max", l.perAddr)
				return nil, nil
			}
		} else if l.open >= l.max {
			evicted = l.oldestIdle(func(*limitedConn) bool { return true })
		}
		if evicted != nil {
			l.releaseLocked(evicted)
		}
		if l.open < l.max {
			l.open++
			l.byAddr[addr]++
			l.mu.Unlock()
			if evicted != nil {
				evicted.Conn.Close() // its goroutine in net/http ends on the failed read
			}
			return &limitedConn{Conn: c, limit: l, addr: addr}, nil
		}
		l.mu.Unlock()
		l.warn(warnFull, "public listener at MAX_HTTP_CONNECTIONS, none idle: new connections wait", "max", l.max)
		select {
		case <-l.wake:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

// oldestIdle is the connection idle the longest that ok accepts, or nil.
// l.mu is held.
func (l *connLimit) oldestIdle(ok func(*limitedConn) bool) *limitedConn {
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if ic := e.Value.(*limitedConn); ok(ic) {
			return ic
		}
	}
	return nil
}

// releaseLocked gives c's slot back, once. l.mu is held.
func (l *connLimit) releaseLocked(c *limitedConn) {
	if c.released {
		return
	}
	c.released = true
	if c.idleAt != nil {
		l.idle.Remove(c.idleAt)
		c.idleAt = nil
	}
	l.open--
	if n := l.byAddr[c.addr]; n > 1 {
		l.byAddr[c.addr] = n - 1
	} else {
		delete(l.byAddr, c.addr)
	}
	l.signal()
}

// signal wakes a waiting Accept, if any.
func (l *connLimit) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *connLimit) isTrusted(a netip.Addr) bool {
	for _, p := range l.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr is the key of a TCP peer's share: an IPv4 address as it is, an
// IPv6 address by its /64 (one subscriber usually holds a whole /64), as the
// other per-address limits count.
func peerAddr(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip := ta.AddrPort().Addr().Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *connLimit) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// counts is the number of slots taken, those of idle connections, and those
// taken by addr.
func (l *connLimit) counts(addr string) (open, idle, ofAddr int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.idle.Len(), l.byAddr[netip.MustParseAddr(addr)]
}

// connState is the http.Server's ConnState hook: a connection between
// requests may be closed to make way; one hijacked (a WebSocket upgrade) or
// closed gives its slot back.
func (l *connLimit) connState(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch s {
	case http.StateIdle:
		l.mu.Lock()
		if !lc.released && lc.idleAt == nil {
			lc.idleAt = l.idle.PushBack(lc)
			l.signal()
		}
		l.mu.Unlock()
	case http.StateActive:
		l.mu.Lock()
		if lc.idleAt != nil {
			l.idle.Remove(lc.idleAt)
			lc.idleAt = nil
		}
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
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
	limit *connLimit
	addr  netip.Addr // its share's key (peerAddr)

	released bool          // guarded by limit.mu
	idleAt   *list.Element // in limit.idle while idle between requests; guarded by limit.mu
}

func (c *limitedConn) releaseSlot() {
	c.limit.mu.Lock()
	c.limit.releaseLocked(c)
	c.limit.mu.Unlock()
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
