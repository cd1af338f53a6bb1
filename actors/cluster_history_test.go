package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// historyNode is a cluster node (failoverNode) whose projects keep channel
// history in h.
func historyNode(t *testing.T, h *memHistory) *Cluster {
	t.Helper()
	return failoverNodeWith(t, Config{History: h, LoadSettings: func(context.Context, string) (Settings, error) {
		return Settings{HistoryRetention: time.Hour}, nil
	}})
}

// gatedHistoryNode is historyNode with a store whose commits each wait
// for a receive on gate.
func gatedHistoryNode(t *testing.T) (*Cluster, *memHistory, chan struct{}) {
	t.Helper()
	gate := make(chan struct{})
	h := &memHistory{gate: gate}
	c := historyNode(t, h)
	t.Cleanup(func() { close(gate) }) // a failed test must not leave a commit waiting
	return c, h, gate
}

// commitUnderWay waits until a commit of one record waits at the gate.
func commitUnderWay(t *testing.T, h *memHistory) {
	t.Helper()
	waitFor(t, "the commit under way", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.waiting == 1
	})
}

// storedRecord is the record a grain of identity stored for seq, stamped
// by publish id.
func storedRecord(identity string, seq uint64, id string) HistoryRecord {
	project, channel := splitIdentity(identity)
	return HistoryRecord{Project: project, Channel: channel, Seq: seq, At: time.Now(), PublishID: id,
		Message: []byte(fmt.Sprintf(`{"channel":%q,"payload":%d,"seq":%d}`, channel, seq, seq))}
}

// storedChannel is a history node and a channel it owns, whose store holds
// the records of publishes old#from … old#to at those seqs.
func storedChannel(t *testing.T, name string, from, to uint64) (*Cluster, *memHistory, string) {
	t.Helper()
	h := &memHistory{}
	c := historyNode(t, h)
	identity := ownedChannel(t, c, name)
	for seq := from; seq <= to; seq++ {
		h.recs = append(h.recs, storedRecord(identity, seq, fmt.Sprintf("old#%d", seq)))
	}
	return c, h, identity
}

// publishWith sends a publish of id to grain from relay, history and
// resent as given.
func publishWith(c *Cluster, grain, relay *actor.PID, id string, history, resent bool) {
	sendFrom(c, grain, relay, &clusterpb.ChannelPublish{Id: id, ReplyTo: ref(relay), Payload: []byte(`{"id":"` + id + `"}`),
		AtUnixNano: time.Now().UnixNano(), ChannelLimit: 1000, History: history, Resent: resent})
}

// A grain of a history project stores what it stamps before it delivers
// or answers it, with the publish's id; a retry while it waits is not
// stamped again; a failed commit answers service_unavailable and delivers
// nothing.
func TestGrainStoresBeforeItAnswers(t *testing.T) {
	c, h, gate := gatedHistoryNode(t)
	identity := ownedChannel(t, c, "stored")
	grain := startGrain(c, identity)
	relay, got := relayStub(c)
	register(c, grain, relay, 0, 1)
	publishWith(c, grain, relay, "e#1", true, false)
	commitUnderWay(t, h)
	publishWith(c, grain, relay, "e#1", true, true) // the relay's retry, 300 ms later
	// A subscribe meanwhile: its seq is the last delivered, below the held
	// message (which its relay would otherwise take as had).
	joiner, fromJoiner := relayStub(c)
	sendFrom(c, grain, joiner, &clusterpb.ChannelJoin{Relay: ref(joiner), Sub: &clusterpb.Subscriber{Conn: 5}})
	j, ok := next(t, fromJoiner, time.Second).(*clusterpb.ChannelJoined)
	if !ok {
		t.Fatalf("join answered %v", j)
	}
	silent(t, got, 200*time.Millisecond) // nothing delivered nor answered before the commit
	h.mu.Lock()
	h.gate = nil
	h.mu.Unlock()
	gate <- struct{}{}
	d, ok := next(t, got, time.Second).(*clusterpb.ChannelDeliver)
	p, ok2 := next(t, got, time.Second).(*clusterpb.ChannelPublished)
	if !ok || !ok2 || p.Error != "" || p.Seq != d.Seq || p.Id != "e#1" {
		t.Fatalf("after the commit: %v then %v, want the delivery then its answer", d, p)
	}
	if recs := h.stored(); len(recs) != 1 || recs[0].Seq != p.Seq || recs[0].PublishID != "e#1" {
		t.Fatalf("stored %+v", recs)
	}
	if jd, ok := next(t, fromJoiner, time.Second).(*clusterpb.ChannelDeliver); !ok || j.Seq >= p.Seq || jd.Seq != p.Seq {
		t.Fatalf("the subscriber that joined while it was held: joined at %d, then %v; want below %d, then it", j.Seq, jd, p.Seq)
	}
	silent(t, got, 100*time.Millisecond) // the retry was not stamped again

	h.set(fmt.Errorf("store down"))
	publishWith(c, grain, relay, "e#2", true, false)
	if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "service_unavailable" {
		t.Fatalf("a failed commit answered %v", p)
	}
	silent(t, got, 100*time.Millisecond)
}

