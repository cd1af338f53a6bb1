package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
)

// The subscriber side must not be the bottleneck at a million deliveries per
// second on two cores. After its handshake and subscribe ack, a connection's
// socket is read by one of a few epoll loops (rxloop.go), one read per ready
// socket per wake-up into the connection's own buffer, frames parsed in
// place: no goroutine per connection to wake, no read that ends in EAGAIN,
// no allocation per message. A message is scanned by hand for "seq" and "t"
// (no JSON decoder), and each connection has its own latency histogram and
// seq bitset (no shared lock or counter per message).

const (
	readBufSize   = 4096    // per connection to start with; grows for a larger frame
	maxFrameBytes = 1 << 20 // the server's messages are at most 128 KiB
)

var errBadFrame = errors.New("malformed frame from server")

// parseFrame parses the frame at the start of b. need > 0 means b holds only
// part of it and need bytes are required in all. A masked frame (servers do
// not mask) is unmasked in place.
func parseFrame(b []byte) (op ws.OpCode, fin bool, payload []byte, size, need int, err error) {
	if len(b) < 2 {
		return 0, false, nil, 0, 2, nil
	}
	fin, op = b[0]&0x80 != 0, ws.OpCode(b[0]&0x0f)
	masked := b[1]&0x80 != 0
	n := uint64(b[1] & 0x7f)
	hl := 2
	switch n {
	case 126:
		hl = 4
	case 127:
		hl = 10
	}
	if masked {
		hl += 4
	}
	if len(b) < hl {
		return 0, false, nil, 0, hl, nil
	}
	switch n {
	case 126:
		n = uint64(binary.BigEndian.Uint16(b[2:]))
	case 127:
		n = binary.BigEndian.Uint64(b[2:])
	}
	if n > maxFrameBytes {
		return 0, false, nil, 0, 0, errBadFrame
	}
	size = hl + int(n)
	if len(b) < size {
		return 0, false, nil, 0, size, nil
	}
	payload = b[hl:size]
	if masked {
		var mask [4]byte
		copy(mask[:], b[hl-4:hl])
		ws.Cipher(payload, mask, 0)
	}
	return op, fin, payload, size, 0, nil
}

var (
	msgPrefix = []byte(`{"channel":`)
	seqKey    = []byte(`"seq":`)
	tKey      = []byte(`{"t":`)
	ackKey    = []byte(`"action":"subscribe"`)
	errKey    = []byte(`"error"`)
)

// seqOf reads the seq of {…,"seq":N}: it is the last member, so the scan
// runs backwards from the end (falling back to a search).
func seqOf(p []byte) (uint64, bool) {
	i := len(p) - 1
	for i >= 0 && (p[i] == '}' || p[i] == ' ' || p[i] == '\n') {
		i--
	}
	end := i + 1
	for i >= 0 && p[i] >= '0' && p[i] <= '9' {
		i--
	}
	if start := i + 1; start < end && bytes.HasSuffix(p[:start], seqKey) {
		return scanUint(p, start)
	}
	if i := bytes.LastIndex(p, seqKey); i >= 0 {
		return scanUint(p, i+len(seqKey))
	}
	return 0, false
}

// sentAt reads t of a payload {"t":N,…} (the message's first nested object).
func sentAt(p []byte) (int64, bool) {
	if len(p) < 2 {
		return 0, false
	}
	i := bytes.Index(p[1:], tKey)
	if i < 0 {
		return 0, false
	}
	t, ok := scanUint(p, 1+i+len(tKey))
	return int64(t), ok
}

// scanUint parses the digits after p[i:] (skipping blanks).
func scanUint(p []byte, i int) (uint64, bool) {
	for i < len(p) && p[i] == ' ' {
		i++
	}
	var v uint64
	start := i
	for ; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
		v = v*10 + uint64(p[i]-'0')
	}
	return v, i > start
}

