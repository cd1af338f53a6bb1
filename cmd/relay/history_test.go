package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// historyMsg is a stored message's exact body.
func historyMsg(seq uint64, n int) string {
	return fmt.Sprintf(`{"channel":"room","payload":{"n":%d},"seq":%d}`, n, seq)
}

// TestChannelHistory, on both stores: a project with history on. An emit
// is answered once its message is stored (the row is there when the 200
// is); GET /channels/{channel}/messages pages forwards and backwards with
// exact bodies; after a restart the history is kept, a since across the
// restart gets every message with no replay_gap, and seq goes on from the
// stored last one, with no jump.
func TestChannelHistory(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("history")
		owner.Do("PATCH", "/api/projects/"+p.ID+"/settings", `{"historyRetentionSeconds":3600}`).Expect(t, http.StatusOK,
			cpSettings(p.ID, nil, false, false, nil, false, 3600))
		ws := ts.DialWS(p.PublicKey)
		ws.Send(`{"action":"subscribe","channel":"room"}`)
		ws.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
		var seqs []uint64
		for i := range 5 {
			r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":{"n":%d}}`, i))
			seq := uint64(relaytest.Num(r.JSON, "seq"))
			rows, err := ts.app.store.HistoryAfter(t.Context(), p.ID, "room", seq-1, 2)
			if err != nil || len(rows) != 1 || rows[0].Message != historyMsg(seq, i) {
				t.Fatalf("emit %d answered, stored %+v %v", i, rows, err)
			}
			ws.Expect(historyMsg(seq, i))
			seqs = append(seqs, seq)
		}
		page := func(query, want string) {
			t.Helper()
			owner.BearerGet("/channels/room/messages"+query, p.SecretKey).Expect(t, http.StatusOK, want)
		}
		body := func(gap, more bool, idx ...int) string {
			var msgs []string
			for _, i := range idx {
				msgs = append(msgs, historyMsg(seqs[i], i))
			}
			return fmt.Sprintf(`{"channel":"room","messages":[%s],"gap":%v,"more":%v}`, strings.Join(msgs, ","), gap, more)
		}
		page("?limit=2", body(false, true, 3, 4))
		page(fmt.Sprintf("?before=%d&limit=2", seqs[3]), body(false, true, 1, 2))
		page(fmt.Sprintf("?before=%d&limit=2", seqs[1]), body(false, false, 0))
		page(fmt.Sprintf("?since=%d&limit=2", seqs[0]), body(false, true, 1, 2))
		page(fmt.Sprintf("?since=%d&limit=2", seqs[2]), body(false, false, 3, 4))
		page(fmt.Sprintf("?since=%d&before=%d", seqs[0], seqs[3]), body(false, false, 1, 2))
		page("?since=0", body(true, false, 0, 1, 2, 3, 4))
		page("", body(false, false, 0, 1, 2, 3, 4))

		// A since that names no stored message: no gap when a message
		// before it is stored (the sweeps delete the oldest first), a gap
		// when none is; forwards and backwards alike.
		var sparse []store.HistoryMessage
		for _, seq := range []int64{10, 20, 30} {
			sparse = append(sparse, store.HistoryMessage{ProjectID: p.ID, Channel: "sparse", Seq: seq,
				Message: fmt.Sprintf(`{"channel":"sparse","payload":%d,"seq":%d}`, seq, seq), CreatedAt: time.Now()})
		}
		if _, err := ts.app.store.AppendHistory(t.Context(), sparse); err != nil {
			t.Fatal(err)
		}
		msg := func(seq int) string { return fmt.Sprintf(`{"channel":"sparse","payload":%d,"seq":%d}`, seq, seq) }
		for _, c := range []struct{ query, want string }{
			{"?since=15", `{"channel":"sparse","messages":[` + msg(20) + `,` + msg(30) + `],"gap":false,"more":false}`},
			{"?since=15&before=30", `{"channel":"sparse","messages":[` + msg(20) + `],"gap":false,"more":false}`},
			{"?since=5", `{"channel":"sparse","messages":[` + msg(10) + `,` + msg(20) + `,` + msg(30) + `],"gap":true,"more":false}`},
			{"?since=5&before=30", `{"channel":"sparse","messages":[` + msg(10) + `,` + msg(20) + `],"gap":true,"more":false}`},
		} {
			owner.BearerGet("/channels/sparse/messages"+c.query, p.SecretKey).Expect(t, http.StatusOK, c.want)
		}

		// The Go backend package pages the same.
		be := backend.Server{EmitURL: ts.Base + "/emit", SecretKey: p.SecretKey}
		u := func(n uint64) *uint64 { return &n }
		for _, c := range []struct {
			q    backend.HistoryPage
			want string
		}{
			{backend.HistoryPage{Limit: 2}, body(false, true, 3, 4)},
			{backend.HistoryPage{Before: u(seqs[3]), Limit: 2}, body(false, true, 1, 2)},
			{backend.HistoryPage{Since: u(seqs[2]), Limit: 2}, body(false, false, 3, 4)},
			{backend.HistoryPage{Since: u(seqs[0]), Before: u(seqs[3])}, body(false, false, 1, 2)},
		} {
			h, err := be.MessagesPage(t.Context(), "room", c.q)
			if got, _ := json.Marshal(h); err != nil || string(got) != c.want {
				t.Fatalf("MessagesPage %+v: %s %v, want %s", c.q, got, err, c.want)
			}
		}
		owner.BearerGet("/channels/room/messages?limit=0", p.SecretKey).Expect(t, http.StatusBadRequest, `{"error":"invalid_query","param":"limit"}`)
		owner.BearerGet("/channels/room/messages?before=x", p.SecretKey).Expect(t, http.StatusBadRequest, `{"error":"invalid_query","param":"before"}`)
		for _, q := range []string{"limit=1001", "limit=abc", "limit=-1", "limit="} {
			owner.BearerGet("/channels/room/messages?"+q, p.SecretKey).Expect(t, http.StatusBadRequest, `{"error":"invalid_query","param":"limit"}`)
		}
		owner.BearerGet("/channels/room/messages?since=x", p.SecretKey).Expect(t, http.StatusBadRequest, `{"error":"invalid_since"}`)
		owner.BearerGet("/channels/room/messages?since=x&limit=2", p.SecretKey).Expect(t, http.StatusBadRequest, `{"error":"invalid_since"}`)

		// 105 messages stored: without limit the newest 100, and more; limit
		// 1000 (the most) takes them all.
		const stored = 105
		bulk := make([]store.HistoryMessage, stored)
		bulkMsg := func(seq int) string { return fmt.Sprintf(`{"channel":"bulk","payload":{"n":%d},"seq":%d}`, seq, seq) }
		for i := range bulk {
			bulk[i] = store.HistoryMessage{ProjectID: p.ID, Channel: "bulk", Seq: int64(i + 1), Message: bulkMsg(i + 1), CreatedAt: time.Now()}
		}
		if _, err := ts.app.store.AppendHistory(t.Context(), bulk); err != nil {
			t.Fatal(err)
		}
		bulkPage := func(from, to int, more bool) string {
			var msgs []string
			for seq := from; seq <= to; seq++ {
				msgs = append(msgs, bulkMsg(seq))
			}
			return fmt.Sprintf(`{"channel":"bulk","messages":[%s],"gap":false,"more":%v}`, strings.Join(msgs, ","), more)
		}
		owner.BearerGet("/channels/bulk/messages", p.SecretKey).Expect(t, http.StatusOK, bulkPage(stored-99, stored, true))
		owner.BearerGet("/channels/bulk/messages?limit=1000", p.SecretKey).Expect(t, http.StatusOK, bulkPage(1, stored, false))
		ws.Conn.Close()

		// A restart: the ring is gone, the store is not.
		ts.Stop()
		ts = startServer(t, dbURL, nil)
		ws = ts.DialWS(p.PublicKey)
		ws.Send(fmt.Sprintf(`{"action":"subscribe","channel":"room","since":%d}`, seqs[1]))
		for i := 2; i < 5; i++ {
			ws.Expect(strings.TrimSuffix(historyMsg(seqs[i], i), "}") + `,"replay":true}`)
		}
		ws.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
		r := ts.Client().Emit(p.SecretKey, `{"channel":"room","payload":{"n":5}}`)
		if seq := uint64(relaytest.Num(r.JSON, "seq")); seq != seqs[4]+1 {
			t.Fatalf("seq after the restart %d, want %d", seq, seqs[4]+1)
		}
		ws.Expect(historyMsg(uint64(relaytest.Num(r.JSON, "seq")), 5))
		ws.Conn.Close()
	})
}

