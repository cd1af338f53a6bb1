package main

import (
	"context"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestUsageRowsExact(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		clock := newClock() // one minute window for the budget
		ts := startServerAt(t, url, map[string]string{"USAGE_ROLLUP_SECONDS": "1", "EMIT_RATE_LIMIT_PER_MINUTE": "5"}, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		other := owner.CreateProject("quiet")
		conns := []*wsClient{ts.DialWS(p.PublicKey), ts.DialWS(p.PublicKey), ts.DialWS(p.PublicKey)}
		conns[2].Send(`{"action":"subscribe","channel":"a"}`)
		conns[2].Expect(`{"action":"subscribe","channel":"a","ok":true}`)
		for range 6 { // the 6th is refused by the channel budget and is not counted
			owner.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
		}
		day := clock.Now().UTC().Format(time.DateOnly)
		var rows []struct{ c, m, peak int64 }
		relaytest.Eventually(t, 5*time.Second, func() bool {
			us, err := ts.app.store.Usage(context.Background(), p.ID, day)
			if err != nil || len(us) != 1 {
				return false
			}
			rows = append(rows[:0], struct{ c, m, peak int64 }{us[0].ConnectionCount, us[0].MessageCount, us[0].PeakConcurrentConnections})
			// The delivery-health columns: 5 deliveries to the one
			// subscriber, the refused 6th, and a latency measured.
			return us[0].ConnectionCount == 3 && us[0].MessageCount == 5 && us[0].Deliveries == 5 &&
				us[0].ChannelRateLimited == 1 && us[0].ProjectRateLimited == 0 && us[0].Dropped == 0 && us[0].LatencyP99Ms > 0
		}, "usage rows of the traffic")
		if rows[0].peak != 3 {
			t.Fatalf("peak %d, want 3 live connections at the rollup", rows[0].peak)
		}
		// One more connect and emit, then a clean shutdown: flushed, not lost.
		conns[0].Conn.Close()
		ts.DialWS(p.PublicKey)
		owner.Emit(p.SecretKey, `{"channel":"b","payload":1}`)
		ts.Stop()
		ts2 := startServer(t, url, nil) // read back through a fresh process core
		us, err := ts2.app.store.Usage(context.Background(), p.ID, day)
		if err != nil || len(us) != 1 || us[0].ConnectionCount != 4 || us[0].MessageCount != 6 || us[0].PeakConcurrentConnections != 3 ||
			us[0].Deliveries != 5 || us[0].ChannelRateLimited != 1 {
			t.Fatalf("after shutdown: %+v, %v; want 4 connects, 6 messages, peak 3", us, err)
		}
		if q, _ := ts2.app.store.Usage(context.Background(), other.ID, day); len(q) != 0 {
			t.Fatalf("a project without traffic has rows: %+v", q)
		}
	})
}
