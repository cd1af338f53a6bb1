package transport

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"
)

// Conn is one WebSocket connection. Send and Close are safe from any
// goroutine; the read state is touched only by the worker that holds the
// connection's one-shot epoll event.
type Conn struct {
	id      uint64
	srv     *Server
	handler Handler
	created int64 // unix nanos

	lastActive   atomic.Int64 // unix nanos of the last byte in either direction
	closingSince atomic.Int64 // unix nanos when Close was called; 0 while open

	// Read state: one worker at a time, by the one-shot epoll event. readMu
	// makes that hand-over visible to Go's memory model (and the race
	// detector), which cannot see the ordering epoll gives; it is never contended.
	readMu    sync.Mutex
	partial   []byte    // bytes of an incomplete frame, kept between reads
	message   []byte    // data of a fragmented message being reassembled
	messageOp ws.OpCode // its opcode, 0 when none
	readDone  bool      // a close frame or protocol error ended reading

	// Write state, under mu (the flags sit beside the read ones, where the
	// struct had padding; a Conn is 320 bytes, a size class of its own:
	// TestConnSizeClass).
	writing    bool // a flush owns the writes (on a worker, or waiting for room)
	closing    bool // close frame queued: nothing more is accepted
	closed     bool // torn down
	registered bool // in the epoll set
	// fd is the socket, owned by the Conn alone (Server.Upgrade lets go of
	// net/http's net.Conn and its entry in Go's poller). Reads and writes
	// run outside mu, so each holds a reference (beginIO), and the socket
	// is closed by the last of teardown and the syscalls in flight: never
	// while one may still use the number, which the kernel gives to the
	// next socket opened. -1 once closed.
	fd     int32
	ioRefs int32 // syscalls in flight on fd
	mu     sync.Mutex
	// drain is a slow peer's wait for room (waitWritable), from its first
	// stall on.
	drain  *drainWait
	inline [4][]byte // the queue's backing array while it is short
	queue  [][]byte  // frames waiting to be written, oldest first
	head   int       // bytes of queue[0] already written
	queued int       // bytes in queue
	// stamp is the accepted time (unix nanos) of the oldest queued frame
	// given one by SendAt and not yet taken by a write, 0 when none: a
	// write that sends it reports its age (WriteObserver).
	stamp     int64
	closeInfo CloseInfo // what HandleClose will be told
}

// WriteObserver is an optional method of a Handler: after a write sent
// every frame it took, it is told the accepted time (SendAt) of the oldest
// stamped frame among them, and the time the write ended, both unix nanos.
type WriteObserver interface {
	HandleWritten(accepted, written int64)
}

// ID is unique among the server's connections for its lifetime.
func (c *Conn) ID() uint64 { return c.id }

// beginIO takes a reference on the socket for a syscall made outside mu and
// returns its number; false once the connection is torn down. Caller holds mu.
func (c *Conn) beginIO() (int, bool) {
	if c.closed {
		return -1, false
	}
	c.ioRefs++
	return int(c.fd), true
}

// endIO gives back beginIO's reference: the last one out of a torn-down
// connection closes the socket. Caller holds mu.
func (c *Conn) endIO() {
	c.ioRefs--
	if c.closed && c.ioRefs == 0 {
		c.closeFD()
	}
}

// tornDown reports whether teardown has run: a read that holds the socket
// open stops there, as a read on the closed socket did.
func (c *Conn) tornDown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// closeFD closes the socket once. Caller holds mu.
func (c *Conn) closeFD() {
	if c.fd >= 0 {
		unix.Close(int(c.fd))
		c.fd = -1
	}
}

// touch records activity now, and returns the time (unix nanos).
func (c *Conn) touch() int64 {
	now := time.Now().UnixNano()
	c.lastActive.Store(now)
	return now
}

// Send queues a complete, already framed message (server frames are unmasked,
// so the same bytes may be queued on many connections; they are never
// modified). It never blocks. It reports false if the connection is closing
// or gone, or if the queue overflowed, in which case the connection is closed
// as a slow consumer.
func (c *Conn) Send(frame []byte) bool { return c.SendAt(frame, 0) }

