package actors

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// recordingInvoker stands in for protoactor's actor context: it records what
// the mailbox hands it, and panics on the message "boom".
type recordingInvoker struct {
	got       []any
	escalated []any
	onUser    func(any)
}

func (r *recordingInvoker) InvokeSystemMessage(m any) { r.got = append(r.got, m) }
func (r *recordingInvoker) InvokeUserMessage(m any) {
	if r.onUser != nil {
		r.onUser(m)
	}
	if m == "boom" {
		panic("boom")
	}
	r.got = append(r.got, m)
}
func (r *recordingInvoker) EscalateFailure(reason, m any) {
	r.escalated = append(r.escalated, reason, m)
}

// heldDispatcher keeps scheduled turns for the test to run.
type heldDispatcher struct{ turns []func() }

func (d *heldDispatcher) Schedule(fn func()) { d.turns = append(d.turns, fn) }
func (d *heldDispatcher) Throughput() int    { return 300 }

func (d *heldDispatcher) runAll() {
	for len(d.turns) > 0 {
		fn := d.turns[0]
		d.turns = d.turns[1:]
		fn()
	}
}

func newTestMailbox() (*mailbox, *recordingInvoker, *heldDispatcher) {
	inv, disp := &recordingInvoker{}, &heldDispatcher{}
	m := &mailbox{state: &mailboxState{}}
	m.RegisterHandlers(inv, disp)
	return m, inv, disp
}

func TestMailboxOrderSystemFirst(t *testing.T) {
	m, inv, disp := newTestMailbox()
	m.PostUserMessage("u1")
	m.PostUserMessage("u2")
	m.PostSystemMessage("s1")
	if len(disp.turns) != 1 {
		t.Fatalf("scheduled %d turns, want 1 (the first post takes the turn)", len(disp.turns))
	}
	disp.runAll()
	if want := []any{"s1", "u1", "u2"}; !slices.Equal(inv.got, want) {
		t.Fatalf("handled %v, want %v", inv.got, want)
	}
	if d := m.state.depth(); d != 0 {
		t.Fatalf("depth %d after the turn, want 0", d)
	}
	if m.running.Load() {
		t.Fatal("the turn is still held after the pool ran it")
	}
}

func TestMailboxPosterRunsIdleActor(t *testing.T) {
	m, inv, disp := newTestMailbox()
	var sawPoster bool
	inv.onUser = func(any) { sawPoster = m.state.posterForwards == posterTurns }
	p := &Publish{Channel: "c", posterRuns: true}
	m.PostUserMessage(p)
	if len(disp.turns) != 0 {
		t.Fatal("an idle actor's poster handed the turn to the pool")
	}
	if len(inv.got) != 1 || inv.got[0] != p {
		t.Fatalf("handled %v, want the Publish, on the poster's goroutine", inv.got)
	}
	if !sawPoster {
		t.Fatal("Receive did not see its forwards during the poster's turn")
	}
	if m.state.posterForwards != 0 || m.running.Load() {
		t.Fatal("the poster's turn left the mailbox held or marked")
	}
	if p.posterRuns {
		t.Fatal("the request to run was not cleared: a forward would run it again")
	}
}

func TestMailboxPosterLeavesBusyActorToItsHolder(t *testing.T) {
	m, inv, disp := newTestMailbox()
	m.PostUserMessage("first") // the pool holds the turn now, not yet run
	m.PostUserMessage(&Publish{posterRuns: true})
	if len(inv.got) != 0 {
		t.Fatalf("the poster ran %v while the pool held the turn", inv.got)
	}
	disp.runAll()
	if len(inv.got) != 2 || inv.got[0] != "first" {
		t.Fatalf("handled %v, want both, in order, by the holder", inv.got)
	}
}

func TestMailboxPosterRunsAtMostPosterTurns(t *testing.T) {
	m, inv, disp := newTestMailbox()
	// A backlog queued without a turn (as when posts race a turn's end).
	for i := range 10 {
		m.user.push(fmt.Sprint(i))
	}
	m.PostUserMessage(&Publish{posterRuns: true})
	if len(inv.got) != posterTurns {
		t.Fatalf("the poster ran %d messages, want %d", len(inv.got), posterTurns)
	}
	if len(disp.turns) != 1 {
		t.Fatalf("the rest went to %d pool turns, want 1", len(disp.turns))
	}
	disp.runAll()
	if len(inv.got) != 11 {
		t.Fatalf("handled %d in all, want 11", len(inv.got))
	}
	for i := range 10 {
		if inv.got[i] != fmt.Sprint(i) {
			t.Fatalf("message %d was %v: out of order", i, inv.got[i])
		}
	}
}

func TestMailboxSuspendResume(t *testing.T) {
	m, inv, disp := newTestMailbox()
	m.PostSystemMessage(&actor.SuspendMailbox{})
	m.PostUserMessage("u1")
	disp.runAll()
	if len(inv.got) != 0 {
		t.Fatalf("a suspended mailbox handed over %v", inv.got)
	}
	if m.pending() {
		t.Fatal("a suspended mailbox's user messages count as pending")
	}
	m.PostUserMessage(&Publish{posterRuns: true}) // nor does a poster run it
	if len(inv.got) != 0 {
		t.Fatalf("a poster ran a suspended mailbox: %v", inv.got)
	}
	m.PostSystemMessage(&actor.ResumeMailbox{})
	disp.runAll()
	if len(inv.got) != 2 || inv.got[0] != "u1" {
		t.Fatalf("after resume handled %v, want u1 then the Publish", inv.got)
	}
}

