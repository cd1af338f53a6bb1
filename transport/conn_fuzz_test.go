package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// fuzzMaxMessage is the MaxMessageBytes of the fuzzed connection: small, so
// that the fuzzer reaches the 1009 paths with short inputs.
const fuzzMaxMessage = 512

// FuzzConsume drives the frame reader (consume → check → frame → deliver)
// the way a worker does: the bytes of one connection, cut into reads at
// arbitrary points. There are two modes.
//
// Raw (build false): data is the byte stream as the client sent it; the
// outcome (messages delivered, pongs queued, the close frame sent and the
// CloseInfo) must equal that of wsModel, an independent reading of RFC 6455
// and of cmd/relay/OPERATING.md › Close codes, whatever the cut points; the partial-frame
// and reassembly buffers must stay bounded by MaxMessageBytes.
//
// Build (build true): data is a recipe for a valid sequence of masked frames
// (fragmented text and binary messages, pings and pongs between fragments,
// any mask, minimal or not length encodings, an optional close at the end);
// every message must be reassembled exactly, every ping answered, and
// nothing closed except by the final close frame.
func FuzzConsume(f *testing.F) {
	m := func(op ws.OpCode, fin bool, p []byte) []byte {
		return ws.MustCompileFrame(ws.MaskFrameWith(ws.NewFrame(op, fin, p), [4]byte{1, 2, 3, 4}))
	}
	cat := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	big := bytes.Repeat([]byte("x"), 300)
	// Raw streams, each with the reads it is cut into.
	for _, seed := range []struct {
		stream, cuts []byte
	}{
		{m(ws.OpText, true, []byte("hello")), []byte{2, 0, 7}},
		{cat(m(ws.OpText, false, []byte("hel")), m(ws.OpPing, true, []byte("p")), m(ws.OpContinuation, true, []byte("lo"))), []byte{0}},
		// Fragments over the cap: 1009.
		{cat(m(ws.OpBinary, false, big), m(ws.OpContinuation, false, big)), nil},
		// A ping between fragments near the cap is not part of the message.
		{cat(m(ws.OpText, false, big[:250]), m(ws.OpContinuation, false, big[:250]), m(ws.OpPing, true, big[:20]), m(ws.OpContinuation, true, nil)), nil},
		// 64-bit length with the MSB set; a 1 GiB header alone; unmasked.
		{[]byte{0x81, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}, nil},
		{[]byte{0x81, 0xff, 0, 0, 0, 0, 0x40, 0, 0, 0, 1, 2, 3, 4}, []byte{3}},
		{[]byte{0x81, 0x05, 'h', 'e', 'l', 'l', 'o'}, nil},
		// Invalid UTF-8; a rune cut short.
		{m(ws.OpText, true, []byte{0xff, 0xfe}), nil},
		{m(ws.OpText, true, []byte("\xe2\x82")), nil},
		// Close frames: echoed, empty, 1-byte body, reserved code, reason not UTF-8.
		{m(ws.OpClose, true, ws.NewCloseFrameBody(4321, "bye")), nil},
		{m(ws.OpClose, true, nil), nil},
		{m(ws.OpClose, true, []byte{3}), nil},
		{m(ws.OpClose, true, ws.NewCloseFrameBody(1005, "")), nil},
		{m(ws.OpClose, true, ws.NewCloseFrameBody(1000, "\xff")), nil},
		// Fragmented ping, reserved opcode, lone continuation, message inside a message.
		{m(ws.OpPing, false, nil), nil},
		{m(ws.OpCode(3), true, nil), nil},
		{m(ws.OpContinuation, true, []byte("x")), nil},
		{cat(m(ws.OpText, false, []byte("a")), m(ws.OpText, true, []byte("b"))), nil},
	} {
		f.Add(seed.stream, seed.cuts, false)
	}
	// Recipes.
	f.Add([]byte("\x00\x05hello\x10\x20\x30\x40"), []byte{1, 1, 1}, true)
	f.Add([]byte("\x0d\xffsome fragmented text\x00\x01\x02\x03\xfe\x10pingpayload"), []byte{5, 9}, true)

	f.Fuzz(func(t *testing.T, data, cuts []byte, build bool) {
		var stream []byte
		var want wsOutcome
		if build {
			stream, want = buildFrames(data)
		} else {
			stream = data
			want = wsModel(stream, fuzzMaxMessage)
		}
		c, rec := newFuzzConn(fuzzMaxMessage)
		for _, chunk := range cutStream(stream, cuts) {
			c.consume(chunk)
			if len(c.partial) > ws.MaxHeaderSize+fuzzMaxMessage || len(c.message) > fuzzMaxMessage {
				t.Fatalf("buffers over the cap: partial %d, message %d", len(c.partial), len(c.message))
			}
		}
		got := outcomeOf(t, c, rec)
		if !got.equal(want) {
			t.Fatalf("stream %x\n got %s\nwant %s", stream, got, want)
		}
	})
}

