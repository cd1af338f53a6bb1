package actors

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/proto"
)

// memHistory is a HistoryStore in memory that can be made to fail, or to
// hold its commits until released.
type memHistory struct {
	mu      sync.Mutex
	recs    []HistoryRecord
	fail    error
	commits int
	reads   int           // LastHistorySeq calls
	lookups int           // HistorySeqsOf calls
	gate    chan struct{} // non-nil: each commit waits for a receive
	waiting int           // records of the commit that waits at the gate
}

func (h *memHistory) AppendHistory(ctx context.Context, recs []HistoryRecord) ([]int, error) {
	if g := h.gateOf(); g != nil {
		h.mu.Lock()
		h.waiting = len(recs)
		h.mu.Unlock()
		<-g
		h.mu.Lock()
		h.waiting = 0
		h.mu.Unlock()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commits++
	if h.fail != nil {
		return nil, h.fail
	}
	var refused []int
	for i, r := range recs { // one record per seq and per publish, as the store keeps them
		_, dup, _ := h.seqOfLocked(r.Project, r.Channel, r.PublishID)
		if dup || slices.ContainsFunc(h.recs, func(s HistoryRecord) bool {
			return s.Project == r.Project && s.Channel == r.Channel && s.Seq == r.Seq
		}) {
			refused = append(refused, i)
			continue
		}
		h.recs = append(h.recs, r)
	}
	return refused, nil
}

func (h *memHistory) gateOf() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gate
}

func (h *memHistory) LastHistorySeq(ctx context.Context, project, channel string) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reads++
	var last uint64
	for _, r := range h.recs {
		if r.Project == project && r.Channel == channel {
			last = max(last, r.Seq)
		}
	}
	return last, h.fail
}

func (h *memHistory) HistoryBefore(ctx context.Context, project, channel string, before, above uint64, limit int) ([]HistoryRecord, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []HistoryRecord
	for i := len(h.recs) - 1; i >= 0 && len(out) < limit; i-- {
		if r := h.recs[i]; r.Project == project && r.Channel == channel && r.Seq < before && r.Seq > above {
			out = append(out, r)
		}
	}
	return out, h.fail
}

func (h *memHistory) HistorySeqsOf(ctx context.Context, project, channel string, publishIDs []string) (map[string]uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lookups++
	if h.fail != nil {
		return nil, h.fail
	}
	out := map[string]uint64{}
	for _, id := range publishIDs {
		if seq, ok, _ := h.seqOfLocked(project, channel, id); ok {
			out[id] = seq
		}
	}
	return out, nil
}

func (h *memHistory) seqOfLocked(project, channel, publishID string) (uint64, bool, error) {
	for _, r := range h.recs {
		if r.Project == project && r.Channel == channel && r.PublishID == publishID && publishID != "" {
			return r.Seq, true, nil
		}
	}
	return 0, false, nil
}

func (h *memHistory) set(fail error) {
	h.mu.Lock()
	h.fail = fail
	h.mu.Unlock()
}

func (h *memHistory) stored() []HistoryRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]HistoryRecord(nil), h.recs...)
}

func historySystem(t *testing.T, h *memHistory, retention time.Duration) *System {
	return newTestSystem(t, Config{History: h, LoadSettings: func(context.Context, string) (Settings, error) {
		return Settings{HistoryRetention: retention}, nil
	}})
}

