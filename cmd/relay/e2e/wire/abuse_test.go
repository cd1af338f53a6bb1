package wire

// Clients that hold the server's resources without finishing a request.

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestSlowlorisCutOffByReadHeaderTimeout: clients that send their request
// headers one byte a second, never finishing, are disconnected once the
// public listener's ReadHeaderTimeout (5 s, run.go) has passed, well before
// ReadTimeout (30 s) or HTTP_IDLE_TIMEOUT_SECONDS (60 s) could have done it; meanwhile
// everyone else is served.
func TestSlowlorisCutOffByReadHeaderTimeout(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	addr := ts.Addr()
	const clients = 20
	// Headers that never end: no blank line ever comes.
	header := "GET /healthz HTTP/1.1\r\nHost: relay\r\nX-Slow: " + strings.Repeat("a", 200)

	type result struct {
		after time.Duration // from connect to the server's close
		sent  int           // bytes sent by then
		err   string
	}
	results := make(chan result, clients)
	trickling := make(chan struct{}, clients) // a client connected and sent its first byte, or failed
	for range clients {
		go func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				results <- result{err: err.Error()}
				trickling <- struct{}{}
				return
			}
			defer conn.Close()
			began := time.Now()
			closed := make(chan time.Duration, 1)
			go func() {
				io.Copy(io.Discard, conn) // returns when the server closes (it answers nothing)
				closed <- time.Since(began)
			}()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			giveUp := time.After(40 * time.Second)
			for sent := 0; ; {
				if sent < len(header) {
					if _, err := conn.Write([]byte{header[sent]}); err == nil {
						sent++
						if sent == 1 {
							trickling <- struct{}{}
						}
					}
				}
				select {
				case d := <-closed:
					results <- result{after: d, sent: sent}
					return
				case <-giveUp:
					results <- result{err: "still connected after 40 s", sent: sent}
					return
				case <-tick.C:
				}
			}
		}()
	}

	// While they trickle, a normal request is answered at once.
	for i := range clients {
		select {
		case <-trickling:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d slow clients trickling after 5 s", i, clients)
		}
	}
	if status, body := relaytest.GetText(t, ts.Base+"/healthz"); status != 200 {
		t.Fatalf("/healthz during the slowloris: %d %s", status, body)
	}

	for range clients {
		r := <-results
		if r.err != "" {
			t.Fatalf("slow client: %s (sent %d bytes)", r.err, r.sent)
		}
		// The server cannot close before its 5 s deadline; 20 s leaves room
		// for a loaded machine and is still below ReadTimeout (30 s).
		if r.after < 4*time.Second || r.after > 20*time.Second {
			t.Fatalf("slow client cut off after %v (sent %d bytes), want about 5 s", r.after, r.sent)
		}
		if r.sent >= len(header) {
			t.Fatalf("the whole header went out (%d bytes) before the cut", r.sent)
		}
	}
}
