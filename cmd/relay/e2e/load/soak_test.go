//go:build soak

package load

// The soak test runs only with `make soak` (go test -tags soak): the real
// binary on PostgreSQL, 5 000 WebSocket connections on loopback, emits at the
// default budgets, clients joining and dropping at random, the database
// restarted once, for SOAK_DURATION (default 3 minutes). Everything listens on
// 127.0.0.1 (the relay, its operator listener) or a Unix socket (PostgreSQL),
// and every phase has a fixed length or a deadline.
//
// Loss is checked over each connection's whole connected span, quiet or not:
// a subscriber must have received every emit acknowledged (200) to the emitter
// that was sent after its subscribe ack arrived and answered before it sent
// its closing ping. The order of things on the server makes this exact: the
// channel actor adds a subscriber before it queues the ack; an emit's frame is
// in every subscriber's write queue before the emit is answered 200; the pong
// goes through the same FIFO queue. So once the pong has arrived, every
// such emit has arrived too, and a missing one is a lost message.

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// soakAck is one emit answered 200: its seq, when it was sent and when its
// answer came.
type soakAck struct {
	seq         uint64
	sent, acked time.Time
}

// soakSpan is one connection's life as its client saw it.
type soakSpan struct {
	channel    int
	subscribed time.Time // when the subscribe ack arrived (zero: it never did)
	pinged     time.Time // when the closing ping was sent (zero: never sent)
	drained    bool      // the pong came back: everything queued before it arrived
	seqs       []uint64  // seqs received, in arrival order
	failure    string    // why the connection ended other than by its client
}