// TestHistoryAckMeansStored: with history on, an HTTP emit is answered once
// its message is committed (the record is there when the answer is), and
// it is delivered as before; a store that fails answers 503 and delivers
// nothing (nor keeps it for replay); once it works again, emits go on with
// a higher seq. With history off nothing is stored.
func TestHistoryAckMeansStored(t *testing.T) {
	h := &memHistory{}
	sys := historySystem(t, h, time.Hour)
	sub := subscribeOne(t, sys, "p1", "room", 1)
	var seqs []uint64
	for i := range 3 {
		res, err := sys.Publish(context.Background(), "p1", "room", []byte(`{"n":1}`))
		if err != nil || res.Err != nil {
			t.Fatalf("emit %d: %v %v", i, err, res.Err)
		}
		recs := h.stored()
		if len(recs) != i+1 || recs[i].Seq != res.Seq || string(recs[i].Message) != `{"channel":"room","payload":{"n":1},"seq":`+itoa(res.Seq)+`}` {
			t.Fatalf("answered before stored: %+v (seq %d)", recs, res.Seq)
		}
		if res.Subscribers != 1 || res.Delivered != 1 {
			t.Fatalf("counts %+v", res)
		}
		seqs = append(seqs, res.Seq)
	}
	waitFor(t, "deliveries", func() bool { return len(sub.messages(t)) == 4 })

	h.set(errors.New("store down"))
	res, err := sys.Publish(context.Background(), "p1", "room", []byte(`{"n":2}`))
	if err != nil || res.Err == nil || res.Err.Code != proto.CodeUnavailable {
		t.Fatalf("a failed commit: %+v %v", res, err)
	}
	h.set(nil)
	res, err = sys.Publish(context.Background(), "p1", "room", []byte(`{"n":3}`))
	if err != nil || res.Err != nil || res.Seq <= seqs[2]+1 {
		t.Fatalf("after the store is back: %+v %v", res, err)
	}
	waitFor(t, "the next delivery", func() bool { return len(sub.messages(t)) == 5 })
	for _, m := range sub.messages(t)[1:] {
		if p := m["payload"].(map[string]any); p["n"] == 2.0 {
			t.Fatalf("a message the store refused was delivered: %v", m)
		}
	}
	late := &sink{id: 9}
	sess := openConn(sys, "p1", late)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"room","since":` + itoa(seqs[2]) + `}`))
	waitFor(t, "the replay", func() bool { return len(late.messages(t)) == 2 })
	if m := late.messages(t); m[0]["seq"] != float64(res.Seq) || m[1]["action"] != "subscribe" {
		t.Fatalf("replay after the failed commit: %v", m)
	}

	off := &memHistory{}
	sysOff := historySystem(t, off, 0)
	if res, err := sysOff.Publish(context.Background(), "p1", "room", []byte(`{}`)); err != nil || res.Err != nil {
		t.Fatal(res.Err, err)
	}
	if len(off.stored()) != 0 || off.commits != 0 {
		t.Fatalf("history off stored %v", off.stored())
	}
}

// TestHistorySeqReadBackoff: when a channel's last stored seq cannot be
// read, its emits are refused 503 at once, without asking the store again,
// until historyReadWait has passed on the injected clock; then the store is
// asked again and, answering, lets emits through above its last seq.
func TestHistorySeqReadBackoff(t *testing.T) {
	h := &memHistory{fail: errors.New("database away")}
	h.recs = []HistoryRecord{{Project: "p1", Channel: "room", Seq: 1 << 62, Message: []byte(`{}`)}}
	var clock atomic.Int64
	clock.Store(time.Unix(1_800_000_000, 0).UnixNano())
	sys := newTestSystem(t, Config{History: h, Now: func() time.Time { return time.Unix(0, clock.Load()) },
		LoadSettings: func(context.Context, string) (Settings, error) { return Settings{HistoryRetention: time.Hour}, nil }})
	emit := func() PublishResult {
		t.Helper()
		res, err := sys.Publish(context.Background(), "p1", "room", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	reads := func() int { h.mu.Lock(); defer h.mu.Unlock(); return h.reads }
	for i := range 3 {
		if res := emit(); res.Err == nil || res.Err.Code != proto.CodeUnavailable {
			t.Fatalf("emit %d with the last seq unread: %+v, want service_unavailable", i, res)
		}
		if i == 1 { // the store answers again, but its last failure is recent
			h.mu.Lock()
			h.fail = nil
			h.mu.Unlock()
		}
	}
	if n := reads(); n != 1 {
		t.Fatalf("the last seq was read %d times within historyReadWait of a failure, want 1", n)
	}
	clock.Add(int64(historyReadWait))
	res := emit()
	if res.Err != nil || res.Seq <= 1<<62 {
		t.Fatalf("emit once historyReadWait passed: %+v, want a seq above the stored %d", res, uint64(1<<62))
	}
	if n := reads(); n != 2 {
		t.Fatalf("the last seq was read %d times, want 2", n)
	}
}

// TestHistoryQueueFull: an emit the writer cannot take (its queue's bytes
// are spent) is answered service_unavailable at once, counted, never
// stored and never delivered; once the queue has room, emits go on.
func TestHistoryQueueFull(t *testing.T) {
	h := &memHistory{}
	sys := historySystem(t, h, time.Hour)
	sub := subscribeOne(t, sys, "p1", "room", 1)
	w := sys.cfg.historyWriter
	w.bytes.Store(historyQueueBytes) // as if 64 MiB waited for a commit
	res, err := sys.Publish(context.Background(), "p1", "room", []byte(`{"n":1}`))
	if err != nil || res.Err == nil || res.Err.Code != proto.CodeUnavailable {
		t.Fatalf("an emit the full queue refused: %+v %v", res, err)
	}
	if got := sys.Counters().HistoryQueueFull.Load(); got != 1 {
		t.Fatalf("HistoryQueueFull = %d, want 1", got)
	}
	w.bytes.Store(0)
	res, err = sys.Publish(context.Background(), "p1", "room", []byte(`{"n":2}`))
	if err != nil || res.Err != nil {
		t.Fatalf("once the queue has room: %+v %v", res, err)
	}
	waitFor(t, "the next delivery", func() bool { return len(sub.messages(t)) >= 2 })
	if m := sub.messages(t); len(m) != 2 || m[1]["payload"].(map[string]any)["n"] != 2.0 {
		t.Fatalf("the subscriber got %v, want only the second emit", m)
	}
	if recs := h.stored(); len(recs) != 1 || recs[0].Seq != res.Seq {
		t.Fatalf("stored %+v, want only the second emit (seq %d)", recs, res.Seq)
	}
	if got := sys.Counters().HistoryQueueFull.Load(); got != 1 {
		t.Fatalf("HistoryQueueFull = %d after an emit taken, want 1", got)
	}
}

// TestHistoryOrderAndBatches: emits that arrive while a commit runs go in
// the next commit, together; they are delivered and acknowledged in seq
// order, a client-emit refusal behind them waiting its turn.
func TestHistoryOrderAndBatches(t *testing.T) {
	gate := make(chan struct{})
	h := &memHistory{gate: gate}
	sys := historySystem(t, h, time.Hour)
	t.Cleanup(func() { close(gate) }) // before the system's shutdown: a failed test must not leave a commit waiting
	sub := subscribeOne(t, sys, "p1", "room", 1)
	const n = 50
	answers := make(chan PublishResult, n)
	for range n {
		go func() {
			res, _ := sys.Publish(context.Background(), "p1", "room", []byte(`{}`))
			answers <- res
		}()
	}
	// Every emit stamped and handed to the writer: the first commit took
	// some (it waits at the gate), the queue holds the rest.
	var first int // records in the first commit
	waitFor(t, "the emits to queue", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		first = h.waiting
		return first > 0 && first+len(sys.cfg.historyWriter.q) == n
	})
	// A client emit refused (the project has no client-emit secret) on the
	// same channel, behind the held emits: its error frame waits its turn.
	// The same socket's subscribe after it reaches the channel after it:
	// once that is acked, the refusal has been decided, and not yet sent.
	var answered int // HTTP emits stored when the refusal was sent
	em := &hookSink{sink: sink{id: 7}, onSend: func(f []byte) {
		if strings.Contains(string(f), `"error"`) {
			answered = len(h.stored())
		}
	}}
	emSess := openConn(sys, "p1", em)
	emSess.HandleMessage([]byte(`{"action":"emit","channel":"room","type":"t","payload":{}}`))
	emSess.HandleMessage([]byte(`{"action":"subscribe","channel":"room"}`))
	waitFor(t, "the emitter's subscribe ack", func() bool { return len(em.messages(t)) >= 1 })
	if m := em.messages(t); len(m) != 1 || m[0]["action"] != "subscribe" {
		t.Fatalf("the refusal was answered before the held emits: %v", m)
	}
	h.mu.Lock()
	h.gate = nil // the commits after the first do not wait
	h.mu.Unlock()
	gate <- struct{}{} // the first commit; every emit queued meanwhile goes in the next one
	wantCommits := 1
	if first < n {
		wantCommits = 2
	}
	for range n {
		if res := <-answers; res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	// The emitter subscribed: it gets the held messages, then the refusal.
	waitFor(t, "the refusal", func() bool { return len(em.messages(t)) >= n+2 })
	if m := em.messages(t); len(m) != n+2 || m[n]["seq"] == nil || m[n+1]["error"] != "client_emit_not_configured" || m[n+1]["channel"] != "room" {
		t.Fatalf("the emitter got %d frames, the last %v, want its ack, the %d messages then client_emit_not_configured", len(m), m[len(m)-1], n)
	}
	if answered != n {
		t.Fatalf("the refusal was sent when %d of the %d held emits were stored, want all", answered, n)
	}
	if h.commits != wantCommits || len(h.stored()) != n {
		t.Fatalf("%d commits of %d messages, want %d of %d (the first held %d)", h.commits, len(h.stored()), wantCommits, n, first)
	}
	waitFor(t, "deliveries", func() bool { return len(sub.messages(t)) == n+1 })
	last := 0.0
	for _, m := range sub.messages(t)[1:] {
		if s := m["seq"].(float64); s <= last {
			t.Fatalf("out of order: %v after %v", s, last)
		}
		last = m["seq"].(float64)
	}
}

// TestHistoryRefusedRecordFailsAlone: a record the store refuses (its seq
// was stored meanwhile by another owner of the channel, as after a crash
// mid-commit) fails its own emit, 503, and no other emit of its batch; its
// channel goes on above it.
func TestHistoryRefusedRecordFailsAlone(t *testing.T) {
	gate := make(chan struct{})
	h := &memHistory{gate: gate, recs: []HistoryRecord{
		{Project: "p1", Channel: "room", Seq: 100, Message: []byte(`{}`)},
		{Project: "p1", Channel: "lobby", Seq: 200, Message: []byte(`{}`)},
	}}
	sys := historySystem(t, h, time.Hour)
	publish := func(ch string) chan PublishResult {
		out := make(chan PublishResult, 1)
		go func() {
			res, err := sys.Publish(context.Background(), "p1", ch, []byte(`{}`))
			if err != nil {
				res.Err = &proto.Error{Code: proto.Code(err.Error())}
			}
			out <- res
		}()
		return out
	}
	first := publish("warm") // its commit waits at the gate
	waitFor(t, "the first commit", func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.waiting == 1 })
	room, lobby := publish("room"), publish("lobby")
	waitFor(t, "both emits queued", func() bool { return len(sys.cfg.historyWriter.q) == 2 })
	h.mu.Lock()
	h.recs = append(h.recs, HistoryRecord{Project: "p1", Channel: "room", Seq: 101, Message: []byte(`{"other":true}`)})
	h.gate = nil
	h.mu.Unlock()
	gate <- struct{}{}
	if res := <-first; res.Err != nil {
		t.Fatalf("the first emit: %+v", res)
	}
	if res := <-room; res.Err == nil || res.Err.Code != proto.CodeUnavailable {
		t.Fatalf("the emit whose seq was stored meanwhile: %+v, want service_unavailable", res)
	}
	if res := <-lobby; res.Err != nil || res.Seq != 201 {
		t.Fatalf("the other channel's emit in the same batch: %+v, want seq 201", res)
	}
	if res := <-publish("room"); res.Err != nil || res.Seq != 102 {
		t.Fatalf("the next emit on the refused one's channel: %+v, want seq 102", res)
	}
}

// TestHistoryReplayFromStore: a since older than the ring reaches back
// through the store: the same frames, in seq order, no replay_gap when the
// since message is stored, and one (with the newest HistoryReplayMax) when
// more is asked for; a channel that starts again continues seq above the
// stored last one.
func TestHistoryReplayFromStore(t *testing.T) {
	h := &memHistory{}
	for seq := uint64(1); seq <= HistoryReplayMax+10; seq++ {
		h.recs = append(h.recs, HistoryRecord{Project: "p1", Channel: "room", Seq: seq,
			Message: []byte(`{"channel":"room","payload":` + itoa(seq) + `,"seq":` + itoa(seq) + `}`)})
	}
	future := uint64(time.Now().Add(time.Hour).UnixMicro()) // a seq above the clock's
	h.recs = append(h.recs, HistoryRecord{Project: "p1", Channel: "later", Seq: future, Message: []byte(`{}`)})
	sys := historySystem(t, h, time.Hour)

	k := &sink{id: 1}
	sess := openConn(sys, "p1", k)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"room","since":1000}`))
	waitFor(t, "the replay", func() bool { return len(k.messages(t)) == 11 })
	for i, m := range k.messages(t)[:10] {
		if m["seq"] != float64(1001+i) || m["replay"] != true || m["payload"] != float64(1001+i) {
			t.Fatalf("replayed %d: %v", i, m)
		}
	}
	k2 := &sink{id: 2}
	sess2 := openConn(sys, "p1", k2)
	sess2.HandleMessage([]byte(`{"action":"subscribe","channel":"room","since":3}`))
	waitFor(t, "the bounded replay", func() bool { return len(k2.messages(t)) == HistoryReplayMax+2 })
	m := k2.messages(t)
	if m[0]["type"] != "replay_gap" || m[1]["seq"] != float64(11) || m[HistoryReplayMax]["seq"] != float64(HistoryReplayMax+10) {
		t.Fatalf("bounded replay: %v %v %v", m[0], m[1], m[HistoryReplayMax])
	}
	// A since no message has (a fraction here; a subscribe's answer before
	// anything was stamped, in a cluster): the store holds messages before
	// it, so nothing after it was swept: no gap.
	k3 := &sink{id: 3}
	sess3 := openConn(sys, "p1", k3)
	sess3.HandleMessage([]byte(`{"action":"subscribe","channel":"room","since":1005.5}`))
	waitFor(t, "the replay after a since between messages", func() bool { return len(k3.messages(t)) == 6 })
	if m := k3.messages(t); m[0]["seq"] != float64(1006) || m[4]["seq"] != float64(1010) || m[5]["action"] != "subscribe" {
		t.Fatalf("since 1005.5: %v", m)
	}
	res, err := sys.Publish(context.Background(), "p1", "later", []byte(`{}`))
	if err != nil || res.Err != nil || res.Seq != future+1 {
		t.Fatalf("seq after the stored last: %d, want %d (%v %v)", res.Seq, future+1, err, res.Err)
	}
}

