package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
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

// seqOf is the seq the store holds for publish id on a channel, and
// whether it holds one.
func seqOf(t *testing.T, s *store.Store, project, channel, id string) (uint64, bool, error) {
	t.Helper()
	seqs, err := s.HistorySeqsOf(context.Background(), project, channel, []string{id})
	seq, ok := seqs[id]
	return seq, ok, err
}

// size is the bytes of rows' messages.
func size(rows []store.HistoryMessage) int64 {
	var n int64
	for _, r := range rows {
		n += int64(len(r.Message))
	}
	return n
}

// historyProjects is a store with a user (owner, its id) and two of its
// projects.
func historyProjects(t testing.TB, url string) (s *store.Store, owner string, p, q store.Project) {
	t.Helper()
	s = open(t, url)
	u, err := s.CreateUser(context.Background(), "a@example.com", "h")
	if err != nil {
		t.Fatal(err)
	}
	p, _, _ = newProject(t, s, u.ID)
	q, _, _ = newProject(t, s, u.ID)
	return s, u.ID, p, q
}

func seqsOf(ms []store.HistoryMessage) []int64 {
	out := []int64{}
	for _, m := range ms {
		out = append(out, m.Seq)
	}
	return out
}

// appendAll stores rows, every one of them.
func appendAll(t *testing.T, s *store.Store, rows []store.HistoryMessage) {
	t.Helper()
	if refused, err := s.AppendHistory(context.Background(), rows); err != nil || len(refused) > 0 {
		t.Fatalf("append: refused %v, %v", refused, err)
	}
}

