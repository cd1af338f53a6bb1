package actors

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	gproto "google.golang.org/protobuf/proto"

	"github.com/relayhq/relay/proto/clusterpb"
)

// The project grain without a cluster, driven by hand as the channel
// grains are (cluster_move_test.go): its leases of the backstop, the
// clientId windows, repeats answered from memory, and its state handed to
// the project's next owner. These run with -race.

// projectNode is a member of two (127.0.0.1:1, this one, and :2) that
// joined long ago, on the clock now.
func projectNode(t *testing.T, now func() time.Time) *Cluster {
	t.Helper()
	sys := newTestSystem(t, Config{Now: now})
	sys.as.ProcessRegistry.Address = "127.0.0.1:1"
	c := newTestCluster(t, sys, nil)
	c.topology(projectTopology(c))
	c.moves.joinedAt.Store(time.Now().Add(-time.Hour).UnixNano())
	return c
}

// projectTopology is c (127.0.0.1:1) and another member (:2), each hosting both kinds.
func projectTopology(c *Cluster) *pcluster.ClusterTopology {
	kinds := []string{ChannelKind, ProjectKind}
	return &pcluster.ClusterTopology{Members: []*pcluster.Member{
		{Id: c.self, Host: "127.0.0.1", Port: 1, Kinds: kinds},
		{Id: "t@other", Host: "127.0.0.1", Port: 2, Kinds: kinds},
	}}
}

// ownedProject is a project whose grain this node owns.
func ownedProject(t *testing.T, c *Cluster) string {
	t.Helper()
	return owned(t, c, ProjectKind, "proj-%d")
}

// startProjectGrain starts a project grain as a move starts it, with its
// predecessor's state (empty): it lends clientId windows at once.
func startProjectGrain(c *Cluster, id string) *actor.PID {
	pid := startFreshProjectGrain(c, id)
	c.sys.root.Send(pid, &clusterpb.ProjectState{ProjectId: id})
	return pid
}

// startFreshProjectGrain starts a project grain with no predecessor's state.
func startFreshProjectGrain(c *Cluster, id string) *actor.PID {
	pid := c.sys.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return newProjectGrain(c) }))
	c.sys.root.Send(pid, &pcluster.ClusterInit{Identity: &pcluster.ClusterIdentity{Kind: ProjectKind, Identity: id}})
	return pid
}

// budgetAsker stands for one node's project actor: take sends an ask and
// returns the grain's answer.
type budgetAsker struct {
	t       *testing.T
	c       *Cluster
	grain   *actor.PID
	pid     *actor.PID
	got     chan *clusterpb.ProjectTaken
	recalls chan *clusterpb.ClientRecall // the grain's recalls of a hold
}

func newBudgetAsker(t *testing.T, c *Cluster, grain *actor.PID) *budgetAsker {
	b := &budgetAsker{t: t, c: c, grain: grain, got: make(chan *clusterpb.ProjectTaken, 16), recalls: make(chan *clusterpb.ClientRecall, 4)}
	b.pid = c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *clusterpb.ProjectTaken:
			b.got <- m
		case *clusterpb.ClientRecall:
			b.recalls <- m
		}
	}))
	return b
}

// send sends an ask without waiting for its answer.
func (b *budgetAsker) send(m *clusterpb.ProjectTake) {
	m.ReplyTo = ref(b.pid)
	sendFrom(b.c, b.grain, b.pid, m)
}

func (b *budgetAsker) take(m *clusterpb.ProjectTake) *clusterpb.ProjectTaken {
	b.t.Helper()
	b.send(m)
	select {
	case ans := <-b.got:
		if ans.Id != m.Id {
			b.t.Fatalf("answer to %s, want %s", ans.Id, m.Id)
		}
		return ans
	case <-time.After(2 * time.Second):
		b.t.Fatalf("no answer to %s", m.Id)
		return nil
	}
}

// lease asks for want units (0: a refresh) of a backstop of 20.
func lease(id string, want int32) *clusterpb.ProjectTake {
	return &clusterpb.ProjectTake{Id: id, ProjectLimit: 20, Lease: want, Refresh: want == 0}
}

