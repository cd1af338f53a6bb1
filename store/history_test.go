package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

func historyRows(project, channel string, from, to uint64, at time.Time) []store.HistoryMessage {
	var out []store.HistoryMessage
	for seq := from; seq <= to; seq++ {
		out = append(out, store.HistoryMessage{ProjectID: project, Channel: channel, Seq: int64(seq),
			Message: fmt.Sprintf(`{"channel":%q,"payload":%d,"seq":%d}`, channel, seq, seq), CreatedAt: at})
	}
	return out
}

func seqsOf(ms []store.HistoryMessage) []int64 {
	out := []int64{}
	for _, m := range ms {
		out = append(out, m.Seq)
	}
	return out
}

// TestHistory: a batch is stored whole or not at all; reads forwards and
// backwards by seq with exact bodies; the last seq; the retention sweep in
// bounded batches, per project, and everything of a project whose history
// is off; a deleted project's rows go with it.
func TestHistory(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		q, _, _ := newProject(t, s, u.ID)
		now := time.Now().UTC()
		if seq, err := s.LastHistorySeq(ctx, p.ID, "room"); err != nil || seq != 0 {
			t.Fatalf("last seq of nothing: %d %v", seq, err)
		}
		must(t, s.AppendHistory(ctx, historyRows(p.ID, "room", 101, 110, now.Add(-2*time.Hour))))
		must(t, s.AppendHistory(ctx, historyRows(p.ID, "room", 111, 120, now)))
		must(t, s.AppendHistory(ctx, historyRows(p.ID, "other", 1, 3, now)))
		must(t, s.AppendHistory(ctx, historyRows(q.ID, "room", 1, 1500, now.Add(-2*time.Hour)))) // chunks of 1000
		// A batch with a seq stored already stores nothing.
		if err := s.AppendHistory(ctx, historyRows(p.ID, "room", 120, 125, now)); err != store.ErrDuplicate {
			t.Fatalf("a duplicate seq: %v", err)
		}
		if seq, err := s.LastHistorySeq(ctx, p.ID, "room"); err != nil || seq != 120 {
			t.Fatalf("last seq: %d %v", seq, err)
		}
		after, err := s.HistoryAfter(ctx, p.ID, "room", 105, 3)
		if err != nil || fmt.Sprint(seqsOf(after)) != "[106 107 108]" || after[0].Message != `{"channel":"room","payload":106,"seq":106}` ||
			after[0].ProjectID != p.ID || after[0].Channel != "room" {
			t.Fatalf("after 105: %+v %v", after, err)
		}
		before, err := s.HistoryBefore(ctx, p.ID, "room", 115, 0, 4)
		if err != nil || fmt.Sprint(seqsOf(before)) != "[114 113 112 111]" || before[3].Message != `{"channel":"room","payload":111,"seq":111}` {
			t.Fatalf("before 115: %+v %v", before, err)
		}
		if before, _ = s.HistoryBefore(ctx, p.ID, "room", 115, 112, 10); fmt.Sprint(seqsOf(before)) != "[114 113]" {
			t.Fatalf("between 112 and 115: %v", seqsOf(before))
		}
		if after, _ = s.HistoryAfter(ctx, p.ID, "room", 120, 10); len(after) != 0 {
			t.Fatalf("after the last: %v", seqsOf(after))
		}

		// The sweep: p keeps an hour, q is off (everything goes), bounded.
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID, HistoryRetentionSeconds: 3600}))
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: q.ID}))
		n, err := s.SweepHistory(ctx, now, 100, 700)
		if err != nil || n != 700 {
			t.Fatalf("first sweep: %d %v", n, err)
		}
		for n != 0 {
			if n, err = s.SweepHistory(ctx, now, 100, 700); err != nil {
				t.Fatal(err)
			}
		}
		left, _ := s.HistoryAfter(ctx, p.ID, "room", 0, 100)
		if fmt.Sprint(seqsOf(left)) != "[111 112 113 114 115 116 117 118 119 120]" {
			t.Fatalf("p after the sweep: %v", seqsOf(left))
		}
		if left, _ = s.HistoryAfter(ctx, q.ID, "room", 0, 100); len(left) != 0 {
			t.Fatalf("q (history off) after the sweep: %v", seqsOf(left))
		}
		if left, _ = s.HistoryAfter(ctx, p.ID, "other", 0, 100); len(left) != 3 {
			t.Fatalf("p's other channel after the sweep: %v", seqsOf(left))
		}
		must(t, s.DeleteProject(ctx, p.ID, u.ID))
		if left, _ = s.HistoryAfter(ctx, p.ID, "room", 0, 100); len(left) != 0 {
			t.Fatalf("a deleted project's rows: %v", seqsOf(left))
		}
	})
}