// TestFuzzConsumeOverSocket replays the checked-in FuzzConsume corpus
// through a real Server, socket and epoll worker: what the client gets back
// (pongs, the close frame) and what the Handler sees (messages, CloseInfo)
// must be what wsModel says, as FuzzConsume requires of the in-memory Conn.
// This ties the fuzzed seam to the server's actual read path. A stream that
// ends cleanly gets a close frame appended so that every case ends in a
// close handshake.
func TestFuzzConsumeOverSocket(t *testing.T) {
	files, err := filepath.Glob("testdata/fuzz/FuzzConsume/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	srv, err := New(Config{MaxMessageBytes: fuzzMaxMessage, FlushDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	recs := make(chan *recorder, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.Upgrade(w, r, func(*Conn) Handler {
			rec := &recorder{closed: make(chan CloseInfo, 1)}
			recs <- rec
			return rec
		})
	}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
	})
	url := "ws://" + strings.TrimPrefix(hs.URL, "http://")
	for _, file := range files {
		data, cuts, build := readConsumeCorpus(t, file)
		stream := data
		if build {
			stream, _ = buildFrames(data)
		}
		want := wsModel(stream, fuzzMaxMessage)
		if !want.closed {
			stream = append(slices.Clip(stream), frameBytes(8, true, ws.NewCloseFrameBody(1000, "end"), [4]byte{9, 8, 7, 6}, 0)...)
			if want = wsModel(stream, fuzzMaxMessage); !want.closed {
				continue // ends inside a frame, which swallows the close
			}
		}
		t.Run(filepath.Base(file), func(t *testing.T) {
			conn, br, _, err := ws.Dial(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if br == nil {
				br = bufio.NewReader(conn)
			}
			rec := <-recs
			for _, chunk := range cutStream(stream, cuts) {
				if _, err := conn.Write(chunk); err != nil {
					break // closed on us mid-stream: what came back still tells
				}
			}
			var got wsOutcome
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			for !got.closed {
				f, err := ws.ReadFrame(br)
				if err != nil {
					t.Fatalf("after pongs %q: %v", got.pongs, err)
				}
				switch f.Header.OpCode {
				case ws.OpPong:
					got.pongs = append(got.pongs, string(f.Payload))
				case ws.OpClose:
					got.closed, got.wire = true, f.Payload
				default:
					t.Fatalf("unexpected frame op %d", f.Header.OpCode)
				}
			}
			select {
			case got.info = <-rec.closed:
			case <-time.After(5 * time.Second):
				t.Fatal("HandleClose not called")
			}
			rec.mu.Lock()
			got.messages = rec.messages
			rec.mu.Unlock()
			if !got.equal(want) {
				t.Fatalf("stream %x\n got %s\nwant %s", stream, got, want)
			}
		})
	}
}

// readConsumeCorpus reads a FuzzConsume corpus file ("go test fuzz v1",
// then []byte data, []byte cuts, bool build).
func readConsumeCorpus(t *testing.T, file string) (data, cuts []byte, build bool) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 4 || lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a FuzzConsume corpus file", file)
	}
	var vals [2][]byte
	for i := range vals {
		lit, ok := strings.CutPrefix(lines[i+1], "[]byte(")
		s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
		if !ok || err != nil {
			t.Fatalf("%s: line %d: %q", file, i+2, lines[i+1])
		}
		vals[i] = []byte(s)
	}
	switch lines[3] {
	case "bool(true)":
		build = true
	case "bool(false)":
	default:
		t.Fatalf("%s: line 4: %q", file, lines[3])
	}
	return vals[0], vals[1], build
}

