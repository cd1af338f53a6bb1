package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/proto/clusterpb"
)

// In a cluster, the project backstop and the per-clientId client-emit
// windows count the whole cluster, in the project's grain
// (cluster_project_grain.go).
//
// The backstop reaches the nodes as leases, so that an emit does not wait
// for the grain: the grain grants a node's project actor a share of the
// current window (see leaseShare) and counts it as spent at once; the actor
// spends it emit by emit, asks for the next share when half of the last is
// gone, and holds emits only when its share ran out (in the order they
// came). A grant of nothing means the window is used up: the node refuses
// until it ends. A unit an emit gave back (its channel refused it) goes
// back to the node's share. So the cluster never accepts more than the
// limit in a window, and may refuse up to about 1.5 shares per other node
// early, while those nodes still hold units (or held them when their
// project actor went dormant).
//
// The remaining an emit reports is the grain's at its last answer to this
// node plus this node's unspent share: lower than the cluster's by the
// other nodes' unspent shares, higher by what they accepted since that
// answer. An emit waits for a new answer when the last is older than
// leaseFresh (so a node emitting less than about once a second waits a
// round trip each time), unless the grain is slow to answer: then the
// share goes on. The share ends by this node's clock (the grain says how
// long its window has left), so the two clocks need not agree.
//
// A client emit asks the grain for its clientId's window (rule 6), unless
// this node holds that window (cluster_client_holds.go): a window of a
// second per clientId is too small to share out, but it can be lent whole.
// Those asks are answered in the order they came, so that a socket's emits
// are still answered in order, then spend the backstop like an HTTP emit.
//
// An ask left unanswered for publishRetryAfter is sent again with the same
// id (the grain answers a repeat from memory). A client emit left waiting
// for clientEmitGiveUp is refused service_unavailable; an HTTP emit whose
// edge gave up is dropped.
type projectBudgets struct {
	grain    grainLookup
	self     *clusterpb.Ref
	lease    backstopLease
	leasing  *grainAsk    // the lease ask in flight; nil when none
	held     []leaseWait  // emits waiting for a lease, in the order they came
	clients  []*clientAsk // client emits waiting for rule 6, in the order they came
	byID     map[string]*clientAsk
	retrying bool
	holds    map[string]*nodeHold  // clientId → this node's hold of its window
	renewals map[string]string     // renewal ask id → clientId
	ended    map[string]*endedHold // hold id → given back, for endedKept
}

// leaseShares: a share is this fraction of the backstop's limit (see leaseShare).
const leaseShares = 50

// grainAsk is one ProjectTake the grain has not answered yet.
type grainAsk struct {
	msg    *clusterpb.ProjectTake
	came   time.Time // asked first
	sentAt time.Time // sent last
}

// clientAsk is one client emit that passed rules 1–5, waiting for rule 6,
// or one refused by them while an earlier one of its socket waits
// (refused: its code; emit nil, so that its payload is not kept).
type clientAsk struct {
	grainAsk
	emit     *clientEmit
	channel  string
	sink     Sink
	clientID string
	answer   *clusterpb.ProjectTaken
	gaveUp   bool // answered service_unavailable without the grain
	refused  proto.Code
}

// leaseWait is an emit waiting for a share (pub; sink: a client emit's
// socket), or a client emit's refusal waiting behind the emits held
// before it (sink, channel, code), so that a socket's
// answers keep their order.
type leaseWait struct {
	pub     *Publish
	channel string
	sink    Sink
	code    proto.Code
}

// backstopLease is the node's share of the backstop's current window.
type backstopLease struct {
	limit    int
	units    int       // granted and not spent
	left     int       // the grain's remaining when it last answered
	resetAt  time.Time // the window's end on the grain's clock (reported, and names the window)
	endsAt   time.Time // the same end on this node's clock: when the units are void
	answered time.Time // when the grain last answered, on this node's clock
	dry      bool      // the grain had nothing left to grant in the window
}

