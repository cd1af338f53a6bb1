package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"
)

// Handler is the upper layer's side of one connection.
type Handler interface {
	// HandleMessage gets each complete text or binary message, in order, one
	// call at a time. payload is only valid during the call.
	HandleMessage(payload []byte)
	// HandleClose is called exactly once, once the connection is torn down:
	// nothing is read or written after it but what a read or write already
	// under way finishes, and the socket is closed when that ends. info says
	// who closed it and with which code.
	HandleClose(info CloseInfo)
}

// CloseInfo describes how a connection ended.
type CloseInfo struct {
	Cause Cause
	// Code and Reason are from the peer's close frame when ByPeer is true
	// (Code 1005 "no status" when the frame had none), else what we sent.
	Code   CloseCode
	Reason string
	ByPeer bool
	// Abrupt: no close frame of ours was attempted: the peer dropped the
	// connection, a write failed or timed out, or a close handshake or
	// Shutdown ran out of time. Otherwise the close was decided here, and its
	// frame went out unless it cut a write short (abort, a slow consumer's
	// queue overflowing).
	Abrupt bool
}

var (
	// ErrShuttingDown: Upgrade refused because Shutdown has begun.
	ErrShuttingDown = errors.New("transport: shutting down")
)

// Config bounds what one connection may cost.
type Config struct {
	// MaxMessageBytes caps an incoming frame and a reassembled message;
	// bigger ones are refused with close 1009 before they are buffered.
	MaxMessageBytes int
	// QueueFrames and QueueBytes bound a connection's write queue; a peer
	// whose queue overflows is closed as a slow consumer.
	QueueFrames int
	QueueBytes  int
	// WriteTimeout bounds a blocked write before the peer is dropped.
	WriteTimeout time.Duration
	// IdleTimeout closes a connection with no data either way for this long;
	// MaxLifetime closes any connection this old. Zero disables either.
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	// Workers is the size of the read/write worker pool.
	Workers int
	// FlushDelay 0 (the default) batches by load: a flush pass starts as
	// soon as a frame is queued while no pass is under way, and frames
	// queued during a pass wait for the next one, so under fan-out load a
	// socket gets several frames per system call and at low load none
	// waits. A positive FlushDelay also waits that long before each pass;
	// negative hands every queued frame to a writer at once.
	FlushDelay time.Duration
	Logger     *slog.Logger
}