// TestChannelHistoryOffByDefault: a project that never turns history on
// stores nothing and gets the ring's answer, body for body as before.
func TestChannelHistoryOffByDefault(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("plain")
		r := owner.Emit(p.SecretKey, `{"channel":"room","payload":{"n":0}}`)
		seq := uint64(relaytest.Num(r.JSON, "seq"))
		owner.BearerGet("/channels/room/messages", p.SecretKey).Expect(t, http.StatusOK,
			`{"channel":"room","messages":[`+historyMsg(seq, 0)+`],"gap":false}`)
		if last, err := ts.app.store.LastHistorySeq(t.Context(), p.ID, "room"); err != nil || last != 0 {
			t.Fatalf("history off stored up to %d (%v)", last, err)
		}
		ws := ts.DialWS(p.PublicKey)
		ws.Send(`{"action":"subscribe","channel":"room","since":1}`)
		ws.Expect(`{"type":"replay_gap","channel":"room","since":1}`)
		ws.Expect(strings.TrimSuffix(historyMsg(seq, 0), "}") + `,"replay":true}`)
		ws.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
	})
}

// TestChannelHistoryOffAndOnAgain, on both stores: while a project's
// history is off its channels deliver messages stored nowhere; turned on
// again, it deletes what it still stored from before, so that a channel
// that starts again (a restart) goes on above the messages delivered
// meanwhile, not from an older stored seq.
func TestChannelHistoryOffAndOnAgain(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("toggled")
		retention := func(seconds int) {
			t.Helper()
			if r := owner.Do("PATCH", "/api/projects/"+p.ID+"/settings", fmt.Sprintf(`{"historyRetentionSeconds":%d}`, seconds)); r.Status != http.StatusOK {
				t.Fatalf("historyRetentionSeconds %d: %d %s", seconds, r.Status, r.Raw)
			}
		}
		emit := func(n int) uint64 {
			t.Helper()
			return uint64(relaytest.Num(ts.Client().Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":{"n":%d}}`, n)).JSON, "seq"))
		}
		retention(3600)
		emit(0)
		retention(0)
		var unstored uint64
		relaytest.Eventually(t, 5*time.Second, func() bool { // once the channel has heard the history is off
			unstored = emit(1)
			last, err := ts.app.store.LastHistorySeq(t.Context(), p.ID, "room")
			return err == nil && last < unstored
		}, "an emit not stored")
		retention(3600)
		if last, err := ts.app.store.LastHistorySeq(t.Context(), p.ID, "room"); err != nil || last != 0 {
			t.Fatalf("turned on again, the project still stores up to %d (%v), want nothing from before", last, err)
		}
		ts.Stop()
		ts = startServer(t, dbURL, nil)
		if seq := emit(2); seq <= unstored {
			t.Fatalf("seq after the restart %d, not above %d (delivered while the history was off)", seq, unstored)
		}
	})
}