// SendAt is Send for a frame accepted at the given time (unix nanos, 0 for
// none), whose age at the write that sends it goes to the handler's
// WriteObserver.
func (c *Conn) SendAt(frame []byte, accepted int64) bool {
	c.mu.Lock()
	if c.closing || c.closed {
		c.mu.Unlock()
		return false
	}
	if len(c.queue) >= c.srv.cfg.QueueFrames || c.queued+len(frame) > c.srv.cfg.QueueBytes {
		c.mu.Unlock()
		c.abort(CloseInfo{Cause: CauseSlowConsumer, Code: CloseTryAgainLater, Reason: "slow consumer"})
		return false
	}
	c.queue = append(c.queue, frame)
	c.queued += len(frame)
	if c.stamp == 0 {
		c.stamp = accepted
	}
	start := !c.writing
	c.writing = true
	c.mu.Unlock()
	if start {
		c.srv.scheduleFlush(c)
	}
	return true
}

// Close sends a close frame after the frames already queued, then closes the
// socket. Further Sends are refused. Safe to call more than once.
func (c *Conn) Close(code CloseCode, reason string) {
	c.closeFor(CauseApplication, code, reason)
}

func (c *Conn) closeFor(cause Cause, code CloseCode, reason string) {
	c.closeWith(CloseInfo{Cause: cause, Code: code, Reason: reason}, closeBody(code, reason))
}

func closeBody(code CloseCode, reason string) []byte {
	if len(reason) > 123 {
		reason = reason[:123] // control frames carry at most 125 bytes
	}
	return ws.NewCloseFrameBody(code.ws(), reason)
}

func (c *Conn) closeWith(info CloseInfo, body []byte) {
	c.mu.Lock()
	if c.closing || c.closed {
		c.mu.Unlock()
		return
	}
	c.closing = true
	c.closeInfo = info
	c.closingSince.Store(time.Now().UnixNano())
	frame := compile(ws.NewCloseFrame(body))
	c.queue = append(c.queue, frame)
	c.queued += len(frame)
	start := !c.writing
	c.writing = true
	c.mu.Unlock()
	if start {
		c.srv.scheduleFlush(c)
	}
}

// abort drops whatever is queued, tries once to send a close frame without
// waiting, and tears the connection down now.
func (c *Conn) abort(info CloseInfo) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closing = true
	if !info.Abrupt && !c.writing { // never interleave with a writev in flight
		frame := compile(ws.NewCloseFrame(closeBody(info.Code, info.Reason)))
		unix.Write(int(c.fd), frame) // under mu, before teardown: the socket is open
	}
	c.mu.Unlock()
	c.teardown(info)
}

// teardown ends the connection once and tells the handler: the socket
// leaves the epoll set and is closed now, or by the last read or write still
// under way (endIO).
func (c *Conn) teardown(info CloseInfo) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed, c.closing = true, true
	if c.registered {
		// Remove before closing: afterwards the fd number may belong to a new socket.
		c.srv.poll.remove(int(c.fd))
		c.registered = false
	}
	if d := c.drain; d != nil {
		if d.inSet {
			c.srv.wpoll.remove(int(c.fd))
			c.srv.writers.remove(c.id)
			d.inSet = false
		}
		d.timer.Stop()
	}
	if c.ioRefs == 0 {
		c.closeFD()
	} // else the last syscall in flight closes it (endIO)
	for i := range c.queue {
		c.queue[i] = nil
	}
	c.queue, c.queued, c.head = nil, 0, 0
	h := c.handler
	if h == nil {
		// Torn down while open still runs (its handler may close at once, as
		// a revoked token does): Upgrade tells the handler once open returns.
		c.closeInfo = info
	}
	c.mu.Unlock()
	c.srv.forget(c, info)
	if h != nil {
		h.HandleClose(info)
	}
}

func (c *Conn) register() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	err := c.srv.poll.add(int(c.fd), c.id)
	c.registered = err == nil
	c.mu.Unlock()
	switch {
	case errors.Is(err, errPollerClosed):
		// The handshake outlived Shutdown's deadline: the 1001 every other
		// connection got. The upgrade itself succeeded (the handler hears of
		// the close), so it is no error for the caller, who must not answer.
		c.abort(CloseInfo{Cause: CauseShutdown, Code: CloseGoingAway, Reason: "server shutting down"})
		return nil
	case err != nil:
		c.teardown(CloseInfo{Cause: CausePeerGone, Code: CloseInternalError, Abrupt: true})
	}
	return err
}

func (c *Conn) rearm() {
	c.mu.Lock()
	if !c.closed && c.registered {
		if err := c.srv.poll.rearm(int(c.fd), c.id); err != nil {
			c.mu.Unlock()
			c.teardown(CloseInfo{Cause: CausePeerGone, Code: CloseInternalError, Abrupt: true})
			return
		}
	}
	c.mu.Unlock()
}

// ---- writing ----

// maxIovecs is how many frames one writev call takes (Linux's IOV_MAX is 1024).
const maxIovecs = 1024

