package transport

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"
)

// socketOf names the socket behind c's descriptor ("socket:[inode]").
func socketOf(t *testing.T, c *Conn) string {
	t.Helper()
	c.mu.Lock()
	fd := c.fd
	c.mu.Unlock()
	name, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil || !strings.HasPrefix(name, "socket:") {
		t.Fatalf("descriptor %d: %q, %v", fd, name, err)
	}
	return name
}

// registered waits for Upgrade to put c in the transport's readable set. The
// fixture hands a test its handler from open, which Upgrade calls (on the
// HTTP server's goroutine) before it registers the socket, so until then no
// epoll set watches it. None needs to: a socket added to an epoll set is
// reported at once if it is already readable (TestMessageDuringOpenRead).
func registered(t *testing.T, c *Conn) {
	t.Helper()
	waitFor(t, "the upgraded socket registered", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.registered
	})
}

// descriptorsOf counts this process's descriptors open on socket: other
// tests' sockets, closing in the background, do not count.
func descriptorsOf(t *testing.T, socket string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if name, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && name == socket {
			n++
		}
	}
	return n
}

// descriptorsAre is a waitFor condition: n descriptors open on socket.
func descriptorsAre(t *testing.T, socket string, n int) func() bool {
	return func() bool { return descriptorsOf(t, socket) == n }
}

// epollsWatching counts the epoll instances of this process that watch
// socket ("socket:[inode]"): the transport's (its readable set, and its
// writable set while a flush waits for room), and Go's poller if a net.Conn
// or *os.File still holds it.
func epollsWatching(t *testing.T, socket string) int {
	t.Helper()
	var inode uint64
	if _, err := fmt.Sscanf(socket, "socket:[%d]", &inode); err != nil {
		t.Fatalf("%q: %v", socket, err)
	}
	watched := fmt.Sprintf(" ino:%x ", inode)
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if name, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || name != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err == nil && strings.Contains(string(info), watched) {
			n++
		}
	}
	return n
}

// stall queues 32 MiB on c, far more than the loopback socket buffers of a
// peer that does not read take (a few MiB with Linux's defaults), so that a
// flush waits for room.
func stall(t *testing.T, c *Conn) {
	t.Helper()
	frame := ws.MustCompileFrame(ws.NewTextFrame(bytes.Repeat([]byte("s"), 64<<10)))
	for i := 0; i < stallFrames; i++ {
		if !c.Send(frame) {
			t.Fatalf("send %d refused", i)
		}
	}
}

const stallFrames = 512

// waitingForRoom is a waitFor condition: a write on c ended short and its
// flush waits in the writable set for the peer to make room.
func waitingForRoom(c *Conn) func() bool {
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.drain != nil && c.drain.inSet && c.drain.left > 0
	}
}

// An upgraded socket leaves net/http and Go's poller: one descriptor is
// open on it (net/http's is closed, no duplicate is left behind), only the
// transport's epoll set watches it, and nothing is left once it is closed.
func TestUpgradedSocketLeavesGosPoller(t *testing.T) {
	f := newFixture(t, Config{})
	conn, br, e := f.dial(t)
	socket := socketOf(t, e.conn)
	registered(t, e.conn)
	if n := descriptorsOf(t, socket); n != 1 { // detach closed net/http's before open
		t.Fatalf("%d descriptors on the upgraded socket, want 1", n)
	}
	if n := epollsWatching(t, socket); n != 1 {
		t.Fatalf("%d epoll sets watch the upgraded socket, want the transport's alone", n)
	}

	e.conn.Send(ws.MustCompileFrame(ws.NewTextFrame([]byte("hello"))))
	expectText(t, conn, br, "hello")
	e.conn.Close(CloseGoingAway, "bye")
	expectClose(t, conn, br, ws.StatusGoingAway)
	e.closeInfo(t)
	waitFor(t, "no descriptor after the close", descriptorsAre(t, socket, 0))
}

