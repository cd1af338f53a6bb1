package actors

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// Durable channel history (issue 33), for a project that turns it on
// (Settings.HistoryRetention). On one node the channel actor hosts it (this
// file); in a cluster the channel grain (cluster_channel_history.go), with
// the same writer.
//
// The channel core stamps a message as always; its host hands it to the
// node's historyWriter and holds it: it is delivered, kept in the ring and
// acknowledged (the HTTP 200, the emit ack) only once its batch is
// committed. A message the writer cannot take (its queue is full) or whose
// batch fails is answered service_unavailable and never delivered. Each
// channel lands its messages in seq order: one that follows a held message
// waits behind it (whatever its project's setting), and so does every
// client-emit answer, so a socket still gets its answers in order.
//
// The writer is the node's, shared by every channel: it takes whatever
// arrived while the previous commit ran, at most historyBatchMax messages,
// and stores them in one transaction, so commits are grouped. Its queue is
// bounded (historyQueueMax messages, historyQueueBytes bytes). A cluster's
// grain could hand its stamped messages to the same writer (the host, not
// the core, does it).

// HistoryRecord is one stored message of a channel: the message object its
// subscribers got (without "replay").
type HistoryRecord struct {
	Project, Channel string
	Seq              uint64
	Message          []byte
	At               time.Time
	PublishID        string // the cluster publish that stamped it ("" on one node)
}

// HistoryStore is the store's channel history, as the actors use it.
type HistoryStore interface {
	// AppendHistory stores the records in one transaction, all or none,
	// but for those whose seq (on their channel) or publish is stored
	// already: it returns their indexes.
	AppendHistory(ctx context.Context, recs []HistoryRecord) (refused []int, err error)
	// LastHistorySeq is a channel's greatest stored seq, 0 when none.
	LastHistorySeq(ctx context.Context, project, channel string) (uint64, error)
	// HistoryBefore is a channel's records with above < seq < before,
	// newest first, at most limit.
	HistoryBefore(ctx context.Context, project, channel string, before, above uint64, limit int) ([]HistoryRecord, error)
	// HistorySeqsOf is the seqs of the records the cluster publishes
	// stamped, by publish id (absent: none stored). A second record of one
	// publish is refused.
	HistorySeqsOf(ctx context.Context, project, channel string, publishIDs []string) (map[string]uint64, error)
}

// Bounds of the history writer and of a replay from the store.
const (
	historyQueueMax   = 16384    // messages waiting for a commit, on a node
	historyQueueBytes = 64 << 20 // their bytes
	historyBatchMax   = 2000     // messages in one commit
	historyCommitWait = 5 * time.Second
	historyReadWait   = 2 * time.Second
	// HistoryReplayMax and HistoryReplayBytes bound what a subscribe's
	// since takes from the store (the newest of what it asks for; a
	// replay_gap says the rest is missing, and GET
	// /channels/{channel}/messages?since= pages through it).
	HistoryReplayMax   = 1000
	HistoryReplayBytes = 512 << 10
)

// historyWriter commits the node's history, in batches, in order.
type historyWriter struct {
	store HistoryStore
	root  *actor.RootContext // tells the channels their commits
	log   *slog.Logger
	q     chan historyItem
	bytes atomic.Int64
	stop  chan struct{}
	done  chan struct{}
}

type historyItem struct {
	rec HistoryRecord
	to  *actor.PID // the channel actor, told historyStored
}

// historyStored tells a channel that its messages up to seq upTo are
// committed (err nil) or failed, but for those refused (their seq or
// publish was stored already: they fail alone).
type historyStored struct {
	upTo    uint64
	err     error
	refused []uint64
}