// TestChannelHistorySweep, on both stores: the background sweep deletes
// what is past the project's retention (its clock), and a since that
// reached it gets a replay_gap; what is younger stays.
func TestChannelHistorySweep(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, nil, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("sweep")
		owner.Do("PATCH", "/api/projects/"+p.ID+"/settings", `{"historyRetentionSeconds":60}`).Expect(t, http.StatusOK,
			cpSettings(p.ID, nil, false, false, nil, false, 60))
		var seqs []uint64
		for i := range 3 {
			if i == 2 {
				clock.Advance(50 * time.Second)
			}
			r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":{"n":%d}}`, i))
			seqs = append(seqs, uint64(relaytest.Num(r.JSON, "seq")))
		}
		clock.Advance(30 * time.Second) // the first two are 80 s old, the third 30 s
		ts.app.sweepHistory(t.Context())
		owner.BearerGet("/channels/room/messages", p.SecretKey).Expect(t, http.StatusOK,
			`{"channel":"room","messages":[`+historyMsg(seqs[2], 2)+`],"gap":false,"more":false}`)
		owner.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", seqs[0]), p.SecretKey).Expect(t, http.StatusOK,
			`{"channel":"room","messages":[`+historyMsg(seqs[2], 2)+`],"gap":true,"more":false}`)
	})
}

