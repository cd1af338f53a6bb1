package actors

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	gproto "google.golang.org/protobuf/proto"

	"github.com/relayhq/relay/proto/clusterpb"
)

// A clientId's window held by the node its socket is on
// (cluster_client_holds.go): counted there without an ask per emit, and
// exact when another node's emit of that clientId needs it back.

const holdsSecret = "0123456789abcdef0123456789abcdef"

// clientEmitter is one socket subscribed with presence as clientId, and
// its client emits.
type clientEmitter struct {
	t    *testing.T
	k    *sink
	sess *Session
	tok  string
	ch   string
	sent int
}

func newClientEmitter(t *testing.T, sys *System, project, channel, clientID string, id uint64, now time.Time) *clientEmitter {
	t.Helper()
	e := &clientEmitter{t: t, k: &sink{id: id}, ch: channel, tok: mintForTest(t, holdsSecret, project, channel, clientID, now)}
	e.sess = openConn(sys, project, e.k)
	e.sess.HandleMessage(fmt.Appendf(nil, `{"action":"subscribe","channel":%q,"presence":true,"clientId":%q}`, channel, clientID))
	waitFor(t, "subscribe ack", func() bool { return len(e.k.messages(t)) >= 2 }) // the ack and the sync
	return e
}

// emit sends one client emit and returns its answer: "ack" or the error code.
func (e *clientEmitter) emit() string {
	e.t.Helper()
	before := len(e.answers())
	e.sess.HandleMessage(fmt.Appendf(nil, `{"action":"emit","channel":%q,"type":"msg","payload":%d,"token":%q}`, e.ch, e.sent, e.tok))
	e.sent++
	waitFor(e.t, "the emit's answer", func() bool { return len(e.answers()) > before })
	return e.answers()[before]
}

func (e *clientEmitter) answers() []string {
	var out []string
	for _, m := range e.k.messages(e.t) {
		switch {
		case m["action"] == "emit" && m["ok"] == true:
			out = append(out, "ack")
		case m["error"] != nil:
			out = append(out, fmt.Sprint(m["error"]))
		}
	}
	return out
}

func holdsConfig(now func() time.Time) Config {
	return Config{ClientEmitRatePerSecond: 3, Now: now,
		LoadSettings: func(context.Context, string) (Settings, error) { return Settings{ClientEmitSecret: holdsSecret}, nil }}
}

// One node: the first emit asks the grain and gets the window; the rest of
// that second's emits are counted here (the 4th refused, at the limit of
// 3), with no ask. A second later the hold is renewed beside an emit, and
// once the clientId stops emitting it goes back, so the next emit asks.
func TestInProcessClientWindowHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newInProcessNode(t, holdsConfig(time.Now))
		project, channel := n.ownedProjectChannel(t)
		advance(time.Second - time.Duration(time.Now().UnixNano())%time.Second) // the start of a second
		e := newClientEmitter(t, n.c.sys, project, channel, "ann", 1, time.Now())
		for i, want := range []string{"ack", "ack", "ack", "client_emit_rate_limited"} {
			if got := e.emit(); got != want {
				t.Fatalf("emit %d in the first second: %s, want %s", i, got, want)
			}
		}
		if asks := n.clientAsks.Load(); asks != 1 {
			t.Fatalf("%d asks of the project grain for 4 emits, want 1", asks)
		}
		advance(time.Second)
		for i := range 3 {
			if got := e.emit(); got != "ack" {
				t.Fatalf("emit %d in the next second: %s", i, got)
			}
		}
		if asks := n.clientAsks.Load(); asks != 2 {
			t.Fatalf("%d asks after the next second's emits, want 2: the grant and one renewal", asks)
		}
		if r := n.releases.Load(); r != 0 {
			t.Fatalf("%d releases while the hold is used, want 0", r)
		}
		advance(holdFor + time.Second) // unused: given back
		if r := n.releases.Load(); r != 1 {
			t.Fatalf("%d releases of the idle hold, want 1: it goes back unused", r)
		}
		if e.emit(); n.clientAsks.Load() != 3 {
			t.Fatalf("%d asks after an idle hold, want 3: the emit after it asks again", n.clientAsks.Load())
		}
		e.sess.HandleClose(CloseStatus{}) // its presence leaves while the channel runs (no dead letter in the bubble)
		synctest.Wait()
	})
}