func (c *Config) defaults() {
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 256 << 10
	}
	if c.QueueFrames <= 0 {
		c.QueueFrames = 4096
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = 8 << 20
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.Workers <= 0 {
		c.Workers = max(4, 2*runtime.GOMAXPROCS(0))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Stats are cumulative counters since start.
type Stats struct {
	Open          int64 // live connections
	Opened        int64
	Closed        int64
	SlowConsumers int64 // closed because their queue overflowed or a write timed out
	FramesSent    int64
	WriteCalls    int64
	ClosedBy      map[string]int64 // by Cause name
}

// Server owns the poller, the worker pool and every live connection.
type Server struct {
	cfg  Config
	log  *slog.Logger
	poll *poller // readable sockets
	// wpoll holds the sockets of slow peers whose flush waits for room
	// (Conn.waitWritable): the wait costs neither a goroutine nor a descriptor.
	wpoll *poller
	// writers are the connections in wpoll, found there by the writable
	// events: a connection can stall while its handler's open still runs,
	// before Upgrade puts it in the shards.
	writers connShard
	jobs    chan job
	nextID  atomic.Uint64

	shards [connShards]connShard

	// dirty holds connections with frames waiting for the next flush pass.
	dirtyMu sync.Mutex
	dirty   []*Conn
	wake    chan struct{} // the flusher sleeps on it while nothing is dirty

	shuttingDown atomic.Bool
	// upgrading counts Upgrades under way, so that Shutdown waits for a
	// handshake that passed its shuttingDown check before closing the rest.
	upgrading atomic.Int64
	stop      chan struct{}
	wg        sync.WaitGroup

	opened, closed, framesSent, writeCalls atomic.Int64
	closedBy                               [numCauses]atomic.Int64
}

const connShards = 64

// connShard is a set of connections by id: one of the server's shards, or
// the connections waiting in the writable set (Server.writers).
type connShard struct {
	mu    sync.RWMutex
	conns map[uint64]*Conn
}

func (sh *connShard) put(c *Conn) {
	sh.mu.Lock()
	sh.conns[c.id] = c
	sh.mu.Unlock()
}

func (sh *connShard) remove(id uint64) {
	sh.mu.Lock()
	delete(sh.conns, id)
	sh.mu.Unlock()
}

func (sh *connShard) get(id uint64) *Conn {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return sh.conns[id]
}

// job is one unit of worker time: read a readable connection, or flush one.
type job struct {
	c      *Conn
	events uint32     // epoll events for a read; 0 means flush
	pass   *flushPass // the flush pass this flush belongs to, if any
}

// flushPass counts the flushes of one pass still to finish; the last one to
// finish signals done.
type flushPass struct {
	pending atomic.Int64
	done    chan struct{} // capacity 1
}

func (p *flushPass) finished() {
	if p.pending.Add(-1) == 0 {
		p.done <- struct{}{}
	}
}

// flush writes j's connection's queue and tells its pass, if any.
func (j job) flush() {
	j.c.flush()
	if j.pass != nil {
		j.pass.finished()
	}
}

// New starts the poller, the workers and the sweeper.
func New(cfg Config) (*Server, error) {
	cfg.defaults()
	p, err := newPoller(readEvents)
	if err != nil {
		return nil, err
	}
	wp, err := newPoller(writeEvents)
	if err != nil {
		p.close()
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, poll: p, wpoll: wp, writers: connShard{conns: map[uint64]*Conn{}},
		jobs: make(chan job, 4096), stop: make(chan struct{}), wake: make(chan struct{}, 1)}
	for i := range s.shards {
		s.shards[i].conns = map[uint64]*Conn{}
	}
	s.wg.Add(4 + cfg.Workers)
	go s.flushLoop()
	go s.pollLoop()
	go s.writableLoop()
	go s.sweepLoop()
	for range cfg.Workers {
		go s.worker()
	}
	return s, nil
}

func (s *Server) shard(id uint64) *connShard { return &s.shards[id%connShards] }

func (s *Server) lookup(id uint64) *Conn { return s.shard(id).get(id) }

func (s *Server) pollLoop() {
	defer s.wg.Done()
	err := s.poll.wait(func(id uint64, events uint32) {
		if c := s.lookup(id); c != nil {
			select {
			case s.jobs <- job{c: c, events: events}:
			case <-s.stop:
			}
		}
	})
	if err != nil {
		s.log.Error("epoll wait failed; no further reads", "err", err)
	}
}

// writableLoop hands each slow peer whose socket has room again to a
// worker, which goes on with the flush that waited (Conn.waitWritable).
func (s *Server) writableLoop() {
	defer s.wg.Done()
	err := s.wpoll.wait(func(id uint64, _ uint32) {
		if c := s.writers.get(id); c != nil {
			s.dispatchFlush(c, nil)
		}
	})
	if err != nil {
		s.log.Error("epoll wait failed; slow peers are written no more", "err", err)
	}
}

func (s *Server) worker() {
	defer s.wg.Done()
	for {
		select {
		case j := <-s.jobs:
			if j.events != 0 {
				j.c.onReadable(j.events)
			} else {
				j.flush()
			}
		case <-s.stop:
			return
		}
	}
}

// scheduleFlush puts a connection with newly queued frames on the dirty list
// for the next flush pass (or hands it to a worker at once when FlushDelay is
// negative). The caller (a channel actor fanning out) never waits.
func (s *Server) scheduleFlush(c *Conn) {
	if s.cfg.FlushDelay < 0 {
		s.dispatchFlush(c, nil)
		return
	}
	s.dirtyMu.Lock()
	s.dirty = append(s.dirty, c)
	first := len(s.dirty) == 1
	s.dirtyMu.Unlock()
	if first {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// dispatchFlush hands c to a worker, or to a goroutine of its own if every
// worker slot is taken; pass, when set, is told when the flush is done.
func (s *Server) dispatchFlush(c *Conn, pass *flushPass) {
	j := job{c: c, pass: pass}
	select {
	case s.jobs <- j:
	default:
		go j.flush()
	}
}

// flushLoop runs flush passes: when woken by a first dirty connection it
// takes every dirty connection, has the workers flush them, and waits for
// all of them before it takes the next set. Frames queued while a pass is
// under way join the next pass, so a pass carries as many frames per
// connection as the load brings (one, when the server is quiet: nothing
// waits for a timer), the way a read loop that runs dry flushes. It sleeps
// while nothing is queued.
func (s *Server) flushLoop() {
	defer s.wg.Done()
	var batch []*Conn
	pass := &flushPass{done: make(chan struct{}, 1)}
	for {
		select {
		case <-s.wake:
		case <-s.stop:
			return
		}
		for {
			if s.cfg.FlushDelay > 0 {
				time.Sleep(s.cfg.FlushDelay)
			}
			s.dirtyMu.Lock()
			batch, s.dirty = s.dirty, batch[:0]
			s.dirtyMu.Unlock()
			if len(batch) == 0 {
				break
			}
			pass.pending.Store(int64(len(batch)))
			for i, c := range batch {
				s.dispatchFlush(c, pass)
				batch[i] = nil
			}
			// Wait for the pass, unless the server stops: its workers then
			// leave what is still queued (Shutdown has closed or dropped
			// every connection by then).
			select {
			case <-pass.done:
			case <-s.stop:
				return
			}
		}
	}
}

// Upgrade completes the WebSocket handshake of an already-authenticated
// request and registers the connection. open is called before any frame is
// read and returns the connection's Handler.
func (s *Server) Upgrade(w http.ResponseWriter, r *http.Request, open func(*Conn) Handler) error {
	s.upgrading.Add(1) // before the check: see Shutdown
	defer s.upgrading.Add(-1)
	if s.shuttingDown.Load() {
		return ErrShuttingDown
	}
	// Header: the headers the HTTP layer has already set (the security
	// headers) go on the upgrader's own answers too, the 101 and a refused
	// handshake's 400, which it writes on the hijacked socket itself.
	nc, rw, _, err := ws.HTTPUpgrader{Timeout: 5 * time.Second, Header: w.Header()}.Upgrade(r, w)
	if err != nil {
		// The upgrader hijacks before it checks, answers a bad handshake on the
		// hijacked socket and hands that socket back: close it, or it stays
		// open (a kept-alive client waits on it) until the GC finds it.
		if nc != nil {
			nc.Close()
		}
		return err
	}
	// net/http may have read bytes a client pipelined behind its handshake.
	var early []byte
	if n := rw.Reader.Buffered(); n > 0 {
		early, _ = rw.Reader.Peek(n)
		early = append([]byte(nil), early...)
	}
	fd, err := detach(nc)
	if err != nil {
		s.log.Warn("upgraded socket not taken over", "err", err)
		return err
	}
	now := time.Now().UnixNano()
	c := &Conn{id: s.nextID.Add(1), srv: s, fd: int32(fd), created: now}
	c.lastActive.Store(now)
	c.queue = c.inline[:0]
	opened := false
	defer func() {
		if !opened { // open panicked: nobody else will close the socket
			c.mu.Lock()
			c.closed = true
			if c.ioRefs == 0 {
				c.closeFD()
			} // else a write open started closes it when it ends
			c.mu.Unlock()
		}
	}()
	h := open(c)
	opened = true
	s.opened.Add(1)
	c.mu.Lock()
	c.handler = h
	closedEarly, info := c.closed, c.closeInfo
	if !closedEarly {
		// Listed under mu: a teardown from now on finds it listed (forget).
		s.shard(c.id).put(c)
	}
	c.mu.Unlock()
	if closedEarly { // open's own Close (or a failed write) ended it already
		h.HandleClose(info)
		return nil
	}

	if len(early) > 0 {
		c.readMu.Lock()
		c.consume(early)
		c.readMu.Unlock()
	}
	return c.register()
}

// detach takes the socket out of net/http and Go's poller: it returns a
// duplicate of nc's descriptor (dupSocket) and closes nc, a listener
// wrapper's (a connection cap's) included. Go keeps 512 bytes outside the
// heap for each socket in its poller, and the net.Conn's own state and
// addresses another 290 on it: together more than half of an idle
// connection's memory, which the Conn's epoll registration makes needless.
func detach(nc net.Conn) (int, error) {
	defer nc.Close()
	inner := nc
	if w, ok := nc.(interface{ NetConn() net.Conn }); ok {
		inner = w.NetConn()
	}
	sc, ok := inner.(syscall.Conn)
	if !ok {
		return -1, errors.New("transport: connection has no file descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("transport: upgraded socket: %w", err)
	}
	fd, dupErr := -1, error(nil)
	if err := rc.Control(func(f uintptr) { fd, dupErr = dupSocket(f) }); err != nil {
		return -1, fmt.Errorf("transport: upgraded socket: %w", err)
	}
	if dupErr != nil {
		return -1, fmt.Errorf("transport: duplicating the upgraded socket: %w", dupErr)
	}
	return fd, nil
}

// dupSocket duplicates a socket's descriptor, close-on-exec; the duplicate
// shares the original's non-blocking flag.
func dupSocket(fd uintptr) (int, error) {
	return unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
}

// Len is the number of live connections.
func (s *Server) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.RLock()
		n += len(sh.conns)
		sh.mu.RUnlock()
	}
	return n
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Open: int64(s.Len()), Opened: s.opened.Load(), Closed: s.closed.Load(),
		SlowConsumers: s.closedBy[CauseSlowConsumer].Load(), FramesSent: s.framesSent.Load(), WriteCalls: s.writeCalls.Load(),
		ClosedBy: map[string]int64{},
	}
	for _, c := range Causes() {
		st.ClosedBy[c.String()] = s.closedBy[c].Load()
	}
	return st
}

// each calls fn for every live connection (outside the shard locks).
func (s *Server) each(fn func(*Conn)) {
	var batch []*Conn
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.RLock()
		batch = batch[:0]
		for _, c := range sh.conns {
			batch = append(batch, c)
		}
		sh.mu.RUnlock()
		for _, c := range batch {
			fn(c)
		}
	}
}

func (s *Server) forget(c *Conn, info CloseInfo) {
	s.shard(c.id).remove(c.id)
	s.closed.Add(1)
	s.closedBy[info.Cause].Add(1)
	s.log.Debug("connection closed", "conn", c.id, "cause", info.Cause.String(), "code", int(info.Code),
		"reason", info.Reason, "abrupt", info.Abrupt, "age", time.Duration(time.Now().UnixNano()-c.created).Round(time.Millisecond))
}

// sweepLoop enforces the idle timeout and lifetime cap, and drops
// connections whose close handshake outlived the write timeout.
func (s *Server) sweepLoop() {
	defer s.wg.Done()
	period := time.Second
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.sweep(now.UnixNano())
		}
	}
}

