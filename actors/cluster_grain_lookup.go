package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// grainLookup is an actor's handle on one grain it sends to (a channel's
// relay on its channel grain, a project actor on its project grain). The
// lookup runs beside the actor, since protoactor's can wait seconds for a
// node that is gone, and its answer comes back as grainResolved. The actor
// watches the grain it uses: its Terminated (the grain stopped, or its node
// went away) starts a new lookup.
type grainLookup struct {
	c         *Cluster
	kind      string
	identity  string
	pid       *actor.PID // nil until resolved
	gen       uint64     // the lookup whose answer counts
	resolving bool
	stale     int // lookups in a row that found the grain off the owner (staleLookups)
	lost      int // lookups in a row whose ask went unanswered (activationWait doubles)
}

// grainResolved carries a grain lookup back into the actor.
type grainResolved struct {
	pid     *actor.PID
	refused bool // the owner asked answered that it does not own the grain
	lost    bool // the owner asked did not answer in time (activationWait)
	gen     uint64
}

// resolveAgain retries a lookup that found nothing, unless a later one began.
type resolveAgain struct{ gen uint64 }

// resolveRetry: how soon a failed grain lookup is tried again.
const resolveRetry = 500 * time.Millisecond

// A lookup made as the member list changes can find the member it asks
// with another list than this node's: that member refuses to start a grain
// it does not own (placement), or the answer names a grain on a member
// that is not the owner in this node's list by the time it arrives. The
// actor uses neither: it looks again after staleRetry, up to staleLookups
// times (the lists agree again within that), then after resolveRetry, and
// takes a grain off the owner after staleLookups.
const (
	staleRetry   = 50 * time.Millisecond
	staleLookups = 20
)

func (l *grainLookup) resolve(ctx actor.Context) {
	l.gen++
	l.resolving = true
	gen, self, root, place, identity, kind := l.gen, ctx.Self(), ctx.ActorSystem().Root, l.c.place, l.identity, l.kind
	wait := min(activationWait<<min(l.lost, 3), activationWaitMax)
	go func() {
		pid, refused, lost := place.get(kind, identity, wait)
		root.Send(self, &grainResolved{pid: pid, refused: refused, lost: lost, gen: gen})
	}()
}

// resolveOnce starts a lookup unless one is under way.
func (l *grainLookup) resolveOnce(ctx actor.Context) {
	if !l.resolving {
		l.resolve(ctx)
	}
}

// resolved takes a lookup's answer. It reports true when the answer is a
// grain other than the one in use: the actor then sends it what it needs.
// A lookup that found nothing (no member hosts the kind yet, or the owner
// failed to answer) is tried again after resolveRetry; one the owner
// refused, after staleRetry; one whose request went unanswered, at once (it
// waited activationWait already, and the next waits twice as long).
func (l *grainLookup) resolved(ctx actor.Context, m *grainResolved) bool {
	if m.gen != l.gen {
		return false // a later lookup is under way
	}
	l.resolving = false
	if !m.lost {
		l.lost = 0
	}
	switch {
	case m.pid == nil && m.refused && l.stale < staleLookups:
		l.stale++ // the owner asked has another member list than this node
		l.again(ctx, m.gen, staleRetry)
		return false
	case m.pid == nil && m.lost:
		l.lost++
		l.resolve(ctx)
		return false
	case m.pid == nil:
		l.again(ctx, m.gen, resolveRetry)
		return false
	}
	if owner := l.c.ownerAddress(l.kind, l.identity); owner != "" && m.pid.Address != owner && l.stale < staleLookups {
		l.stale++ // the member list changed while the lookup ran
		l.again(ctx, m.gen, staleRetry)
		return false
	}
	l.stale = 0
	if l.pid != nil && l.pid.Equal(m.pid) {
		return false
	}
	if l.pid != nil {
		ctx.Unwatch(l.pid)
	}
	l.pid = m.pid
	ctx.Watch(l.pid)
	return true
}

// again schedules lookup gen once more after d (as resolveAgain).
func (l *grainLookup) again(ctx actor.Context, gen uint64, d time.Duration) {
	l.resolving = true
	sendLater(ctx, d, &resolveAgain{gen: gen})
}

// retry runs a scheduled lookup, unless a later one began meanwhile.
func (l *grainLookup) retry(ctx actor.Context, m *resolveAgain) {
	if m.gen == l.gen {
		l.resolve(ctx)
	}
}

// moved: the member list changed; look again if the grain has a new owner.
func (l *grainLookup) moved(ctx actor.Context) {
	if l.pid == nil || l.c.ownerAddress(l.kind, l.identity) != l.pid.Address {
		l.lost = 0 // asks of another owner, or of one restarted: a short wait again
		l.resolve(ctx)
	}
}

// terminated handles a Terminated: if it is the grain's, look again.
func (l *grainLookup) terminated(ctx actor.Context, who *actor.PID) bool {
	if l.pid == nil || !who.Equal(l.pid) {
		return false
	}
	l.pid, l.lost = nil, 0
	l.resolve(ctx)
	return true
}

func (l *grainLookup) stop(ctx actor.Context) {
	if l.pid != nil {
		ctx.Unwatch(l.pid) // a long-lived grain would keep the watch
	}
}
