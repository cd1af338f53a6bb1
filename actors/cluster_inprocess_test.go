package actors

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A cluster member's whole emit path in one actor system, with no remote:
// the edge, the project actor with its lease of the backstop, the channel
// relay, and the project's and the channel's grains, found through the
// placement's local lookup. Run in testing/synctest bubbles, under -race,
// so that the lease's timing rules are checked to the nanosecond.

// inProcessNode is projectNode with the grains found in its own actor
// system. The project grain sits behind a proxy that counts the asks it
// forwards (renewals of a hold included) and the releases, and drops both
// while frozen (its node stopped).
type inProcessNode struct {
	c          *Cluster
	asks       atomic.Int64
	clientAsks atomic.Int64 // of them, a client emit's (rule 6) or a hold's renewal
	releases   atomic.Int64 // holds given back
	frozen     atomic.Bool
	grains     startedGrains
}

func newInProcessNode(t *testing.T, cfg Config) *inProcessNode {
	t.Helper()
	sys := newTestSystem(t, cfg)
	sys.as.ProcessRegistry.Address = "127.0.0.1:1"
	n := &inProcessNode{c: newTestCluster(t, sys, nil)}
	c := n.c
	c.topology(projectTopology(c))
	c.moves.joinedAt.Store(time.Now().Add(-time.Hour).UnixNano())
	c.place = &placement{c: c, local: n.grain}
	sys.cluster.Store(c)
	return n
}

// grain is the placement's local lookup: a grain started on first use.
func (n *inProcessNode) grain(kind, identity string) *actor.PID {
	return n.grains.get(kind, identity, func() *actor.PID {
		if kind == ChannelKind {
			return startGrain(n.c, identity)
		}
		real := startProjectGrain(n.c, identity)
		return n.c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
			switch m := ctx.Message().(type) {
			case *clusterpb.ProjectTake:
				if !n.frozen.Load() {
					n.asks.Add(1)
					if m.ClientId != "" {
						n.clientAsks.Add(1)
					}
					ctx.RequestWithCustomSender(real, m, ctx.Sender())
				}
			case *clusterpb.ClientRelease:
				if !n.frozen.Load() {
					n.releases.Add(1)
					ctx.RequestWithCustomSender(real, m, ctx.Sender())
				}
			}
		}))
	})
}

// startedGrains are the grains a test's placement started, by kind and
// identity.
type startedGrains struct {
	mu  sync.Mutex
	pid map[string]*actor.PID
}

// get returns the grain of kind and identity, started by start on first use.
func (g *startedGrains) get(kind, identity string, start func() *actor.PID) *actor.PID {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := kind + "/" + identity
	if pid, ok := g.pid[key]; ok {
		return pid
	}
	if g.pid == nil {
		g.pid = map[string]*actor.PID{}
	}
	g.pid[key] = start()
	return g.pid[key]
}

func (g *startedGrains) has(kind, identity string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.pid[kind+"/"+identity]
	return ok
}

// ownedProjectChannel is a project and a channel whose grains this node owns.
func (n *inProcessNode) ownedProjectChannel(t *testing.T) (string, string) {
	t.Helper()
	project := ownedProject(t, n.c)
	return project, strings.TrimPrefix(owned(t, n.c, ChannelKind, project+"/ch-%d"), project+"/")
}

// emit is an HTTP emit through this node's edge, and how long it took.
func (n *inProcessNode) emit(t *testing.T, project, channel string) (PublishResult, time.Duration) {
	t.Helper()
	began := time.Now()
	res := publishOK(t, n.c.sys, project, channel, []byte(`1`))
	return res, time.Since(began)
}

// publishOK is an HTTP emit through sys's edge, with the edge's 5 s bound;
// one not accepted fails the test.
func publishOK(t *testing.T, sys *System, project, channel string, payload []byte) PublishResult {
	t.Helper()
	res, err := sys.PublishWithin(context.Background(), 5*time.Second, project, channel, payload)
	if err != nil || res.Err != nil {
		t.Fatalf("emit %s on %s/%s: %+v, %v", payload, project, channel, res, err)
	}
	return res
}

// With a backstop of 400 a minute (shares of 8), 20 emits through a node
// ask the project grain 3 times, not 20; each reports the project grain's
// remaining plus the node's unspent share.
func TestInProcessEmitsSpendTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newInProcessNode(t, Config{ProjectRatePerMinute: 400})
		project, channel := n.ownedProjectChannel(t)
		for i := range 20 {
			res, took := n.emit(t, project, channel)
			if took != 0 || res.Seq == 0 || res.Project.Limit != 400 || res.Project.Remaining != 400-(i+1) {
				t.Fatalf("emit %d: %+v after %v; want answered at once, remaining %d", i, res, took, 400-(i+1))
			}
		}
		synctest.Wait()
		// A share of 8 at the first emit, and the next one each time fewer
		// than 4 are left: after emits 5 and 13 (what is left is exact: one node).
		if asks := n.asks.Load(); asks != 3 {
			t.Fatalf("%d asks of the project grain for 20 emits, want 3", asks)
		}
	})
}

// The project grain's node frozen: emits go on with the node's share. An
// emit whose last answer from the grain is over leaseFresh old waits for
// a new one at most publishRetryAfter.
func TestInProcessFrozenProjectGrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newInProcessNode(t, Config{ProjectRatePerMinute: 400})
		project, channel := n.ownedProjectChannel(t)
		n.emit(t, project, channel) // a share of 8, 7 left
		synctest.Wait()
		n.frozen.Store(true)

		if _, took := n.emit(t, project, channel); took != 0 {
			t.Fatalf("an emit on a fresh answer waited %v", took)
		}
		advance(leaseFresh) // the answer is leaseFresh old, not older: spent at once, and a refresh asked (unanswered)
		if _, took := n.emit(t, project, channel); took != 0 {
			t.Fatalf("an emit on an answer leaseFresh old waited %v", took)
		}

		// Thawed, the refresh is resent and answered (and one more, asked
		// by the retry tick after it); frozen again, no ask in flight, and
		// the answer over leaseFresh old: an emit asks, and spends its
		// share when the grain has not answered in publishRetryAfter.
		synctest.Wait() // the refresh reached the frozen grain's proxy before the thaw
		n.frozen.Store(false)
		advance(2*publishRetryAfter + time.Nanosecond) // + 1 ns: the test wakes after the second tick, not with it
		if asks := n.asks.Load(); asks != 3 {
			t.Fatalf("%d asks reached the grain, want 3: the first share, the refresh sent again, the tick's refresh", asks)
		}
		n.frozen.Store(true)
		advance(leaseFresh + time.Nanosecond)
		res, took := n.emit(t, project, channel)
		if took != publishRetryAfter || res.Project.Remaining != 400-4 { // the grain's 392 and 4 of the share left
			t.Fatalf("an emit on an old answer, the grain frozen: answered after %v, remaining %d; want %v and 396",
				took, res.Project.Remaining, publishRetryAfter)
		}
	})
}