// leaseFresh: an emit waits for a new answer of the grain when the last is
// older, so the remaining it reports lags the cluster's by no more than
// what the other nodes accepted in about that time.
const leaseFresh = time.Second

// take spends a unit at now; decided is false when the node must ask the
// grain first: no share, a past window's, or an answer older than
// leaseFresh, unless the grain is slow to answer (slow): then the share is
// spent on the old answer rather than held, so a project grain whose node
// froze or died does not stop the project's emits while shares last.
func (l *backstopLease) take(now time.Time, slow bool) (b Budget, ok, decided bool) {
	switch {
	case !now.Before(l.endsAt):
		l.units = 0 // void: ask for a share of the next window
		return Budget{}, false, false
	case l.units == 0 && l.dry: // nothing comes back in this window
		return l.budget(), false, true
	case l.units == 0 || (now.Sub(l.answered) > leaseFresh && !slow):
		return Budget{}, false, false
	}
	l.units--
	return l.budget(), true, true
}

// want is how many units to ask the grain for, the share being share units:
// none (only the grain's remaining) while half of a share is left.
func (l *backstopLease) want(share int) int {
	if l.units >= (share+1)/2 {
		return 0
	}
	return share
}

// refund gives back a unit taken in the window that ends at window (the
// grain's resetAt the emit reported), if it is still the share's.
func (l *backstopLease) refund(window time.Time) {
	if window.Equal(l.resetAt) && l.limit > 0 {
		l.units++
	}
}

// grant adds the grain's answer to a lease ask first sent at asked. The
// grain answered after that, so the share ends no later than its window
// by this node's clock, even when the answer comes late or is a repeat.
func (l *backstopLease) grant(ans *clusterpb.ProjectTaken, asked time.Time) {
	w := budgetFromProto(ans.Project)
	if !w.ResetAt.Equal(l.resetAt) { // a new window: the last one's units are void
		l.units = 0
	}
	l.limit, l.left, l.resetAt, l.answered = w.Limit, w.Remaining, w.ResetAt, asked
	l.endsAt = asked.Add(time.Duration(ans.ResetInNanos))
	l.units += int(ans.Leased)
	if !ans.Leases { // an older grain (a rolling upgrade): it took one unit unless it refused, and tells no reset_in
		l.endsAt = w.ResetAt
		if !ans.ProjectDenied {
			l.units++
		}
	}
	l.dry = w.Remaining == 0
}

func (l *backstopLease) budget() Budget {
	return Budget{Limit: l.limit, Remaining: l.left + l.units, ResetAt: l.resetAt}
}

// budgetTick drives publishRetryAfter for the asks.
type budgetTick struct{}

func newProjectBudgets(c *Cluster, projectID string) *projectBudgets {
	return &projectBudgets{grain: grainLookup{c: c, kind: ProjectKind, identity: projectID}, byID: map[string]*clientAsk{},
		holds: map[string]*nodeHold{}, renewals: map[string]string{}, ended: map[string]*endedHold{}}
}

// startBudgets is the project actor starting in a cluster.
func (a *projectActor) startBudgets(ctx actor.Context) {
	b := a.budgets
	b.self = &clusterpb.Ref{Address: ctx.Self().Address, Id: ctx.Self().Id}
	b.grain.resolve(ctx)
}

// budgetMessage handles the project grain's side of the actor; false when
// msg is not about it.
func (a *projectActor) budgetMessage(ctx actor.Context, msg any) bool {
	b := a.budgets
	switch m := msg.(type) {
	case *clusterpb.ProjectTaken:
		a.budgetAnswered(ctx, m)
	case *budgetTick:
		b.retrying = false
		a.retryBudgets(ctx)
	case *grainResolved:
		if b.grain.resolved(ctx, m) { // a new grain: the holds back to it, everything unanswered again, in order
			a.newGrain(ctx)
			if b.leasing != nil {
				a.sendAsk(ctx, b.leasing)
			}
			for _, ask := range b.clients {
				if ask.waiting() {
					a.sendAsk(ctx, &ask.grainAsk)
				}
			}
		}
	case *resolveAgain:
		b.grain.retry(ctx, m)
	case *clusterpb.ClientRecall:
		a.recall(ctx, m)
	case *actor.Terminated:
		return b.grain.terminated(ctx, m.Who)
	default:
		return false
	}
	return true
}