// TestHistory: a batch is stored but for the rows whose seq is stored
// already; reads forwards and backwards by seq with exact bodies; the last
// seq; the retention sweep in bounded batches, per project, and everything
// of a project whose history is off; a deleted project's rows go with it.
func TestHistory(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s, owner, p, q := historyProjects(t, url)
		now := time.Now().UTC()
		if seq, err := s.LastHistorySeq(ctx, p.ID, "room"); err != nil || seq != 0 {
			t.Fatalf("last seq of nothing: %d %v", seq, err)
		}
		appendAll(t, s, historyRows(p.ID, "room", 101, 110, now.Add(-2*time.Hour)))
		appendAll(t, s, historyRows(p.ID, "room", 111, 120, now))
		appendAll(t, s, historyRows(p.ID, "other", 1, 3, now))
		appendAll(t, s, historyRows(q.ID, "room", 1, 1500, now.Add(-2*time.Hour))) // chunks of 1000
		// Seqs stored already are refused, and nothing of them stored.
		if refused, err := s.AppendHistory(ctx, historyRows(p.ID, "room", 119, 120, now)); err != nil || fmt.Sprint(refused) != "[0 1]" {
			t.Fatalf("duplicate seqs: refused %v, %v", refused, err)
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
		n, err := s.SweepHistory(ctx, now, 0, 100, 700)
		if err != nil || n != 700 {
			t.Fatalf("first sweep: %d %v", n, err)
		}
		for n != 0 {
			if n, err = s.SweepHistory(ctx, now, 0, 100, 700); err != nil {
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
		must(t, s.DeleteProject(ctx, p.ID, owner))
		if left, _ = s.HistoryAfter(ctx, p.ID, "room", 0, 100); len(left) != 0 {
			t.Fatalf("a deleted project's rows: %v", seqsOf(left))
		}
	})
}

// TestHistoryBytesAndCap: the bytes a project's history holds follow every
// append (not a refused one) and every sweep exactly; past capBytes the
// sweep deletes a project's oldest messages, and only that project's, until
// it is under the cap; RecordHistoryUsage puts the day's largest figure in
// the usage row, which a rollup does not lower; the figure goes with the
// project.
func TestHistoryBytesAndCap(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s, owner, p, q := historyProjects(t, url)
		now := time.Now().UTC()
		bytesOf := func(id string) int64 {
			t.Helper()
			n, err := s.HistoryBytes(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := bytesOf(p.ID); n != 0 {
			t.Fatalf("no history: %d bytes", n)
		}
		old := historyRows(p.ID, "room", 1, 100, now.Add(-2*time.Hour))
		recent := historyRows(p.ID, "room", 101, 200, now.Add(-time.Minute))
		other := historyRows(q.ID, "room", 1, 50, now.Add(-3*time.Hour))
		mixed := append(historyRows(q.ID, "b", 1, 5, now), historyRows(p.ID, "b", 1, 5, now)...) // two projects in one batch
		for _, rows := range [][]store.HistoryMessage{old, recent, other, mixed} {
			appendAll(t, s, rows)
		}
		wantP := size(old) + size(recent) + size(mixed[5:])
		wantQ := size(other) + size(mixed[:5])
		// A batch with a seq stored already: that row is refused, and not
		// counted; the others are stored.
		again := historyRows(p.ID, "room", 200, 210, now)
		if refused, err := s.AppendHistory(ctx, again); err != nil || fmt.Sprint(refused) != "[0]" {
			t.Fatalf("a duplicate seq: refused %v, %v", refused, err)
		}
		wantP += size(again[1:])
		if bytesOf(p.ID) != wantP || bytesOf(q.ID) != wantQ {
			t.Fatalf("bytes %d and %d, want %d and %d", bytesOf(p.ID), bytesOf(q.ID), wantP, wantQ)
		}

		// Retention: p keeps an hour (its old rows go), q a day.
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID, HistoryRetentionSeconds: 3600}))
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: q.ID, HistoryRetentionSeconds: 86400}))
		day := now.Format(time.DateOnly)
		must(t, s.RecordHistoryUsage(ctx, day))
		if n, err := s.SweepHistory(ctx, now, 0, 30, 1000); err != nil || n != 100 {
			t.Fatalf("retention sweep: %d %v", n, err)
		}
		wantP -= size(old)
		if bytesOf(p.ID) != wantP || bytesOf(q.ID) != wantQ {
			t.Fatalf("after the retention sweep: %d and %d, want %d and %d", bytesOf(p.ID), bytesOf(q.ID), wantP, wantQ)
		}

		// The cap: p is over it and loses its oldest (room 101… before b's
		// newer rows); q is under it and keeps everything.
		capBytes := wantP / 2
		if n, err := s.SweepHistory(ctx, now, capBytes, 7, 1000); err != nil || n == 0 {
			t.Fatalf("cap sweep: %d %v", n, err)
		}
		left, _ := s.HistoryAfter(ctx, p.ID, "room", 0, 1000)
		leftB, _ := s.HistoryAfter(ctx, p.ID, "b", 0, 1000)
		got := size(left) + size(leftB)
		if bytesOf(p.ID) != got || got > capBytes || got <= capBytes-int64(len(recent[0].Message))*2 {
			t.Fatalf("p after the cap sweep: counted %d, holds %d, cap %d", bytesOf(p.ID), got, capBytes)
		}
		if len(left) == 0 || left[0].Seq <= 101 || left[len(left)-1].Seq != 210 || len(leftB) != 5 {
			t.Fatalf("p kept room %v and b %v: want its newest", seqsOf(left), seqsOf(leftB))
		}
		if bytesOf(q.ID) != wantQ {
			t.Fatalf("q under the cap: %d, want %d", bytesOf(q.ID), wantQ)
		}

		// Usage: the day's largest figure, kept by a later sample and a rollup.
		must(t, s.RecordHistoryUsage(ctx, day))
		must(t, s.AddUsage(ctx, store.Usage{ProjectID: p.ID, Day: day, MessageCount: 3}))
		rows, err := s.Usage(ctx, p.ID, day)
		if err != nil || len(rows) != 1 || rows[0].HistoryBytes != size(old)+size(recent)+size(mixed[5:])+size(again[1:]) || rows[0].MessageCount != 3 {
			t.Fatalf("p's usage row: %+v %v", rows, err)
		}
		if rows, _ = s.Usage(ctx, q.ID, day); len(rows) != 1 || rows[0].HistoryBytes != wantQ {
			t.Fatalf("q's usage row: %+v", rows)
		}
		must(t, s.DeleteProject(ctx, p.ID, owner))
		if n := bytesOf(p.ID); n != 0 {
			t.Fatalf("a deleted project's history bytes: %d", n)
		}
	})
}

