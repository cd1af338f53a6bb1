package transport

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// observed is a Handler that records what its WriteObserver is told.
type observed struct {
	mu      sync.Mutex
	reports [][2]int64 // accepted, written
}

func (o *observed) HandleMessage([]byte)  {}
func (o *observed) HandleClose(CloseInfo) {}
func (o *observed) HandleWritten(accepted, written int64) {
	o.mu.Lock()
	o.reports = append(o.reports, [2]int64{accepted, written})
	o.mu.Unlock()
}

func (o *observed) snapshot() [][2]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([][2]int64(nil), o.reports...)
}

// observedConn opens one connection whose handler observes its writes.
func observedConn(t *testing.T) (*Conn, *observed, net.Conn, *bufio.Reader) {
	t.Helper()
	conns := make(chan *Conn, 1)
	o := &observed{}
	_, url := serveWS(t, Config{}, func(c *Conn) Handler { conns <- c; return o })
	nc, br := dialWS(t, url)
	c := <-conns
	// open hands c over before Upgrade stores its handler, and a write
	// finished before then reports to no one.
	waitFor(t, "Upgrade storing the handler", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.handler != nil
	})
	return c, o, nc, br
}

// TestWriteObserverStampedFrames: a write reports the oldest stamp it sent
// and when it ended; unstamped frames report nothing; under a reader that
// lags (partial writes), every stamp reported is one that was sent, in
// order, the first one first.
func TestWriteObserverStampedFrames(t *testing.T) {
	c, o, nc, br := observedConn(t)
	read := func(n int) {
		t.Helper()
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		for range n {
			if _, err := ws.ReadFrame(br); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitReports := func(n int) [][2]int64 {
		t.Helper()
		var r [][2]int64
		waitFor(t, fmt.Sprintf("%d write reports", n), func() bool { r = o.snapshot(); return len(r) >= n })
		return r
	}

	c.Send(TextFrame([]byte(`"unstamped"`)))
	read(1)

	// A flush reports a write before it takes the next one, so a report of
	// the unstamped frame's write would come before the stamped one's.
	accepted := time.Now().UnixNano()
	c.SendAt(TextFrame([]byte(`1`)), accepted)
	read(1)
	r := waitReports(1)
	if len(r) != 1 || r[0][0] != accepted {
		t.Fatalf("reports %v, want the stamped frame's alone: the unstamped frame reported", r)
	}
	if r[0][0] != accepted || r[0][1] < accepted {
		t.Fatalf("report %v, want accepted %d and a later write", r[0], accepted)
	}

	// A burst far beyond the socket buffers while the client does not read:
	// the first write ends short and hands its stamp back, so the write that
	// finishes the burst (the drain's) reports the first frame's stamp.
	const frames = 100 // 6.4 MiB: beyond loopback socket buffers, within the 8 MiB queue
	big := TextFrame([]byte(`"` + strings.Repeat("x", 64<<10) + `"`))
	base := time.Now().UnixNano()
	for i := range frames {
		if !c.SendAt(big, base+int64(i)) {
			t.Fatalf("frame %d refused", i)
		}
	}
	waitFor(t, "the burst's write ended short", waitingForRoom(c))
	read(frames)
	r = waitReports(2)[1:]
	t.Logf("the burst went out in %d reported writes", len(r))
	if r[0][0] != base {
		t.Fatalf("first report of the burst has stamp %d, want the first frame's %d", r[0][0]-base, 0)
	}
	for i, rep := range r {
		if rep[0] < base || rep[0] >= base+frames || rep[1] < rep[0] || (i > 0 && rep[0] < r[i-1][0]) {
			t.Fatalf("report %d of the burst: stamp %+d, written %+d (reports %d)", i, rep[0]-base, rep[1]-base, len(r))
		}
	}
}