// wsSub is one subscribed connection and everything it received. Its receive
// state is written by the goroutine that dials it, then only by its epoll
// loop; it is read after done is closed (recv alone is atomic, for progress).
type wsSub struct {
	id      uint64
	conn    net.Conn
	wmu     sync.Mutex // writes: pongs, close frames
	channel int
	node    int // which of the relay's nodes (-base) it is connected to

	// Receive state.
	buf    []byte // buf[:n] holds bytes not yet parsed (a partial frame)
	n      int
	msg    []byte // a fragmented message being reassembled
	msgOp  ws.OpCode
	acked  bool
	ackErr error
	ended  bool // reading is over; the loop tears the connection down

	fdMu sync.Mutex // fd is -1 once the socket is closed (numbers are reused)
	fd   int

	hist       latHist
	seqs       seqSet
	recv       atomic.Int64 // messages (counting duplicates)
	reads      int64        // socket reads that brought data
	other      int64        // frames that were not messages
	firstNs    int64
	lastRecvNs int64

	// closing is set by whoever ends the connection first: the tool (close)
	// or the reader when the server closed it. closeBy is when the tool gives
	// up waiting for the server's answer to its close frame (unix nanos).
	closing atomic.Bool
	closeBy atomic.Int64

	serverClosed bool  // the server ended it before the tool did
	closeFrame   bool  // the server's end came as a close frame (not a drop)
	closeCode    int   // its status code
	closeTimeout bool  // our close was not answered in time
	err          error // what ended reading, unless a close frame
	done         chan struct{}
}

var subIDs atomic.Uint64

// srcIP spreads connections over 127.0.0.2 … 127.0.0.(1+sources) so that
// many connections do not exhaust one source address's ports. nil means the
// kernel picks (sources ≤ 0, or an IPv6 target).
func srcIP(i, sources int, base string) net.IP {
	if sources <= 0 || strings.Contains(base, "[") {
		return nil
	}
	return net.IPv4(127, 0, 0, byte(2+i%sources))
}

// dialSub connects, subscribes to channel, waits for the ack and hands the
// socket to an epoll loop.
func dialSub(ctx context.Context, wsURL string, src net.IP, channel string, chIndex int) (*wsSub, error) {
	d := ws.Dialer{Timeout: 10 * time.Second}
	if src != nil {
		d.NetDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}).DialContext(ctx, network, addr)
		}
	}
	conn, br, _, err := d.Dial(ctx, wsURL)
	if err != nil {
		return nil, err
	}
	s := &wsSub{id: subIDs.Add(1), conn: conn, channel: chIndex, buf: make([]byte, readBufSize), fd: -1, done: make(chan struct{})}
	if br != nil { // bytes the server sent right behind its handshake
		if b := br.Buffered(); b > len(s.buf) {
			s.buf = make([]byte, b)
		}
		s.n, _ = br.Read(s.buf) // only what is buffered
		ws.PutReader(br)
	}
	msg := []byte(`{"action":"subscribe","channel":"` + channel + `"}`)
	if err := ws.WriteFrame(conn, ws.MaskFrameInPlace(ws.NewTextFrame(msg))); err != nil {
		conn.Close()
		return nil, err
	}
	// Until the ack, read through the Go connection; messages that follow the
	// ack in the same read are counted like any other.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	s.consume(time.Now().UnixNano())
	for !s.acked && !s.ended && s.ackErr == nil {
		m, err := conn.Read(s.buf[s.n:])
		s.n += m
		if m > 0 {
			s.consume(time.Now().UnixNano())
		}
		if err != nil && !s.acked {
			conn.Close()
			return nil, fmt.Errorf("waiting for the subscribe ack: %w", err)
		}
	}
	if !s.acked || s.ended {
		conn.Close()
		if s.ackErr != nil {
			return nil, s.ackErr
		}
		return nil, fmt.Errorf("closed before the subscribe ack (%d): %v", s.closeCode, s.err)
	}
	conn.SetReadDeadline(time.Time{})
	if err := registerRx(s); err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

// consume parses the complete frames in buf[:n] and keeps the rest.
func (s *wsSub) consume(now int64) {
	off := 0
	for !s.ended {
		op, fin, p, size, need, err := parseFrame(s.buf[off:s.n])
		if err != nil {
			s.endRead(err)
			break
		}
		if need > 0 {
			if need > len(s.buf) { // a frame larger than the buffer
				nb := make([]byte, max(need, 2*len(s.buf)))
				s.n = copy(nb, s.buf[off:s.n])
				s.buf, off = nb, 0
				return
			}
			break
		}
		off += size
		s.frame(op, fin, p, now)
	}
	s.n = copy(s.buf, s.buf[off:s.n])
}

