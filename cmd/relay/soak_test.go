//go:build soak

package main

// The soak test runs only with `make soak` (go test -tags soak): the real
// binary on PostgreSQL, 5 000 connections on loopback, emits at the default
// budgets, clients joining and dropping at random, the database restarted
// once, for SOAK_DURATION (default 3 minutes). It reports the counts and
// checks that no subscriber missed a message while it was connected and that
// memory and goroutines do not grow.

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/store/storetest"
)

func TestSoak(t *testing.T) {
	duration := 3 * time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		duration = d
	}
	const conns, channels = 5000, 10
	url := storetest.PostgresURL(t)
	debugAddr := freeAddr(t)
	proc := startProcess(t, "DATABASE_URL="+url, "USAGE_ROLLUP_SECONDS=5", "RELAY_DEBUG_ADDR="+debugAddr)
	ts := &testServer{t: t, base: proc.base}
	owner := ts.signup("alice@example.com")
	p := owner.createProject("soak")
	wsURL := ts.wsURL(p.publicKey)

	serverStats := func() (rssKiB, goroutines float64) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", proc.cmd.Process.Pid))
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				rssKiB, _ = strconv.ParseFloat(strings.Fields(v)[0], 64)
			}
		}
		_, text := getText(t, "http://"+debugAddr+"/metrics")
		return rssKiB, metric(t, text, "go_goroutines", "")
	}

	// acked[channel] holds every seq answered 200, in order.
	var ackMu sync.Mutex
	acked := make([][]uint64, channels)
	var emitted, refused, failedEmits atomic.Int64

	type span struct {
		channel int
		seqs    []uint64
	}
	var spanMu sync.Mutex
	var spans []span
	var received, dropped, reconnects atomic.Int64

	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := func(id int) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ch := id % channels
			conn, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
			if err != nil {
				time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
				continue
			}
			conn.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`{"action":"subscribe","channel":"c%d"}`, ch)))
			life := time.Duration(5+rand.IntN(60)) * time.Second
			deadline := time.Now().Add(life)
			var got []uint64
			subscribed := false
			for time.Now().Before(deadline) {
				conn.SetReadDeadline(time.Now().Add(time.Second))
				_, msg, err := conn.ReadMessage()
				if err != nil {
					if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
						select {
						case <-stop:
							deadline = time.Now()
						default:
						}
						conn = reopenAfterTimeout(conn)
						if conn == nil {
							break
						}
						continue
					}
					break
				}
				var m struct {
					Action string  `json:"action"`
					Seq    *uint64 `json:"seq"`
				}
				json.Unmarshal(msg, &m)
				if m.Action == "subscribe" {
					subscribed = true
				} else if m.Seq != nil && subscribed {
					got = append(got, *m.Seq)
					received.Add(1)
				}
			}
			if conn != nil {
				conn.Close()
			}
			dropped.Add(1)
			spanMu.Lock()
			spans = append(spans, span{channel: ch, seqs: got})
			spanMu.Unlock()
			reconnects.Add(1)
		}
	}
	for i := range conns {
		wg.Add(1)
		go client(i)
		if i%500 == 499 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(5 * time.Second)
	rss0, g0 := serverStats()

	// Emits at the default budgets: 6000 a minute for the project = 100/s.
	emitter := ts.client()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ch := i % channels
			r := emitter.emitNoFail(p.secretKey, fmt.Sprintf(`{"channel":"c%d","payload":%d}`, ch, i))
			switch r.status {
			case 200:
				emitted.Add(1)
				ackMu.Lock()
				acked[ch] = append(acked[ch], uint64(num(r.json, "seq")))
				ackMu.Unlock()
			case 429:
				refused.Add(1)
			default:
				failedEmits.Add(1)
			}
		}
	}()

	time.Sleep(duration / 3)
	storetest.StopPostgres(t)
	time.Sleep(10 * time.Second)
	storetest.StartPostgres(t)
	time.Sleep(duration - duration/3 - 10*time.Second)
	close(stop)
	wg.Wait()
	time.Sleep(5 * time.Second)
	rss1, g1 := serverStats()

	// No loss while connected: each span's seqs are exactly the acked seqs of
	// its channel between its first and last one.
	ackIndex := make([]map[uint64]int, channels)
	for c := range acked {
		ackIndex[c] = map[uint64]int{}
		for i, s := range acked[c] {
			ackIndex[c][s] = i
		}
	}
	lost := 0
	for _, sp := range spans {
		if len(sp.seqs) == 0 {
			continue
		}
		first, okF := ackIndex[sp.channel][sp.seqs[0]]
		last, okL := ackIndex[sp.channel][sp.seqs[len(sp.seqs)-1]]
		if !okF || !okL {
			continue // a message whose 200 the emitter did not see (its request was cut)
		}
		if want := last - first + 1; len(sp.seqs) != want {
			lost += want - len(sp.seqs)
		}
	}
	t.Logf("soak %v: %d connections, emitted %d (200), %d refused by budget (429), %d failed; received %d; %d connection lifetimes; lost while connected: %d",
		duration, conns, emitted.Load(), refused.Load(), failedEmits.Load(), received.Load(), len(spans), lost)
	t.Logf("server RSS %.0f → %.0f KiB, goroutines %.0f → %.0f", rss0, rss1, g0, g1)
	if lost != 0 {
		t.Errorf("%d messages lost to connected subscribers", lost)
	}
	if g1 > g0*1.2+50 {
		t.Errorf("goroutines grew: %.0f → %.0f", g0, g1)
	}
	if rss1 > rss0*1.5+50_000 {
		t.Errorf("RSS grew: %.0f → %.0f KiB", rss0, rss1)
	}
}

// reopenAfterTimeout: gorilla connections cannot be read after a timeout, so
// a quiet read ends this connection's life early.
func reopenAfterTimeout(conn *websocket.Conn) *websocket.Conn {
	conn.Close()
	return nil
}