func newHistoryWriter(st HistoryStore, root *actor.RootContext, log *slog.Logger) *historyWriter {
	w := &historyWriter{store: st, root: root, log: log, q: make(chan historyItem, historyQueueMax), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// take queues a record; false when the queue is full.
func (w *historyWriter) take(it historyItem) bool {
	n := int64(len(it.rec.Message))
	if w.bytes.Add(n) > historyQueueBytes {
		w.bytes.Add(-n)
		return false
	}
	select {
	case w.q <- it:
		return true
	default:
		w.bytes.Add(-n)
		return false
	}
}

func (w *historyWriter) close() {
	close(w.stop)
	<-w.done
}

func (w *historyWriter) run() {
	defer close(w.done)
	batch := make([]historyItem, 0, historyBatchMax)
	recs := make([]HistoryRecord, 0, historyBatchMax)
	answered := map[*actor.PID]struct{}{}
	for {
		select {
		case it := <-w.q:
			batch = append(batch[:0], it)
		case <-w.stop:
			return
		}
	fill:
		for len(batch) < historyBatchMax {
			select {
			case it := <-w.q:
				batch = append(batch, it)
			default:
				break fill
			}
		}
		recs = recs[:0]
		var n int64
		for _, it := range batch {
			recs = append(recs, it.rec)
			n += int64(len(it.rec.Message))
		}
		ctx, cancel := context.WithTimeout(context.Background(), historyCommitWait)
		refused, err := w.store.AppendHistory(ctx, recs)
		cancel()
		w.bytes.Add(-n)
		if err != nil {
			w.log.Warn("channel history not stored: its emits are answered 503", "messages", len(recs), "err", err)
		}
		var refusedOf map[*actor.PID][]uint64 // by channel
		if len(refused) > 0 {
			// A previous owner of the channel stored them (it crashed or
			// froze mid-commit), or the project is gone: the rest of the
			// batch is stored.
			w.log.Warn("channel history: messages the store refused (their seq or publish stored already, or their project deleted) are answered 503", "messages", len(refused))
			refusedOf = map[*actor.PID][]uint64{}
			for _, i := range refused {
				refusedOf[batch[i].to] = append(refusedOf[batch[i].to], batch[i].rec.Seq)
			}
		}
		// One answer per channel: its last seq of the batch.
		for i := len(batch) - 1; i >= 0; i-- {
			it := batch[i]
			if _, told := answered[it.to]; !told {
				answered[it.to] = struct{}{}
				w.root.Send(it.to, &historyStored{upTo: it.rec.Seq, err: err, refused: refusedOf[it.to]})
			}
		}
		clear(answered)
		clear(batch)
		clear(recs) // the messages are not held past their commit
	}
}

// historyMode is what a channel knows of its project's history setting.
type historyMode uint8

const (
	historyOff     historyMode = iota
	historyOn                  // the project keeps history (and this node writes it)
	historyUnknown             // the project's settings are loading
)

// keepsHistory: the settings loaded say the project keeps history (and
// this node has a history store).
func (a *projectActor) keepsHistory() bool {
	return a.cfg.History != nil && a.settings.HistoryRetention > 0
}

// historyMode is the project's history, as its channels apply it.
func (a *projectActor) historyMode() historyMode {
	switch {
	case a.cfg.History == nil:
		return historyOff
	case !a.isReady:
		return historyUnknown
	case a.settings.HistoryRetention > 0:
		return historyOn
	}
	return historyOff
}

// held is what a channel host (the channel actor, a cluster's grain) holds
// of an emit it has decided and not yet answered: its message waits for its
// commit, or for an earlier one's. The hosts keep them in the order they
// came, and answer them in that order (landReady).
type held struct {
	msg    *stamped // nil: refused (out.err), or never stamped (failed)
	out    emitOutcome
	stored bool // may land (committed, or never to be stored)
	failed bool // not stored: answer service_unavailable, deliver nothing
}

func (h *held) part() *held { return h }

// holder is a host's held emit (it embeds held).
type holder interface{ part() *held }

// decide stamps e, and when keep (the project keeps history) queues its
// message for a commit that tells to: failed without a stamp when the
// stored last seq cannot be read (seqRead false), failed when the writer's
// queue is full.
func (h *held) decide(core *channelCore, cfg *Config, e *emitRequest, keep, seqRead bool, to *actor.PID, publishID string) {
	if keep && !seqRead {
		h.stored, h.failed = true, true
		return
	}
	h.msg, h.out = core.stamp(e)
	switch {
	case h.msg == nil || !keep:
		h.stored = true
	case !cfg.historyWriter.take(historyItem{rec: HistoryRecord{Project: core.project, Channel: core.name, Seq: h.msg.seq,
		Message: transport.FramePayload(h.msg.buf), At: e.at, PublishID: publishID}, to: to}):
		cfg.counters.HistoryQueueFull.Add(1)
		h.stored, h.failed = true, true
	}
}

// markStored marks q's messages up to upTo committed (failed with err).
func markStored[T holder](q []T, m *historyStored) {
	for _, it := range q {
		if h := it.part(); h.msg != nil && !h.stored && h.msg.seq <= m.upTo {
			h.stored, h.failed = true, m.err != nil || slices.Contains(m.refused, h.msg.seq)
		}
	}
}

// landReady answers, in order, q's emits that may land (ready), and returns
// the rest (nil when none is left).
func landReady[T holder](q []T, ready func(T) bool, answer func(T)) []T {
	n := 0
	for _, it := range q {
		if !ready(it) {
			break
		}
		n++
		answer(it)
	}
	clear(q[:n])
	if q = q[n:]; len(q) == 0 {
		return nil
	}
	return q
}

// failHeld marks q's emits not yet committed failed (all of them, with
// committed ones too): their host stops.
func failHeld[T holder](q []T, all bool) {
	for _, it := range q {
		if h := it.part(); !h.stored || all {
			h.stored, h.failed = true, true
		}
	}
}

// heldEmit is a channel actor's held emit, or a client-emit refusal
// waiting behind held emits (refuseEmit: sink and code).
type heldEmit struct {
	held
	pub  *Publish
	sink Sink
	code proto.Code
}

// channelHistory is a channel actor's part of history.
type channelHistory struct {
	seq  storedSeq
	held []*heldEmit // in the order they came
}

// storedSeq is a channel host's reading of its stored last seq.
type storedSeq struct {
	loaded bool      // seq continues above the stored last seq
	last   uint64    // the stored last seq it read
	failed time.Time // the last read of it failed then: not read again for historyReadWait
}

// load continues core's seq from the channel's stored last seq, once
// (channelCore.continueFrom).
//
// A store that does not answer is asked again only historyReadWait after
// the failed read: meanwhile each emit fails at once (503) instead of
// holding the channel's turn for up to historyReadWait.
func (l *storedSeq) load(core *channelCore, cfg *Config) bool {
	if l.loaded {
		return true
	}
	now := cfg.Now()
	if !l.failed.IsZero() && now.Sub(l.failed) < historyReadWait {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), historyReadWait)
	defer cancel()
	last, err := cfg.History.LastHistorySeq(ctx, core.project, core.name)
	if err != nil {
		l.failed = now
		cfg.Logger.Warn("channel history: last seq not read", "project", core.project, "channel", core.name, "err", err)
		return false
	}
	core.continueFrom(last)
	l.loaded, l.last = true, last
	return true
}

func (a *channelActor) loadSeq() bool { return a.hist.seq.load(a.core, a.cfg) }

// publishHeld decides an emit that must wait: one of a history project, or
// one behind such an emit still held.
func (a *channelActor) publishHeld(ctx actor.Context, m *Publish) {
	h := &heldEmit{pub: m}
	a.hist.held = append(a.hist.held, h)
	e := a.emitRequest(m)
	h.decide(a.core, a.cfg, &e, m.history, !m.history || a.loadSeq(), ctx.Self(), "")
	a.landHeld(ctx)
}

// stored marks the held messages up to upTo committed (or failed).
func (a *channelActor) stored(ctx actor.Context, m *historyStored) {
	markStored(a.hist.held, m)
	a.landHeld(ctx)
}

// landHeld delivers and answers the held emits that may land, in order.
func (a *channelActor) landHeld(ctx actor.Context) {
	a.hist.held = landReady(a.hist.held, func(h *heldEmit) bool { return h.stored || h.sink != nil },
		func(h *heldEmit) { a.answerHeld(ctx, h) })
}

func (a *channelActor) answerHeld(ctx actor.Context, h *heldEmit) {
	if h.sink != nil {
		h.sink.Send(errorFrame(&proto.Error{Code: h.code, Channel: a.core.name}))
		return
	}
	m := h.pub
	var res PublishResult
	switch {
	case h.failed:
		res = settleEmit(ctx, m, a.usage, a.cfg.counters, proto.CodeUnavailable, PublishResult{})
	case h.msg == nil:
		res = settleEmit(ctx, m, a.usage, a.cfg.counters, h.out.err, PublishResult{Channel: h.out.channel})
	default:
		out := a.core.land(h.msg, m.At, h.out)
		res = settleEmit(ctx, m, a.usage, a.cfg.counters, "",
			PublishResult{Seq: out.seq, Subscribers: out.subscribers, Delivered: out.delivered, Channel: out.channel})
	}
	a.answer(m, res)
}

// answer sends an emit's answer: the HTTP edge's, or the emitter's ack or
// error frame.
func (a *channelActor) answer(m *Publish, res PublishResult) {
	if m.Reply != nil {
		m.Reply <- res
		return
	}
	m.origin.Send(emitAnswerFrame(a.core.name, res))
}

// dropHeld answers the held emits not yet committed service_unavailable
// (the channel is stopping: such a message may still be stored, but it is
// not delivered); those committed land.
func (a *channelActor) dropHeld(ctx actor.Context) {
	failHeld(a.hist.held, false)
	a.landHeld(ctx)
}

// storedReplay is the part of a subscribe's replay that comes from the
// store: what the ring no longer covers after since, at most
// HistoryReplayMax messages and HistoryReplayBytes (the newest), and
// whether some message after since is missing all the same (gap). nil:
// the ring covers since, or the store could not be read (the ring alone
// answers, with its honest gap).
func (a *channelActor) storedReplay(since float64, now time.Time) *storedReplay {
	if !a.loadSeq() {
		return nil
	}
	return readStoredReplay(a.core, a.cfg, since, now)
}

// readStoredReplay is storedReplay for any host of core whose seq is
// loaded (storedSeq).
func readStoredReplay(core *channelCore, cfg *Config, since float64, now time.Time) *storedReplay {
	core.replay.expire(now)
	low := core.replay.lowWater
	if since >= float64(low) {
		return nil
	}
	from := uint64(max(since, 0)) // floor: seqs are whole numbers
	above := uint64(0)
	if from > 0 {
		above = from - 1 // the since message itself tells whether anything after it was swept
	}
	ctx, cancel := context.WithTimeout(context.Background(), historyReadWait)
	defer cancel()
	rows, err := cfg.History.HistoryBefore(ctx, core.project, core.name, low+1, above, HistoryReplayMax+1)
	if err != nil {
		cfg.Logger.Warn("channel history: replay not read", "project", core.project, "channel", core.name, "err", err)
		return nil
	}
	out := &storedReplay{gap: true}
	if n := len(rows); n > 0 && rows[n-1].Seq == from && from > 0 {
		// The message at or just below since (not replayed): it is stored,
		// so the sweeps (oldest first) took nothing after it.
		rows, out.gap = rows[:n-1], false
	} else if from > 0 && len(rows) <= HistoryReplayMax {
		// since names no stored message (a seq no message has, as a
		// subscribe's answer before anything was stamped): a message stored
		// before it says the sweeps (oldest first) took nothing after it.
		older, err := cfg.History.HistoryBefore(ctx, core.project, core.name, from, 0, 1)
		out.gap = err != nil || len(older) == 0
	}
	if len(rows) > HistoryReplayMax {
		rows, out.gap = rows[:HistoryReplayMax], true
	}
	bytes := 0
	for i, r := range rows {
		if bytes += len(r.Message); bytes > HistoryReplayBytes {
			rows, out.gap = rows[:i], true
			break
		}
	}
	out.msgs, out.seqs = make([][]byte, len(rows)), make([]uint64, len(rows))
	for i, r := range rows {
		out.msgs[len(rows)-1-i], out.seqs[len(rows)-1-i] = r.Message, r.Seq
	}
	return out
}

// storedReplay is the store's part of a replay (oldest first).
type storedReplay struct {
	msgs [][]byte
	seqs []uint64 // msgs' seqs
	gap  bool
}