func TestMailboxPanicEscalatesAndCarriesOn(t *testing.T) {
	m, inv, disp := newTestMailbox()
	m.PostUserMessage("boom")
	m.PostUserMessage("after")
	disp.runAll()
	if len(inv.escalated) != 2 || inv.escalated[0] != "boom" || inv.escalated[1] != "boom" {
		t.Fatalf("escalated %v, want the reason and the message", inv.escalated)
	}
	if m.running.Load() {
		t.Fatal("a panic left the turn held")
	}
	// The supervisor's answer (a system message) gives the mailbox a new turn.
	m.PostSystemMessage(&actor.ResumeMailbox{})
	disp.runAll()
	if len(inv.got) != 1 || inv.got[0] != "after" {
		t.Fatalf("handled %v after the panic, want the next message", inv.got)
	}
}

func TestFIFOReusesItsFront(t *testing.T) {
	var q fifo
	for i := range 3 {
		q.push(i)
	}
	next := 0
	for i := 3; i < 100_000; i++ { // a standing backlog of 3, never empty
		q.push(i)
		v, ok := q.pop()
		if !ok || v != next {
			t.Fatalf("pop %v %v, want %d", v, ok, next)
		}
		next++
	}
	if c := cap(q.items); c > 16 {
		t.Fatalf("capacity %d with a backlog of 3: the consumed front is not reused", c)
	}
	for q.len() > 0 {
		q.pop()
	}
	if _, ok := q.pop(); ok {
		t.Fatal("pop from an empty queue")
	}
	// A burst's backlog is let go once it drains.
	for i := range 10 * fifoKeep {
		q.push(i)
	}
	for q.len() > 0 {
		q.pop()
	}
	if c := cap(q.items); c > fifoKeep {
		t.Fatalf("capacity %d kept after a burst drained, want at most %d", c, fifoKeep)
	}
}

func TestFIFOLongBacklog(t *testing.T) {
	var q fifo
	const backlog = 1000
	for i := range backlog {
		q.push(i)
	}
	next := 0
	for i := backlog; i < 50*backlog; i++ {
		q.push(i)
		if v, _ := q.pop(); v != next {
			t.Fatalf("pop %v, want %d", v, next)
		}
		next++
	}
	if c := cap(q.items); c > 4*backlog {
		t.Fatalf("capacity %d for a standing backlog of %d", c, backlog)
	}
}

func TestPosterForwardsBounded(t *testing.T) {
	s := &mailboxState{}
	if s.forwardHere() {
		t.Fatal("a pool turn forwarded a Publish to run on a poster")
	}
	s.posterForwards = posterTurns
	for i := range posterTurns {
		if !s.forwardHere() {
			t.Fatalf("forward %d refused within the budget", i)
		}
	}
	if s.forwardHere() {
		t.Fatal("a poster's turn forwarded past its budget")
	}
}

// TestPublishAnsweredOnTheEdge: an HTTP emit to idle project and channel
// actors is answered on the caller's goroutine, before tell returns: both
// turns ran there, with no pool goroutine to wait for.
func TestPublishAnsweredOnTheEdge(t *testing.T) {
	sys := newTestSystem(t, Config{})
	k := subscribeOne(t, sys, "p1", "room", 1) // the actors are up
	// The ack is sent from inside the channel's turn, which may still be
	// ending (on a loaded machine): warm up until an emit is answered on the
	// edge, the sign that both actors are idle.
	warm := 0
	waitFor(t, "an emit answered on the edge", func() bool {
		warm++
		reply := make(chan PublishResult, 1)
		sys.tell("p1", &Publish{Channel: "room", Payload: []byte(`0`), At: time.Now(), Reply: reply, posterRuns: true})
		select {
		case <-reply:
			return true
		default:
			<-reply
			return false
		}
	})
	var last uint64
	for i := range 20 {
		reply := make(chan PublishResult, 1)
		sys.tell("p1", &Publish{Channel: "room", Payload: []byte(`1`), At: time.Now(), Reply: reply, posterRuns: true})
		select {
		case res := <-reply:
			if res.Err != nil || (i > 0 && res.Seq != last+1) || res.Delivered != 1 {
				t.Fatalf("emit %d: %+v, want the next seq after %d, delivered 1", i, res, last)
			}
			last = res.Seq
		default:
			t.Fatalf("emit %d was not answered when tell returned", i)
		}
	}
	waitFor(t, "the 20 messages", func() bool { return len(k.messages(t)) == 21+warm })
}

// panickyInvoker fails in Receive and again in EscalateFailure, as a broken
// supervisor would: the panic escapes run.
type panickyInvoker struct{ recordingInvoker }

func (p *panickyInvoker) EscalateFailure(reason, _ any) { panic(reason) }

func TestMailboxPosterReleasesOnEscapingPanic(t *testing.T) {
	inv, disp := &panickyInvoker{}, &heldDispatcher{}
	m := &mailbox{state: &mailboxState{}}
	m.RegisterHandlers(inv, disp)
	inv.onUser = func(any) { panic("receive failed") }
	func() {
		defer func() { recover() }() // net/http would recover it on the handler's goroutine
		m.PostUserMessage(&Publish{posterRuns: true})
	}()
	if m.running.Load() || m.state.posterForwards != 0 {
		t.Fatal("a panic that escaped run left the turn held")
	}
}