// leasedPublish spends a unit of the node's share for an HTTP emit, or a
// client emit past rule 7, and sends it on to its channel; it holds the
// emit while the share is to be asked for.
func (a *projectActor) leasedPublish(ctx actor.Context, m *Publish) {
	b, now := a.budgets, a.cfg.Now()
	if len(b.held) == 0 {
		if budget, ok, decided := b.lease.take(now, a.grainSlow(now)); decided {
			m.projectBudget, m.projectDenied = budget, !ok
			a.send(ctx, m.Channel, m)
			a.leaseAhead(ctx, now)
			return
		}
	}
	b.held = append(b.held, leaseWait{pub: m, sink: m.origin})
	a.askLease(ctx, b.lease.want(a.leaseShare()))
}

// grainSlow: the lease ask in flight has gone unanswered for publishRetryAfter.
func (a *projectActor) grainSlow(now time.Time) bool {
	l := a.budgets.leasing
	return l != nil && now.Sub(l.came) >= publishRetryAfter
}

// leaseShare is how many units a share is: one under a backstop of
// 4×leaseShares, so that small backstops are counted exactly.
func (a *projectActor) leaseShare() int {
	if w := a.cfg.ProjectRatePerMinute / leaseShares; w >= 4 {
		return w
	}
	return 1
}

// leaseAhead asks for the next share when half of the last is spent (not
// for shares of one unit: a unit asked ahead would be held from the other
// nodes), and for the grain's remaining when its last answer is half
// leaseFresh old, so that emits do not wait for either.
func (a *projectActor) leaseAhead(ctx actor.Context, now time.Time) {
	l, share := &a.budgets.lease, a.leaseShare()
	switch {
	case l.dry:
	case share > 1 && l.want(share) > 0:
		a.askLease(ctx, share)
	case now.Sub(l.answered) > leaseFresh/2:
		a.askLease(ctx, 0)
	}
}

// askLease asks the grain for want units (0: its remaining only), unless an ask is in flight.
func (a *projectActor) askLease(ctx actor.Context, want int) {
	b := a.budgets
	if b.leasing != nil {
		return
	}
	b.leasing = &grainAsk{msg: &clusterpb.ProjectTake{Id: b.grain.c.publishID(), ReplyTo: b.self,
		ProjectLimit: int32(a.cfg.ProjectRatePerMinute), Lease: int32(want), Refresh: want == 0}, came: a.cfg.Now()}
	a.sendAsk(ctx, b.leasing)
	a.scheduleBudgetRetry(ctx)
}

// askClientWindow sends a client emit's rule-6 ask to the project grain and holds the emit.
func (a *projectActor) askClientWindow(ctx actor.Context, m *clientEmit, clientID string) {
	b := a.budgets
	a.releaseHold(ctx, clientID, b.grain.pid) // the grain counts from here
	ask := &clientAsk{emit: m, channel: m.msg.Channel, sink: m.sink, clientID: clientID}
	ask.came = a.cfg.Now()
	ask.msg = &clusterpb.ProjectTake{Id: b.grain.c.publishID(), ReplyTo: b.self,
		ClientId: clientID, ClientLimit: int32(a.cfg.ClientEmitRatePerSecond), Hold: true}
	b.clients = append(b.clients, ask)
	b.byID[ask.msg.Id] = ask
	a.sendAsk(ctx, &ask.grainAsk)
	a.scheduleBudgetRetry(ctx)
}