// The owner that stored a message crashed before answering: the new owner
// (no state handed over) answers the publish sent again with the stored
// seq, stamps nothing twice, continues seq above the store, and gives a
// relay that registers what the store holds after its last seq, with no
// replay_gap; a subscribe with since reads the store the same way.
func TestNewOwnerReadsTheStore(t *testing.T) {
	c, h, identity := storedChannel(t, "crashed", 401, 410)
	grain := startGrain(c, identity)
	relay, got := relayStub(c)
	register(c, grain, relay, 405, 1) // it delivered up to 405
	up, ok := next(t, got, time.Second).(*clusterpb.ChannelCatchUp)
	if !ok || up.Gap || fmt.Sprint(seqsOf(up.Messages)) != "[406 407 408 409 410]" {
		t.Fatalf("catch-up %v, want 406…410 from the store and no gap", up)
	}
	publishWith(c, grain, relay, "old#410", true, true) // its answer was lost with the old owner
	if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "" || p.Seq != 410 {
		t.Fatalf("the publish sent again answered %v, want seq 410", p)
	}
	publishWith(c, grain, relay, "new#1", true, false)
	d, _ := next(t, got, time.Second).(*clusterpb.ChannelDeliver)
	p, _ := next(t, got, time.Second).(*clusterpb.ChannelPublished)
	if d == nil || p == nil || p.Seq <= 410 || d.Seq != p.Seq || len(h.stored()) != 11 {
		t.Fatalf("a new publish: %v %v, want a seq above 410, stored once", d, p)
	}

	joiner, fromJoiner := relayStub(c)
	sendFrom(c, grain, joiner, &clusterpb.ChannelJoin{Relay: ref(joiner), Sub: &clusterpb.Subscriber{Conn: 9}, HasSince: true, Since: 402})
	j, ok := next(t, fromJoiner, time.Second).(*clusterpb.ChannelJoined)
	if !ok || j.Gap || len(j.Replay) != 9 {
		t.Fatalf("join with since 402: %v, want 403…410 and the new one, no gap", j)
	}
}

// The publishes sent again to a new owner while it settles (a crash sends
// many at once) are looked up in the store in one query: those stored are
// answered with their seqs, the others stamped above the stored last.
func TestResentPublishesLookedUpTogether(t *testing.T) {
	c, h, identity := storedChannel(t, "resent", 401, 410)
	grain := startGrain(c, identity)
	relay, got := relayStub(c)
	register(c, grain, relay, 410, 1)
	ids := []string{"old#408", "lost#1", "old#409", "old#410", "lost#2"}
	for _, id := range ids {
		publishWith(c, grain, relay, id, true, true)
	}
	seqs := map[string]uint64{}
	for len(seqs) < len(ids) {
		p := nextPublished(t, got)
		if p.Error != "" {
			t.Fatalf("%s answered %s", p.Id, p.Error)
		}
		seqs[p.Id] = p.Seq
	}
	if fmt.Sprint(seqs) != "map[lost#1:411 lost#2:412 old#408:408 old#409:409 old#410:410]" {
		t.Fatalf("answers %v, want the stored ones' seqs and the others from 411", seqs)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lookups != 1 {
		t.Fatalf("%d lookups of the publishes sent again, want 1", h.lookups)
	}
}

// heldForCommit is a history channel's grain, with a relay registered and
// one message (name#1) held while its commit is under way, until gate.
func heldForCommit(t *testing.T, name string) (c *Cluster, h *memHistory, gate chan struct{}, grain *actor.PID, got chan any) {
	t.Helper()
	c, h, gate = gatedHistoryNode(t)
	grain = startGrain(c, ownedChannel(t, c, name))
	relay, got := relayStub(c)
	register(c, grain, relay, 0, 1)
	publishWith(c, grain, relay, name+"#1", true, false)
	commitUnderWay(t, h)
	return c, h, gate, grain, got
}

// A freeze (this node hands its grains over) waits for the messages held
// for their commit: they land first, and the state handed on has them.
func TestFreezeWaitsForHeldMessages(t *testing.T) {
	c, h, gate, grain, got := heldForCommit(t, "frozen")
	states := freezeFor(c, grain)
	select {
	case st := <-states:
		t.Fatalf("state handed on before the held message landed: %v", st)
	case <-time.After(200 * time.Millisecond):
	}
	h.mu.Lock()
	h.gate = nil
	h.mu.Unlock()
	gate <- struct{}{}
	st := <-states
	p := nextPublished(t, got)
	if p.Error != "" || st.Seq != p.Seq || len(st.Replay) != 1 || st.Replay[0].Seq != p.Seq {
		t.Fatalf("answer %v, state seq %d with %d in its ring", p, st.Seq, len(st.Replay))
	}
}

// A freeze whose held message is not committed within freezeHold answers it
// service_unavailable and hands the state on: nothing lands after (the next
// owner may have started without it), even when the commit ends later.
// In a testing/synctest bubble: the state comes at freezeHold exactly.
func TestFreezeGivesUpOnASlowCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, gate, grain, got := heldForCommit(t, "slow")
		began := time.Now()
		states := freezeFor(c, grain)
		select {
		case <-states:
		case <-time.After(freezeTimeout):
			t.Fatal("no state within the handoff's bound")
		}
		if took := time.Since(began); took != freezeHold {
			t.Errorf("the state came %v after the freeze, want freezeHold (%v)", took, freezeHold)
		}
		if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "service_unavailable" {
			t.Fatalf("the held publish answered %v, want service_unavailable", p)
		}
		gate <- struct{}{} // the commit ends now: nothing is delivered
		silent(t, got, 200*time.Millisecond)
	})
}

