package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// conns opens N idle subscribed connections from several loopback source
// addresses, then reports handshakes per second and the server's resident
// memory per connection once they sit idle.
func runConns(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("conns", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 10000, "connections to open (the machine's fd limit is per process)")
	channels := fs.Int("channels", 100, "channels the connections subscribe to, round robin")
	parallel := fs.Int("parallel", 64, "handshakes in flight")
	sources := fs.Int("sources", 4, "loopback source addresses 127.0.0.2… to spread ports over")
	settle := fs.Duration("settle", 3*time.Second, "idle time before measuring")
	fs.Parse(args)
	if err := c.checkLoopback(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	p, err := provision(ctx, &c, "bench-conns")
	if err != nil {
		return err
	}
	// The server's RSS drifts for a while after start (the startup garbage
	// is returned to the kernel gradually), so each reading waits for it to
	// settle.
	var before procStats
	if c.serverPID > 0 {
		if before, err = settledProc(ctx, c.serverPID); err != nil {
			return err
		}
	}
	wsURL := strings.Replace(c.base, "http", "ws", 1) + "/ws?publicKey=" + p.PublicKey

	conns := make([]net.Conn, *n)
	var next, failed atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < *parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= *n || ctx.Err() != nil {
					return
				}
				src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%*sources))}
				d := ws.Dialer{Timeout: 10 * time.Second, NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return (&net.Dialer{LocalAddr: src}).DialContext(ctx, network, addr)
				}}
				conn, br, _, err := d.Dial(ctx, wsURL)
				if err == nil {
					ch := fmt.Sprintf("bench-%d", i%*channels)
					err = wsutil.WriteClientText(conn, []byte(`{"action":"subscribe","channel":"`+ch+`"}`))
					if err == nil {
						var r io.Reader = conn
						if br != nil {
							r = br
						}
						conn.SetReadDeadline(time.Now().Add(10 * time.Second))
						_, err = wsutil.ReadServerText(readerConn{conn, r}) // the ack
						conn.SetReadDeadline(time.Time{})
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					if conn != nil {
						conn.Close()
					}
					continue
				}
				conns[i] = conn
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close()
			}
		}
	}()
	open := int64(*n) - failed.Load()
	select {
	case <-time.After(*settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	out := map[string]any{
		"scenario": "conns", "connections": open, "failed": failed.Load(),
		"handshakes_per_sec": float64(open) / elapsed.Seconds(), "client": selfProc(),
	}
	human := fmt.Sprintf("conns: %d open (%d failed) in %v, %.0f handshakes/s", open, failed.Load(), elapsed.Round(time.Millisecond), float64(open)/elapsed.Seconds())
	if c.serverPID > 0 {
		after, err := settledProc(ctx, c.serverPID)
		if err != nil {
			return err
		}
		perConn := float64(after.RSSKiB-before.RSSKiB) * 1024 / float64(max(open, 1))
		out["server_before"], out["server_after"], out["server_rss_bytes_per_conn"] = before, after, perConn
		human += fmt.Sprintf("; server RSS %d → %d KiB, %.2f KiB per connection; server CPU %.2fs",
			before.RSSKiB, after.RSSKiB, perConn/1024, after.CPUSeconds-before.CPUSeconds)
	}
	if v := firstErr.Load(); v != nil {
		out["first_error"] = fmt.Sprint(v)
	}
	report(out, human)
	return nil
}

// readerConn reads through r (the dialer's buffered reader) and writes to the conn.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// settledProc reads a process's RSS once it has stopped moving: two readings
// a second apart within 1 % (or 256 KiB), for at most 30 s.
func settledProc(ctx context.Context, pid int) (procStats, error) {
	prev, err := readProc(pid)
	if err != nil {
		return prev, err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return prev, ctx.Err()
		}
		cur, err := readProc(pid)
		if err != nil {
			return cur, err
		}
		if d := cur.RSSKiB - prev.RSSKiB; max(d, -d) <= max(256, prev.RSSKiB/100) {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}
