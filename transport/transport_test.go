package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// echo is a Handler that sends every message back and records the close.
type echo struct {
	conn   *Conn
	mu     sync.Mutex
	closed chan CloseInfo
}

func (e *echo) HandleMessage(p []byte) {
	e.conn.Send(ws.MustCompileFrame(ws.NewTextFrame(append([]byte(nil), p...))))
}

func (e *echo) HandleClose(info CloseInfo) { e.closed <- info }

// closeInfo waits (5 s at most) for HandleClose and returns what it was told.
func (e *echo) closeInfo(t *testing.T) CloseInfo {
	t.Helper()
	select {
	case info := <-e.closed:
		return info
	case <-time.After(5 * time.Second):
		t.Fatal("HandleClose not called")
	}
	return CloseInfo{}
}

type fixture struct {
	srv     *Server
	url     string
	handles chan *echo
}

// newFixture hands each connection's handler to dial once Upgrade has
// returned: open gets the Conn before Upgrade stores its handler and
// registers the socket, so a test acting on it from open could tear down
// a Conn whose handler was still nil.
func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	f := &fixture{handles: make(chan *echo, 100)}
	f.srv, f.url = serve(t, cfg, func(srv *Server) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var e *echo
			srv.Upgrade(w, r, func(c *Conn) Handler {
				e = &echo{conn: c, closed: make(chan CloseInfo, 1)}
				return e
			})
			if e != nil {
				f.handles <- e
			}
		}
	})
	return f
}

// serveWS serves WebSocket upgrades on a loopback HTTP server with a
// transport of cfg, each connection handled by open's handler; both stop
// when the test ends. It returns the transport and the ws:// URL.
func serveWS(t *testing.T, cfg Config, open func(*Conn) Handler) (*Server, string) {
	t.Helper()
	return serve(t, cfg, func(srv *Server) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { srv.Upgrade(w, r, open) }
	})
}

// serve is serveWS with the HTTP handler that upgrade makes of the transport.
func serve(t *testing.T, cfg Config, upgrade func(*Server) http.HandlerFunc) (*Server, string) {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(upgrade(srv))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
	})
	return srv, "ws://" + strings.TrimPrefix(hs.URL, "http://")
}