// frame reassembles fragmented messages and dispatches complete ones.
func (s *wsSub) frame(op ws.OpCode, fin bool, p []byte, now int64) {
	switch {
	case op.IsControl():
	case op == ws.OpContinuation:
		if s.msgOp == 0 {
			s.endRead(errBadFrame)
			return
		}
		s.msg = append(s.msg, p...)
		if !fin {
			return
		}
		op, p, s.msgOp = s.msgOp, s.msg, 0
	case !fin:
		s.msgOp = op
		s.msg = append(s.msg[:0], p...)
		return
	}
	s.handle(op, p, now)
}

func (s *wsSub) handle(op ws.OpCode, p []byte, now int64) {
	switch op {
	case ws.OpText:
		switch {
		case bytes.HasPrefix(p, msgPrefix):
			s.onMessage(p, now)
		case !s.acked && bytes.Contains(p, ackKey):
			s.acked = true
		case !s.acked && bytes.Contains(p, errKey):
			s.ackErr = fmt.Errorf("subscribe refused: %s", p)
		default:
			s.other++
		}
	case ws.OpClose:
		s.closeFrame = true
		code, _ := ws.ParseCloseFrameDataUnsafe(p)
		s.closeCode = int(code)
		if s.markGone() { // the server's initiative: answer it
			s.serverClosed = true
			s.write(ws.NewCloseFrame(ws.NewCloseFrameBody(code, "")))
		}
		s.ended = true
	case ws.OpPing:
		s.write(ws.NewPongFrame(append([]byte(nil), p...)))
	default:
		s.other++
	}
}

// onMessage handles {"channel":…,"payload":{"t":…,…},"seq":…} with no
// allocation; now is when the read that brought it returned.
func (s *wsSub) onMessage(p []byte, now int64) {
	if seq, ok := seqOf(p); ok {
		s.seqs.add(seq)
	}
	if t, ok := sentAt(p); ok {
		s.hist.record(uint64(max(now-t, 0)) / 1000)
	}
	if s.firstNs == 0 {
		s.firstNs = now
	}
	s.lastRecvNs = now
	s.recv.Add(1)
}

// endRead records why reading stopped without a close frame.
func (s *wsSub) endRead(err error) {
	if s.markGone() {
		s.serverClosed = true
	}
	s.err, s.ended = err, true
}

func (s *wsSub) markGone() bool {
	return !s.closing.Swap(true)
}

func (s *wsSub) write(f ws.Frame) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	return ws.WriteFrame(s.conn, ws.MaskFrameInPlace(f))
}

// close ends the connection from the tool's side: a close frame, and the
// loop waits up to 2 s for the server's answer; or, abrupt, a shutdown of the
// socket with no close frame. It reports whether the tool was first.
func (s *wsSub) close(abrupt bool) bool {
	if !s.markGone() {
		return false
	}
	if !abrupt && s.write(ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))) == nil {
		s.closeBy.Store(time.Now().Add(2 * time.Second).UnixNano())
		return true
	}
	s.fdMu.Lock()
	if s.fd >= 0 {
		shutdown(s.fd) // the loop reads EOF and tears down
	}
	s.fdMu.Unlock()
	return true
}

// subTotals sums what a set of subscribers saw against the seqs the emitter
// was told (expected, per channel index, sorted).
type subTotals struct {
	Subscribers     int            `json:"subscribers"`
	Deliveries      int64          `json:"deliveries"`
	Expected        int64          `json:"expected_deliveries"`
	Lost            int64          `json:"lost"`
	SubsWithLoss    int            `json:"subscribers_with_loss"`
	MaxLostPerSub   int64          `json:"max_lost_per_subscriber"`
	OutOfOrder      int64          `json:"out_of_order"`
	SubsOutOfOrder  int            `json:"subscribers_out_of_order"`
	Duplicates      int64          `json:"duplicates"`
	Unexpected      int64          `json:"unexpected"`          // seqs no 200 response announced
	SeqJumps        int64          `json:"seq_jumps,omitempty"` // seqs far off the others (a reset counter), not checked
	ServerClosed    int            `json:"server_closed"`
	ServerDropped   int            `json:"server_dropped"` // ended without a close frame
	CloseCodes      map[string]int `json:"server_close_codes,omitempty"`
	CloseTimeouts   int            `json:"close_timeouts"`
	OtherFrames     int64          `json:"other_frames"`
	PerRead         float64        `json:"messages_per_read"` // > 1: the server batched writes or the tool fell behind
	Latency         latSummary     `json:"latency"`
	firstNs, lastNs int64          // first and last delivery
	hist            mergedHist
}