// hookSink is a sink that calls onSend with each frame before keeping it.
type hookSink struct {
	sink
	onSend func(f []byte)
}

func (s *hookSink) Send(f []byte) bool {
	s.onSend(f)
	return s.sink.Send(f)
}

func (s *hookSink) SendAt(f []byte, at int64) bool { return s.Send(f) }

// TestHistoryReplayBytesBound: a since through the store takes at most
// HistoryReplayBytes of messages, the newest, with a replay_gap first.
func TestHistoryReplayBytesBound(t *testing.T) {
	const size, stored = 1024, 600 // bytes a message; messages stored
	h := &memHistory{}
	for seq := uint64(1); seq <= stored; seq++ {
		head := `{"channel":"room","payload":"`
		tail := `","seq":` + itoa(seq) + `}`
		msg := head + strings.Repeat("x", size-len(head)-len(tail)) + tail
		h.recs = append(h.recs, HistoryRecord{Project: "p1", Channel: "room", Seq: seq, Message: []byte(msg)})
	}
	sys := historySystem(t, h, time.Hour)
	k := &sink{id: 1}
	sess := openConn(sys, "p1", k)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"room","since":1}`))
	// Seqs 2 to 600 are asked for (599 KiB); 512 KiB hold the newest 512.
	const want = HistoryReplayBytes / size
	waitFor(t, "the subscribe ack", func() bool {
		m := k.messages(t)
		return len(m) > 0 && m[len(m)-1]["action"] == "subscribe"
	})
	m := k.messages(t)
	if len(m) != want+2 || m[0]["type"] != "replay_gap" {
		t.Fatalf("%d frames (first %v), want replay_gap, %d messages, the ack", len(m), m[0], want)
	}
	for i, r := range m[1 : want+1] {
		if r["seq"] != float64(stored-want+1+i) || r["replay"] != true {
			t.Fatalf("replayed %d: seq %v, want %d", i, r["seq"], stored-want+1+i)
		}
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
