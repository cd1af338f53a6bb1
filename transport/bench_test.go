package transport

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// quiet is a Handler for connections that only receive.
type quiet struct{}

func (quiet) HandleMessage([]byte)  {}
func (quiet) HandleClose(CloseInfo) {}

// fanoutRig is a transport Server with n live connections on real loopback
// sockets, each drained by a reader goroutine that counts the bytes it got.
type fanoutRig struct {
	srv   *Server
	conns []*Conn
	got   atomic.Int64 // bytes read by every reader together
	// want is what a waitFor waits for the readers to reach (0: none); the
	// reader that takes it (or waitFor itself) sends on reached.
	want    atomic.Int64
	reached chan struct{}
	timeout *time.Timer // waitFor's, reused: the measured loop allocates nothing for it
}

// read counts k more bytes read and wakes a waitFor they complete.
func (r *fanoutRig) read(k int) {
	got := r.got.Add(int64(k))
	if w := r.want.Load(); w > 0 && got >= w && r.want.CompareAndSwap(w, 0) {
		r.reached <- struct{}{}
	}
}

// newFanoutRig fails b on error and is torn down when owner ends.
func newFanoutRig(b, owner *testing.B, n int, cfg Config) *fanoutRig {
	b.Helper()
	srv, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	rig := &fanoutRig{srv: srv, reached: make(chan struct{}, 1), timeout: time.NewTimer(time.Hour)}
	rig.timeout.Stop()
	opened := make(chan *Conn, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.Upgrade(w, r, func(c *Conn) Handler { opened <- c; return quiet{} })
	}))
	url := "ws://" + strings.TrimPrefix(hs.URL, "http://")
	var closers []io.Closer
	owner.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		for _, c := range closers {
			c.Close()
		}
		hs.Close()
	})
	for range n {
		conn, br, _, err := ws.Dial(context.Background(), url)
		if err != nil {
			b.Fatal(err)
		}
		closers = append(closers, conn)
		var rd io.Reader = conn
		if br != nil { // bytes that came with the handshake answer
			rd = br
		}
		go func() {
			buf := make([]byte, 64<<10)
			for {
				k, err := rd.Read(buf)
				rig.read(k)
				if err != nil {
					return
				}
			}
		}()
		select {
		case c := <-opened:
			rig.conns = append(rig.conns, c)
		case <-time.After(5 * time.Second):
			b.Fatal("no connection opened")
		}
	}
	return rig
}

// waitFor waits until the readers together have read at least total bytes
// (30 s at most): woken by the read that completes them, not by polling.
func (r *fanoutRig) waitFor(b *testing.B, total int64) {
	if r.got.Load() >= total {
		return
	}
	r.want.Store(total)
	if r.got.Load() >= total && r.want.CompareAndSwap(total, 0) {
		return // completed before a reader saw want
	}
	r.timeout.Reset(30 * time.Second)
	defer r.timeout.Stop()
	select {
	case <-r.reached:
	case <-r.timeout.C:
		b.Fatalf("readers got %d of %d bytes", r.got.Load(), total)
	}
}

// BenchmarkFanoutConns measures the transport's share of a fan-out: one
// pre-framed 100-byte message handed to Conn.Send on each of 1 000 live
// connections, then flushed (gathered per connection, one writev each) to real
// loopback sockets whose readers drain them. One op is one message to every
// connection; ns/delivery and allocs/delivery are per frame that reached a
// reader, allocations counted over every goroutine (the flusher and workers,
// and the readers, which allocate nothing per read). A window of rounds in
// flight keeps the queues far below their caps, as a paced sender would.
// flush=passes is the default (batching by load), flush=2ms waits 2 ms
// before each pass, flush=now writes at once.
func BenchmarkFanoutConns(b *testing.B) {
	payload := []byte(`{"channel":"c","payload":{"text":"hello, this is about a hundred bytes of payload for the bench"},"seq":1}`)
	frame := ws.MustCompileFrame(ws.NewTextFrame(payload))
	const n = 1000
	const window = 64 // rounds in flight: 64 frames a connection at most, far under QueueFrames
	for _, fc := range []struct {
		name  string
		delay time.Duration
	}{{"passes", 0}, {"2ms", 2 * time.Millisecond}, {"now", -1}} {
		var rig *fanoutRig // set up once, kept across the runs that size b.N
		parent := b
		b.Run(fmt.Sprintf("conns=%d/flush=%s", n, fc.name), func(b *testing.B) {
			if rig == nil {
				rig = newFanoutRig(b, parent, n, Config{FlushDelay: fc.delay})
			}
			fl := int64(len(frame))
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			st0 := rig.srv.Stats()
			base := rig.got.Load()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i >= window {
					rig.waitFor(b, base+int64(i-window+1)*n*fl)
				}
				for _, c := range rig.conns {
					if !c.Send(frame) {
						b.Fatal("Send refused")
					}
				}
			}
			rig.waitFor(b, base+int64(b.N)*n*fl)
			b.StopTimer()
			runtime.ReadMemStats(&after)
			st1 := rig.srv.Stats()
			deliveries := float64(b.N) * n
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/deliveries, "ns/delivery")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/deliveries, "allocs/delivery")
			if calls := st1.WriteCalls - st0.WriteCalls; calls > 0 {
				b.ReportMetric(float64(st1.FramesSent-st0.FramesSent)/float64(calls), "frames/write")
			}
			if st1.Closed != 0 {
				b.Fatalf("%d connections closed during the benchmark: %+v", st1.Closed, st1.ClosedBy)
			}
		})
	}
}