// TestChannelHistorySizeCap, on both stores: a project over
// HISTORY_MAX_BYTES_PER_PROJECT loses its oldest messages at the next sweep
// (before their retention), until it is under; a since into them gets a
// gap from the store; another project under the cap
// keeps all of its; the day's usage row says the most each held.
func TestChannelHistorySizeCap(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		msgBytes := len(historyMsg(1795783384197757, 10)) // each message below: 10 to 19, same length
		ts := startServer(t, dbURL, map[string]string{"HISTORY_MAX_BYTES_PER_PROJECT": fmt.Sprint(4 * msgBytes)})
		owner := ts.Signup("alice@example.com")
		p, q := owner.CreateProject("capped"), owner.CreateProject("small")
		for _, id := range []string{p.ID, q.ID} {
			owner.Do("PATCH", "/api/projects/"+id+"/settings", `{"historyRetentionSeconds":3600}`).Expect(t, http.StatusOK,
				cpSettings(id, nil, false, false, nil, false, 3600))
		}
		var seqs []uint64
		for i := range 10 {
			r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":{"n":%d}}`, 10+i))
			seqs = append(seqs, uint64(relaytest.Num(r.JSON, "seq")))
		}
		owner.Emit(q.SecretKey, `{"channel":"room","payload":{"n":10}}`)
		if n, _ := ts.app.store.HistoryBytes(t.Context(), p.ID); n != int64(10*msgBytes) {
			t.Fatalf("p holds %d bytes, want %d", n, 10*msgBytes)
		}
		ts.app.sweepHistory(t.Context())

		var kept []string
		for i, seq := range seqs[6:] {
			kept = append(kept, historyMsg(seq, 16+i))
		}
		owner.BearerGet("/channels/room/messages", p.SecretKey).Expect(t, http.StatusOK,
			`{"channel":"room","messages":[`+strings.Join(kept, ",")+`],"gap":false,"more":false}`)
		owner.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", seqs[0]), p.SecretKey).Expect(t, http.StatusOK,
			`{"channel":"room","messages":[`+strings.Join(kept, ",")+`],"gap":true,"more":false}`)
		if n, _ := ts.app.store.HistoryBytes(t.Context(), p.ID); n != int64(4*msgBytes) {
			t.Fatalf("p holds %d bytes after the sweep, want %d (the cap)", n, 4*msgBytes)
		}
		if n, _ := ts.app.store.HistoryBytes(t.Context(), q.ID); n != int64(msgBytes) {
			t.Fatalf("q holds %d bytes, want %d", n, msgBytes)
		}

		// The day's usage: the most each held (p before the sweep: the sweep
		// samples after it deleted, and the figure is the day's largest
		// sample, so p's is the cap).
		day := time.Now().UTC().Format(time.DateOnly)
		r := owner.Do("GET", "/api/projects/"+p.ID+"/usage?from="+day+"&to="+day, "")
		if days, _ := r.JSON["days"].([]any); r.Status != http.StatusOK || len(days) != 1 || days[0].(map[string]any)["historyBytes"] != float64(4*msgBytes) {
			t.Fatalf("p's usage: %d %s", r.Status, r.Raw)
		}
		r = owner.Do("GET", "/api/projects/"+q.ID+"/usage?from="+day+"&to="+day, "")
		if r.Status != http.StatusOK || r.JSON["total"].(map[string]any)["historyBytes"] != float64(msgBytes) {
			t.Fatalf("q's usage: %d %s", r.Status, r.Raw)
		}
	})
}