var iovecPool = sync.Pool{New: func() any { s := make([][]byte, 0, maxIovecs); return &s }}

// take copies up to maxIovecs queued frames into iov (the first one minus the
// bytes already written), with the stamp they carry. Frames it leaves keep
// the stamp too (an age reported twice errs on the old side). Caller holds mu.
func (c *Conn) take(iov [][]byte) ([][]byte, int, int64) {
	stamp := c.stamp
	if len(c.queue) <= maxIovecs {
		c.stamp = 0
	}
	total := 0
	for i, f := range c.queue {
		if i == maxIovecs {
			break
		}
		if i == 0 {
			f = f[c.head:]
		}
		iov = append(iov, f)
		total += len(f)
	}
	return iov, total, stamp
}

// unsent gives back the stamp of a write that did not send all it took:
// older than any frame queued since, it is again the oldest. Caller holds mu.
func (c *Conn) unsent(stamp int64) {
	if stamp != 0 {
		c.stamp = stamp
	}
}

// written reports a finished write's stamp to the handler's WriteObserver.
func (c *Conn) written(h Handler, stamp, now int64) {
	if stamp == 0 {
		return
	}
	if o, ok := h.(WriteObserver); ok {
		o.HandleWritten(stamp, now)
	}
}

// consumed drops n written bytes from the head of the queue and returns how
// many frames they completed. Caller holds mu.
func (c *Conn) consumed(n int) (frames int) {
	c.queued -= n
	for n > 0 {
		rest := len(c.queue[0]) - c.head
		if n < rest {
			c.head += n
			return frames
		}
		n -= rest
		c.queue[0] = nil
		c.queue = c.queue[1:]
		c.head = 0
		frames++
	}
	if len(c.queue) == 0 {
		c.queue = c.inline[:0] // back to the inline array: no allocation while short
	}
	return frames
}

// flush writes queued frames with non-blocking writev calls until the queue
// is empty. If the socket buffer fills, it waits for room without holding
// the worker (waitWritable), so workers never block on a peer.
func (c *Conn) flush() {
	iovp := iovecPool.Get().(*[][]byte)
	defer iovecPool.Put(iovp)
	for {
		c.mu.Lock()
		if c.closed {
			c.writing = false
			c.mu.Unlock()
			return
		}
		if len(c.queue) == 0 {
			c.writing = false
			done := c.closing
			info := c.closeInfo
			c.mu.Unlock()
			if done {
				c.teardown(info) // the close frame is out
			}
			return
		}
		iov, total, stamp := c.take((*iovp)[:0])
		fd, _ := c.beginIO() // not closed: checked above, under the same lock
		c.mu.Unlock()

		n, err := unix.Writev(fd, iov)
		clear(iov)
		if n < 0 {
			n = 0
		}
		stalled := n < total && (err == nil || errors.Is(err, unix.EAGAIN))
		c.srv.writeCalls.Add(1)
		var now int64
		if n > 0 {
			now = c.touch()
		}
		c.mu.Lock()
		c.endIO()
		if c.closed { // torn down meanwhile; the queue is gone
			c.writing = false
			c.mu.Unlock()
			return
		}
		frames := c.consumed(n)
		if n < total {
			c.unsent(stamp)
		}
		c.drain.wrote(n)
		h := c.handler // nil while open still runs: Upgrade sets it under mu
		var waitErr error
		if stalled {
			waitErr = c.waitWritable(total - n)
		}
		c.mu.Unlock()
		c.srv.framesSent.Add(int64(frames))
		if n == total {
			c.written(h, stamp, now)
		}
		switch {
		case err == nil && n == total:
			continue
		case stalled && waitErr == nil:
			return // the writable event hands c to a worker again
		case errors.Is(waitErr, errPollerClosed):
			c.teardown(CloseInfo{Cause: CauseShutdown, Code: CloseGoingAway, Reason: "server shutting down", Abrupt: true})
			return
		case stalled:
			c.srv.log.Warn("slow peer dropped: cannot wait for room", "conn", c.id, "err", waitErr)
			c.teardown(CloseInfo{Cause: CauseSlowConsumer, Code: CloseTryAgainLater, Reason: "slow consumer", Abrupt: true})
			return
		default:
			c.teardown(CloseInfo{Cause: CausePeerGone, Code: CloseAbnormal, Abrupt: true})
			return
		}
	}
}