// A project grain that started without its predecessor's state lends no
// window for holdFor (a state coming late must find no hold of its own
// beside the handed ones); after that it does.
func TestAFreshProjectGrainLendsNoWindowAtFirst(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 10, 0, time.UTC)
	clock, now := steppedClock(t0)
	c := projectNode(t, now)
	asker := newBudgetAsker(t, c, startFreshProjectGrain(c, ownedProject(t, c)))
	if ans := asker.take(&clusterpb.ProjectTake{Id: "a#1", ClientId: "u1", ClientLimit: 3, Hold: true}); ans.ClientDenied || ans.HoldNanos != 0 {
		t.Fatalf("a fresh grain answered %v, want accepted without a hold", ans)
	}
	clock.Add(int64(holdFor))
	if ans := asker.take(&clusterpb.ProjectTake{Id: "a#2", ClientId: "u1", ClientLimit: 3, Hold: true}); ans.HoldNanos != int64(holdFor) {
		t.Fatalf("after holdFor: %v, want a hold", ans)
	}
}

// Two members: A's socket holds clientId ann's window and fills it (3 of 3,
// two counted on A alone); B's emit of ann recalls the window and is
// refused, then B's and A's next emits ask per emit for a while (contested).
// Without the recall the grain would count 1 and accept B's emit.
func TestTwoMembersRecallAHeldClientWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 10, 0, time.UTC)
	clock, now := steppedClock(t0)
	a, b := twoMembers(t, holdsConfig(now))
	project, channel := b.ownedProjectChannel(t) // the project grain on B
	onA := newClientEmitter(t, a.c.sys, project, channel, "ann", 1, t0)
	onB := newClientEmitter(t, b.c.sys, project, channel, "ann", 2, t0)
	for i := range 3 {
		if got := onA.emit(); got != "ack" {
			t.Fatalf("A's emit %d: %s", i, got)
		}
	}
	if got := onB.emit(); got != "client_emit_rate_limited" {
		t.Fatalf("B's emit after A's 3 in one window: %s, want client_emit_rate_limited", got)
	}
	if got := onA.emit(); got != "client_emit_rate_limited" {
		t.Fatalf("A's 4th emit in the window: %s", got)
	}

	// The next second: 3 again for the cluster, through both members.
	clock.Add(int64(time.Second))
	var got []string
	for _, e := range []*clientEmitter{onB, onA, onB, onA} {
		got = append(got, e.emit())
	}
	if fmt.Sprint(got) != "[ack ack ack client_emit_rate_limited]" {
		t.Fatalf("the next second through B, A, B, A: %v, want three acks, then refused", got)
	}
}

// A holder that does not answer the recall (its node died): the waiting
// emit is answered once the hold has ended on the grain's clock, with the
// window the hold ended in counted as full (the holder may have filled
// it); the window after it is the clientId's again.
func TestTwoMembersHolderGone(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 10, 0, time.UTC)
	clock, now := steppedClock(t0)
	a, b := twoMembers(t, holdsConfig(now))
	project, channel := b.ownedProjectChannel(t)
	onA := newClientEmitter(t, a.c.sys, project, channel, "ann", 1, t0)
	onB := newClientEmitter(t, b.c.sys, project, channel, "ann", 2, t0)
	if got := onA.emit(); got != "ack" {
		t.Fatalf("A's emit: %s", got)
	}
	a.crash(b)
	onB.sess.HandleMessage(fmt.Appendf(nil, `{"action":"emit","channel":%q,"type":"msg","payload":1,"token":%q}`, channel, onB.tok))
	<-time.After(3 * publishRetryAfter) // asked again and again: it waits for the recall
	if ans := onB.answers(); len(ans) != 0 {
		t.Fatalf("B's emit answered %v while A's hold lasts", ans)
	}
	clock.Add(int64(holdFor)) // the hold ends, in the window of t0+2s
	waitFor(t, "B's emit answered", func() bool { return len(onB.answers()) == 1 })
	if ans := onB.answers()[0]; ans != "client_emit_rate_limited" {
		t.Fatalf("B's emit in the window A's hold ended in: %s, want client_emit_rate_limited", ans)
	}
	clock.Add(int64(time.Second))
	if got := onB.emit(); got != "ack" {
		t.Fatalf("B's emit in the window after: %s", got)
	}
}

