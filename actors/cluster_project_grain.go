package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"github.com/relayhq/relay/proto/clusterpb"
)

// ProjectKind is the cluster kind of project grains; a grain's identity is
// the project id.
const ProjectKind = "relay-project"

// projectGrain counts, for the whole cluster, the budgets that belong to a
// project rather than a channel: the emit backstop
// (PROJECT_RATE_LIMIT_PER_MINUTE), which it leases out to the nodes' project
// actors a share at a time, and the per-clientId client-emit windows, which
// a client emit asks for (cluster_project_budgets.go).
// Everything else of a project (keys, settings, revocations, connections)
// stays with each node's project actor, kept in step by control-plane
// broadcasts. Its windows run on its own clock. Every field is owned by
// Receive.
type projectGrain struct {
	c   *Cluster
	cfg *Config
	id  string

	backstop fixedWindow // counts every unit leased out
	clients  clientWindows
	holds    map[string]*clientHold // clientId → the node that counts its window (cluster_client_holds.go)
	// orphans are releases of holds not known here, for holdFor: the
	// handed state that names the hold may come next.
	orphans map[string]orphanRelease
	// noHoldsUntil: a grain that started without its predecessor's state
	// lends no window for a while, so that a state coming late finds no
	// hold of this grain's beside its own.
	noHoldsUntil time.Time
	answers      answerMemory[*clusterpb.ProjectTaken]
	quiet        quietPeriod

	// receive is the grain's behaviour: owning, or frozen once its state is
	// handed over (it answers repeats from memory, refuses the rest
	// not_owner, and stops soon).
	receive func(actor.Context)
}

// freezeProject asks a project grain for its state and makes it refuse
// takes: the project is moving to another member (cluster_handoff.go).
type freezeProject struct{ reply chan *clusterpb.ProjectState }

func newProjectGrain(c *Cluster) *projectGrain {
	g := &projectGrain{c: c, cfg: c.sys.cfg, backstop: fixedWindow{size: time.Minute},
		clients: clientWindows{}, holds: map[string]*clientHold{}, orphans: map[string]orphanRelease{},
		answers: newAnswerMemory[*clusterpb.ProjectTaken]()}
	g.receive = g.owning
	return g
}

func (g *projectGrain) Receive(ctx actor.Context) { g.receive(ctx) }

// frozen answers asks it answered before, and refuses new ones.
func (g *projectGrain) frozen(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *clusterpb.ProjectTake:
		if g.c.refsItsSender(ctx, m) && !g.answerRepeat(ctx, m, g.cfg.Now()) {
			g.refuseNotOwner(ctx, m)
		}
	case *clusterpb.ClientRelease:
		// Its hold went with the state handed on: the holder sends the
		// release again to the grain it finds next.
	default:
		g.owning(ctx)
	}
}

func (g *projectGrain) owning(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		g.c.activations.Add(1)
		scheduleQuietTick(ctx, g.cfg.ActorDormancy)
	case *cluster.ClusterInit:
		g.id = m.Identity.Identity
		if g.c.leaving.Load() {
			// This node has handed its project grains over: one started now
			// would grant from empty windows that no one hands on. Its asks
			// are refused not_owner and asked again of the next owner.
			g.receive = g.frozen
			ctx.Poison(ctx.Self())
			return
		}
		g.c.projectGrains.Store(g.id, ctx.Self())
		if st, ok := claimHanded(&g.c.projectHandoffs, g.id, time.Now()); ok {
			g.adopt(ctx, st.(*clusterpb.ProjectState))
		} else {
			g.noHoldsUntil = g.cfg.Now().Add(holdFor)
		}
	case *freezeProject:
		g.receive = g.frozen
		m.reply <- g.state()
	case *clusterpb.ProjectState:
		g.adopt(ctx, m)
	case *actor.Stopped:
		g.c.projectGrains.CompareAndDelete(g.id, ctx.Self())
	case *clusterpb.ProjectTake:
		if g.c.refsItsSender(ctx, m) {
			g.take(ctx, m)
		}
	case *clusterpb.ClientRelease:
		if g.c.refsItsSender(ctx, m) {
			g.released(ctx, m)
		}
	case *clusterpb.ProjectRefund: // an older node's: the unit stays counted
	case *quietTick:
		scheduleQuietTick(ctx, g.cfg.ActorDormancy)
		g.lapseHolds(ctx, g.cfg.Now())
		if g.quiet.dormantAgain(g.dormant()) {
			ctx.Poison(ctx.Self())
		}
	}
}

