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
//   - A node that finds a new project grain (the project moved, or its
//     grain restarted) gives its holds back to it first. A grain that
//     started without its predecessor's state (that node crashed) knows of
//     no hold: until the holders notice, for a lookup's time, another node
//     can be granted the same window, so a clientId emitting through two
//     nodes then may get up to twice its rate for a moment.

const (
	holdFor    = 2 * time.Second
	contestFor = time.Second
)

// clientHold is the grain's record of one clientId's hold; holder nil: not
// held, and no new hold before contested.
type clientHold struct {
	holder    *clusterpb.Ref
	id        string    // the ask that granted it
	until     time.Time // on the grain's clock
	limit     int       // the clientId's limit when granted
	recalled  bool
	waiting   []*clusterpb.ProjectTake // other nodes' asks, waiting for the window back
	contested time.Time
}

// waitForHold: another node holds m's clientId window, and m waits until
// it comes back (recalled now if it was not yet). A hold that ended on the
// grain's clock ends here first, its window counted as full.
func (g *projectGrain) waitForHold(ctx actor.Context, m *clusterpb.ProjectTake, now time.Time) bool {
	h := g.holds[m.ClientId]
	switch {
	case h == nil || h.holder == nil:
		return false
	case !now.Before(h.until): // never given back: the holder may have filled the window the hold ended in
		g.clientWindow(m.ClientId).merge(h.until.Truncate(time.Second), h.limit)
		h.waiting = slices.DeleteFunc(h.waiting, func(w *clusterpb.ProjectTake) bool { return w.Id == m.Id })
		g.endHold(ctx, m.ClientId, h, now)
		return false
	case sameRef(h.holder, m.ReplyTo):
		return false // the holder itself: a renewal, or an ask after its release
	}
	if !h.recalled {
		h.recalled = true
		holder := actor.NewPID(h.holder.GetAddress(), h.holder.GetId())
		if holder.Address != ctx.Self().Address {
			g.c.crossNode.Add(1)
		}
		ctx.Request(holder, &clusterpb.ClientRecall{ClientId: m.ClientId, HoldId: h.id})
	}
	if !slices.ContainsFunc(h.waiting, func(w *clusterpb.ProjectTake) bool { return w.Id == m.Id }) {
		h.waiting = append(h.waiting, m)
	}
	return true
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
	ans.ClientDenied = !g.clients.take(m.ClientId, now, int(m.ClientLimit))
	switch {
	case h != nil && h.holder != nil:
		// The holder's own ask, sent before its grant reached it (a node
		// asks only when it holds nothing): counted here, and the answer
		// tells the holder the window's count.
		if !h.recalled {
			h.until = now.Add(holdFor)
		}
	case ans.ClientDenied || !m.Hold || (h != nil && now.Before(h.contested)):
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
		return // a hold that ended already
	}
	if cw.Count > 0 {
		g.clientWindow(cw.ClientId).merge(time.Unix(0, cw.StartUnixNano), int(cw.Count))
	}
	g.endHold(ctx, cw.ClientId, h, g.cfg.Now())
}

