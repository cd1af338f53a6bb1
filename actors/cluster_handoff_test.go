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

// A handoff (a graceful stop, or a join) sends the project states as soon
// as they are in, and the channel states once every channel grain answered
// its freeze, or freezeTimeout passed (one never will: it had stopped). It
// counts what it handed and what it could not, and stops the project
// grains. In a testing/synctest bubble.
func TestHandOverSendsProjectStatesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := projectNode(t, time.Now)
		got := newHandoffReceiver(t, c)
		live := startGrain(c, ownedChannel(t, c, "live"))
		gone := startGrain(c, ownedChannel(t, c, "gone"))
		projectID := ownedProject(t, c)
		startProjectGrain(c, projectID)
		synctest.Wait()
		c.sys.root.Stop(gone)
		synctest.Wait()

		began := time.Now()
		f := c.freeze([]*actor.PID{live, gone}, func(string) bool { return true })
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