// TestHistoryCapSteps: the cap deletes about what is over it whatever the
// rows' size (64 KiB rows, one over: one goes), and two sweeps at once (two
// nodes) together bring a project just under the cap, not below it by more
// than a row.
func TestHistoryCapSteps(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s, _, p, _ := historyProjects(t, url)
		must(t, s.SaveSettings(ctx, store.Settings{ProjectID: p.ID, HistoryRetentionSeconds: 86400}))
		now := time.Now().UTC()
		big := func(from, to int) []store.HistoryMessage {
			var rows []store.HistoryMessage
			for seq := from; seq <= to; seq++ {
				rows = append(rows, store.HistoryMessage{ProjectID: p.ID, Channel: "room", Seq: int64(seq),
					Message: fmt.Sprintf(`{"seq":%06d,"payload":"%s"}`, seq, strings.Repeat("x", 64<<10)), CreatedAt: now.Add(time.Duration(seq) * time.Millisecond)})
			}
			return rows
		}
		rows := big(1, 60)
		appendAll(t, s, rows)
		row := int64(len(rows[0].Message))
		n, err := s.SweepHistory(ctx, now, 59*row, 1000, 10000)
		if err != nil || n != 1 {
			t.Fatalf("one 64 KiB row over the cap: %d deleted (%v), want 1", n, err)
		}
		if left, _ := s.HistoryAfter(ctx, p.ID, "room", 0, 100); len(left) != 59 || left[0].Seq != 2 {
			t.Fatalf("left %d rows from seq %v", len(left), seqsOf(left[:1]))
		}

		// Twice the cap, two sweeps at once.
		appendAll(t, s, big(61, 178))
		capBytes := 88 * row
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.SweepHistory(ctx, now, capBytes, 7, 10000)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil && !strings.Contains(err.Error(), "locked") { // SQLite: one writer; the other waits or gives up
				t.Fatal(err)
			}
		}
		held, err := s.HistoryBytes(ctx, p.ID)
		if err != nil || held > capBytes || held <= capBytes-row {
			t.Fatalf("after two sweeps at once: %d bytes (%v), want at most the cap %d and within a row of it", held, err, capBytes)
		}
		left, _ := s.HistoryAfter(ctx, p.ID, "room", 0, 1000)
		var stored int64
		for _, r := range left {
			stored += int64(len(r.Message))
		}
		if stored != held || left[len(left)-1].Seq != 178 {
			t.Fatalf("counted %d bytes, %d stored; newest %d", held, stored, left[len(left)-1].Seq)
		}
	})
}

