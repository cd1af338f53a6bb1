//go:build worstcase

package load

// The worst-case memory measurement runs with `make worstcase` (go test
// -tags worstcase): the real binary with every limit at its default, on
// loopback, bounded in count and time. It prints how much RSS one holder of a
// public key (from one address) and one holder of a secret key can add,
// doing the most each is allowed; cmd/relay/OPERATING.md › Abuse limits quotes the figures.
// Each run also checks the bounds that page gives. `make test` runs a short
// form (go test -short: 100 sockets, shorter phases) with the same checks.

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// settle gives the server a moment (GC, queues drained) before a reading.
// Time by nature: a measurement's fixed rest, the same before every reading
// (OPERATING.md's figures were taken so).
func settle() { time.Sleep(3 * time.Second) }

// The defaults the bounds are made of: MAX_QUEUED_BYTES_PER_CONNECTION and
// MAX_REPLAY_BYTES_PER_PROJECT; slack is the runtime's headroom (a heap
// that may grow to twice its live size before a collection) and buffers.
const (
	queueBound  = 2 << 20
	replayBound = 32 << 20
	slack       = 64 << 20
)

// samplePeak samples pid's RSS every 100 ms until the returned function is
// called, which returns the highest reading.
func samplePeak(t *testing.T, pid int) func() float64 {
	var peak float64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			peak = max(peak, relaytest.RSS(t, pid))
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		return peak
	}
}

// worstCaseSize is the public key holder's sockets, how long their peak is
// sampled, and how long the secret key holder emits: make worstcase's, or
// the short form's.
func worstCaseSize() (sockets int, hold, emitFor time.Duration) {
	if testing.Short() {
		return 100, 3 * time.Second, 8 * time.Second
	}
	return 500, 10 * time.Second, 20 * time.Second
}

// A public key holder, one address: MAX_CONNECTIONS_PER_ADDRESS sockets, each
// with MAX_SUBSCRIPTIONS_PER_CONNECTION presence subscriptions under a
// clientId of MAX_CLIENT_ID_BYTES (distinct per socket).
func TestWorstCasePublicKeyHolder(t *testing.T) {
	for _, reading := range []bool{false, true} {
		t.Run(fmt.Sprintf("reading=%v", reading), func(t *testing.T) { publicKeyHolder(t, reading) })
	}
}

// publicKeyHolder: with reading, every socket drains what it is sent (so it
// stays open and holds its subscriptions); without, nobody reads and each
// socket's write queue fills up to its bound before it is closed.
func publicKeyHolder(t *testing.T, reading bool) {
	proc := relaytest.StartBinary(t)
	srv := relaytest.ServerOf(t, proc)
	p := srv.Signup("alice@example.com").CreateProject("target")
	pid := proc.Cmd.Process.Pid
	settle()
	before := relaytest.RSS(t, pid)
	sockets, hold, _ := worstCaseSize()
	const subs = 200
	peakRSS := samplePeak(t, pid)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []*websocket.Conn
	errs := make(chan error, sockets)
	sem := make(chan struct{}, 32)
	for i := range sockets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c, _, err := websocket.DefaultDialer.Dial(srv.WSURL(p.PublicKey), nil)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if reading {
				go func() {
					for {
						if _, _, err := c.ReadMessage(); err != nil {
							return
						}
					}
				}()
			}
			id := fmt.Sprintf("%04d", i) + strings.Repeat("c", 124)
			for ch := range subs {
				msg := fmt.Sprintf(`{"action":"subscribe","channel":"ch%d","presence":true,"clientId":"%s"}`, ch, id)
				if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Nobody reads: the joins and syncs queue up to each socket's write
	// queue bound, which is part of what this holder can make the server
	// hold. Give the server time to process every subscribe. Time by
	// nature: the peak RSS is sampled over this fixed hold (and without
	// reading, no answer shows that a socket's subscribes are all done).
	time.Sleep(hold)
	peak := peakRSS()
	settle()
	after := relaytest.RSS(t, pid)
	open := relaytest.ScrapeMetrics(t, proc.Debug+"/metrics").Get(t, "relay_connections_open", "")
	t.Logf("public key holder, one address: %d sockets × %d presence subscriptions (128-byte clientIds), reading=%v: RSS %.0f MiB before, peak %.0f MiB (+%.0f MiB, %.1f KiB per socket), %.0f MiB after; %v sockets still open",
		sockets, subs, reading, before/1024, peak/1024, (peak-before)/1024, (peak-before)/float64(sockets), after/1024, open)
	// Reading or not, a socket holds at most its write queue and its
	// subscriptions (a few hundred KiB for these).
	if bound := float64(sockets*(queueBound+256<<10)+slack) / 1024; peak-before > bound {
		t.Errorf("peak RSS grew by %.0f MiB, over the bound of %.0f MiB (%d sockets × (the write queue's 2 MiB + 256 KiB) + 64 MiB)",
			(peak-before)/1024, bound/1024, sockets)
	}
	for _, c := range conns {
		c.Close()
	}
}

// A secret key holder: emits of the largest allowed payload over many
// channels at the default budgets (600 a minute per channel, 6 000 a minute
// for the project) for 20 s, the replay window (8 s in the short form).
func TestWorstCaseSecretKeyHolder(t *testing.T) {
	proc := relaytest.StartBinary(t)
	owner := relaytest.ServerOf(t, proc).Signup("alice@example.com")
	p := owner.CreateProject("target")
	pid := proc.Cmd.Process.Pid
	settle()
	before := relaytest.RSS(t, pid)
	payload := `"` + strings.Repeat("x", 130_000) + `"`
	var wg sync.WaitGroup
	var ok, refused int64
	var mu sync.Mutex
	_, _, emitFor := worstCaseSize()
	peakRSS := samplePeak(t, pid)
	stop := time.Now().Add(emitFor)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop) && i < 400; i++ {
				r := owner.EmitNoFail(p.SecretKey, fmt.Sprintf(`{"channel":"c%d","payload":%s}`, (w*400+i)%250, payload))
				mu.Lock()
				if r.Status == 200 {
					ok++
				} else {
					refused++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	peak := peakRSS()
	settle()
	after := relaytest.RSS(t, pid)
	t.Logf("secret key holder: %d emits of 130 KB accepted (%d refused) over 250 channels in %v: RSS %.0f → %.0f MiB (+%.0f MiB), peak %.0f MiB",
		ok, refused, emitFor, before/1024, after/1024, (after-before)/1024, peak/1024)
	// The project keeps at most twice its replay cap (OPERATING.md), at
	// its peak too.
	if bound := float64(2*replayBound+slack) / 1024; peak-before > bound || ok == 0 {
		t.Errorf("peak RSS grew by %.0f MiB with %d emits accepted: want some accepted, and at most %.0f MiB (twice the 32 MiB replay cap + 64 MiB)",
			(peak-before)/1024, ok, bound/1024)
	}
}