func TestProjectGrainLeases(t *testing.T) {
	var clock atomic.Int64
	t0 := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	clock.Store(t0.UnixNano())
	c := projectNode(t, func() time.Time { return time.Unix(0, clock.Load()) })
	grain := startProjectGrain(c, ownedProject(t, c))
	asker := newBudgetAsker(t, c, grain)
	minute := t0.Truncate(time.Minute).Add(time.Minute)
	check := func(what string, ans *clusterpb.ProjectTaken, leased, remaining int32, denied bool) {
		t.Helper()
		w := ans.GetProject()
		if ans.Error != "" || !ans.Leases || ans.Leased != leased || ans.ProjectDenied != denied || w.GetLimit() != 20 ||
			w.GetRemaining() != remaining || w.GetResetAtUnixNano() != minute.UnixNano() ||
			ans.ResetInNanos != int64(minute.Sub(time.Unix(0, clock.Load()))) {
			t.Fatalf("%s: %v; want leased %d, remaining %d, denied %v, the window ending %v", what, ans, leased, remaining, denied, minute)
		}
	}

	first := asker.take(lease("n1#1", 8))
	check("a share of 8", first, 8, 12, false)
	dupes := c.duplicates.Load()
	if again := asker.take(lease("n1#1", 8)); !gproto.Equal(again, first) || c.duplicates.Load() != dupes+1 {
		t.Fatalf("a repeat answered %v, want the first answer %v, counted as a duplicate", again, first)
	}
	check("the next share", asker.take(lease("n1#2", 8)), 8, 4, false)
	check("what is left", asker.take(lease("n1#3", 8)), 4, 0, false)
	check("nothing left", asker.take(lease("n1#4", 8)), 0, 0, true)
	check("a refresh", asker.take(lease("n1#5", 0)), 0, 0, false)

	// The next minute: an older node's ask is a lease of one unit, one
	// refused after rule 7 (client_only) takes none.
	clock.Store(t0.Add(55 * time.Second).UnixNano())
	minute = minute.Add(time.Minute)
	check("an older node's ask", asker.take(&clusterpb.ProjectTake{Id: "old#1", ProjectLimit: 20}), 1, 19, false)
	check("an older node's client_only ask", asker.take(&clusterpb.ProjectTake{Id: "old#2", ProjectLimit: 20, ClientOnly: true}), 0, 19, false)

	// A clientId's window (rule 6): 2 a second here. A client ask of this
	// version carries no backstop; an older one refused at rule 6 takes no unit.
	for i, denied := range []bool{false, false, true} {
		ans := asker.take(&clusterpb.ProjectTake{Id: fmt.Sprintf("c#%d", i), ClientId: "u1", ClientLimit: 2})
		if ans.ClientDenied != denied || ans.Project != nil || ans.Leased != 0 {
			t.Fatalf("client ask %d: %v; want client_denied %v and no backstop", i, ans, denied)
		}
	}
	if ans := asker.take(&clusterpb.ProjectTake{Id: "old#3", ProjectLimit: 20, ClientId: "u1", ClientLimit: 2}); !ans.ClientDenied || ans.Project != nil {
		t.Fatalf("an older client ask over the clientId's window: %v", ans)
	}
	if ans := asker.take(&clusterpb.ProjectTake{Id: "c#other", ClientId: "u2", ClientLimit: 2}); ans.ClientDenied {
		t.Fatalf("another clientId's window: %v", ans)
	}
	check("the backstop after them", asker.take(lease("n1#6", 8)), 8, 11, false)
}

func TestProjectGrainHandsOver(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	c := projectNode(t, func() time.Time { return at }) // one minute and one second throughout
	id := ownedProject(t, c)
	old := startProjectGrain(c, id)
	asker := newBudgetAsker(t, c, old)
	first := asker.take(&clusterpb.ProjectTake{Id: "n1#1", ProjectLimit: 20, Lease: 8})
	asker.take(&clusterpb.ProjectTake{Id: "c#1", ClientId: "u1", ClientLimit: 1})

	reply := make(chan *clusterpb.ProjectState, 1)
	c.sys.root.Send(old, &freezeProject{reply: reply})
	var st *clusterpb.ProjectState
	select {
	case st = <-reply:
	case <-time.After(2 * time.Second):
		t.Fatal("no state from the frozen grain")
	}
	if st.ProjectId != id || st.WindowCount != 8 || len(st.Clients) != 1 || st.Clients[0].Count != 1 || len(st.Answered) != 2 {
		t.Fatalf("handed state %v; want the 8 units leased, u1's window and both answers", st)
	}
	if ans := asker.take(&clusterpb.ProjectTake{Id: "n1#2", ProjectLimit: 20, Lease: 8}); ans.Error != errNotOwner {
		t.Fatalf("a frozen grain answered %v, want not_owner", ans)
	}

	// The next owner adopts it: a repeat is answered from memory, and the
	// counts go on (8 of 20 leased, u1's window full).
	next := startProjectGrain(c, id)
	c.sys.root.Send(next, st)
	asker.grain = next
	if again := asker.take(&clusterpb.ProjectTake{Id: "n1#1", ProjectLimit: 20, Lease: 8}); !gproto.Equal(again, first) {
		t.Fatalf("a repeat at the next owner answered %v, want %v", again, first)
	}
	if ans := asker.take(&clusterpb.ProjectTake{Id: "n2#1", ProjectLimit: 20, Lease: 8}); ans.Leased != 8 || ans.GetProject().GetRemaining() != 4 {
		t.Fatalf("the next share at the next owner: %v, want 8 leased and 4 left", ans)
	}
	if ans := asker.take(&clusterpb.ProjectTake{Id: "c#2", ClientId: "u1", ClientLimit: 1}); !ans.ClientDenied {
		t.Fatalf("u1's window at the next owner: %v, want it full", ans)
	}
}

// A project grain started on a node that has handed its grains over (a
// lookup between the handoff and the node's deregistration) grants
// nothing: its windows would be empty and handed to no one. It stops at
// once, refusing not_owner what reaches it first, so the asker looks again.
func TestProjectGrainStartedWhileLeavingGrantsNothing(t *testing.T) {
	c := projectNode(t, time.Now)
	c.leaving.Store(true)
	id := ownedProject(t, c)
	grain := startProjectGrain(c, id)
	asker := newBudgetAsker(t, c, grain)
	sendFrom(c, grain, asker.pid, &clusterpb.ProjectTake{Id: "n1#1", ReplyTo: ref(asker.pid), ProjectLimit: 20, Lease: 8})
	gone := make(chan struct{})
	c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch ctx.Message().(type) {
		case *actor.Started:
			ctx.Watch(grain)
		case *actor.Terminated:
			close(gone)
		}
	}))
	select {
	case <-gone:
	case <-time.After(2 * time.Second):
		t.Fatal("a grain started on a leaving node is still running")
	}
	select {
	case ans := <-asker.got:
		if ans.Error != errNotOwner || ans.Leased != 0 {
			t.Fatalf("a grain started on a leaving node answered %v, want not_owner", ans)
		}
	default: // stopped before the ask came: a dead letter, and the asker's watch looks again
	}
	if _, ok := c.projectGrains.Load(id); ok {
		t.Fatal("the grain registered itself on a leaving node")
	}
}