// dialWS opens a client connection to url, closed when the test ends.
func dialWS(t *testing.T, url string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, br, _, err := ws.Dial(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if br == nil {
		br = bufio.NewReader(conn)
	}
	return conn, br
}

func (f *fixture) dial(t *testing.T) (net.Conn, *bufio.Reader, *echo) {
	t.Helper()
	conn, br := dialWS(t, f.url)
	select {
	case e := <-f.handles:
		return conn, br, e
	case <-time.After(5 * time.Second):
		t.Fatal("no handler opened")
	}
	return nil, nil, nil
}

func readFrame(t *testing.T, conn net.Conn, br *bufio.Reader) ws.Frame {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := ws.ReadFrame(br)
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	if f.Header.Masked {
		t.Fatal("server frames must not be masked")
	}
	return f
}

func expectText(t *testing.T, conn net.Conn, br *bufio.Reader, want string) {
	t.Helper()
	f := readFrame(t, conn, br)
	if f.Header.OpCode != ws.OpText || string(f.Payload) != want {
		t.Fatalf("got op %d %q, want text %q", f.Header.OpCode, f.Payload, want)
	}
}

func expectClose(t *testing.T, conn net.Conn, br *bufio.Reader, want ws.StatusCode) string {
	t.Helper()
	for {
		f := readFrame(t, conn, br)
		if f.Header.OpCode == ws.OpClose {
			code, reason := ws.ParseCloseFrameData(f.Payload)
			if code != want {
				t.Fatalf("close %d %q, want %d", code, reason, want)
			}
			return reason
		}
	}
}

func masked(op ws.OpCode, fin bool, p []byte) []byte {
	return ws.MustCompileFrame(ws.MaskFrame(ws.NewFrame(op, fin, p)))
}

func TestEchoAndPipelinedFrames(t *testing.T) {
	f := newFixture(t, Config{})
	conn, br, _ := f.dial(t)
	// Two messages and a ping in one write.
	var b bytes.Buffer
	b.Write(masked(ws.OpText, true, []byte("one")))
	b.Write(masked(ws.OpPing, true, []byte("p")))
	b.Write(masked(ws.OpText, true, []byte("two")))
	conn.Write(b.Bytes())
	expectText(t, conn, br, "one")
	if fr := readFrame(t, conn, br); fr.Header.OpCode != ws.OpPong || string(fr.Payload) != "p" {
		t.Fatalf("want pong p, got %d %q", fr.Header.OpCode, fr.Payload)
	}
	expectText(t, conn, br, "two")
}

func TestFrameSplitAcrossReads(t *testing.T) {
	f := newFixture(t, Config{})
	conn, br, e := f.dial(t)
	msg := bytes.Repeat([]byte("x"), 70000) // 64-bit length header
	fr := masked(ws.OpText, true, msg)
	for _, cut := range []int{1, 5, 9000, 40000, len(fr) - 1} {
		conn.Write(fr[:cut])
		// The server has read the first part and keeps it as an incomplete
		// frame before the rest is written.
		waitFor(t, fmt.Sprintf("the first %d bytes kept as a partial frame", cut), func() bool {
			e.conn.readMu.Lock()
			defer e.conn.readMu.Unlock()
			return len(e.conn.partial) == cut
		})
		conn.Write(fr[cut:])
		expectText(t, conn, br, string(msg))
	}
}

func TestFragmentedMessageWithControlFrameBetween(t *testing.T) {
	f := newFixture(t, Config{})
	conn, br, _ := f.dial(t)
	conn.Write(masked(ws.OpText, false, []byte("hel")))
	conn.Write(masked(ws.OpPing, true, nil))
	conn.Write(masked(ws.OpContinuation, false, []byte("lo ")))
	conn.Write(masked(ws.OpContinuation, true, []byte("world")))
	if fr := readFrame(t, conn, br); fr.Header.OpCode != ws.OpPong {
		t.Fatalf("want pong first, got %d", fr.Header.OpCode)
	}
	expectText(t, conn, br, "hello world")
}

func TestOversizeFrameClosed1009BeforeBuffering(t *testing.T) {
	f := newFixture(t, Config{MaxMessageBytes: 1000})
	conn, br, e := f.dial(t)
	// Only the header of a 1 GiB frame: the server must refuse it at once.
	hdr := ws.Header{Fin: true, OpCode: ws.OpText, Length: 1 << 30, Masked: true, Mask: ws.NewMask()}
	ws.WriteHeader(conn, hdr)
	expectClose(t, conn, br, ws.StatusMessageTooBig)
	if info := e.closeInfo(t); info.Code != CloseCode(ws.StatusMessageTooBig) || info.ByPeer || info.Cause != CauseTooBig {
		t.Fatalf("close info %+v", info)
	}
	if n := f.srv.Stats().ClosedBy["too_big"]; n != 1 {
		t.Fatalf("too_big count %d", n)
	}
}

func TestFragmentsOverCapClosed1009(t *testing.T) {
	f := newFixture(t, Config{MaxMessageBytes: 1000})
	conn, br, _ := f.dial(t)
	conn.Write(masked(ws.OpText, false, bytes.Repeat([]byte("a"), 600)))
	conn.Write(masked(ws.OpContinuation, true, bytes.Repeat([]byte("a"), 600)))
	expectClose(t, conn, br, ws.StatusMessageTooBig)
}

func TestProtocolErrors(t *testing.T) {
	cases := map[string]struct {
		frame []byte
		code  ws.StatusCode
	}{
		"unmasked":              {ws.MustCompileFrame(ws.NewTextFrame([]byte("x"))), ws.StatusProtocolError},
		"rsv bits":              {ws.MustCompileFrame(ws.MaskFrame(ws.Frame{Header: ws.Header{Fin: true, Rsv: 4, OpCode: ws.OpText, Length: 1}, Payload: []byte("x")})), ws.StatusProtocolError},
		"reserved opcode":       {masked(ws.OpCode(3), true, []byte("x")), ws.StatusProtocolError},
		"lone continuation":     {masked(ws.OpContinuation, true, []byte("x")), ws.StatusProtocolError},
		"fragmented ping":       {masked(ws.OpPing, false, nil), ws.StatusProtocolError},
		"invalid utf-8 in text": {masked(ws.OpText, true, []byte{0xff, 0xfe}), ws.StatusInvalidFramePayloadData},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, Config{})
			conn, br, _ := f.dial(t)
			conn.Write(tc.frame)
			expectClose(t, conn, br, tc.code)
		})
	}
}