// A hold moves with the project grain's state: the next owner recalls it
// from its holder at once, and answers no ask of that clientId, the
// holder's own included, before the window is back.
func TestProjectGrainHandsAHoldOver(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	c := projectNode(t, func() time.Time { return at })
	id := ownedProject(t, c)
	holder, st := heldAndHanded(t, c, id)
	next := startProjectGrain(c, id)
	c.sys.root.Send(next, st)

	var r *clusterpb.ClientRecall
	select {
	case r = <-holder.recalls: // before any ask
	case <-time.After(2 * time.Second):
		t.Fatal("the next owner did not recall the hold it was handed")
	}
	if r.ClientId != "u1" || r.HoldId != "a#1" {
		t.Fatalf("recall %v", r)
	}
	other := newBudgetAsker(t, c, next)
	other.send(&clusterpb.ProjectTake{Id: "b#1", ClientId: "u1", ClientLimit: 3, Hold: true})
	holder.grain = next
	holder.send(&clusterpb.ProjectTake{Id: "a#2", ClientId: "u1", ClientLimit: 3, Hold: true})
	select {
	case ans := <-other.got:
		t.Fatalf("the other node's ask answered %v before the window came back", ans)
	case ans := <-holder.got:
		t.Fatalf("the holder's own ask answered %v before its window came back", ans)
	case <-time.After(100 * time.Millisecond):
	}
	// The holder counted 2 more: the other node's ask finds 3 of 3.
	sendFrom(c, next, holder.pid, &clusterpb.ClientRelease{Relay: ref(holder.pid), HoldId: "a#1",
		Window: &clusterpb.ClientWindow{ClientId: "u1", StartUnixNano: at.Truncate(time.Second).UnixNano(), Count: 2}})
	for name, asker := range map[string]*budgetAsker{"the other node's": other, "the holder's": holder} {
		select {
		case ans := <-asker.got:
			if !ans.ClientDenied || ans.HoldNanos != 0 {
				t.Fatalf("%s ask after the release: %v, want refused, and no hold", name, ans)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%s ask not answered after the release", name)
		}
	}
}

// A node's second ask, sent before the grant of its first came back,
// reaches the grain after another node's ask made it recall the hold: the
// answer to it carries no hold, so the node, having given the hold back,
// counts no emit itself (the grain alone knows the count).
func TestPipelinedAskAfterARecall(t *testing.T) {
	at := time.Date(2026, 11, 28, 12, 0, 10, 100*int(time.Millisecond), time.UTC)
	sys := newTestSystem(t, holdsConfig(func() time.Time { return at }))
	sys.as.ProcessRegistry.Address = "127.0.0.1:1"
	n := &inProcessNode{c: newTestCluster(t, sys, nil)}
	c := n.c
	c.topology(projectTopology(c))
	c.moves.joinedAt.Store(time.Now().Add(-time.Hour).UnixNano())
	var other *budgetAsker
	var mu sync.Mutex
	var held []*clusterpb.ProjectTake
	c.place = &placement{c: c, local: func(kind, identity string) *actor.PID {
		return n.grains.get(kind, identity, func() *actor.PID {
			if kind == ChannelKind {
				return startGrain(n.c, identity)
			}
			real := startProjectGrain(n.c, identity)
			other = newBudgetAsker(t, c, real)
			// The node's first two client asks are held, then sent with
			// the other node's ask between them.
			return n.c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
				switch m := ctx.Message().(type) {
				case *clusterpb.ProjectTake:
					mu.Lock()
					defer mu.Unlock()
					if m.ClientId == "" || len(held) >= 2 {
						ctx.RequestWithCustomSender(real, m, ctx.Sender())
						return
					}
					if held = append(held, m); len(held) == 2 {
						ctx.RequestWithCustomSender(real, held[0], ctx.Sender())
						other.send(&clusterpb.ProjectTake{Id: "b#1", ClientId: "ann", ClientLimit: 3, Hold: true})
						ctx.RequestWithCustomSender(real, held[1], ctx.Sender())
					}
				case *clusterpb.ClientRelease:
					ctx.RequestWithCustomSender(real, m, ctx.Sender())
				}
			}))
		})
	}}
	sys.cluster.Store(c)
	project, channel := n.ownedProjectChannel(t)
	e := newClientEmitter(t, sys, project, channel, "ann", 1, at)
	for i := range 2 {
		e.sess.HandleMessage(fmt.Appendf(nil, `{"action":"emit","channel":%q,"type":"msg","payload":%d,"token":%q}`, e.ch, i, e.tok))
		e.sent++
	}
	waitFor(t, "the node's two answers", func() bool { return len(e.answers()) == 2 })
	var b *clusterpb.ProjectTaken
	select {
	case b = <-other.got:
	case <-time.After(2 * time.Second):
		t.Fatal("the other node's ask not answered")
	}
	third := e.emit()
	accepted := 0
	for _, ans := range append(e.answers(), map[bool]string{false: "ack", true: "refused"}[b.ClientDenied]) {
		if ans == "ack" {
			accepted++
		}
	}
	if accepted != 3 || third != "client_emit_rate_limited" {
		t.Fatalf("the node's %v and the other's (denied %v): %d accepted in one window of 3", e.answers(), b.ClientDenied, accepted)
	}
}