func TestSoak(t *testing.T) {
	duration := 3 * time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		duration = d
	}
	if duration < 30*time.Second {
		t.Fatalf("SOAK_DURATION %v: want at least 30s (the database is down for 10s of it)", duration)
	}
	const conns, channels = 5000, 10
	url := storetest.PostgresURL(t)
	proc := relaytest.StartBinary(t, "DATABASE_URL="+url, "USAGE_ROLLUP_SECONDS=5", "MAX_CONNECTIONS_PER_ADDRESS=100000")
	srv := relaytest.ServerOf(t, proc)
	p := srv.Signup("alice@example.com").CreateProject("soak")
	wsURL := srv.WSURL(p.PublicKey)

	type stats struct{ rssKiB, heapMiB, goroutines, open float64 }
	serverStats := func() stats {
		var s stats
		s.rssKiB = relaytest.RSS(t, proc.Cmd.Process.Pid)
		m := relaytest.ScrapeMetrics(t, proc.Debug+"/metrics")
		s.heapMiB = m.Get(t, "go_memstats_heap_inuse_bytes", "") / (1 << 20)
		s.goroutines = m.Get(t, "go_goroutines", "")
		s.open = m.Get(t, "relay_connections_open", "")
		return s
	}
	// Warm up before the idle baseline: the first actor starts the process's
	// fixed pool of actor goroutines (4 × GOMAXPROCS), which then stays.
	warm, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	warm.WriteMessage(websocket.TextMessage, []byte(`{"action":"subscribe","channel":"warmup"}`))
	warm.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := warm.ReadMessage(); err != nil { // the ack
		t.Fatal(err)
	}
	if r := srv.Client().EmitNoFail(p.SecretKey, `{"channel":"warmup","payload":0}`); r.Status != 200 {
		t.Fatalf("warm-up emit: %d %s", r.Status, r.Raw)
	}
	if _, _, err := warm.ReadMessage(); err != nil { // the message
		t.Fatal(err)
	}
	warm.Close()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	relaytest.Within(10*time.Second, func() bool { return serverStats().open == 0 }) // the baseline is taken either way
	idle := serverStats()

	// acked[channel]: every emit answered 200, in the order sent (one emitter).
	var ackMu sync.Mutex
	acked := make([][]soakAck, channels)
	var emitted, refused, failedEmits atomic.Int64
	var failures []string // the first few failed emits, for the report

	var spanMu sync.Mutex
	var spans []soakSpan
	var dialFailures, firstConnected atomic.Int64

	stop := make(chan struct{})
	var wg sync.WaitGroup
	dialer := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	client := func(id int) {
		defer wg.Done()
		ch := id % channels
		counted := false
		for {
			select {
			case <-stop:
				return
			default:
			}
			conn, _, err := dialer.Dial(wsURL, nil)
			if err != nil {
				dialFailures.Add(1)
				select { // a client's pace: try again in 0.2 to 1 s
				case <-stop:
					return
				case <-time.After(time.Duration(200+rand.IntN(800)) * time.Millisecond):
				}
				continue
			}
			if !counted {
				counted = true
				firstConnected.Add(1)
			}
			life := time.Duration(5000+rand.IntN(60_000)) * time.Millisecond
			sp := soakLife(conn, ch, life, stop)
			spanMu.Lock()
			spans = append(spans, sp)
			spanMu.Unlock()
		}
	}
	ramp := time.NewTicker(100 * time.Millisecond) // the ramp's pace: 500 clients a tick
	for i := range conns {
		if i%500 == 0 && i > 0 {
			<-ramp.C
		}
		wg.Add(1)
		go client(i)
	}
	ramp.Stop()
	// Every client connected once (the first ones may already be on their
	// second connection: lifetimes are 5 to 65 s).
	if !relaytest.Within(2*time.Minute, func() bool { return firstConnected.Load() >= conns }) {
		close(stop)
		wg.Wait()
		t.Fatalf("only %d of %d clients connected within 2 minutes", firstConnected.Load(), conns)
	}
	loaded := serverStats()

	// Emits at the default budgets: 6000 a minute for the project = 100/s,
	// 600 a minute per channel = 10/s on each of the 10.
	emitter := &http.Client{Timeout: 10 * time.Second}
	var emitWG sync.WaitGroup
	emitWG.Add(1)
	go func() {
		defer emitWG.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ch := i % channels
			req, _ := http.NewRequest("POST", proc.Base+"/emit", strings.NewReader(fmt.Sprintf(`{"channel":"c%d","payload":%d}`, ch, i)))
			req.Header.Set("Authorization", "Bearer "+p.SecretKey)
			req.Header.Set("Content-Type", "application/json")
			sent := time.Now()
			res, err := emitter.Do(req)
			if err != nil {
				failedEmits.Add(1)
				ackMu.Lock()
				if len(failures) < 5 {
					failures = append(failures, err.Error())
				}
				ackMu.Unlock()
				continue
			}
			at := time.Now() // the 200's headers are written after the fan-out
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			switch res.StatusCode {
			case 200:
				var r struct {
					Seq uint64 `json:"seq"`
				}
				json.Unmarshal(body, &r)
				emitted.Add(1)
				ackMu.Lock()
				acked[ch] = append(acked[ch], soakAck{seq: r.Seq, sent: sent, acked: at})
				ackMu.Unlock()
			case 429:
				refused.Add(1)
			default:
				failedEmits.Add(1)
				ackMu.Lock()
				if len(failures) < 5 {
					failures = append(failures, fmt.Sprintf("%d %s", res.StatusCode, body))
				}
				ackMu.Unlock()
			}
		}
	}()

	// The soak's phases are time by nature; the relay exiting ends one at once.
	phase := func(d time.Duration, what string) {
		select {
		case <-time.After(d):
		case <-proc.Exited:
			close(stop)
			t.Fatalf("relay exited %s:\n%s", what, proc.Logs)
		}
	}
	phase(duration/3, "under load")
	storetest.StopPostgres(t)
	phase(10*time.Second, "with the database down")
	storetest.StartPostgres(t)
	phase(duration-duration/3-10*time.Second, "after the database came back")
	close(stop)
	emitWG.Wait()
	wg.Wait() // every client drains (ping/pong, at most 30 s) and closes
	emitter.CloseIdleConnections()

	// After: no connection left, then the server's goroutines back at their
	// idle level. Slack of 5: database/sql's cleaner goroutine (alive while
	// the pool holds connections) and a turn or scrape in flight.
	var after stats
	relaytest.Within(60*time.Second, func() bool { // judged below either way
		after = serverStats()
		return after.open == 0 && after.goroutines <= idle.goroutines+5
	})

	// Loss over each whole connected span.
	var lost, expected, received, drained, undrained, outOfOrder int
	var perSpan []int
	var failuresSeen []string
	for _, sp := range spans {
		received += len(sp.seqs)
		if sp.failure != "" {
			if len(failuresSeen) < 5 {
				failuresSeen = append(failuresSeen, sp.failure)
			}
		}
		if !sp.drained || sp.subscribed.IsZero() {
			undrained++
			continue
		}
		drained++
		perSpan = append(perSpan, len(sp.seqs))
		got := make(map[uint64]bool, len(sp.seqs))
		for i, s := range sp.seqs {
			got[s] = true
			if i > 0 && s <= sp.seqs[i-1] {
				outOfOrder++
			}
		}
		as := acked[sp.channel]
		from := sort.Search(len(as), func(i int) bool { return as[i].sent.After(sp.subscribed) })
		for _, a := range as[from:] {
			if !a.acked.Before(sp.pinged) {
				break
			}
			expected++
			if !got[a.seq] {
				lost++
			}
		}
	}
	slices.Sort(perSpan)
	pct := func(q float64) int {
		if len(perSpan) == 0 {
			return 0
		}
		return perSpan[int(q*float64(len(perSpan)-1))]
	}
	closedBy := []string{}
	m := relaytest.ScrapeMetrics(t, proc.Debug+"/metrics")
	if fam := m["relay_connections_closed_total"]; fam != nil {
		for _, s := range fam.GetMetric() {
			for _, l := range s.GetLabel() {
				if n := s.GetCounter().GetValue(); l.GetName() == "cause" && n != 0 {
					closedBy = append(closedBy, fmt.Sprintf("%s=%v", l.GetValue(), n))
				}
			}
		}
	}

	t.Logf("soak %v, %d clients on %d channels, database stopped for 10s at %v", duration, conns, channels, duration/3)
	t.Logf("emits: %d answered 200, %d refused by budget (429), %d failed; first failures: %q", emitted.Load(), refused.Load(), failedEmits.Load(), failures)
	t.Logf("connections: %d lifetimes (%d drained and checked, %d not), %d dial failures, %d ended by the server or network: %q; closes by cause %v",
		len(spans), drained, undrained, dialFailures.Load(), countFailed(spans), failuresSeen, closedBy)
	t.Logf("received: %d messages in all; per checked lifetime min %d, median %d, p90 %d, max %d; expected while connected %d, lost %d, out of order %d",
		received, pct(0), pct(0.5), pct(0.9), pct(1), expected, lost, outOfOrder)
	t.Logf("server idle → loaded → after: RSS %.0f → %.0f → %.0f KiB, heap in use %.1f → %.1f → %.1f MiB, goroutines %.0f → %.0f → %.0f, open connections %.0f → %.0f → %.0f",
		idle.rssKiB, loaded.rssKiB, after.rssKiB, idle.heapMiB, loaded.heapMiB, after.heapMiB,
		idle.goroutines, loaded.goroutines, after.goroutines, idle.open, loaded.open, after.open)

	if emitted.Load() == 0 || received == 0 || expected == 0 {
		t.Errorf("nothing flowed: emitted %d, received %d, expected %d", emitted.Load(), received, expected)
	}
	if n := failedEmits.Load(); n != 0 {
		t.Errorf("%d emits failed (neither 200 nor 429)", n)
	}
	if lost != 0 {
		t.Errorf("%d messages lost to connected subscribers", lost)
	}
	if n := countFailed(spans); n != 0 {
		t.Errorf("%d connections ended by the server or the network, not by their client", n)
	}
	if after.open != 0 {
		t.Errorf("%.0f connections still open after every client left", after.open)
	}
	if after.goroutines > idle.goroutines+5 {
		t.Errorf("goroutines grew: %.0f idle, %.0f after", idle.goroutines, after.goroutines)
	}
	if after.rssKiB > loaded.rssKiB*1.5+50_000 {
		t.Errorf("RSS grew: %.0f KiB loaded, %.0f after", loaded.rssKiB, after.rssKiB)
	}
}