func (s *Server) sweep(now int64) {
	idle, life := int64(s.cfg.IdleTimeout), int64(s.cfg.MaxLifetime)
	s.each(func(c *Conn) {
		switch {
		case c.closingSince.Load() != 0 && now-c.closingSince.Load() > int64(s.cfg.WriteTimeout):
			c.abort(CloseInfo{Cause: CausePeerGone, Code: CloseGoingAway, Reason: "close timed out", Abrupt: true})
		case idle > 0 && now-c.lastActive.Load() > idle:
			c.closeFor(CauseIdle, CloseGoingAway, "idle timeout")
		case life > 0 && now-c.created > life:
			c.closeFor(CauseLifetime, CloseGoingAway, "connection lifetime exceeded")
		}
	})
}

// Shutdown refuses new upgrades, closes every connection with 1001 after its
// queued frames are flushed, and waits for them to go (or for ctx, after
// which the rest are dropped). Then it stops the poller and workers.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shuttingDown.Store(true)
	// An Upgrade that got past its check before the Store above is counted in
	// upgrading; once it is done its connection is in the map, and every later
	// Upgrade sees shuttingDown. Without this wait a handshake racing the
	// shutdown could register after the close sweep and never be closed.
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.upgrading.Load() > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	var err error
	if s.upgrading.Load() > 0 {
		// Given up on: it registers after the poller is closed, which answers
		// it with the 1001 (Conn.register).
		err = ctx.Err()
	}
	s.each(func(c *Conn) { c.closeFor(CauseShutdown, CloseGoingAway, "server shutting down") })
wait:
	for s.Len() > 0 {
		select {
		case <-ctx.Done():
			err = ctx.Err()
			s.each(func(c *Conn) {
				c.abort(CloseInfo{Cause: CauseShutdown, Code: CloseGoingAway, Reason: "server shutting down", Abrupt: true})
			})
			break wait
		case <-t.C:
		}
	}
	close(s.stop)
	s.poll.interrupt()
	s.wpoll.interrupt()
	s.wg.Wait()
	s.poll.close()
	s.wpoll.close()
	// An upgrade given up on above may have registered after the last sweep,
	// while the workers finished: nothing would read or close it now. One
	// registering later finds the poller closed (Conn.register).
	s.each(func(c *Conn) {
		c.abort(CloseInfo{Cause: CauseShutdown, Code: CloseGoingAway, Reason: "server shutting down"})
	})
	return err
}

// ShuttingDown reports whether Shutdown has begun.
func (s *Server) ShuttingDown() bool { return s.shuttingDown.Load() }

// compile builds a control frame once.
func compile(f ws.Frame) []byte { return ws.MustCompileFrame(f) }
