package api

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayhq/relay/api/webhook"
)

// TestStatsCollectorOneSnapshotPerScrape: every metric of a source comes
// from one Stats() per scrape, with its type, labels and value.
func TestStatsCollectorOneSnapshotPerScrape(t *testing.T) {
	calls := 0
	c := &statsCollector[webhook.Stats]{snapshot: func() webhook.Stats {
		calls++
		return webhook.Stats{Sent: 7, DroppedBy: map[string]int64{webhook.DropQueueFull: 3}, Queued: 2}
	}}
	c.counter("t_sent_total", "Sent.", nil, func(s webhook.Stats) int64 { return s.Sent })
	for _, r := range []string{webhook.DropQueueFull, webhook.DropShutdown} {
		c.counter("t_drops_total", "Drops.", prometheus.Labels{"reason": r}, func(s webhook.Stats) int64 { return s.DroppedBy[r] })
	}
	c.gauge("t_queued", "Queued.", nil, func(s webhook.Stats) int64 { return int64(s.Queued) })
	reg := prometheus.NewPedanticRegistry() // also checks Describe against Collect
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("one scrape took %d snapshots, want 1", calls)
	}
	var got []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			got = append(got, fmt.Sprintf("%s %s{%s} %g", f.GetType(), f.GetName(), strings.Join(labels, ","), v))
		}
	}
	sort.Strings(got)
	want := "[COUNTER t_drops_total{reason=queue_full} 3 COUNTER t_drops_total{reason=shutdown} 0 COUNTER t_sent_total{} 7 GAUGE t_queued{} 2]"
	if fmt.Sprint(got) != want {
		t.Fatalf("scrape %v\nwant   %s", got, want)
	}
}