// A new history channel, nothing stored, handed over while its only
// message waits for a commit that then fails: the relay that joined was
// told the seq before that message, and re-registering with the next owner
// it gets no replay_gap (nothing was delivered after it).
func TestHandedOverMidCommitNoFalseGap(t *testing.T) {
	c, h, gate := gatedHistoryNode(t)
	identity := ownedChannel(t, c, "new")
	grain := startGrain(c, identity)
	relay, got := relayStub(c)
	j := joinAs(t, c, grain, relay, got, 1)
	publishWith(c, grain, relay, "n#1", true, false)
	commitUnderWay(t, h)
	states := freezeFor(c, grain)
	st := <-states
	if p := nextPublished(t, got); p.Error != "service_unavailable" {
		t.Fatalf("the held publish answered %v, want service_unavailable", p)
	}
	h.set(errors.New("store down"))
	gate <- struct{}{} // the commit fails: nothing stored, nothing delivered
	h.set(nil)
	c.sys.root.Stop(grain)

	next2 := startGrain(c, identity)
	c.sys.root.Send(next2, st)
	register(c, next2, relay, j.Seq, 1)
	select {
	case m := <-got:
		if up, ok := m.(*clusterpb.ChannelCatchUp); !ok || up.Gap || len(up.Messages) > 0 {
			t.Fatalf("the relay re-registering after %d got %T %v, want no gap and nothing", j.Seq, m, m)
		}
	case <-time.After(300 * time.Millisecond):
	}
}

// A publish sent again whose record the old owner stored after this grain
// read the stored last seq (it was frozen mid-commit) is answered
// service_unavailable: nobody delivered it. A fresh grain's join carries
// the stored last seq, a message's, not the clock's start.
func TestStoredAfterTheTakeOver(t *testing.T) {
	c, h, identity := storedChannel(t, "late", 700, 700)
	grain := startGrain(c, identity)
	relay, got := relayStub(c)
	sendFrom(c, grain, relay, &clusterpb.ChannelJoin{Relay: ref(relay), Sub: &clusterpb.Subscriber{Conn: 1}})
	if j, ok := next(t, got, time.Second).(*clusterpb.ChannelJoined); !ok || j.Seq != 700 {
		t.Fatalf("a fresh grain's join answered %v, want seq 700 (the stored last)", j)
	}
	h.mu.Lock()
	h.recs = append(h.recs, storedRecord(identity, 701, "old#701")) // the frozen owner's commit, after the take-over
	h.mu.Unlock()
	publishWith(c, grain, relay, "old#701", true, true)
	if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "service_unavailable" {
		t.Fatalf("the publish stored after the take-over answered %v, want service_unavailable", p)
	}
	publishWith(c, grain, relay, "old#700", true, true)
	if p, ok := next(t, got, time.Second).(*clusterpb.ChannelPublished); !ok || p.Error != "" || p.Seq != 700 {
		t.Fatalf("the publish stored before answered %v, want seq 700", p)
	}
}