// A release that reaches the grain after it handed its state on is not
// counted there: the holder sends it again to the next owner, or answers
// that owner's recall with it, and the count is whole.
func TestAReleaseToAFrozenGrainCountsAtTheNext(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	c := projectNode(t, func() time.Time { return at })
	id := ownedProject(t, c)
	holder, st := heldAndHanded(t, c, id)
	old := holder.grain
	// The holder counted 2 itself, and gives the hold back to the grain it knows.
	release := &clusterpb.ClientRelease{Relay: ref(holder.pid), HoldId: "a#1",
		Window: &clusterpb.ClientWindow{ClientId: "u1", StartUnixNano: at.Truncate(time.Second).UnixNano(), Count: 2}}
	sendFrom(c, old, holder.pid, release)
	next := startProjectGrain(c, id)
	c.sys.root.Send(next, st)
	other := newBudgetAsker(t, c, next)
	other.send(&clusterpb.ProjectTake{Id: "b#1", ClientId: "u1", ClientLimit: 3, Hold: true})
	select {
	case <-holder.recalls: // the next owner recalls what the frozen grain was told
	case <-time.After(2 * time.Second):
		t.Fatal("no recall from the next owner")
	}
	sendFrom(c, next, holder.pid, release) // as recall() answers a hold given back
	select {
	case ans := <-other.got:
		if !ans.ClientDenied {
			t.Fatalf("the 4th emit of a window of 3 accepted: %v", ans)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the other node's ask not answered")
	}
}

// A hold that is never given back and that no ask waits for ends on the
// grain's clock, the window it ended in counted as full (the same check
// lets the grain go dormant): it is not handed on past its end.
func TestAnAbandonedHoldEnds(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	clock, now := steppedClock(t0)
	c := projectNode(t, now)
	id := ownedProject(t, c)
	grain := startProjectGrain(c, id)
	holder := newBudgetAsker(t, c, grain)
	holder.take(&clusterpb.ProjectTake{Id: "a#1", ClientId: "u1", ClientLimit: 3, Hold: true})
	clock.Add(int64(holdFor))
	st := freezeGrain(t, c, grain)
	for _, cw := range st.Clients {
		if cw.Holder != nil {
			t.Fatalf("a hold past its end handed on: %v", cw)
		}
	}
	if len(st.Clients) != 1 || st.Clients[0].Count != 3 || st.Clients[0].StartUnixNano != t0.Add(holdFor).Truncate(time.Second).UnixNano() {
		t.Fatalf("handed %v, want u1's window of the hold's end, full", st.Clients)
	}
}

// A recall of a hold the node has given back already (its release went to
// a grain that had handed its state on, whose successor recalls the hold)
// is answered with that release again, count and all, not an empty one.
func TestARecallOfAHoldGivenBackGetsItsRelease(t *testing.T) {
	at := time.Date(2026, 11, 28, 12, 0, 10, 100*int(time.Millisecond), time.UTC)
	sys := newTestSystem(t, holdsConfig(func() time.Time { return at }))
	sys.as.ProcessRegistry.Address = "127.0.0.1:1"
	n := &inProcessNode{c: newTestCluster(t, sys, nil)}
	c := n.c
	c.topology(projectTopology(c))
	c.moves.joinedAt.Store(time.Now().Add(-time.Hour).UnixNano())
	holdIDs := make(chan string, 4)
	c.place = &placement{c: c, local: func(kind, identity string) *actor.PID {
		return n.grains.get(kind, identity, func() *actor.PID {
			if kind == ChannelKind {
				return startGrain(n.c, identity)
			}
			real := startProjectGrain(n.c, identity)
			return n.c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
				if m, ok := ctx.Message().(*clusterpb.ProjectTake); ok && m.ClientId != "" && m.Hold {
					holdIDs <- m.Id
				}
				if _, ok := ctx.Message().(*actor.Started); !ok {
					ctx.RequestWithCustomSender(real, ctx.Message(), ctx.Sender())
				}
			}))
		})
	}}
	sys.cluster.Store(c)
	project, channel := n.ownedProjectChannel(t)
	e := newClientEmitter(t, sys, project, channel, "ann", 1, at)
	for i := range 3 {
		if got := e.emit(); got != "ack" {
			t.Fatalf("emit %d: %s", i, got)
		}
	}
	holdID := <-holdIDs
	releases := make(chan *clusterpb.ClientRelease, 4)
	recaller := sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(*clusterpb.ClientRelease); ok {
			releases <- m
		}
	}))
	v, _ := sys.projects.Load(project)
	for _, what := range []string{"the recall", "a second recall, of the hold given back"} {
		sys.root.RequestWithCustomSender(v.(*projectRef).pid, &clusterpb.ClientRecall{ClientId: "ann", HoldId: holdID}, recaller)
		select {
		case r := <-releases:
			if r.HoldId != holdID || r.GetWindow().GetCount() != 2 || r.GetWindow().GetStartUnixNano() != at.Truncate(time.Second).UnixNano() {
				t.Fatalf("%s answered %v, want the 2 emits the node counted itself", what, r)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%s not answered", what)
		}
	}
}