func countFailed(spans []soakSpan) int {
	n := 0
	for _, sp := range spans {
		if sp.failure != "" {
			n++
		}
	}
	return n
}

// soakLife subscribes conn to channel c<ch>, reads everything for life (or
// until stop), then sends a ping and reads until its pong, and closes, half
// of the time without a close frame (an abrupt drop). A quiet connection is
// just quiet: only its client ends it.
func soakLife(conn *websocket.Conn, ch int, life time.Duration, stop <-chan struct{}) soakSpan {
	sp := soakSpan{channel: ch}
	defer func() {
		if rand.IntN(2) == 0 {
			conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		}
		conn.Close()
	}()
	if err := conn.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`{"action":"subscribe","channel":"c%d"}`, ch))); err != nil {
		sp.failure = "subscribe: " + err.Error()
		return sp
	}
	// The reader owns subscribed and seqs until it is done; it ends at the
	// pong, or on an error. Its deadline only bounds a broken run.
	conn.SetReadDeadline(time.Now().Add(life + 60*time.Second))
	type readResult struct {
		subscribed time.Time
		seqs       []uint64
		pong       bool
		err        error
	}
	done := make(chan readResult, 1)
	go func() {
		var r readResult
		for {
			_, msg, err := conn.ReadMessage()
			if err != nil {
				r.err = err
				done <- r
				return
			}
			var m struct {
				Action string  `json:"action"`
				Seq    *uint64 `json:"seq"`
			}
			json.Unmarshal(msg, &m)
			switch {
			case m.Action == "subscribe":
				r.subscribed = time.Now()
			case m.Action == "pong":
				r.pong = true
				done <- r
				return
			case m.Action == "" && m.Seq != nil:
				r.seqs = append(r.seqs, *m.Seq)
			}
		}
	}()
	timer := time.NewTimer(life)
	defer timer.Stop()
	var r readResult
	select {
	case <-timer.C:
	case <-stop:
	case r = <-done: // ended before its client ended it
		sp.subscribed, sp.seqs = r.subscribed, r.seqs
		sp.failure = fmt.Sprintf("read: %v", r.err)
		return sp
	}
	sp.pinged = time.Now()
	if err := conn.WriteMessage(websocket.TextMessage, []byte(`{"action":"ping"}`)); err != nil {
		conn.Close() // unblocks the reader
		r = <-done
		sp.subscribed, sp.seqs = r.subscribed, r.seqs
		sp.failure = "ping: " + err.Error()
		return sp
	}
	// The pong must come within 30 s, or the drain failed.
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	r = <-done
	sp.subscribed, sp.seqs, sp.drained = r.subscribed, r.seqs, r.pong
	if !r.pong {
		sp.failure = fmt.Sprintf("drain: %v", r.err)
	}
	return sp
}