// endHold ends a hold and answers the asks that waited for it, in order.
func (g *projectGrain) endHold(ctx actor.Context, clientID string, h *clientHold, now time.Time) {
	delete(g.holds, clientID)
	if h.recalled {
		g.holds[clientID] = &clientHold{contested: now.Add(contestFor)}
	}
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

// holdsIdle: no clientId is held or contested.
func (g *projectGrain) holdsIdle(now time.Time) bool {
	for id, h := range g.holds {
		if h.holder != nil {
			return false
		}
		if !now.Before(h.contested) {
			delete(g.holds, id)
		}
	}
	return len(g.holds) == 0
}

func sameRef(a, b *clusterpb.Ref) bool {
	return a.GetAddress() == b.GetAddress() && a.GetId() == b.GetId()
}

// nodeHold is a node's hold of a clientId's window; a.clientWindows counts
// it: the grain's count at its last answer plus what this node counted
// since (own, in the window starting at ownStart), which goes back with the
// release.
type nodeHold struct {
	id       string    // the ask that granted it
	until    time.Time // on this node's clock
	asked    time.Time // when the grant or the last renewal was asked
	ownStart time.Time
	own      int
	renewing string // the renewal in flight ("": none)
}

// heldWindow: this node holds clientID's window and may count the emit
// itself. While an ask of the clientId is on its way to the grain, the
// grain's count is ahead of this node's; while one of the socket's (under
// another clientId) is, its answer must come first. Either way the emit
// asks too, and the hold goes back first.
func (a *projectActor) heldWindow(ctx actor.Context, clientID string, sink Sink, now time.Time) bool {
	b := a.budgets
	h := b.holds[clientID]
	switch {
	case h == nil:
		return false
	case !now.Before(h.until) || b.asking(clientID) || b.inClients(sink):
		a.releaseHold(ctx, clientID, b.grain.pid)
		return false
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
	return true
}

// asking: a client emit of clientID waits for the grain.
func (b *projectBudgets) asking(clientID string) bool {
	return slices.ContainsFunc(b.clients, func(ask *clientAsk) bool { return ask.clientID == clientID && ask.waiting() })
}

// countedHere records an emit this node counted in its hold of clientID.
func (a *projectActor) countedHere(clientID string) {
	h, w := a.budgets.holds[clientID], a.clientWindows[clientID]
	if h == nil || w == nil {
		return
	}
	if !w.start.Equal(h.ownStart) {
		h.ownStart, h.own = w.start, 0
	}
	h.own++
}

// holdAnswered takes the hold an ask's answer grants (or the window's count
// in a hold this node has).
func (a *projectActor) holdAnswered(ask *clientAsk, m *clusterpb.ProjectTaken) {
	b, cw := a.budgets, m.GetClientWindow()
	if m.HoldNanos <= 0 || cw.GetClientId() != ask.clientID {
		return
	}
	if _, ok := b.recalled[cw.HoldId]; ok { // recalled before it came: given back empty already
		return
	}
	h := b.holds[ask.clientID]
	if h == nil || h.id != cw.HoldId {
		h = &nodeHold{id: cw.HoldId}
		b.holds[ask.clientID] = h
		delete(a.clientWindows, ask.clientID)
	}
	h.until, h.asked = ask.came.Add(time.Duration(m.HoldNanos)), ask.came
	start := time.Unix(0, cw.StartUnixNano)
	switch w := a.clientWindows[ask.clientID]; {
	case w == nil || start.After(w.start):
		a.clientWindows[ask.clientID] = &fixedWindow{size: time.Second, start: start, count: int(cw.Count)}
	case start.Equal(w.start):
		w.count = int(cw.Count)
		if h.ownStart.Equal(start) {
			w.count += h.own
		}
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
	if m.HoldNanos <= 0 || cw == nil || b.grain.pid == nil {
		return
	}
	if h := b.holds[cw.ClientId]; h != nil && h.id == cw.HoldId {
		return // this node holds by it
	}
	b.grain.c.send(ctx, b.grain.pid, &clusterpb.ClientRelease{Relay: b.self, HoldId: cw.HoldId,
		Window: &clusterpb.ClientWindow{ClientId: cw.ClientId}})
}

// recall gives a hold back to the grain that asks for it (or, for a grant
// not come yet, says so and remembers not to take it).
func (a *projectActor) recall(ctx actor.Context, m *clusterpb.ClientRecall) {
	b := a.budgets
	if h := b.holds[m.ClientId]; h != nil && h.id == m.HoldId {
		a.releaseHold(ctx, m.ClientId, ctx.Sender())
		return
	}
	b.recalled[m.HoldId] = a.cfg.Now()
	if ctx.Sender() != nil {
		b.grain.c.send(ctx, ctx.Sender(), &clusterpb.ClientRelease{Relay: b.self, HoldId: m.HoldId,
			Window: &clusterpb.ClientWindow{ClientId: m.ClientId}})
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
	delete(a.clientWindows, clientID)
	cw := &clusterpb.ClientWindow{ClientId: clientID}
	if h.own > 0 {
		cw.StartUnixNano, cw.Count = h.ownStart.UnixNano(), int32(h.own)
	}
	if to != nil {
		b.grain.c.send(ctx, to, &clusterpb.ClientRelease{Relay: b.self, HoldId: h.id, Window: cw})
	}
}

// releaseIdleHolds gives back the holds not renewed for a while (their
// clientIds stopped emitting here), and all of them when all is set (a new
// grain, or the actor stopping).
func (a *projectActor) releaseIdleHolds(ctx actor.Context, now time.Time, all bool) {
	b := a.budgets
	for id, h := range b.holds {
		if all || !now.Before(h.until.Add(-2*publishRetryAfter)) {
			a.releaseHold(ctx, id, b.grain.pid)
		}
	}
	for id, at := range b.recalled {
		if now.Sub(at) > time.Minute {
			delete(b.recalled, id)
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