// refuseClientEmitInOrder answers a client emit refused before rule 6
// behind its socket's client emits still waiting for the grain or a share
// (one node, or none waiting: at once).
func (a *projectActor) refuseClientEmitInOrder(ctx actor.Context, m *clientEmit, code proto.Code) {
	if b := a.budgets; b != nil && b.inClients(m.sink) {
		b.clients = append(b.clients, &clientAsk{channel: m.msg.Channel, sink: m.sink, refused: code})
		return
	}
	a.refuseBehindHeld(ctx, m.msg.Channel, m.sink, code)
}

// refuseBehindHeld answers a refused client emit behind its socket's emits
// held for a share (one node, or none held: at once).
func (a *projectActor) refuseBehindHeld(ctx actor.Context, channel string, sink Sink, code proto.Code) {
	if b := a.budgets; b != nil && b.inHeld(sink) {
		b.held = append(b.held, leaseWait{channel: channel, sink: sink, code: code})
		return
	}
	a.refuseEmit(ctx, channel, sink, code)
}

// inClients: a client emit of the socket waits for rule 6.
func (b *projectBudgets) inClients(sink Sink) bool {
	for _, ask := range b.clients {
		if ask.sink.ID() == sink.ID() {
			return true
		}
	}
	return false
}

// inHeld: a client emit of the socket, or its refusal, waits for a share.
func (b *projectBudgets) inHeld(sink Sink) bool {
	for _, h := range b.held {
		if h.sink != nil && h.sink.ID() == sink.ID() {
			return true
		}
	}
	return false
}

// waiting: the ask is the grain's to answer.
func (ask *clientAsk) waiting() bool { return ask.answer == nil && !ask.gaveUp && ask.refused == "" }

func (a *projectActor) sendAsk(ctx actor.Context, ask *grainAsk) {
	b := a.budgets
	if b.grain.pid == nil {
		return // the lookup's answer sends it
	}
	if !ask.sentAt.IsZero() {
		b.grain.c.retries.Add(1)
	}
	ask.sentAt = a.cfg.Now()
	b.grain.c.send(ctx, b.grain.pid, ask.msg)
}

func (a *projectActor) scheduleBudgetRetry(ctx actor.Context) {
	b := a.budgets
	if b.retrying || !b.waiting() {
		return
	}
	b.retrying = true
	sendLater(ctx, publishRetryAfter, &budgetTick{})
}

// retryBudgets sends again what the grain has not answered, and gives up
// on what nobody waits for any more.
func (a *projectActor) retryBudgets(ctx actor.Context) {
	b := a.budgets
	now := a.cfg.Now()
	if b.leasing != nil && now.Sub(b.leasing.sentAt) >= publishRetryAfter {
		a.sendAsk(ctx, b.leasing)
	}
	for _, ask := range b.clients {
		switch {
		case !ask.waiting():
		case now.Sub(ask.came) > clientEmitGiveUp:
			ask.gaveUp = true
		case now.Sub(ask.sentAt) >= publishRetryAfter:
			a.sendAsk(ctx, &ask.grainAsk)
		}
	}
	kept := b.held[:0]
	for _, h := range b.held {
		switch m := h.pub; {
		case m != nil && m.abandoned():
		case m != nil && m.Reply == nil && now.Sub(m.At) > clientEmitGiveUp: // its answer keeps its place
			kept = append(kept, leaseWait{channel: m.Channel, sink: m.origin, code: proto.CodeUnavailable})
		default:
			kept = append(kept, h)
		}
	}
	clear(b.held[len(kept):])
	b.held = kept
	a.releaseHeld(ctx) // a slow grain: the share goes on with its old answer
	a.releaseClients(ctx)
	a.releaseIdleHolds(ctx, now, false)
	if b.grain.pid == nil && (b.leasing != nil || len(b.clients) > 0) {
		b.grain.resolveOnce(ctx)
	}
	a.scheduleBudgetRetry(ctx)
}

