package actors

import (
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A clientId's client-emit window (rule 6) is counted once for the cluster,
// by the project grain. Asking it for every client emit would cost each
// emit a round trip before the one to the channel; but a clientId's sockets
// are nearly always on one node. So the grain hands the window to the node
// that asks for it (a hold): while the node holds it, that node alone
// counts the clientId's emits, with no ask. The count stays exact:
//
//   - A hold lasts holdFor from the ask that got it, on the node's clock,
//     and a little longer on the grain's (it starts when the grain answers).
//     A node that uses its hold renews it once half of that has passed (an
//     ask beside the emit, which does not wait for it); one it no longer
//     uses, it gives back (ClientRelease, with what it counted since).
//   - Another node's emit of that clientId waits at the grain: the grain
//     recalls the window (ClientRecall), the holder gives it back with its
//     count, and the grain answers the waiting emits from the whole count.
//     For contestFor after that, the grain grants no new hold of that
//     clientId: a clientId emitting through two nodes at once asks per emit,
//     as without holds.
//   - A holder that does not answer (its node died or froze) keeps the hold
//     until it ends on the grain's clock; the grain then counts the window
//     the hold ended in as full, since the holder may have filled it. So a
//     clientId whose holder died is refused for up to holdFor + 1 s.
//   - Holds move with the grain's state, and the next grain recalls each
//     at once: until its holder's count is back, every ask of that
//     clientId waits, the holder's own too. A node that finds a new project
//     grain (the project moved, or its grain restarted) gives its holds
//     back to it, and sends again the releases of the last holdFor: one
//     that reached the old grain after it handed its state over is not
//     counted there (a frozen grain ignores releases), and one that reaches
//     the new grain before the state is kept until the state comes. A
//     recall of a hold the node gave back is answered with that release
//     again. A grain that starts without its predecessor's state lends no
//     window for holdFor, so that a state coming late finds no hold of its
//     own beside the handed ones. One that comes later still: two nodes
//     may have counted the same seconds, so the clientId may pass its
//     limit once; both are recalled and the clientId is refused until the
//     handed hold's second is over. A grain that never gets its
//     predecessor's state (that node crashed) knows of no hold: until the
//     holders notice, for a lookup's time, another node can be granted the
//     same window, so a clientId emitting through two nodes then may get up
//     to twice its rate for a moment.
//   - The two new messages go only to members whose registration says they
//     know them (wireVersion): in a rolling upgrade, a node of this version
//     holds no window of a grain on an older node, which counts per ask.

const (
	holdFor    = 2 * time.Second
	contestFor = time.Second
	holdsWire  = 1 // the wire version that has ClientRecall and ClientRelease
	// endedKept: how long a node remembers a hold it gave back, for a
	// recall or a grant answer that comes late (a grain holds a hold it
	// was handed for holdFor at most).
	endedKept = 5 * holdFor
	// maxOrphans bounds the releases a grain keeps for a state to come.
	maxOrphans = 4096
)

// clientHold is the grain's record of one clientId's hold; holder nil: not
// held, and no new hold before contested.
type clientHold struct {
	holder    *clusterpb.Ref
	id        string    // the ask that granted it
	until     time.Time // on the grain's clock
	limit     int       // the clientId's limit when granted
	recalled  bool
	handed    bool                     // from the previous grain's state: the holder's asks wait too
	waiting   []*clusterpb.ProjectTake // asks waiting for the window back
	contested time.Time
	// refusing (holder nil): two holders counted at once; the clientId's
	// emits are refused until contested (adoptHold).
	refusing bool
}

// orphanRelease is a release of a hold this grain does not know, kept for
// the handed state that may name it.
type orphanRelease struct {
	release *clusterpb.ClientRelease
	at      time.Time
}

// waitForHold: another node holds m's clientId window, and m waits until
// it comes back (recalled now if it was not yet). A hold that ended on the
// grain's clock ends here first (lapse).
func (g *projectGrain) waitForHold(ctx actor.Context, m *clusterpb.ProjectTake, now time.Time) bool {
	h := g.holds[m.ClientId]
	switch {
	case h == nil || h.holder == nil:
		return false
	case !now.Before(h.until):
		h.waiting = slices.DeleteFunc(h.waiting, func(w *clusterpb.ProjectTake) bool { return w.Id == m.Id })
		g.lapse(m.ClientId, h, now)
		g.answerWaiting(ctx, h)
		return false
	case sameRef(h.holder, m.ReplyTo) && !h.handed:
		return false // the holder itself: a renewal, or an ask sent before its grant reached it
	}
	g.recall(ctx, m.ClientId, h)
	if !slices.ContainsFunc(h.waiting, func(w *clusterpb.ProjectTake) bool { return w.Id == m.Id }) {
		h.waiting = append(h.waiting, m)
	}
	return true
}

// recall asks the holder for the window back, once.
func (g *projectGrain) recall(ctx actor.Context, clientID string, h *clientHold) {
	if h.recalled {
		return
	}
	h.recalled = true
	holder := actor.NewPID(h.holder.GetAddress(), h.holder.GetId())
	if !g.c.speaks(holder.Address, holdsWire) {
		return // it lapses
	}
	if holder.Address != ctx.Self().Address {
		g.c.crossNode.Add(1)
	}
	ctx.Request(holder, &clusterpb.ClientRecall{ClientId: clientID, HoldId: h.id})
}

// adoptHold takes a hold from the previous grain's state and recalls it at
// once (its holder's count since the grant is not in the state), unless
// its release came first. One beside a hold of this grain's own (a state
// later than holdFor): two nodes may have counted the same seconds, and
// neither count can be trusted to complete the other's; both holds are
// recalled, so that they stop counting, and the clientId is refused until
// the second the handed hold ends in is over.
func (g *projectGrain) adoptHold(ctx actor.Context, cw *clusterpb.ClientWindow) {
	now := g.cfg.Now()
	h := &clientHold{holder: cw.Holder, id: cw.HoldId, until: now.Add(time.Duration(cw.HoldLeftNanos)), limit: int(cw.Count), handed: true}
	if o, ok := g.orphans[cw.HoldId]; ok && sameRef(o.release.Relay, cw.Holder) {
		delete(g.orphans, cw.HoldId)
		if w := o.release.GetWindow(); w.GetCount() > 0 {
			g.clientWindow(cw.ClientId).merge(time.Unix(0, w.StartUnixNano), int(w.Count))
		}
		return
	}
	if own := g.holds[cw.ClientId]; own != nil && own.holder != nil {
		g.recall(ctx, cw.ClientId, own)
		g.recall(ctx, cw.ClientId, h)
		end := h.until.Truncate(time.Second).Add(time.Second)
		g.holds[cw.ClientId] = &clientHold{contested: end, refusing: true}
		g.answerWaiting(ctx, own)
		return
	}
	g.holds[cw.ClientId] = h
	g.recall(ctx, cw.ClientId, h)
}

// lapse ends a hold that its holder never gave back: the holder may have
// filled the window the hold ended in, so that window counts as full.
func (g *projectGrain) lapse(clientID string, h *clientHold, now time.Time) {
	g.clientWindow(clientID).merge(h.until.Truncate(time.Second), h.limit)
	g.endHold(clientID, h, now)
}

// clientTake applies rule 6 to a client ask (or renews a hold) and fills ans.
func (g *projectGrain) clientTake(m *clusterpb.ProjectTake, now time.Time, ans *clusterpb.ProjectTaken) {
	h := g.holds[m.ClientId]
	if m.Renew {
		if h != nil && h.holder != nil && !h.recalled && sameRef(h.holder, m.ReplyTo) {
			h.until = now.Add(holdFor)
			ans.HoldNanos = int64(holdFor)
		}
		return
	}
	if h != nil && h.refusing && now.Before(h.contested) {
		ans.ClientDenied = true
		return
	}
	ans.ClientDenied = !g.clients.take(m.ClientId, now, int(m.ClientLimit))
	switch {
	case h != nil && h.holder != nil && h.recalled:
		return // the holder's ask, sent before its grant reached it: counted; the hold is going back
	case h != nil && h.holder != nil:
		// The holder's ask, sent before its grant reached it (a node asks
		// only when it holds nothing): counted here, and the answer tells
		// the holder the window's count.
		h.until = now.Add(holdFor)
	case ans.ClientDenied || !m.Hold || (h != nil && now.Before(h.contested)) || now.Before(g.noHoldsUntil):
		return
	default:
		h = &clientHold{holder: m.ReplyTo, id: m.Id, until: now.Add(holdFor), limit: int(m.ClientLimit)}
		g.holds[m.ClientId] = h
	}
	w := g.clients[m.ClientId]
	ans.HoldNanos = int64(h.until.Sub(now))
	ans.ClientWindow = &clusterpb.ClientWindow{ClientId: m.ClientId, StartUnixNano: w.start.UnixNano(), Count: int32(w.count), HoldId: h.id}
}

// released takes a hold back, with what its holder counted.
func (g *projectGrain) released(ctx actor.Context, m *clusterpb.ClientRelease) {
	cw := m.GetWindow()
	h := g.holds[cw.GetClientId()]
	if h == nil || h.holder == nil || h.id != m.HoldId || !sameRef(h.holder, m.Relay) {
		// A hold that ended already, or one whose state has not come yet.
		if len(g.orphans) < maxOrphans {
			g.orphans[m.HoldId] = orphanRelease{release: m, at: g.cfg.Now()}
		}
		return
	}
	if cw.Count > 0 {
		g.clientWindow(cw.ClientId).merge(time.Unix(0, cw.StartUnixNano), int(cw.Count))
	}
	g.endHold(cw.ClientId, h, g.cfg.Now())
	g.answerWaiting(ctx, h)
}

// endHold ends a hold; one that was recalled leaves the clientId contested.
func (g *projectGrain) endHold(clientID string, h *clientHold, now time.Time) {
	delete(g.holds, clientID)
	if h.recalled {
		g.holds[clientID] = &clientHold{contested: now.Add(contestFor)}
	}
}

// answerWaiting answers the asks that waited for an ended hold, in order.
func (g *projectGrain) answerWaiting(ctx actor.Context, h *clientHold) {
	for _, m := range h.waiting {
		g.take(ctx, m)
	}
}

func (g *projectGrain) clientWindow(clientID string) *fixedWindow {
	w, ok := g.clients[clientID]
	if !ok {
		w = &fixedWindow{size: time.Second}
		g.clients[clientID] = w
	}
	return w
}

// lapseHolds ends the holds past their end (their holder gone, or its
// release lost) and answers the asks that waited for them (ctx nil: they
// are dropped, and asked again of the next owner), and forgets contests
// and orphans that are over.
func (g *projectGrain) lapseHolds(ctx actor.Context, now time.Time) {
	var lapsed []*clientHold
	for id, h := range g.holds {
		switch {
		case h.holder == nil && !now.Before(h.contested):
			delete(g.holds, id)
		case h.holder != nil && !now.Before(h.until):
			g.lapse(id, h, now)
			lapsed = append(lapsed, h)
		}
	}
	for _, h := range lapsed {
		if ctx != nil {
			g.answerWaiting(ctx, h)
		}
	}
	for id, o := range g.orphans {
		if now.Sub(o.at) >= holdFor {
			delete(g.orphans, id)
		}
	}
}

func sameRef(a, b *clusterpb.Ref) bool {
	return a.GetAddress() == b.GetAddress() && a.GetId() == b.GetId()
}

// nodeHold is a node's hold of a clientId's window. w counts it: the
// grain's count at its last answer plus what this node counted since (own,
// in the window starting at ownStart), which goes back with the release.
type nodeHold struct {
	id       string    // the ask that granted it
	until    time.Time // on this node's clock
	asked    time.Time // when the grant or the last renewal was asked
	w        fixedWindow
	ownStart time.Time
	own      int
	renewing string // the renewal in flight ("": none)
}

// endedHold is a hold this node gave back (or one recalled before its grant
// came), and its release: a recall of it, or a new grain, gets the release again.
type endedHold struct {
	at      time.Time
	release *clusterpb.ClientRelease
}

// heldWindow: this node holds clientID's window and may count the emit
// itself. While an ask of the clientId is on its way to the grain, the
// grain's count is ahead of this node's; while one of the socket's (under
// another clientId) is, its answer must come first. Either way the emit
// asks too, and the hold goes back first.
func (a *projectActor) heldWindow(ctx actor.Context, clientID string, sink Sink, now time.Time) *nodeHold {
	b := a.budgets
	h := b.holds[clientID]
	if h == nil || !now.Before(h.until) || b.asking(clientID) || b.inClients(sink) {
		return nil // askClientWindow gives it back
	}
	if h.renewing == "" && now.Sub(h.asked) >= holdFor/2 {
		h.renewing, h.asked = b.grain.c.publishID(), now
		b.renewals[h.renewing] = clientID
		if b.grain.pid != nil {
			b.grain.c.send(ctx, b.grain.pid, &clusterpb.ProjectTake{Id: h.renewing, ReplyTo: b.self, ClientId: clientID,
				ClientLimit: int32(a.cfg.ClientEmitRatePerSecond), Renew: true})
		}
		a.scheduleBudgetRetry(ctx)
	}
	return h
}

// asking: a client emit of clientID waits for the grain.
func (b *projectBudgets) asking(clientID string) bool {
	return slices.ContainsFunc(b.clients, func(ask *clientAsk) bool { return ask.clientID == clientID && ask.waiting() })
}

// take counts an emit in the held window, and as this node's own.
func (h *nodeHold) take(now time.Time, limit int) bool {
	if _, ok := h.w.take(now, limit); !ok {
		return false
	}
	if !h.w.start.Equal(h.ownStart) {
		h.ownStart, h.own = h.w.start, 0
	}
	h.own++
	return true
}

// holdAnswered takes the hold an ask's answer grants (or the window's count
// in a hold this node has).
func (a *projectActor) holdAnswered(ask *clientAsk, m *clusterpb.ProjectTaken) {
	b, cw := a.budgets, m.GetClientWindow()
	if m.HoldNanos <= 0 || cw.GetClientId() != ask.clientID {
		return
	}
	if _, ok := b.ended[cw.HoldId]; ok { // given back (or recalled) already
		return
	}
	h := b.holds[ask.clientID]
	if h == nil || h.id != cw.HoldId {
		h = &nodeHold{id: cw.HoldId, w: fixedWindow{size: time.Second}}
		b.holds[ask.clientID] = h
	}
	h.until, h.asked = ask.came.Add(time.Duration(m.HoldNanos)), ask.came
	start := time.Unix(0, cw.StartUnixNano)
	switch w := &h.w; {
	case w.start.IsZero() || start.After(w.start):
		w.start, w.count = start, int(cw.Count)
	case start.Equal(w.start):
		n := int(cw.Count) // a repeat from the grain's memory may be older than an answer before it
		if h.ownStart.Equal(start) {
			n += h.own
		}
		w.count = max(w.count, n)
	}
}

// renewed takes the answer to a renewal: extended, or the hold is over.
func (a *projectActor) renewed(ctx actor.Context, clientID string, m *clusterpb.ProjectTaken) {
	b := a.budgets
	h := b.holds[clientID]
	if h == nil || h.renewing != m.Id {
		return
	}
	h.renewing = ""
	if m.HoldNanos <= 0 {
		a.releaseHold(ctx, clientID, b.grain.pid)
		return
	}
	h.until = h.asked.Add(time.Duration(m.HoldNanos))
}

// strayGrant gives back a hold granted to an ask nobody waits for any more.
func (a *projectActor) strayGrant(ctx actor.Context, m *clusterpb.ProjectTaken) {
	b, cw := a.budgets, m.GetClientWindow()
	if m.HoldNanos <= 0 || cw == nil {
		return
	}
	if h := b.holds[cw.ClientId]; h != nil && h.id == cw.HoldId {
		return // this node holds by it
	}
	if _, ok := b.ended[cw.HoldId]; ok {
		return
	}
	a.ended(ctx, cw.HoldId, cw.ClientId, &clusterpb.ClientWindow{ClientId: cw.ClientId}, b.grain.pid)
}

// recall gives a hold back to the grain that asks for it; a hold given back
// already is given back again (the release may have reached a grain that
// had handed its state on), and one whose grant has not come yet, empty.
func (a *projectActor) recall(ctx actor.Context, m *clusterpb.ClientRecall) {
	b := a.budgets
	switch h, e := b.holds[m.ClientId], b.ended[m.HoldId]; {
	case h != nil && h.id == m.HoldId:
		a.releaseHold(ctx, m.ClientId, ctx.Sender())
	case e != nil:
		a.sendRelease(ctx, e.release, ctx.Sender())
	default:
		a.ended(ctx, m.HoldId, m.ClientId, &clusterpb.ClientWindow{ClientId: m.ClientId}, ctx.Sender())
	}
}

// releaseHold ends this node's hold of clientID and sends to (the grain)
// what this node counted.
func (a *projectActor) releaseHold(ctx actor.Context, clientID string, to *actor.PID) {
	b := a.budgets
	h := b.holds[clientID]
	if h == nil {
		return
	}
	delete(b.holds, clientID)
	cw := &clusterpb.ClientWindow{ClientId: clientID}
	if h.own > 0 {
		cw.StartUnixNano, cw.Count = h.ownStart.UnixNano(), int32(h.own)
	}
	a.ended(ctx, h.id, clientID, cw, to)
}

// ended records a hold as given back with window, and sends the release.
func (a *projectActor) ended(ctx actor.Context, holdID, clientID string, cw *clusterpb.ClientWindow, to *actor.PID) {
	b := a.budgets
	rel := &clusterpb.ClientRelease{Relay: b.self, HoldId: holdID, Window: cw}
	b.ended[holdID] = &endedHold{at: a.cfg.Now(), release: rel}
	a.sendRelease(ctx, rel, to)
}

// sendRelease sends a release to a grain whose member knows the message.
func (a *projectActor) sendRelease(ctx actor.Context, rel *clusterpb.ClientRelease, to *actor.PID) {
	if c := a.budgets.grain.c; to != nil && c.speaks(to.Address, holdsWire) {
		c.send(ctx, to, rel)
	}
}

// newGrain gives the holds back to a grain just found, and sends it again
// the releases of the last holdFor.
func (a *projectActor) newGrain(ctx actor.Context) {
	b, now := a.budgets, a.cfg.Now()
	for _, e := range b.ended {
		if now.Sub(e.at) < holdFor {
			a.sendRelease(ctx, e.release, b.grain.pid)
		}
	}
	a.releaseIdleHolds(ctx, now, true)
}

// releaseIdleHolds gives back the holds not renewed for a while (their
// clientIds stopped emitting here), and all of them when all is set (a new
// grain, or the actor stopping), and forgets what is old.
func (a *projectActor) releaseIdleHolds(ctx actor.Context, now time.Time, all bool) {
	b := a.budgets
	for id, h := range b.holds {
		if all || !now.Before(h.until.Add(-2*publishRetryAfter)) {
			a.releaseHold(ctx, id, b.grain.pid)
		}
	}
	for id, e := range b.ended {
		if now.Sub(e.at) > endedKept {
			delete(b.ended, id)
		}
	}
	for id, clientID := range b.renewals {
		if h := b.holds[clientID]; h == nil || h.renewing != id {
			delete(b.renewals, id)
		} else if now.Sub(h.asked) >= publishRetryAfter { // unanswered: the next emit asks again
			h.renewing = ""
			delete(b.renewals, id)
		}
	}
}
