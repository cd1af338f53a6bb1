package relaytest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gobwas/ws"
)

// Proxy is a loopback TCP proxy in front of the server. A test can freeze it
// (stop forwarding and keep the connections, like a server that hangs), cut
// every connection through it while the server stays up, hold new
// connections until released, refuse them, and put a server frame in front
// of what the server sends on the next connections.
type Proxy struct {
	ln     net.Listener
	target string
	Frozen Freeze
	Refuse atomic.Bool

	mu       sync.Mutex
	conns    map[net.Conn]bool
	hold     chan struct{} // non-nil: new connections wait until it is closed
	inject   []byte
	accepted int
}

// NewProxy starts a proxy to target (host:port), closed when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		ln.Close()
		px.Release()
		px.Cut()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go px.serve(in)
		}
	}()
	return px
}

// Base is the proxy's address as an http:// base URL.
func (px *Proxy) Base() string { return "http://" + px.ln.Addr().String() }

func (px *Proxy) serve(in net.Conn) {
	px.mu.Lock()
	px.accepted++
	hold, inject := px.hold, px.inject
	px.conns[in] = true
	px.mu.Unlock()
	if hold != nil {
		<-hold
	}
	var out net.Conn
	var err error
	if !px.Refuse.Load() {
		out, err = net.Dial("tcp", px.target)
	}
	px.mu.Lock()
	_, live := px.conns[in] // not cut while held
	if out != nil {
		px.conns[out] = true
	}
	px.mu.Unlock()
	if px.Refuse.Load() || err != nil || !live {
		px.drop(in, out)
		return
	}
	go px.pipe(out, in, nil)
	px.pipe(in, out, inject)
}

func (px *Proxy) drop(conns ...net.Conn) {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			c.Close()
			delete(px.conns, c)
		}
	}
}

// pipe copies src to dst; inject goes to dst right after the HTTP head.
func (px *Proxy) pipe(dst, src net.Conn, inject []byte) {
	defer px.drop(dst, src)
	buf := make([]byte, 32<<10)
	var head []byte
	for {
		n, err := src.Read(buf)
		if err == nil {
			px.Frozen.hold(n) // while frozen: the peer hears nothing
		}
		data := buf[:n]
		if inject != nil {
			head = append(head, data...)
			i := bytes.Index(head, []byte("\r\n\r\n"))
			if i < 0 && err == nil {
				continue
			}
			if i >= 0 {
				data = append(append(head[:i+4:i+4], inject...), head[i+4:]...)
			} else {
				data = head
			}
			inject = nil
		}
		if len(data) > 0 {
			if _, werr := dst.Write(data); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Freeze is a proxy's frozen switch: Store(true) makes every pipe hold the
// bytes it reads until Store(false).
type Freeze struct {
	mu     sync.Mutex
	thawed chan struct{} // closed at Store(false); nil while not frozen
	held   int           // reads held since the last Store(true)
}

// Store freezes the proxy (true) or thaws it.
func (f *Freeze) Store(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case on && f.thawed == nil:
		f.thawed, f.held = make(chan struct{}), 0
	case !on && f.thawed != nil:
		close(f.thawed)
		f.thawed = nil
	}
}

// hold waits while the proxy is frozen, counting a read of n bytes held.
func (f *Freeze) hold(n int) {
	f.mu.Lock()
	thawed := f.thawed
	if thawed != nil && n > 0 {
		f.held++
	}
	f.mu.Unlock()
	if thawed != nil {
		<-thawed
	}
}

// HeldReads is how many reads the pipes hold since the proxy froze.
func (f *Freeze) HeldReads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
}

// UnreadFromClients is how many bytes the clients sent that the proxy has
// not read yet (a frozen pipe stops reading).
func (px *Proxy) UnreadFromClients() int {
	px.mu.Lock()
	defer px.mu.Unlock()
	total := 0
	for c := range px.conns {
		if c.LocalAddr().String() == px.ln.Addr().String() { // accepted from a client
			if n, ok := Unread(c.LocalAddr(), c.RemoteAddr()); ok {
				total += n
			}
		}
	}
	return total
}

// Cut closes every connection through the proxy.
func (px *Proxy) Cut() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for c := range px.conns {
		c.Close()
		delete(px.conns, c)
	}
}

// HoldNew makes new connections wait (the client's reconnect hangs in its
// handshake) until release.
func (px *Proxy) HoldNew() {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.hold == nil {
		px.hold = make(chan struct{})
	}
}

// Release lets the held connections through.
func (px *Proxy) Release() {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.hold != nil {
		close(px.hold)
		px.hold = nil
	}
}

// InjectNext puts a server text frame carrying msg in front of the server's
// bytes on every later connection ("" stops it).
func (px *Proxy) InjectNext(msg string) {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.inject = nil
	if msg != "" {
		px.inject = ws.MustCompileFrame(ws.NewTextFrame([]byte(msg)))
	}
}

// Accepts is how many connections the proxy has accepted.
func (px *Proxy) Accepts() int {
	px.mu.Lock()
	defer px.mu.Unlock()
	return px.accepted
}
