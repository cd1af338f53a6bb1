package actors

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/proto/clusterpb"
)

// Channel history in a cluster: the channel grain stores what it stamps
// before it delivers and answers, as the channel actor does on one node
// (history.go), with its node's writer. What a cluster adds:
//
//   - each stored message keeps the id of the publish that stamped it, so
//     that a publish sent again to the channel's next owner (the owner that
//     stamped and stored it crashed or froze before answering) is answered
//     with the stored seq, not stamped twice; the store refuses a second
//     record of one publish;
//   - a relay that registers (a new owner, after a crash) and a subscribe
//     with since are given what the store holds after their last seq when
//     the ring does not reach back, not a replay_gap;
//   - a freeze (the node hands its grains over) waits for the held
//     messages to land, so their seqs and ring go with the state.

// grainHistory is a channel grain's part of history.
type grainHistory struct {
	on      bool // its node's project actor reads the project's history on (hooksChanged)
	told    bool // … and has said so (until then the store is asked for replays)
	seq     storedSeq
	held    []*heldPublish  // in the order they came
	pending map[string]bool // publish ids held: a retry waits for their answer
	// freezing: freezes waiting for the held messages to land (at most
	// freezeHold: then what is held is answered service_unavailable).
	freezing     []chan *clusterpb.GrainState
	landDue      bool      // a landAgain is due (the node is fenced)
	lookupFailed time.Time // a publish id's lookup in the store failed then: none again for historyReadWait
	// found: the resent publishes held while the grain settled, looked up
	// in one query before they are decided (lookUpResent): their stored
	// seqs by id, 0 when none is stored.
	found map[string]uint64
}

// freezeHold bounds how long a freeze waits for held messages: less than
// the handoff's freezeTimeout, after which the next owner may start
// without this grain's state (and must not meet a message it lands late).
const freezeHold = freezeTimeout * 3 / 4

// freezeOver: freezeHold has passed since the freeze.
type freezeOver struct{}

// landAgain: the node was fenced when a held message could land; try again.
type landAgain struct{}

// landRecheck: how soon a fenced grain tries to land again.
const landRecheck = 100 * time.Millisecond

// heldPublish is a publish the grain has decided but not yet answered: its
// message waits for its commit, or for an earlier one's.
type heldPublish struct {
	held
	m       *clusterpb.ChannelPublish
	replyTo *actor.PID
	at      time.Time
}

// keepsHistory: this publish's message is stored before it is answered.
func (g *channelGrain) keepsHistory(m *clusterpb.ChannelPublish) bool {
	return g.cfg.History != nil && (g.hist.on || m.History)
}

// mayKeepHistory: the project keeps history, or its node has not said yet
// (a new owner after a crash hears its relays register first): the store
// is read for seq and replays.
func (g *channelGrain) mayKeepHistory() bool {
	return g.cfg.History != nil && (g.hist.on || !g.hist.told)
}

// lookupResting: a lookup of publish ids failed less than historyReadWait
// ago; none is tried again meanwhile.
func (g *channelGrain) lookupResting(now time.Time) bool {
	return !g.hist.lookupFailed.IsZero() && now.Sub(g.hist.lookupFailed) < historyReadWait
}

// joinSeq is the seq a join is answered with, which the relay takes as
// delivered already. With history: the channel's landed seq, never a
// stamped message's that may still fail (nor a failed one's: after a
// crash, the next owner continues from the stored last seq and may stamp
// that number again). Without, or while nothing landed: seq (the clock's
// start if nothing was stamped), below the messages held for their commit,
// and the core is no longer fresh (that seq was told).
func (g *channelGrain) joinSeq() uint64 {
	c := g.core
	if c.landed > 0 && g.mayKeepHistory() {
		return c.landed
	}
	c.fresh = false
	for _, h := range g.hist.held {
		if h.msg != nil {
			return h.msg.seq - 1
		}
	}
	return c.seq
}

// loadSeq continues seq from the channel's stored last seq, once
// (storedSeq.load).
func (g *channelGrain) loadSeq() bool { return g.hist.seq.load(g.core, g.cfg) }

// storedPublish answers a publish sent again (its first attempt went
// unanswered) whose message the store already holds: with its seq, as a
// predecessor's answer known from a register would be, when the record was
// there when this grain read the stored last seq (so the relays' catch-ups
// have it, or get it); service_unavailable when it came later (the owner
// that stored it was frozen mid-commit: nobody delivers it), or when the
// store cannot say. false: not stored, to be decided as new.
func (g *channelGrain) storedPublish(ctx actor.Context, m *clusterpb.ChannelPublish, replyTo *actor.PID, now time.Time) bool {
	if !m.Resent {
		return false
	}
	unavailable := func() bool {
		ctx.Send(replyTo, &clusterpb.ChannelPublished{Id: m.Id, Error: string(proto.CodeUnavailable)})
		return true
	}
	if !g.loadSeq() || g.lookupResting(now) {
		return unavailable()
	}
	seq, ok := g.hist.found[m.Id]
	if !ok {
		found, err := g.seqsOf([]string{m.Id})
		if err != nil {
			g.hist.lookupFailed = now
			return unavailable()
		}
		seq = found[m.Id]
	}
	switch {
	case seq == 0:
		return false
	case seq > g.hist.seq.last:
		return unavailable()
	}
	g.c.duplicates.Add(1)
	res := g.predecessorAnswer(m, seq, now)
	g.answered.remember(m.Id, now, res)
	ctx.Send(replyTo, res)
	return true
}

