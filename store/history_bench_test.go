package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// BenchmarkAppendHistory: one history commit of n messages (about 100
// bytes each, over 16 channels, as a node's writer groups them), on each
// store. ns/op is one commit; the messages a second one writer stores is
// n / (ns/op).
func BenchmarkAppendHistory(b *testing.B) {
	for _, db := range []struct{ name, url string }{{"sqlite", storetest.SQLiteURL(b)}, {"postgres", storetest.PostgresURL(b)}} {
		s, _, p, _ := historyProjects(b, db.url)
		seq := int64(0) // across the runs: a seq is stored once
		for _, n := range []int{1, 64, 256} {
			b.Run(fmt.Sprintf("%s/%d", db.name, n), func(b *testing.B) {
				rows := make([]store.HistoryMessage, n)
				for b.Loop() {
					for i := range rows {
						seq++
						ch := fmt.Sprint("room", i%16)
						rows[i] = store.HistoryMessage{ProjectID: p.ID, Channel: ch, Seq: seq, CreatedAt: time.Now(),
							Message: fmt.Sprintf(`{"channel":%q,"payload":{"n":%d,"text":"hello there"},"seq":%d}`, ch, seq, seq)}
					}
					if refused, err := s.AppendHistory(context.Background(), rows); err != nil || len(refused) > 0 {
						b.Fatal(refused, err)
					}
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