// A release that reaches the next grain before the previous one's state
// (a join: the holder found the new grain first) is kept, and counted when
// the state names its hold: the holder's next ask finds the whole count.
func TestAReleaseBeforeTheStateCounts(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	c := projectNode(t, func() time.Time { return at })
	id := ownedProject(t, c)
	holder, st := heldAndHanded(t, c, id)
	next := startFreshProjectGrain(c, id)
	sendFrom(c, next, holder.pid, &clusterpb.ClientRelease{Relay: ref(holder.pid), HoldId: "a#1",
		Window: &clusterpb.ClientWindow{ClientId: "u1", StartUnixNano: at.Truncate(time.Second).UnixNano(), Count: 2}})
	c.sys.root.Send(next, st)
	holder.grain = next
	if ans := holder.take(&clusterpb.ProjectTake{Id: "a#2", ClientId: "u1", ClientLimit: 3, Hold: true}); !ans.ClientDenied {
		t.Fatalf("the 4th emit of a window of 3 accepted: %v", ans)
	}
}

// A state that comes later than holdFor after its grain started, naming a
// hold beside one that grain has lent since: both nodes may have counted
// the same seconds. Both holds are recalled, and the clientId is refused
// until the second the handed hold ends in is over, in this second too;
// then it is the clientId's again.
func TestALateStateBesideAHoldOfTheGrains(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 10, 300*int(time.Millisecond), time.UTC)
	clock, now := steppedClock(at)
	c := projectNode(t, now)
	id := ownedProject(t, c)
	a, st := heldAndHanded(t, c, id)
	next := startFreshProjectGrain(c, id)
	b := newBudgetAsker(t, c, next)
	b.take(&clusterpb.ProjectTake{Id: "b#0", ClientId: "u2", ClientLimit: 3}) // the grain has started
	clock.Add(int64(holdFor))                                                 // 12.3: the handed hold has about holdFor left when it comes
	if ans := b.take(&clusterpb.ProjectTake{Id: "b#1", ClientId: "u1", ClientLimit: 3, Hold: true}); ans.HoldNanos <= 0 {
		t.Fatalf("b#1 after holdFor: %v, want a hold", ans)
	}
	c.sys.root.Send(next, st)
	for who, recalls := range map[string]chan *clusterpb.ClientRecall{"the handed holder": a.recalls, "the grain's own holder": b.recalls} {
		select {
		case <-recalls:
		case <-time.After(2 * time.Second):
			t.Fatalf("%s not recalled", who)
		}
	}
	other := newBudgetAsker(t, c, next)
	for i, d := range []time.Duration{0, holdFor} { // this second (12), and the one the handed hold ends in (14)
		if ans := other.take(&clusterpb.ProjectTake{Id: fmt.Sprintf("c#%d", i), ClientId: "u1", ClientLimit: 3}); !ans.ClientDenied {
			t.Fatalf("an ask %v after the state: %v, want refused", d, ans)
		}
		clock.Add(int64(holdFor))
	}
	if ans := other.take(&clusterpb.ProjectTake{Id: "c#2", ClientId: "u1", ClientLimit: 3}); ans.ClientDenied {
		t.Fatalf("an ask after the handed hold's second: %v, want accepted", ans)
	}
}