// A peer that stops reading is dropped as a slow consumer once a write has
// waited WriteTimeout, and its socket is closed.
func TestStalledPeerDroppedAfterWriteTimeout(t *testing.T) {
	f := newFixture(t, Config{WriteTimeout: 300 * time.Millisecond, QueueBytes: 64 << 20, QueueFrames: 1 << 20})
	conn, _, e := f.dial(t)
	socket := socketOf(t, e.conn)
	stall(t, e.conn)
	if info := e.closeInfo(t); info.Cause != CauseSlowConsumer || info.Code != CloseTryAgainLater {
		t.Fatalf("closed with %+v, want a slow consumer's 1013", info)
	}
	waitFor(t, "no descriptor after the drop", descriptorsAre(t, socket, 0))
	// The peer finds its connection gone once it reads what reached it.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [64 << 10]byte
	for {
		if _, err := conn.Read(buf[:]); err != nil {
			if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
				t.Fatal("the peer's socket is still open")
			}
			break
		}
	}
}

// A flush waiting for a slow peer holds nothing but its registration in the
// transport's writable set: no duplicate descriptor, nothing in Go's poller
// (and so no goroutine). Tearing the connection down ends the wait at once,
// long before WriteTimeout, and leaves nothing behind.
func TestWaitingFlushHoldsOnlyItsSocket(t *testing.T) {
	f := newFixture(t, Config{WriteTimeout: time.Minute, QueueBytes: 64 << 20, QueueFrames: stallFrames + 10})
	_, _, e := f.dial(t)
	socket := socketOf(t, e.conn)
	registered(t, e.conn) // else the readable set may not watch it yet
	stall(t, e.conn)
	waitFor(t, "the flush waiting for room", waitingForRoom(e.conn))
	if n := descriptorsOf(t, socket); n != 1 {
		t.Fatalf("%d descriptors on the waiting socket, want 1", n)
	}
	if n := epollsWatching(t, socket); n != 2 {
		t.Fatalf("%d epoll sets watch the waiting socket, want the transport's two", n)
	}
	// Over the queue's bound in frames: dropped at once as a slow consumer.
	frame := ws.MustCompileFrame(ws.NewTextFrame([]byte("over")))
	for i := 0; e.conn.Send(frame); i++ {
		if i > stallFrames {
			t.Fatal("sends over the queue's bound were accepted")
		}
	}
	if info := e.closeInfo(t); info.Cause != CauseSlowConsumer {
		t.Fatalf("closed with %+v, want a slow consumer", info)
	}
	// 5 s at most: far less than WriteTimeout, which alone would end the wait.
	waitFor(t, "no descriptor after the teardown", descriptorsAre(t, socket, 0))
	e.conn.mu.Lock()
	inSet, stopped := e.conn.drain.inSet, !e.conn.drain.timer.Stop()
	e.conn.mu.Unlock()
	if inSet || !stopped {
		t.Fatalf("after the teardown: in the writable set %v, write timer stopped %v", inSet, stopped)
	}
}