// answerRepeat answers an ask it answered before (a retry) from memory;
// false: a new one.
func (g *projectGrain) answerRepeat(ctx actor.Context, m *clusterpb.ProjectTake, now time.Time) bool {
	g.answers.forget(now)
	prev, ok := g.answers.get(m.Id)
	if ok {
		g.c.duplicates.Add(1)
		g.c.send(ctx, actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId()), prev)
	}
	return ok
}

func (g *projectGrain) refuseNotOwner(ctx actor.Context, m *clusterpb.ProjectTake) {
	g.c.ownerRefusals.Add(1)
	g.c.send(ctx, actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId()), &clusterpb.ProjectTaken{Id: m.Id, Error: errNotOwner})
}

// take applies client-emit rule 6 (the clientId's window) and grants a
// lease of the backstop, as the ask says.
func (g *projectGrain) take(ctx actor.Context, m *clusterpb.ProjectTake) {
	now := g.cfg.Now()
	if g.answerRepeat(ctx, m, now) {
		return
	}
	if !g.c.owns(ProjectKind, g.id) { // a member joined or left: the project has moved
		g.refuseNotOwner(ctx, m)
		return
	}
	if m.ClientId != "" && g.waitForHold(ctx, m, now) {
		return // answered once the window is back
	}
	replyTo := actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId())
	ans := &clusterpb.ProjectTaken{Id: m.Id}
	g.answers.remember(m.Id, now, ans)
	if m.ClientId != "" {
		g.clientTake(m, now, ans)
	}
	if m.ProjectLimit > 0 && !ans.ClientDenied { // a lease ask (refresh: of no units)
		want := int(m.Lease)
		if want == 0 && !m.Refresh && !m.ClientOnly {
			want = 1 // an older node's ask, for the emit that asks
		}
		budget, n := g.backstop.lease(now, int(m.ProjectLimit), want)
		ans.Leased, ans.Project, ans.ProjectDenied, ans.Leases = int32(n), budgetToProto(budget), want > 0 && n == 0, true
		ans.ResetInNanos = int64(budget.ResetAt.Sub(now))
	}
	g.c.send(ctx, replyTo, ans)
}

// dormant: the windows ran out and no answer is remembered (quietTick
// lapses the holds that ended, and answers their waiting asks, first).
func (g *projectGrain) dormant() bool {
	now := g.cfg.Now()
	g.answers.forget(now)
	return g.backstop.idle(now) && g.clients.idle(now) && len(g.holds) == 0 && g.answers.len() == 0
}

// state is what a project grain hands to the project's next owner.
func (g *projectGrain) state() *clusterpb.ProjectState {
	now := g.cfg.Now()
	g.answers.forget(now)
	g.lapseHolds(nil, now) // the asks waiting for them are asked again of the next owner
	st := &clusterpb.ProjectState{ProjectId: g.id, WindowStartUnixNano: g.backstop.start.UnixNano(), WindowCount: int32(g.backstop.count)}
	for id, w := range g.clients {
		if !w.idle(now) {
			st.Clients = append(st.Clients, &clusterpb.ClientWindow{ClientId: id, StartUnixNano: w.start.UnixNano(), Count: int32(w.count)})
		}
	}
	for id, h := range g.holds { // the asks waiting for a recall are asked again of the next owner
		if h.holder != nil {
			st.Clients = append(st.Clients, &clusterpb.ClientWindow{ClientId: id, Holder: h.holder, HoldId: h.id,
				HoldLeftNanos: int64(h.until.Sub(now)), Count: int32(h.limit)})
		}
	}
	g.answers.each(func(id string, at time.Time, ans *clusterpb.ProjectTaken) {
		st.Answered = append(st.Answered, &clusterpb.AnsweredTake{Id: id, AtUnixNano: at.UnixNano(), Answer: ans})
	})
	return st
}

// adopt adds a former owner's counts to this grain's: usually it has just
// started; if it has counted already (an ask reached it first), the counts
// of the same window add up.
func (g *projectGrain) adopt(ctx actor.Context, st *clusterpb.ProjectState) {
	g.backstop.merge(time.Unix(0, st.WindowStartUnixNano), int(st.WindowCount))
	var holds []*clusterpb.ClientWindow
	for _, cw := range st.Clients {
		if cw.Holder != nil { // a hold, after the windows: count is the clientId's limit
			holds = append(holds, cw)
			continue
		}
		g.clientWindow(cw.ClientId).merge(time.Unix(0, cw.StartUnixNano), int(cw.Count))
	}
	for _, cw := range holds {
		g.adoptHold(ctx, cw)
	}
	g.noHoldsUntil = time.Time{}
	for _, a := range st.Answered {
		if a.Answer != nil {
			g.answers.adopt(a.Id, time.Unix(0, a.AtUnixNano), a.Answer)
		}
	}
	g.answers.resort()
}