func (a *projectActor) budgetAnswered(ctx actor.Context, m *clusterpb.ProjectTaken) {
	b := a.budgets
	if m.Error == errNotOwner { // the project moved: look it up again; the tick resends
		b.grain.resolveOnce(ctx)
		return
	}
	if b.leasing != nil && m.Id == b.leasing.msg.Id {
		b.lease.grant(m, b.leasing.came)
		b.leasing = nil
		a.releaseHeld(ctx)
		return
	}
	if clientID, ok := b.renewals[m.Id]; ok {
		delete(b.renewals, m.Id)
		a.renewed(ctx, clientID, m)
		return
	}
	if ask, ok := b.byID[m.Id]; ok && ask.answer == nil && !ask.gaveUp {
		ask.answer = m
		a.holdAnswered(ask, m)
		a.releaseClients(ctx)
		return
	}
	a.strayGrant(ctx, m)
}

// releaseHeld sends on the held emits the node's share now covers, and the
// refusals behind them.
func (a *projectActor) releaseHeld(ctx actor.Context) {
	b, now := a.budgets, a.cfg.Now()
	slow := a.grainSlow(now)
	n := 0
	for ; n < len(b.held); n++ {
		h := b.held[n]
		switch m := h.pub; {
		case m == nil:
			a.refuseEmit(ctx, h.channel, h.sink, h.code)
			continue
		case m.abandoned():
			continue
		}
		budget, ok, decided := b.lease.take(now, slow)
		if !decided {
			a.askLease(ctx, b.lease.want(a.leaseShare()))
			break
		}
		h.pub.projectBudget, h.pub.projectDenied = budget, !ok
		a.send(ctx, h.pub.Channel, h.pub)
	}
	clear(b.held[:n])
	b.held = append(b.held[:0], b.held[n:]...)
	a.leaseAhead(ctx, now)
}

// releaseClients carries on the answered client emits at the head of the
// queue, as the one-node flow does with its own window (clientEmit).
func (a *projectActor) releaseClients(ctx actor.Context) {
	b := a.budgets
	n := 0
	for ; n < len(b.clients) && !b.clients[n].waiting(); n++ {
		ask := b.clients[n]
		b.clients[n] = nil
		m, code := ask.emit, ask.refused
		if ask.msg != nil {
			delete(b.byID, ask.msg.Id)
		}
		switch {
		case code != "":
		case ask.gaveUp:
			code = proto.CodeUnavailable
		case ask.answer.ClientDenied: // 6
			a.cfg.counters.RateLimitedClient.Add(1)
			a.usage.health.add(hLimitedClient, 1, ask.came.UnixNano())
			code = proto.CodeClientEmitRateLimited
		case m.msg.PayloadErr != nil: // 7
			code = m.msg.PayloadErr.Code
		default:
			a.publish(ctx, a.clientPublish(m, ask.clientID, ask.came))
			continue
		}
		a.refuseBehindHeld(ctx, ask.channel, ask.sink, code)
	}
	if n > 0 {
		b.clients = append(b.clients[:0], b.clients[n:]...)
	}
}

// refuseHeldBudgets answers every emit still waiting for the grain, in the
// order they came, as refuse does (a refusal already decided keeps its code).
func (a *projectActor) refuseHeldBudgets(ctx actor.Context) {
	b := a.budgets
	if b == nil {
		return
	}
	for _, h := range b.held {
		switch m := h.pub; {
		case m == nil:
			a.refuseEmit(ctx, h.channel, h.sink, h.code)
		case m.Reply == nil:
			a.refuseEmit(ctx, m.Channel, m.origin, proto.CodeUnavailable)
		case m.take():
			a.refuse(ctx, m)
		}
	}
	for _, ask := range b.clients {
		switch {
		case ask.refused != "":
			a.refuseEmit(ctx, ask.channel, ask.sink, ask.refused)
		case !ask.gaveUp:
			a.refuse(ctx, ask.emit)
		}
	}
	b.clients, b.held = nil, nil
}

// waiting reports whether an emit or an ask waits for the grain, or this
// node holds a clientId's window.
func (b *projectBudgets) waiting() bool {
	return b.leasing != nil || len(b.clients) > 0 || len(b.held) > 0 || len(b.holds) > 0
}