// drainWait is a slow peer's wait for room in its socket buffer. What a
// stalled write took and did not send is a batch that must go out within
// WriteTimeout of the stall, or the peer is dropped; the next stall after
// it starts a new batch. Under mu.
type drainWait struct {
	inSet    bool      // registered in the server's writable set (wpoll)
	left     int       // bytes of the batch still to write; 0 when none
	deadline time.Time // by which the batch must be written (monotonic)
	timer    *time.Timer
}

// waitWritable puts a stalled flush to sleep until the peer makes room:
// the socket is armed (one-shot) in the server's writable set, whose event
// hands the connection to a worker again, and c.writing stays set so that
// nothing else flushes meanwhile. left is what the write took and did not
// send. Caller holds mu; the connection is not torn down.
func (c *Conn) waitWritable(left int) error {
	d := c.drain
	if d == nil {
		d = &drainWait{}
		c.drain = d
	}
	if d.left == 0 { // a new batch
		d.left = left
		d.deadline = time.Now().Add(c.srv.cfg.WriteTimeout)
		if d.timer == nil {
			d.timer = time.AfterFunc(c.srv.cfg.WriteTimeout, c.writeTimedOut)
		} else {
			d.timer.Reset(c.srv.cfg.WriteTimeout)
		}
	}
	if d.inSet {
		return c.srv.wpoll.rearm(int(c.fd), c.id)
	}
	// Listed before it is armed: the event may come at once, and finds c by
	// id there (even before Upgrade lists it in the shards).
	c.srv.writers.put(c)
	if err := c.srv.wpoll.add(int(c.fd), c.id); err != nil {
		c.srv.writers.remove(c.id)
		return err
	}
	d.inSet = true
	return nil
}

// wrote counts n written bytes against the batch, if one is waiting. Caller
// holds mu.
func (d *drainWait) wrote(n int) {
	if d == nil || d.left == 0 {
		return
	}
	d.left = max(d.left-n, 0)
	if d.left == 0 {
		d.timer.Stop() // written in time
	}
}

// writeTimedOut drops a peer whose batch is still unwritten at its deadline.
// A timer that fired for a batch since written, as the next one began,
// waits again for the next one's deadline.
func (c *Conn) writeTimedOut() {
	c.mu.Lock()
	d := c.drain
	late := false
	if !c.closed && d.left > 0 {
		if wait := time.Until(d.deadline); wait > 0 {
			d.timer.Reset(wait)
		} else {
			late = true
		}
	}
	c.mu.Unlock()
	if late {
		c.teardown(CloseInfo{Cause: CauseSlowConsumer, Code: CloseTryAgainLater, Reason: "slow consumer", Abrupt: true})
	}
}

// ---- reading ----

// readBufSize is the pooled read buffer: big enough for a burst of small
// frames, returned to the pool before the worker moves on.
const readBufSize = 16 << 10

var readPool = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// maxReadsPerEvent bounds one worker's time on one connection; level-triggered
// epoll fires again at once for what is left.
const maxReadsPerEvent = 8

// onReadable runs on a worker when epoll reports the connection.
func (c *Conn) onReadable(events uint32) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.mu.Lock()
	fd, ok := c.beginIO()
	c.mu.Unlock()
	if !ok {
		return // torn down since the event
	}
	bp := readPool.Get().(*[]byte)
	buf := *bp
	eof := false
	for range maxReadsPerEvent {
		n, err := unix.Read(fd, buf)
		if n > 0 {
			c.touch()
			c.consume(buf[:n])
			if n < len(buf) || c.tornDown() {
				break // drained what the kernel had, or the connection is over
			}
			continue
		}
		if err == nil || !errors.Is(err, unix.EAGAIN) {
			eof = true // n == 0: the peer closed; or a hard error
		}
		break
	}
	readPool.Put(bp)
	c.mu.Lock()
	c.endIO()
	c.mu.Unlock()
	if eof || events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.teardown(CloseInfo{Cause: CausePeerGone, Code: CloseAbnormal, Abrupt: true})
		return
	}
	if c.readDone {
		return // waiting for our close frame to go out; reads are over
	}
	c.rearm()
}

