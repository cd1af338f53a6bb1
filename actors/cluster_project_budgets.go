package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/proto/clusterpb"
)

// In a cluster, the project backstop and the per-clientId client-emit
// windows are counted once for the whole cluster by the project's grain
// (cluster_project_grain.go). A project actor asks it once per emit and holds the
// emit meanwhile; answered emits go on in the order they came, so that a
// socket's emits are still answered in order. An ask left unanswered for
// publishRetryAfter is sent again with the same id (the grain answers a
// repeat from memory); a client emit left unanswered for clientEmitGiveUp
// is refused service_unavailable, and an HTTP emit whose edge gave up is
// dropped (its unit, if the grain took one, is given back).
type projectBudgets struct {
	grain    grainLookup
	self     *clusterpb.Ref
	queue    []*budgetAsk // in the order they came
	byID     map[string]*budgetAsk
	retrying bool
	last     Budget // the backstop as the grain last answered (/debug/actors)
}

// budgetAsk is one emit waiting for its budgets: an HTTP emit (pub), or a
// client emit that passed rules 1–5 (client, clientID).
type budgetAsk struct {
	msg      *clusterpb.ProjectTake
	pub      *Publish
	client   *clientEmit
	clientID string
	came     time.Time
	sentAt   time.Time
	answer   *clusterpb.ProjectTaken
	gaveUp   bool // answered service_unavailable (client) or dropped (HTTP) without the grain
}

// budgetTick drives publishRetryAfter for the asks.
type budgetTick struct{}

func newProjectBudgets(c *Cluster, projectID string) *projectBudgets {
	return &projectBudgets{grain: grainLookup{c: c, kind: ProjectKind, identity: projectID}, byID: map[string]*budgetAsk{}}
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
		if b.grain.resolved(ctx, m) {
			for _, ask := range b.queue { // a new grain: everything unanswered again, in order
				if ask.answer == nil && !ask.gaveUp {
					a.sendAsk(ctx, ask)
				}
			}
		}
	case *resolveAgain:
		b.grain.retry(ctx, m)
	case *actor.Terminated:
		return b.grain.terminated(ctx, m.Who)
	default:
		return false
	}
	return true
}

// askBudgets sends one emit's ask to the project grain and holds the emit.
func (a *projectActor) askBudgets(ctx actor.Context, ask *budgetAsk) {
	b := a.budgets
	ask.came = a.cfg.Now()
	ask.msg = &clusterpb.ProjectTake{Id: b.grain.c.publishID(), ReplyTo: b.self, ProjectLimit: int32(a.cfg.ProjectRatePerMinute)}
	if ask.client != nil {
		ask.msg.ClientId, ask.msg.ClientLimit = ask.clientID, int32(a.cfg.ClientEmitRatePerSecond)
		ask.msg.ClientOnly = ask.client.msg.PayloadErr != nil // rule 7 refuses it after rule 6
	}
	b.queue = append(b.queue, ask)
	b.byID[ask.msg.Id] = ask
	a.sendAsk(ctx, ask)
	a.scheduleBudgetRetry(ctx)
}

func (a *projectActor) sendAsk(ctx actor.Context, ask *budgetAsk) {
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
	if b.retrying || len(b.queue) == 0 {
		return
	}
	b.retrying = true
	self, root := ctx.Self(), ctx.ActorSystem().Root
	time.AfterFunc(publishRetryAfter, func() { root.Send(self, &budgetTick{}) })
}

// retryBudgets sends again what the grain has not answered, and gives up
// on what nobody waits for any more.
func (a *projectActor) retryBudgets(ctx actor.Context) {
	b := a.budgets
	now := a.cfg.Now()
	for _, ask := range b.queue {
		switch {
		case ask.answer != nil || ask.gaveUp:
		case ask.pub != nil && ask.pub.abandoned(), ask.client != nil && now.Sub(ask.came) > clientEmitGiveUp:
			ask.gaveUp = true
			a.refundAsk(ctx, ask.msg.Id) // the grain may have taken it
		case now.Sub(ask.sentAt) >= publishRetryAfter:
			a.sendAsk(ctx, ask)
		}
	}
	a.releaseBudgeted(ctx)
	if b.grain.pid == nil && len(b.queue) > 0 {
		b.grain.resolveOnce(ctx)
	}
	a.scheduleBudgetRetry(ctx)
}