// tally merges subscribers. whole: each must have every expected seq of its
// channel (fan-out, subscribed before the first emit); otherwise only those
// between the first and the last seq it received (churn: loss while connected).
func tally(subs []*wsSub, expected [][]uint64, whole bool) subTotals {
	t := subTotals{Subscribers: len(subs), CloseCodes: map[string]int{}}
	var reads int64
	for _, s := range subs {
		reads += s.reads
		exp := expected[s.channel]
		t.Deliveries += s.recv.Load()
		t.hist.add(&s.hist)
		var lost, matched int64
		if whole {
			t.Expected += int64(len(exp))
			lost, matched = s.seqs.missing(exp, 0, ^uint64(0))
		} else if s.seqs.unique > 0 {
			lost, matched = s.seqs.missing(exp, s.seqs.lo, s.seqs.last)
			t.Expected += lost + matched
		}
		t.Lost += lost
		t.Unexpected += s.seqs.unique - matched
		if lost > 0 {
			t.SubsWithLoss++
			t.MaxLostPerSub = max(t.MaxLostPerSub, lost)
		}
		t.OutOfOrder += s.seqs.outOfOrd
		if s.seqs.outOfOrd > 0 {
			t.SubsOutOfOrder++
		}
		t.Duplicates += s.seqs.dups
		t.SeqJumps += s.seqs.jumps
		t.OtherFrames += s.other
		if s.serverClosed {
			t.ServerClosed++
			if s.closeFrame {
				t.CloseCodes[fmt.Sprint(s.closeCode)]++
			} else {
				t.ServerDropped++
			}
		}
		if s.closeTimeout {
			t.CloseTimeouts++
		}
		if s.firstNs != 0 && (t.firstNs == 0 || s.firstNs < t.firstNs) {
			t.firstNs = s.firstNs
		}
		t.lastNs = max(t.lastNs, s.lastRecvNs)
	}
	t.Latency = t.hist.summary()
	if reads > 0 {
		t.PerRead = float64(t.Deliveries) / float64(reads)
	}
	return t
}

// closeAll closes subscribers gracefully and waits for them (each bounded by
// the 2 s close deadline; past 2 s in all, the rest are dropped abruptly).
func closeAll(subs []*wsSub) {
	start := time.Now()
	for _, s := range subs {
		s.close(time.Since(start) > 2*time.Second)
	}
	for _, s := range subs {
		<-s.done
	}
}

// dialMany opens n subscribers (channel i%channels; with several nodes,
// one wsURL each, a channel's subscribers spread over them) with parallel
// handshakes in flight, starts their readers, and returns those that
// subscribed.
func dialMany(ctx context.Context, wsURLs []string, base string, n, channels, parallel, sources int, chName func(int) string) ([]*wsSub, int, error) {
	subs := make([]*wsSub, n)
	var next, failed atomic.Int64
	var first firstErr
	var wg sync.WaitGroup
	for w := 0; w < max(parallel, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				node := spread(i%channels, i/channels, len(wsURLs))
				s, err := dialSub(ctx, wsURLs[node], srcIP(i, sources, base), chName(i%channels), i%channels)
				if err != nil {
					failed.Add(1)
					first.set(err)
					continue
				}
				s.node = node
				subs[i] = s
			}
		}()
	}
	wg.Wait()
	out := subs[:0]
	for _, s := range subs {
		if s != nil {
			out = append(out, s)
		}
	}
	return out, int(failed.Load()), first.get()
}

// firstErr keeps the first of many errors (atomic.Value would panic on a
// second error of another type).
type firstErr struct {
	mu  sync.Mutex
	err error
}

func (f *firstErr) set(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

func (f *firstErr) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func wsURLFor(base, publicKey string) string {
	return strings.Replace(base, "http", "ws", 1) + "/ws?publicKey=" + publicKey
}

// wsURLsFor is wsURLFor of every node.
func wsURLsFor(bases []string, publicKey string) []string {
	out := make([]string, len(bases))
	for i, b := range bases {
		out[i] = wsURLFor(b, publicKey)
	}
	return out
}