// The answer to a node's first ask (granting the hold, count 1) is lost;
// its second ask, sent before, is answered "held, count 2". The retry of
// the first is answered from the grain's memory (count 1): the node keeps
// the higher count, and accepts no more than the limit.
func TestAStaleRepeatKeepsTheHeldCount(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 10, 0, time.UTC)
	clock, now := steppedClock(t0)
	sys := newTestSystem(t, holdsConfig(now))
	sys.as.ProcessRegistry.Address = "127.0.0.1:1"
	n := &inProcessNode{c: newTestCluster(t, sys, nil)}
	c := n.c
	c.topology(projectTopology(c))
	c.moves.joinedAt.Store(time.Now().Add(-time.Hour).UnixNano())
	var dropped, passed atomic.Int32 // answers with a window: the first dropped, the others passed on
	var node atomic.Pointer[actor.PID]
	c.place = &placement{c: c, local: func(kind, identity string) *actor.PID {
		return n.grains.get(kind, identity, func() *actor.PID {
			if kind == ChannelKind {
				return startGrain(n.c, identity)
			}
			real := startProjectGrain(n.c, identity)
			// Between the node and the grain both ways: the answer to the
			// node's first client ask is lost.
			return n.c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
				self := ref(ctx.Self())
				switch m := ctx.Message().(type) {
				case *clusterpb.ProjectTake:
					node.Store(actor.NewPID(m.ReplyTo.Address, m.ReplyTo.Id))
					cp := gproto.Clone(m).(*clusterpb.ProjectTake)
					cp.ReplyTo = self
					ctx.RequestWithCustomSender(real, cp, ctx.Self())
				case *clusterpb.ClientRelease:
					cp := gproto.Clone(m).(*clusterpb.ClientRelease)
					cp.Relay = self
					ctx.RequestWithCustomSender(real, cp, ctx.Self())
				case *clusterpb.ProjectTaken:
					if m.ClientWindow != nil && dropped.CompareAndSwap(0, 1) {
						return
					}
					ctx.Send(node.Load(), m)
					if m.ClientWindow != nil {
						passed.Add(1)
					}
				case *clusterpb.ClientRecall:
					ctx.RequestWithCustomSender(node.Load(), m, ctx.Self())
				}
			}))
		})
	}}
	sys.cluster.Store(c)
	project, channel := n.ownedProjectChannel(t)
	e := newClientEmitter(t, sys, project, channel, "ann", 1, t0)
	for i := range 2 {
		e.sess.HandleMessage(fmt.Appendf(nil, `{"action":"emit","channel":%q,"type":"msg","payload":%d,"token":%q}`, e.ch, i, e.tok))
		e.sent++
	}
	waitFor(t, "a#1's lost answer", func() bool { return dropped.Load() == 1 })
	waitFor(t, "a#2's answer", func() bool { return passed.Load() == 1 })
	clock.Add(int64(400 * time.Millisecond)) // the budget tick retries a#1: answered from memory
	waitFor(t, "the node's two answers", func() bool { return len(e.answers()) == 2 })
	e.emit()
	e.emit()
	accepted := 0
	for _, a := range e.answers() {
		if a == "ack" {
			accepted++
		}
	}
	if accepted > 3 {
		t.Fatalf("%v: %d accepted in one window of 3", e.answers(), accepted)
	}
}