// consume parses whole frames out of data (plus any partial frame kept from
// the last read) and keeps the incomplete tail.
func (c *Conn) consume(data []byte) {
	if c.readDone {
		return
	}
	if len(c.partial) > 0 {
		data = append(c.partial, data...)
	}
	var rd bytes.Reader
	var hdr [ws.MaxHeaderSize - 2]byte
	for len(data) > 0 {
		rd.Reset(data)
		h, err := ws.ReadHeaderBuffer(&rd, hdr[:])
		if err != nil {
			if errors.Is(err, ws.ErrHeaderLengthUnexpected) || errors.Is(err, ws.ErrHeaderLengthMSB) {
				c.protocolError(ws.StatusProtocolError, "bad frame length")
				return
			}
			break // header incomplete
		}
		hlen := len(data) - rd.Len()
		if code, reason := c.check(h); code != 0 {
			c.protocolError(code, reason)
			return
		}
		end := hlen + int(h.Length)
		if len(data) < end {
			break // payload incomplete
		}
		payload := data[hlen:end]
		ws.Cipher(payload, h.Mask, 0)
		c.frame(h, payload)
		data = data[end:]
		if c.readDone {
			return
		}
	}
	if len(data) == 0 {
		c.partial = nil
	} else {
		c.partial = append(c.partial[:0:0], data...) // the read buffer goes back to the pool
	}
}

// check validates a frame header before any of its payload is buffered.
func (c *Conn) check(h ws.Header) (ws.StatusCode, string) {
	switch {
	case h.Rsv != 0:
		return ws.StatusProtocolError, "reserved bits set"
	case !h.Masked:
		return ws.StatusProtocolError, "client frames must be masked"
	case h.OpCode.IsReserved():
		return ws.StatusProtocolError, "reserved opcode"
	case h.OpCode.IsControl() && (!h.Fin || h.Length > ws.MaxControlFramePayloadSize):
		return ws.StatusProtocolError, "bad control frame"
	case h.OpCode == ws.OpContinuation && c.messageOp == 0:
		return ws.StatusProtocolError, "continuation without a message"
	case h.OpCode.IsData() && h.OpCode != ws.OpContinuation && c.messageOp != 0:
		return ws.StatusProtocolError, "new message inside a fragmented one"
	// A control frame between fragments is not part of the message.
	case h.Length > int64(c.srv.cfg.MaxMessageBytes) ||
		h.OpCode == ws.OpContinuation && int64(len(c.message))+h.Length > int64(c.srv.cfg.MaxMessageBytes):
		return ws.StatusMessageTooBig, "message too big"
	}
	return 0, ""
}

func (c *Conn) protocolError(code ws.StatusCode, reason string) {
	c.readDone = true
	c.partial, c.message, c.messageOp = nil, nil, 0
	cause := CauseProtocol
	if code == ws.StatusMessageTooBig {
		cause = CauseTooBig
	}
	c.closeFor(cause, CloseCode(code), reason)
}

// frame handles one complete, unmasked frame.
func (c *Conn) frame(h ws.Header, payload []byte) {
	switch h.OpCode {
	case ws.OpPing:
		c.Send(compile(ws.NewPongFrame(append([]byte(nil), payload...))))
	case ws.OpPong:
	case ws.OpClose:
		code, reason := ws.ParseCloseFrameData(payload)
		if len(payload) == 1 || len(payload) >= 2 && !peerCloseCode(code) {
			c.protocolError(ws.StatusProtocolError, "bad close frame") // never echo 1005 or 0 on the wire
			return
		}
		if !utf8.ValidString(reason) {
			c.protocolError(ws.StatusInvalidFramePayloadData, "invalid UTF-8")
			return
		}
		c.readDone = true
		info := CloseInfo{Cause: CausePeerClosed, Code: CloseCode(code), Reason: reason, ByPeer: true}
		body := payload[:0:0] // echo an empty body for an empty close (never 1005 on the wire)
		if code.Empty() {
			info.Code = CloseNoStatus
		} else {
			body = ws.NewCloseFrameBody(code, "")
		}
		c.closeWith(info, body)
	case ws.OpText, ws.OpBinary:
		if !h.Fin {
			c.messageOp = h.OpCode
			c.message = append(c.message, payload...)
			return
		}
		c.deliver(h.OpCode, payload)
	case ws.OpContinuation:
		c.message = append(c.message, payload...)
		if h.Fin {
			msg, op := c.message, c.messageOp
			c.message, c.messageOp = nil, 0
			c.deliver(op, msg)
		}
	}
}

// peerCloseCode: the codes an endpoint may send in a close frame (RFC 6455
// § 7.4; 1012–1014 registered since, 3000–4999 for applications).
func peerCloseCode(c ws.StatusCode) bool {
	return c >= 1000 && c <= 1003 || c >= 1007 && c <= 1014 || c >= 3000 && c <= 4999
}

func (c *Conn) deliver(op ws.OpCode, msg []byte) {
	if op == ws.OpText && !utf8.Valid(msg) {
		c.protocolError(ws.StatusInvalidFramePayloadData, "invalid UTF-8")
		return
	}
	c.handler.HandleMessage(msg)
}