// A peer that reads slowly but writes off each stalled batch (what one
// writev took: at most maxIovecs frames) within WriteTimeout is kept, however
// long the whole queue takes: the timer counts a batch, not the backlog.
func TestSlowButSteadyPeerKept(t *testing.T) {
	f := newFixture(t, Config{WriteTimeout: 400 * time.Millisecond, QueueBytes: 64 << 20, QueueFrames: 1 << 20})
	conn, br, e := f.dial(t)
	// Small socket buffers on both sides, so that what the kernel holds
	// ahead of a stalled batch is read in a fraction of WriteTimeout.
	if err := conn.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	e.conn.mu.Lock()
	err := unix.SetsockoptInt(int(e.conn.fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 64<<10)
	e.conn.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	// 256-byte frames: a batch (at most maxIovecs frames) is a quarter MiB,
	// read in a tenth of WriteTimeout at the pace below.
	frame := ws.MustCompileFrame(ws.NewTextFrame(bytes.Repeat([]byte("s"), 256)))
	const frames = 48 << 10 // 12 MiB: 2 s or more at the pace below
	for i := range frames {
		if !e.conn.Send(frame) {
			t.Fatalf("send %d refused", i)
		}
	}
	start := time.Now()
	buf := make([]byte, 64<<10)
	for got := 0; got < frames*len(frame); {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := br.Read(buf)
		if err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		got += n
		// Time by nature: a reader's pace, at most 6 MiB/s. A close while
		// the peer keeps reading fails at once, saying why.
		select {
		case info := <-e.closed:
			t.Fatalf("closed with %+v after %d of %d bytes read at a steady pace", info, got, frames*len(frame))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if took := time.Since(start); took < 3*400*time.Millisecond {
		t.Fatalf("read it all in %v: too fast to span several WriteTimeouts", took)
	}
	select {
	case info := <-e.closed:
		t.Fatalf("closed with %+v while the peer kept reading", info)
	default:
	}
	e.conn.Send(ws.MustCompileFrame(ws.NewTextFrame([]byte("still here"))))
	expectText(t, conn, br, "still here")
}

// A connection whose first writes stall while its handler's open still runs
// (before Upgrade lists it) is written on once the peer makes room: the
// writable event finds it all the same.
func TestStallDuringOpenResumes(t *testing.T) {
	frame := ws.MustCompileFrame(ws.NewTextFrame(bytes.Repeat([]byte("o"), 64<<10)))
	const frames = 128 // 8 MiB: more than the socket buffers hold
	release := make(chan struct{})
	defer close(release)
	_, url := serveWS(t, Config{WriteTimeout: time.Minute, QueueBytes: 64 << 20, QueueFrames: 1 << 20}, func(c *Conn) Handler {
		for range frames {
			c.Send(frame)
		}
		<-release // open is still running while the peer reads
		return handlerFuncs{message: func([]byte) {}, close: func(CloseInfo) {}}
	})
	conn, br := dialWS(t, url)
	buf := make([]byte, 64<<10)
	for got := 0; got < frames*len(frame); {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := br.Read(buf)
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", got, frames*len(frame), err)
		}
		got += n
	}
}

// A message that reaches the socket while open still runs, before Upgrade
// registers it and so while no epoll set watches it, is read all the same:
// the registration reports what is already readable.
func TestMessageDuringOpenRead(t *testing.T) {
	readable := make(chan bool, 1)
	_, url := serveWS(t, Config{}, func(c *Conn) Handler {
		c.mu.Lock()
		fd := int32(c.fd)
		c.mu.Unlock()
		// Until the peer's frame is in the socket's receive queue (poll(2)
		// on the descriptor: it leaves the epoll sets alone), 5 s at most.
		fds := []unix.PollFd{{Fd: fd, Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 5000)
		for err == unix.EINTR {
			n, err = unix.Poll(fds, 5000)
		}
		readable <- err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
		return &echo{conn: c, closed: make(chan CloseInfo, 1)}
	})
	conn, br := dialWS(t, url)
	if _, err := conn.Write(masked(ws.OpText, true, []byte("early"))); err != nil {
		t.Fatal(err)
	}
	if !<-readable {
		t.Fatal("the frame did not reach the socket while open ran")
	}
	expectText(t, conn, br, "early")
}

// A handler that tears its connection down stops the reading: after
// HandleClose, the handler gets at most the rest of the read buffer being
// parsed, never what a further read would bring (the read under way holds
// the socket open, so a further read would still succeed).
func TestNoMessageAfterTeardown(t *testing.T) {
	closed := make(chan struct{})
	var mu sync.Mutex
	var afterClose, seen int
	conns := make(chan *Conn, 1)
	_, url := serveWS(t, Config{QueueBytes: 1 << 10}, func(c *Conn) Handler {
		conns <- c
		return handlerFuncs{
			message: func([]byte) {
				mu.Lock()
				defer mu.Unlock()
				seen++
				select {
				case <-closed:
					afterClose++
				default:
				}
				if seen == 1 { // over the queue's bound: torn down at once
					c.Send(ws.MustCompileFrame(ws.NewTextFrame(make([]byte, 2<<10))))
				}
			},
			close: func(CloseInfo) { close(closed) },
		}
	})
	conn, _ := dialWS(t, url)
	var burst []byte
	for i := 0; i < 20000; i++ { // several read buffers' worth
		burst = append(burst, masked(ws.OpText, true, []byte("m"))...)
	}
	conn.Write(burst)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("no close reported")
	}
	// The read under way at the teardown (it holds readMu) has ended; any
	// later readable event finds the connection torn down (beginIO).
	c := <-conns
	c.readMu.Lock()
	c.readMu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	// What one read buffer held may still be parsed (a read ends at the
	// buffer); nothing read after the teardown is.
	if perBuffer := readBufSize / len(masked(ws.OpText, true, []byte("m"))); afterClose > perBuffer {
		t.Fatalf("%d messages after HandleClose (seen %d), want at most one read buffer's %d", afterClose, seen, perBuffer)
	}
}

type handlerFuncs struct {
	message func([]byte)
	close   func(CloseInfo)
}

func (h handlerFuncs) HandleMessage(p []byte)     { h.message(p) }
func (h handlerFuncs) HandleClose(info CloseInfo) { h.close(info) }

// A Conn fits the 320-byte size class: it is most of an idle connection's
// transport memory (relay-bench conns), so growing it shows there first.
func TestConnSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(Conn{}); n > 320 {
		t.Fatalf("Conn is %d bytes: over the 320-byte size class", n)
	}
}

// Teardown while a read or write holds the socket (beginIO) leaves it open
// for that syscall, whose end closes it: the number is never reused under it.
func TestTeardownWaitsForSyscallsInFlight(t *testing.T) {
	f := newFixture(t, Config{})
	_, _, e := f.dial(t)
	c := e.conn
	socket := socketOf(t, c)
	c.mu.Lock()
	fd, ok := c.beginIO()
	c.mu.Unlock()
	if !ok {
		t.Fatal("beginIO refused on an open connection")
	}
	c.teardown(CloseInfo{Cause: CausePeerGone, Code: CloseAbnormal, Abrupt: true})
	if n := descriptorsOf(t, socket); n != 1 {
		t.Fatalf("%d descriptors on the socket with a syscall in flight, want 1", n)
	}
	c.mu.Lock()
	if _, ok := c.beginIO(); ok {
		t.Error("beginIO granted after teardown")
	}
	if int(c.fd) != fd {
		t.Errorf("fd %d changed to %d under a syscall in flight", fd, c.fd)
	}
	c.endIO()
	closedFD := c.fd
	c.mu.Unlock()
	if closedFD != -1 {
		t.Errorf("fd %d after the last syscall ended, want -1", closedFD)
	}
	if n := descriptorsOf(t, socket); n != 0 { // closed by endIO itself
		t.Fatalf("%d descriptors on the socket after the last syscall ended, want 0", n)
	}
}

// A handler may close its connection before open returns (a revoked token
// is refused as the connection opens, from another goroutine): the close
// frame goes out, and the handler open returns hears of the close once, when
// open returns; the connection is not left listed.
func TestCloseDuringOpen(t *testing.T) {
	release := make(chan struct{})
	closed := make(chan CloseInfo, 2)
	srv, url := serveWS(t, Config{}, func(c *Conn) Handler {
		c.Close(4012, "token revoked")
		<-release // the close frame is written and the connection torn down meanwhile
		return handlerFuncs{message: func([]byte) {}, close: func(info CloseInfo) { closed <- info }}
	})
	conn, br := dialWS(t, url)
	if reason := expectClose(t, conn, br, 4012); reason != "token revoked" {
		t.Fatalf("close reason %q", reason)
	}
	waitFor(t, "the connection torn down while open runs", func() bool { return srv.Stats().Closed == 1 })
	close(release)
	select {
	case info := <-closed:
		if info.Cause != CauseApplication || info.Code != 4012 || info.Reason != "token revoked" {
			t.Fatalf("HandleClose got %+v", info)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("HandleClose not called after open returned")
	}
	waitFor(t, "the upgrade finished", func() bool { return srv.Stats().Opened == 1 })
	if st := srv.Stats(); st.Open != 0 {
		t.Fatalf("%d connections listed after the close, want 0", st.Open)
	}
	select {
	case info := <-closed:
		t.Fatalf("HandleClose called twice: %+v", info)
	case <-time.After(200 * time.Millisecond): // a late second call would come by then
	}
}