func (a *projectActor) budgetAnswered(ctx actor.Context, m *clusterpb.ProjectTaken) {
	b := a.budgets
	ask, ok := b.byID[m.Id]
	if !ok || ask.answer != nil || ask.gaveUp {
		return // a repeat answer
	}
	if m.Error == errNotOwner { // the project moved: look it up again; the tick resends
		b.grain.resolveOnce(ctx)
		return
	}
	ask.answer = m
	if m.Project != nil {
		b.last = budgetFromProto(m.Project)
	}
	a.releaseBudgeted(ctx)
}

// releaseBudgeted lets the answered emits at the head of the queue go on.
func (a *projectActor) releaseBudgeted(ctx actor.Context) {
	b := a.budgets
	n := 0
	for ; n < len(b.queue) && (b.queue[n].answer != nil || b.queue[n].gaveUp); n++ {
		ask := b.queue[n]
		delete(b.byID, ask.msg.Id)
		b.queue[n] = nil
		a.budgeted(ctx, ask)
	}
	if n > 0 {
		b.queue = append(b.queue[:0], b.queue[n:]...)
	}
}

// budgeted carries one emit on with the grain's answer, as the one-node
// flow does with its own windows (publish, clientEmit).
func (a *projectActor) budgeted(ctx actor.Context, ask *budgetAsk) {
	ans := ask.answer
	if ask.pub != nil {
		if ask.gaveUp || ask.pub.abandoned() {
			if !ask.gaveUp {
				a.refundAsk(ctx, ask.msg.Id)
			}
			return
		}
		m := ask.pub
		m.takeID, m.projectBudget, m.projectDenied = ask.msg.Id, budgetFromProto(ans.Project), ans.ProjectDenied
		a.send(ctx, m.Channel, m)
		return
	}
	m := ask.client
	switch {
	case ask.gaveUp:
		a.refuseEmit(ctx, m.msg.Channel, m.sink, proto.CodeUnavailable)
	case ans.ClientDenied: // 6
		a.cfg.counters.RateLimitedClient.Add(1)
		a.usage.health.add(hLimitedClient, 1, ask.came.UnixNano())
		a.refuseEmit(ctx, m.msg.Channel, m.sink, proto.CodeClientEmitRateLimited)
	case m.msg.PayloadErr != nil: // 7
		a.refuseEmit(ctx, m.msg.Channel, m.sink, m.msg.PayloadErr.Code)
	default:
		p := a.clientPublish(m, ask.clientID, ask.came)
		p.takeID, p.projectBudget, p.projectDenied = ask.msg.Id, budgetFromProto(ans.Project), ans.ProjectDenied
		a.send(ctx, p.Channel, p)
	}
}

// refundAsk gives the grain back the unit it took for an ask, if it took one.
func (a *projectActor) refundAsk(ctx actor.Context, id string) {
	if g := a.budgets.grain.pid; g != nil {
		a.budgets.grain.c.send(ctx, g, &clusterpb.ProjectRefund{Id: id})
	}
}

// refuseHeldBudgets answers every emit still waiting for the grain, as refuse does.
func (a *projectActor) refuseHeldBudgets(ctx actor.Context) {
	if a.budgets == nil {
		return
	}
	for _, ask := range a.budgets.queue {
		if ask.gaveUp {
			continue
		}
		if ask.pub != nil {
			if ask.pub.take() {
				a.refuse(ctx, ask.pub)
			}
		} else {
			a.refuse(ctx, ask.client)
		}
	}
	a.budgets.queue = nil
}