func TestCloseHandshakeEchoesCode(t *testing.T) {
	f := newFixture(t, Config{})
	conn, br, e := f.dial(t)
	conn.Write(masked(ws.OpClose, true, ws.NewCloseFrameBody(4321, "bye")))
	expectClose(t, conn, br, 4321)
	info := e.closeInfo(t)
	if !info.ByPeer || info.Code != 4321 || info.Reason != "bye" || info.Cause != CausePeerClosed {
		t.Fatalf("close info %+v", info)
	}
	// The server closes the TCP connection after the echo.
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("want EOF after close, got %v", err)
	}
}

func TestEmptyCloseEchoedEmpty(t *testing.T) {
	f := newFixture(t, Config{})
	conn, br, e := f.dial(t)
	conn.Write(masked(ws.OpClose, true, nil))
	fr := readFrame(t, conn, br)
	if fr.Header.OpCode != ws.OpClose || len(fr.Payload) != 0 {
		t.Fatalf("want empty close, got %d %q", fr.Header.OpCode, fr.Payload)
	}
	if info := e.closeInfo(t); info.Code != CloseNoStatus || !info.ByPeer {
		t.Fatalf("close info %+v", info)
	}
}

func TestAbruptDisconnectReported(t *testing.T) {
	f := newFixture(t, Config{})
	conn, _, e := f.dial(t)
	conn.Close()
	if info := e.closeInfo(t); !info.Abrupt {
		t.Fatalf("close info %+v", info)
	}
	waitFor(t, "the connection forgotten", func() bool { return f.srv.Len() == 0 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in 5 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestIdleTimeout(t *testing.T) {
	f := newFixture(t, Config{IdleTimeout: time.Second})
	conn, br, _ := f.dial(t)
	start := time.Now()
	reason := expectClose(t, conn, br, ws.StatusGoingAway)
	if reason != "idle timeout" || time.Since(start) > 4*time.Second {
		t.Fatalf("reason %q after %v", reason, time.Since(start))
	}
	waitFor(t, "an idle close counted", func() bool { return f.srv.Stats().ClosedBy["idle"] == 1 })
}

func TestActivityDefersIdleTimeout(t *testing.T) {
	f := newFixture(t, Config{IdleTimeout: 1500 * time.Millisecond})
	conn, br, e := f.dial(t)
	for i := range 4 {
		// Time by nature: activity every 700 ms, 2.8 s in all, each gap
		// within the 1.5 s idle timeout; a close during a gap fails at once.
		select {
		case info := <-e.closed:
			t.Fatalf("closed with %+v in the 700 ms gap before ping %d (idle timeout 1.5 s)", info, i)
		case <-time.After(700 * time.Millisecond):
		}
		wsutil.WriteClientText(conn, []byte("ping"))
		expectText(t, conn, br, "ping")
	}
	expectClose(t, conn, br, ws.StatusGoingAway)
}

func TestMaxLifetime(t *testing.T) {
	f := newFixture(t, Config{MaxLifetime: time.Second})
	conn, br, _ := f.dial(t)
	if reason := expectClose(t, conn, br, ws.StatusGoingAway); reason != "connection lifetime exceeded" {
		t.Fatalf("reason %q", reason)
	}
}

// TestSlowConsumerClosedOthersUnaffected: a peer that never reads is closed
// when its queue overflows, while a reading peer gets everything.
func TestSlowConsumerClosedOthersUnaffected(t *testing.T) {
	f := newFixture(t, Config{QueueBytes: 1 << 20, QueueFrames: 1 << 20})
	slowConn, _, slow := f.dial(t)
	_ = slowConn
	fastConn, fastBR, fast := f.dial(t)
	frame := ws.MustCompileFrame(ws.NewTextFrame(bytes.Repeat([]byte("z"), 32<<10)))
	const n = 2000 // 64 MiB: far beyond socket buffers plus the 1 MiB queue
	got := make(chan int)
	go func() {
		count := 0
		for count < n {
			fastConn.SetReadDeadline(time.Now().Add(10 * time.Second))
			fr, err := ws.ReadFrame(fastBR)
			if err != nil {
				break
			}
			if fr.Header.OpCode == ws.OpText {
				count++
			}
		}
		got <- count
	}()
	slowOK := true
	for i := 0; i < n; i++ {
		// The fast reader keeps up, just not instantly.
		waitFor(t, "the fast reader's queue below 512 KiB", func() bool { return queued(fast.conn) <= 512<<10 })
		if !fast.conn.Send(frame) {
			t.Fatalf("fast reader refused at frame %d", i)
		}
		if slowOK {
			slowOK = slow.conn.Send(frame)
		}
	}
	if slowOK {
		t.Fatal("slow consumer never refused")
	}
	if info := slow.closeInfo(t); info.Code != CloseTryAgainLater {
		t.Fatalf("slow close %+v", info)
	}
	if c := <-got; c != n {
		t.Fatalf("fast reader got %d of %d", c, n)
	}
	if st := f.srv.Stats(); st.SlowConsumers != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestShutdownSendsGoingAwayAfterQueuedFrames(t *testing.T) {
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	handles := make(chan *echo, 10)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := srv.Upgrade(w, r, func(c *Conn) Handler {
			e := &echo{conn: c, closed: make(chan CloseInfo, 1)}
			handles <- e
			return e
		}); err == ErrShuttingDown {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer hs.Close()
	url := "ws://" + strings.TrimPrefix(hs.URL, "http://")
	conn, br, _, err := ws.Dial(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	if br == nil {
		br = bufio.NewReader(conn)
	}
	e := <-handles
	for i := range 100 {
		e.conn.Send(ws.MustCompileFrame(ws.NewTextFrame([]byte{byte('0' + i%10)})))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error)
	go func() { done <- srv.Shutdown(ctx) }()
	for i := range 100 {
		expectText(t, conn, br, string([]byte{byte('0' + i%10)}))
	}
	expectClose(t, conn, br, ws.StatusGoingAway)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := ws.Dial(context.Background(), url); err == nil {
		t.Fatal("upgrade accepted after shutdown")
	}
}

func queued(c *Conn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queued
}

// TestShutdownWaitsForAnUpgradeUnderWay: a handshake already past its
// shutting-down check when Shutdown starts is waited for, and its connection
// then gets the 1001 like every other (it used to register after the close
// sweep, stay open, and Shutdown returned without it).
func TestShutdownWaitsForAnUpgradeUnderWay(t *testing.T) {
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	inOpen, release := make(chan struct{}), make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.Upgrade(w, r, func(c *Conn) Handler {
			close(inOpen)
			<-release // the handshake is answered; registration is still to come
			return &echo{conn: c, closed: make(chan CloseInfo, 1)}
		})
	}))
	defer hs.Close()
	conn, br, _, err := ws.Dial(context.Background(), "ws://"+strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if br == nil {
		br = bufio.NewReader(conn)
	}
	<-inOpen
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	waitFor(t, "Shutdown begun", srv.ShuttingDown)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) while an upgrade was under way", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	expectClose(t, conn, br, ws.StatusGoingAway)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestUpgradeOutlivingShutdownGetsGoingAway: a handshake still under way when
// Shutdown's deadline ends registers after the poller is closed. It gets the
// 1001 the others got and its socket is closed; it used to try the closed
// epoll descriptor (whose number another file may hold by then) and vanish
// without a close frame, reported as an internal error.
func TestUpgradeOutlivingShutdownGetsGoingAway(t *testing.T) {
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	inOpen, release := make(chan struct{}), make(chan struct{})
	handler := &echo{closed: make(chan CloseInfo, 1)}
	conns, upgraded := make(chan *Conn, 1), make(chan error, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upgraded <- srv.Upgrade(w, r, func(c *Conn) Handler {
			handler.conn = c
			conns <- c
			close(inOpen)
			<-release
			return handler
		})
	}))
	defer hs.Close()
	conn, br := dialWS(t, "ws://"+strings.TrimPrefix(hs.URL, "http://"))
	<-inOpen
	socket := socketOf(t, <-conns)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want its deadline", err)
	}
	close(release)
	if err := <-upgraded; err != nil {
		t.Fatalf("Upgrade: %v; the upgrade succeeded, and its close goes to the handler", err)
	}
	if reason := expectClose(t, conn, br, ws.StatusGoingAway); reason != "server shutting down" {
		t.Fatalf("close reason %q", reason)
	}
	if info := handler.closeInfo(t); info.Cause != CauseShutdown || info.Code != CloseGoingAway {
		t.Fatalf("HandleClose %+v", info)
	}
	waitFor(t, "the socket closed", descriptorsAre(t, socket, 0))
	if srv.Len() != 0 {
		t.Fatalf("%d connections left", srv.Len())
	}
}

// TestUpgradeRegisteredAsShutdownEndsGetsGoingAway: a handshake Shutdown gave
// up on that registers while Shutdown waits for a busy worker, before the
// poller closes, is closed by Shutdown's last sweep. It used to stay open
// with nothing reading it.
func TestUpgradeRegisteredAsShutdownEndsGetsGoingAway(t *testing.T) {
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	busy, release := make(chan struct{}), make(chan struct{})
	keepsWorker := handlerFuncs{ // holds the worker that reads its message
		message: func([]byte) { close(busy); <-release },
		close:   func(CloseInfo) {},
	}
	late := &echo{closed: make(chan CloseInfo, 1)}
	upgraded := make(chan error, 2)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upgraded <- srv.Upgrade(w, r, func(c *Conn) Handler {
			if r.URL.Path == "/busy" {
				return keepsWorker
			}
			<-srv.stop // Shutdown has given up on this upgrade and swept
			late.conn = c
			return late
		})
	}))
	defer hs.Close()
	url := "ws://" + strings.TrimPrefix(hs.URL, "http://")
	busyConn, _ := dialWS(t, url+"/busy")
	if err := <-upgraded; err != nil {
		t.Fatal(err)
	}
	if _, err := busyConn.Write(masked(ws.OpText, true, []byte("hold"))); err != nil {
		t.Fatal(err)
	}
	<-busy
	lateConn, lateBr := dialWS(t, url+"/late")
	waitFor(t, "the late upgrade under way", func() bool { return srv.upgrading.Load() != 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	if err := <-upgraded; err != nil { // registered: the poller is still open
		t.Fatalf("late Upgrade: %v", err)
	}
	close(release) // the worker ends; Shutdown closes the poller
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want its deadline", err)
	}
	expectClose(t, lateConn, lateBr, ws.StatusGoingAway)
	if info := late.closeInfo(t); info.Cause != CauseShutdown {
		t.Fatalf("HandleClose %+v", info)
	}
	if srv.Len() != 0 {
		t.Fatalf("%d connections left", srv.Len())
	}
}

// A flush pass under way when the server stops must not hold up Shutdown:
// the workers leave with the pass's jobs still queued, and the flush loop
// stops waiting for them (it used to wait forever).
func TestFlushLoopStopsWithAPassUnderWay(t *testing.T) {
	s := &Server{jobs: make(chan job, 16), stop: make(chan struct{}), wake: make(chan struct{}, 1)}
	s.wg.Add(1)
	go s.flushLoop()
	c := &Conn{srv: s, closed: true}
	s.scheduleFlush(c) // no worker runs: the job stays queued, the pass open
	waitFor(t, "the flush loop dispatching the pass", func() bool { return len(s.jobs) != 0 })
	close(s.stop)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the flush loop did not stop while its pass was under way")
	}
}