// seqsOf asks the store for the seqs the publishes stamped.
func (g *channelGrain) seqsOf(ids []string) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), historyReadWait)
	defer cancel()
	return g.cfg.History.HistorySeqsOf(ctx, g.core.project, g.core.name, ids)
}

// lookUpResent looks up in one query the resent publishes of a history
// project held while the grain settled (a crash sends many at once), for
// storedPublish; a failed lookup fails them all (lookupFailed).
func (g *channelGrain) lookUpResent(held []*clusterpb.ChannelPublish) {
	var ids []string
	for _, m := range held {
		if m.Resent && g.keepsHistory(m) {
			ids = append(ids, m.Id)
		}
	}
	if len(ids) == 0 || !g.loadSeq() || g.lookupResting(g.cfg.Now()) {
		return
	}
	found, err := g.seqsOf(ids)
	if err != nil {
		g.hist.lookupFailed = g.cfg.Now()
		return
	}
	g.hist.found = make(map[string]uint64, len(ids))
	for _, id := range ids {
		g.hist.found[id] = found[id] // 0: not stored
	}
}

// publishHeld decides a publish that must wait: one of a history project,
// or one behind such a publish still held.
func (g *channelGrain) publishHeld(ctx actor.Context, m *clusterpb.ChannelPublish, replyTo *actor.PID, e *emitRequest) {
	h := &heldPublish{m: m, replyTo: replyTo, at: e.at}
	g.hist.held = append(g.hist.held, h)
	if g.hist.pending == nil {
		g.hist.pending = map[string]bool{}
	}
	g.hist.pending[m.Id] = true
	keep := g.keepsHistory(m)
	h.decide(g.core, g.cfg, e, keep, !keep || g.loadSeq(), ctx.Self(), m.Id)
	g.landHeld(ctx)
}

// stored marks the held messages up to upTo committed (or failed).
func (g *channelGrain) stored(ctx actor.Context, m *historyStored) {
	markStored(g.hist.held, m)
	g.landHeld(ctx)
}

// landHeld delivers and answers the held publishes that may land, in
// order; a freeze waiting for them gets the state once none is left. While
// the node is fenced (it was paused, and may have been dropped: its
// successor may have taken the channel over), a stored message waits: it
// lands once etcd says this node is still the member it was, and is
// answered service_unavailable if the node leaves (dropHeld).
func (g *channelGrain) landHeld(ctx actor.Context) {
	g.hist.held = landReady(g.hist.held, func(h *heldPublish) bool {
		if h.stored && !h.failed && g.c.fenced() {
			g.landLater(ctx)
			return false
		}
		return h.stored
	}, func(h *heldPublish) { g.answerHeld(ctx, h) })
	if len(g.hist.held) == 0 && len(g.hist.freezing) > 0 {
		st := g.state()
		for _, reply := range g.hist.freezing {
			reply <- st
		}
		g.hist.freezing = nil
	}
}

// freeze hands the state on once nothing is held, at most freezeHold
// after the freeze: then what is still held is answered
// service_unavailable, stored or not, and never delivered.
func (g *channelGrain) freeze(ctx actor.Context, reply chan *clusterpb.GrainState) {
	if len(g.hist.held) == 0 {
		reply <- g.state()
		return
	}
	if len(g.hist.freezing) == 0 {
		sendLater(ctx, freezeHold, &freezeOver{})
	}
	g.hist.freezing = append(g.hist.freezing, reply)
}

// freezeEnded: freezeHold has passed.
func (g *channelGrain) freezeEnded(ctx actor.Context) {
	if len(g.hist.freezing) > 0 {
		failHeld(g.hist.held, true)
		g.landHeld(ctx)
	}
}

// landLater tries landHeld again after landRecheck, once.
func (g *channelGrain) landLater(ctx actor.Context) {
	if g.hist.landDue {
		return
	}
	g.hist.landDue = true
	sendLater(ctx, landRecheck, &landAgain{})
}

func (g *channelGrain) answerHeld(ctx actor.Context, h *heldPublish) {
	var res *clusterpb.ChannelPublished
	switch {
	case h.failed:
		res = &clusterpb.ChannelPublished{Id: h.m.Id, Error: string(proto.CodeUnavailable)}
	case h.msg == nil:
		res = publishedOf(h.m.Id, h.out)
	default:
		res = publishedOf(h.m.Id, g.core.land(h.msg, h.at, h.out))
	}
	delete(g.hist.pending, h.m.Id)
	if !h.failed { // a failed one may be sent again (the relay hears 503 and does not)
		g.answered.remember(h.m.Id, g.cfg.Now(), res)
	}
	ctx.Send(h.replyTo, res)
}

// dropHeld answers the held publishes not yet committed
// service_unavailable (the grain is stopping: such a message may still be
// stored, but it is not delivered); those committed land, unless the node
// is fenced (then they are answered service_unavailable too: stored, and
// not delivered).
func (g *channelGrain) dropHeld(ctx actor.Context) {
	failHeld(g.hist.held, g.c.fenced())
	g.landHeld(ctx)
}

// storedReplay is the store's part of a replay after since, for a join or
// a register (nil: history off, the ring covers it, or the store could not
// be read: the ring alone answers, with its honest gap).
func (g *channelGrain) storedReplay(since float64, now time.Time) *storedReplay {
	if !g.mayKeepHistory() || !g.loadSeq() {
		return nil
	}
	return readStoredReplay(g.core, g.cfg, since, now)
}
