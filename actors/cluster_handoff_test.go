package actors

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// handoffReceiver stands for the other member's node actor (127.0.0.1:2) in
// this node's own actor system: messages to that address reach it, and it
// acks each GrainHandoff as a node actor does, noting when it came.
type handoffReceiver struct {
	got []receivedHandoff
}

type receivedHandoff struct {
	at time.Time
	h  *clusterpb.GrainHandoff
}

func newHandoffReceiver(t *testing.T, c *Cluster) *handoffReceiver {
	r := &handoffReceiver{}
	pid := c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if h, ok := ctx.Message().(*clusterpb.GrainHandoff); ok {
			r.got = append(r.got, receivedHandoff{at: time.Now(), h: h})
			ctx.Respond(&clusterpb.GrainHandoffAck{Taken: int32(len(h.Grains))})
		}
	}))
	process, _ := c.sys.as.ProcessRegistry.GetLocal(pid.Id)
	c.sys.as.ProcessRegistry.RegisterAddressResolver(func(to *actor.PID) (actor.Process, bool) {
		return process, to.Address == "127.0.0.1:2"
	})
	return r
}

// neverAnswers is an actor that takes every message and answers none: a
// grain that stopped, or is stuck, as a freeze finds it. (A PID of a
// stopped actor would do, but its dead letter starts protoactor's log
// throttle, a goroutine that would outlive the synctest bubble.)
func neverAnswers(c *Cluster) *actor.PID {
	return c.sys.root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
}

// A handoff (a graceful stop, or a join) sends the project states as soon
// as they are in, and the channel states once every channel grain answered
// its freeze, or freezeTimeout passed (one never will). It counts what it
// handed and what it could not, and stops the project grains. In a
// testing/synctest bubble.
func TestHandOverSendsProjectStatesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := projectNode(t, time.Now)
		got := newHandoffReceiver(t, c)
		live := startGrain(c, ownedChannel(t, c, "live"))
		stuck := neverAnswers(c) // as a grain that stopped meanwhile, without a dead letter
		projectID := ownedProject(t, c)
		startProjectGrain(c, projectID)
		synctest.Wait()

		began := time.Now()
		f := c.freeze([]*actor.PID{live, stuck}, func(string) bool { return true })
		st := c.handOver(context.Background(), f, c.view.Load().others)

		if len(got.got) != 2 {
			t.Fatalf("the other member got %d messages, want 2: the project states, then the channel states", len(got.got))
		}
		first, second := got.got[0], got.got[1]
		if first.at != began || len(first.h.Projects) != 1 || len(first.h.Grains) != 0 {
			t.Errorf("first message %v after %v, want the project state at once", first.h, first.at.Sub(began))
		}
		if second.at != began.Add(freezeTimeout) || len(second.h.Grains) != 1 || len(second.h.Projects) != 0 {
			t.Errorf("second message %v after %v, want the live channel's state at freezeTimeout", second.h, second.at.Sub(began))
		}
		if st.Grains != 1 || st.Failed != 1 || st.Members != 1 {
			t.Errorf("stats %+v, want 1 grain handed, 1 failed, 1 member", st)
		}
		synctest.Wait()
		if _, running := c.projectGrains.Load(projectID); running || first.h.GetProjects()[0].GetProjectId() != projectID {
			t.Errorf("the project grain of %s runs after its handoff (%v), or another's state was handed", projectID, running)
		}
	})
}

// A project grain that never answers its freeze costs only its own state:
// the channel states that came are handed over at freezeTimeout.
func TestHandOverDespiteAStuckProjectGrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := projectNode(t, time.Now)
		got := newHandoffReceiver(t, c)
		live := startGrain(c, ownedChannel(t, c, "live"))
		synctest.Wait()

		began := time.Now()
		f := c.freeze([]*actor.PID{live}, func(string) bool { return false })
		stuck := neverAnswers(c)
		f.projectPIDs, f.projects = []*actor.PID{stuck}, make(chan *clusterpb.ProjectState, 1)
		c.sys.root.Send(stuck, &freezeProject{reply: f.projects})
		st := c.handOver(context.Background(), f, c.view.Load().others)

		if len(got.got) != 1 || len(got.got[0].h.Grains) != 1 || got.got[0].at != began.Add(freezeTimeout) {
			t.Fatalf("the other member got %d messages (%v), want the live channel's state at freezeTimeout", len(got.got), got.got)
		}
		if st.Grains != 1 || st.Failed != 0 || st.Members != 1 {
			t.Errorf("stats %+v, want 1 grain handed to 1 member, none failed", st)
		}
	})
}