// TestHistoryPublishID: a message stamped by a cluster publish keeps its id:
// the seq is found by it, and a second row for the same publish is refused
// (the whole batch); one-node rows (no id) never conflict.
// TestHistoryAwkwardText: messages, channel names and publish ids with
// quotes, backslashes, commas, braces, NULL-looking text and non-ASCII
// come back byte for byte (PostgreSQL takes them as arrays).
func TestHistoryAwkwardText(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s, _, p, _ := historyProjects(t, url)
		texts := []string{`{"payload":"a \"quoted\" word, {braces}, a \\ backslash"}`, `{"payload":"NULL"}`, `{"payload":"ünïcødé ✓ 𝄞"}`,
			`{"payload":"tab\t newline\n \u0000 end"}`, `{}`, `{"payload":" leading and trailing "}`}
		var rows []store.HistoryMessage
		for i, m := range texts {
			rows = append(rows, store.HistoryMessage{ProjectID: p.ID, Channel: `room "one", {1}\`, Seq: int64(i + 1), Message: m,
				PublishID: fmt.Sprintf(`node"%d",{x}\#%d`, i, i), CreatedAt: time.Now()})
		}
		appendAll(t, s, rows)
		got, err := s.HistoryAfter(ctx, p.ID, `room "one", {1}\`, 0, 100)
		if err != nil || len(got) != len(texts) {
			t.Fatalf("read back %d rows, %v", len(got), err)
		}
		for i, g := range got {
			if g.Message != texts[i] || g.Size != int64(len(texts[i])) || g.PublishID != rows[i].PublishID || g.Channel != rows[i].Channel {
				t.Fatalf("row %d came back %+v, stored %+v", i, g, rows[i])
			}
		}
		if seq, ok, err := seqOf(t, s, p.ID, rows[2].Channel, rows[2].PublishID); err != nil || !ok || seq != 3 {
			t.Fatalf("publish %q: %d %v %v", rows[2].PublishID, seq, ok, err)
		}
		if n, err := s.HistoryBytes(ctx, p.ID); err != nil || n != size(rows) {
			t.Fatalf("history bytes %d (%v), want %d", n, err, size(rows))
		}
	})
}

// TestHistoryDeletedProject: a batch holding the rows of a project
// deleted while they waited stores every other project's rows and refuses
// only those (on PostgreSQL the foreign key failed the whole batch).
func TestHistoryDeletedProject(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s, owner, p, q := historyProjects(t, url)
		must(t, s.DeleteProject(ctx, q.ID, owner))
		batch := append(historyRows(p.ID, "room", 1, 2, time.Now()), historyRows(q.ID, "room", 1, 2, time.Now())...)
		batch = append(batch, historyRows(p.ID, "lobby", 1, 1, time.Now())...)
		if refused, err := s.AppendHistory(ctx, batch); err != nil || fmt.Sprint(refused) != "[2 3]" {
			t.Fatalf("a batch with a deleted project's rows: refused %v, %v; want [2 3]", refused, err)
		}
		if got, err := s.HistoryAfter(ctx, p.ID, "room", 0, 10); err != nil || fmt.Sprint(seqsOf(got)) != "[1 2]" {
			t.Fatalf("the live project's rows: %v %v", seqsOf(got), err)
		}
		if n, err := s.HistoryBytes(ctx, p.ID); err != nil || n != size(batch[:2])+size(batch[4:]) {
			t.Fatalf("the live project holds %d bytes (%v), want %d", n, err, size(batch[:2])+size(batch[4:]))
		}
	})
}

func TestHistoryPublishID(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s, _, p, _ := historyProjects(t, url)
		now := time.Now().UTC()
		rows := historyRows(p.ID, "room", 1, 3, now)
		rows[1].PublishID = "pub-2"
		appendAll(t, s, rows)
		appendAll(t, s, historyRows(p.ID, "room", 4, 6, now)) // no ids: no conflict among them
		if seq, ok, err := seqOf(t, s, p.ID, "room", "pub-2"); err != nil || !ok || seq != 2 {
			t.Fatalf("pub-2: %d %v %v", seq, ok, err)
		}
		if _, ok, err := seqOf(t, s, p.ID, "room", "pub-9"); err != nil || ok {
			t.Fatalf("an unknown publish: %v %v", ok, err)
		}
		if seqs, err := s.HistorySeqsOf(ctx, p.ID, "room", []string{"pub-2", "pub-9", "pub-2"}); err != nil || fmt.Sprint(seqs) != "map[pub-2:2]" {
			t.Fatalf("several publishes at once: %v %v", seqs, err)
		}
		again := historyRows(p.ID, "room", 7, 9, now)
		again[1].PublishID = "pub-2" // stored already, at seq 2
		again[2].PublishID = "pub-9"
		if refused, err := s.AppendHistory(ctx, again); err != nil || fmt.Sprint(refused) != "[1]" {
			t.Fatalf("a second row for one publish: refused %v, %v", refused, err)
		}
		if got, err := s.HistoryAfter(ctx, p.ID, "room", 6, 10); err != nil || fmt.Sprint(seqsOf(got)) != "[7 9]" {
			t.Fatalf("the rest of the batch: %v %v", seqsOf(got), err)
		}
		if seq, ok, err := seqOf(t, s, p.ID, "room", "pub-2"); err != nil || !ok || seq != 2 {
			t.Fatalf("pub-2 after the refused row: %d %v %v", seq, ok, err)
		}
		// Two rows of one seq in a batch, the first of a publish stored
		// already: the second is the one stored, and said so.
		clash := historyRows(p.ID, "room", 10, 10, now)
		clash = append(clash, clash[0])
		clash[0].PublishID, clash[1].PublishID, clash[1].Message = "pub-2", "pub-10", `{"other":true}`
		if refused, err := s.AppendHistory(ctx, clash); err != nil || fmt.Sprint(refused) != "[0]" {
			t.Fatalf("two rows of seq 10, the first's publish stored: refused %v, %v", refused, err)
		}
		if got, err := s.HistoryAfter(ctx, p.ID, "room", 9, 10); err != nil || len(got) != 1 || got[0].PublishID != "pub-10" {
			t.Fatalf("seq 10 stored as %+v %v, want pub-10's", got, err)
		}
		other := historyRows(p.ID, "lobby", 1, 1, now)
		other[0].PublishID = "pub-2" // another channel: its own publish
		appendAll(t, s, other)
	})
}