// ---- the connection under test ----

type recorder struct {
	mu       sync.Mutex
	messages []string
	closed   chan CloseInfo
}

func (r *recorder) HandleMessage(p []byte) {
	r.mu.Lock()
	r.messages = append(r.messages, string(p))
	r.mu.Unlock()
}

func (r *recorder) HandleClose(info CloseInfo) {
	select {
	case r.closed <- info:
	default:
	}
}

// newFuzzConn is a Conn on a Server that runs no goroutines: what it queues
// stays in its queue (the flush tick never comes), which is where the test
// reads the pongs and the close frame from.
func newFuzzConn(maxMessage int) (*Conn, *recorder) {
	s := &Server{
		cfg:  Config{MaxMessageBytes: maxMessage, QueueFrames: 1 << 30, QueueBytes: 1 << 40, FlushDelay: time.Hour},
		wake: make(chan struct{}, 1),
	}
	rec := &recorder{closed: make(chan CloseInfo, 1)}
	c := &Conn{id: 1, srv: s, handler: rec}
	c.queue = c.inline[:0]
	return c, rec
}

// cutStream cuts b into reads: each byte of cuts is the length of the next
// read less one; the rest is the last read.
func cutStream(b, cuts []byte) [][]byte {
	var out [][]byte
	for _, n := range cuts {
		if len(b) == 0 {
			break
		}
		k := min(int(n)+1, len(b))
		out = append(out, b[:k])
		b = b[k:]
	}
	if len(b) > 0 {
		out = append(out, b)
	}
	return out
}

// wsOutcome is what a byte stream does to a connection.
type wsOutcome struct {
	messages []string // delivered, in order
	pongs    []string // pong payloads queued, in order
	closed   bool     // a close frame was queued
	wire     []byte   // its body
	info     CloseInfo
}

func (o wsOutcome) equal(p wsOutcome) bool {
	return slices.Equal(o.messages, p.messages) && slices.Equal(o.pongs, p.pongs) &&
		o.closed == p.closed && bytes.Equal(o.wire, p.wire) && o.info == p.info
}

func (o wsOutcome) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d messages", len(o.messages))
	for _, m := range o.messages {
		fmt.Fprintf(&b, " %.40q", m)
	}
	fmt.Fprintf(&b, "; pongs %q", o.pongs)
	if o.closed {
		fmt.Fprintf(&b, "; close body %x, info %+v", o.wire, o.info)
	}
	return b.String()
}

// outcomeOf reads what the connection delivered and queued.
func outcomeOf(t *testing.T, c *Conn, rec *recorder) wsOutcome {
	t.Helper()
	var o wsOutcome
	rec.mu.Lock()
	o.messages = rec.messages
	rec.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, fr := range c.queue {
		r := bytes.NewReader(fr)
		f, err := ws.ReadFrame(r)
		if err != nil || r.Len() != 0 || f.Header.Masked || !f.Header.Fin {
			t.Fatalf("queued frame %d is not one whole unmasked frame: %x (%v)", i, fr, err)
		}
		switch f.Header.OpCode {
		case ws.OpPong:
			if o.closed {
				t.Fatalf("pong queued after the close frame")
			}
			o.pongs = append(o.pongs, string(f.Payload))
		case ws.OpClose:
			if o.closed {
				t.Fatalf("two close frames queued")
			}
			o.closed, o.wire = true, f.Payload
		default:
			t.Fatalf("unexpected frame op %d queued", f.Header.OpCode)
		}
	}
	if o.closed != c.closing {
		t.Fatalf("close frame queued %v, closing %v", o.closed, c.closing)
	}
	if o.closed {
		o.info = c.closeInfo
		if !c.readDone {
			t.Fatal("closing but still reading")
		}
	}
	return o
}

// ---- the model ----