// freezeGrain freezes a project grain and returns the state it hands on.
func freezeGrain(t *testing.T, c *Cluster, grain *actor.PID) *clusterpb.ProjectState {
	t.Helper()
	reply := make(chan *clusterpb.ProjectState, 1)
	c.sys.root.Send(grain, &freezeProject{reply: reply})
	select {
	case st := <-reply:
		return st
	case <-time.After(2 * time.Second):
		t.Fatal("no state from the frozen grain")
		return nil
	}
}

// steppedClock is a clock at t0 that a test moves (clock.Add).
func steppedClock(t0 time.Time) (clock *atomic.Int64, now func() time.Time) {
	clock = &atomic.Int64{}
	clock.Store(t0.UnixNano())
	return clock, func() time.Time { return time.Unix(0, clock.Load()) }
}

// heldAndHanded starts project id's grain, where holder's ask a#1 gets
// clientId u1's window (limit 3, 1 counted), then freezes the grain and
// returns the state it hands on, the hold in it.
func heldAndHanded(t *testing.T, c *Cluster, id string) (holder *budgetAsker, st *clusterpb.ProjectState) {
	t.Helper()
	holder = newBudgetAsker(t, c, startProjectGrain(c, id))
	ans := holder.take(&clusterpb.ProjectTake{Id: "a#1", ClientId: "u1", ClientLimit: 3, Hold: true})
	if ans.HoldNanos != int64(holdFor) || ans.GetClientWindow().GetCount() != 1 || ans.GetClientWindow().GetHoldId() != "a#1" {
		t.Fatalf("a hold ask answered %v, want the window (1 counted) held for %v", ans, holdFor)
	}
	return holder, freezeGrain(t, c, holder.grain)
}