// wsModel is RFC 6455 § 5 read independently of conn.go: what a server with
// MaxMessageBytes max must do with the client bytes b.
func wsModel(b []byte, max int) wsOutcome {
	var o wsOutcome
	var msgOp byte
	var msg []byte
	fail := func(code ws.StatusCode, reason string) wsOutcome {
		cause := CauseProtocol
		if code == ws.StatusMessageTooBig {
			cause = CauseTooBig
		}
		o.closed = true
		o.wire = ws.NewCloseFrameBody(code, reason)
		o.info = CloseInfo{Cause: cause, Code: CloseCode(code), Reason: reason}
		return o
	}
	deliver := func(op byte, p []byte) bool {
		if op == 1 && !utf8.Valid(p) {
			return false
		}
		o.messages = append(o.messages, string(p))
		return true
	}
	for {
		if len(b) < 2 {
			return o
		}
		fin, rsv, op := b[0]&0x80 != 0, b[0]&0x70, b[0]&0x0f
		masked, n := b[1]&0x80 != 0, uint64(b[1]&0x7f)
		h := 2
		switch n {
		case 126:
			if len(b) < 4 {
				return o
			}
			n, h = uint64(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			if len(b) < 10 {
				return o
			}
			n, h = binary.BigEndian.Uint64(b[2:]), 10
		}
		if masked {
			h += 4
		}
		if len(b) < h {
			return o // the header is incomplete
		}
		control := op >= 8
		switch {
		case n >= 1<<63:
			return fail(ws.StatusProtocolError, "bad frame length")
		case rsv != 0:
			return fail(ws.StatusProtocolError, "reserved bits set")
		case !masked:
			return fail(ws.StatusProtocolError, "client frames must be masked")
		case op >= 3 && op <= 7 || op >= 11:
			return fail(ws.StatusProtocolError, "reserved opcode")
		case control && (!fin || n > 125):
			return fail(ws.StatusProtocolError, "bad control frame")
		case op == 0 && msgOp == 0:
			return fail(ws.StatusProtocolError, "continuation without a message")
		case (op == 1 || op == 2) && msgOp != 0:
			return fail(ws.StatusProtocolError, "new message inside a fragmented one")
		case n > uint64(max) || op == 0 && uint64(len(msg))+n > uint64(max):
			// Control frames between fragments do not count against the message.
			return fail(ws.StatusMessageTooBig, "message too big")
		}
		if uint64(len(b)-h) < n {
			return o // the payload is incomplete
		}
		p := slices.Clone(b[h : h+int(n)])
		for i := range p {
			p[i] ^= b[h-4+i%4]
		}
		b = b[h+int(n):]
		switch op {
		case 9:
			o.pongs = append(o.pongs, string(p))
		case 10:
		case 8:
			return closeModel(o, p, fail)
		case 1, 2:
			if !fin {
				msgOp, msg = op, p
				continue
			}
			if !deliver(op, p) {
				return fail(ws.StatusInvalidFramePayloadData, "invalid UTF-8")
			}
		case 0:
			msg = append(msg, p...)
			if fin {
				if !deliver(msgOp, msg) {
					return fail(ws.StatusInvalidFramePayloadData, "invalid UTF-8")
				}
				msgOp, msg = 0, nil
			}
		}
	}
}

// closeModel answers a client close frame with payload p (RFC 6455 § 5.5.1,
// § 7.4): an empty body is echoed empty and reported as 1005; a valid code is
// echoed; a 1-byte body or a code no endpoint may send is a protocol error
// (1002), a reason that is not UTF-8 is 1007.
func closeModel(o wsOutcome, p []byte, fail func(ws.StatusCode, string) wsOutcome) wsOutcome {
	if len(p) == 0 {
		o.closed, o.wire = true, []byte{}
		o.info = CloseInfo{Cause: CausePeerClosed, Code: CloseNoStatus, ByPeer: true}
		return o
	}
	if len(p) == 1 {
		return fail(ws.StatusProtocolError, "bad close frame")
	}
	code := ws.StatusCode(binary.BigEndian.Uint16(p))
	if !sendableCloseCode(code) {
		return fail(ws.StatusProtocolError, "bad close frame")
	}
	if !utf8.Valid(p[2:]) {
		return fail(ws.StatusInvalidFramePayloadData, "invalid UTF-8")
	}
	o.closed, o.wire = true, ws.NewCloseFrameBody(code, "")
	o.info = CloseInfo{Cause: CausePeerClosed, Code: CloseCode(code), Reason: string(p[2:]), ByPeer: true}
	return o
}

// sendableCloseCode: the codes an endpoint may put in a close frame, RFC 6455
// § 7.4 and the IANA registry (1012–1014 registered since; the relay itself
// sends 1013), 3000–4999 for libraries and applications.
func sendableCloseCode(c ws.StatusCode) bool {
	switch {
	case c >= 1000 && c <= 1003, c >= 1007 && c <= 1014:
		return true
	case c >= 3000 && c <= 4999:
		return true
	}
	return false
}

// ---- the recipe mode ----

// recipe reads a valid frame sequence out of fuzz bytes; when they run out it
// answers zeros.
type recipe struct{ b []byte }

func (r *recipe) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *recipe) bytes(n int) []byte {
	n = min(n, len(r.b))
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

// frameBytes encodes one masked client frame; wide picks a longer length
// encoding than needed (RFC 6455 allows readers to accept it; the relay does).
func frameBytes(op byte, fin bool, p []byte, mask [4]byte, wide byte) []byte {
	b := []byte{op, 0x80}
	if fin {
		b[0] |= 0x80
	}
	n := len(p)
	switch {
	case n < 126 && wide%3 == 0:
		b[1] |= byte(n)
	case n < 1<<16 && wide%3 != 2:
		b[1] |= 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] |= 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	b = append(b, mask[:]...)
	start := len(b)
	b = append(b, p...)
	for i := range p {
		b[start+i] ^= mask[i%4]
	}
	return b
}

// buildFrames turns a recipe into a valid stream and the outcome it must have.
func buildFrames(data []byte) ([]byte, wsOutcome) {
	r := &recipe{b: data}
	var out []byte
	var o wsOutcome
	mask := func() [4]byte {
		var m [4]byte
		copy(m[:], r.bytes(4))
		return m
	}
	for len(r.b) > 0 {
		k := r.byte()
		switch k % 4 {
		case 0, 1: // a text or binary message in 1 to 4 fragments
			op := byte(1 + k%2)
			p := r.bytes(int(r.byte()) * 2)
			if op == 1 {
				p = []byte(strings.ToValidUTF8(string(p), "\uFFFD"))
			}
			if len(p) > fuzzMaxMessage {
				p = p[:fuzzMaxMessage]
				if op == 1 {
					p = []byte(strings.ToValidUTF8(string(p), ""))
				}
			}
			o.messages = append(o.messages, string(p))
			parts := int(k>>2)%4 + 1
			rest := p
			for i := range parts {
				var frag []byte
				if i == parts-1 {
					frag, rest = rest, nil
				} else {
					cut := min(int(r.byte()), len(rest))
					frag, rest = rest[:cut], rest[cut:]
				}
				fop := op
				if i > 0 {
					fop = 0
				}
				out = append(out, frameBytes(fop, i == parts-1, frag, mask(), k>>4)...)
				if i < parts-1 && k&0x40 != 0 { // a control frame between fragments
					pp := r.bytes(int(r.byte()) % 126)
					if k&0x80 != 0 {
						out = append(out, frameBytes(9, true, pp, mask(), 0)...)
						o.pongs = append(o.pongs, string(pp))
					} else {
						out = append(out, frameBytes(10, true, pp, mask(), 0)...)
					}
				}
			}
		case 2: // a ping
			pp := r.bytes(int(r.byte()) % 126)
			out = append(out, frameBytes(9, true, pp, mask(), k>>2)...)
			o.pongs = append(o.pongs, string(pp))
		case 3: // an unsolicited pong, or (rarely) the closing handshake
			if k>>2 == 0x3f {
				code := ws.StatusCode(1000 + int(r.byte())%4)
				reason := strings.ToValidUTF8(string(r.bytes(int(r.byte())%100)), "")
				out = append(out, frameBytes(8, true, ws.NewCloseFrameBody(code, reason), mask(), 0)...)
				o.closed, o.wire = true, ws.NewCloseFrameBody(code, "")
				o.info = CloseInfo{Cause: CausePeerClosed, Code: CloseCode(code), Reason: reason, ByPeer: true}
				return out, o
			}
			pp := r.bytes(int(r.byte()) % 126)
			out = append(out, frameBytes(10, true, pp, mask(), k>>2)...)
		}
	}
	return out, o
}
