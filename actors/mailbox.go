package actors

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// mailbox is the mailbox of project and channel actors. It keeps protoactor's
// default semantics (system messages first, suspend and resume for the
// supervisor, a panic escalated to it, turns on the actor system's pool dispatcher)
// and adds one thing: the poster of an HTTP emit runs the actor's turn itself
// when the actor is idle. That goroutine would otherwise sleep until the
// answer while a pool goroutine woke to do the work: two hand-offs between
// threads per hop, which profiles showed costing more than the turn itself.
// A poster runs at most posterTurns messages, so a busy actor's queue goes
// back to the pool and never holds one emit's answer for long. A
// MessageBatch is not unpacked as protoactor's mailbox does: the relay sends
// none.
type mailbox struct {
	mu        sync.Mutex
	user, sys fifo
	running   atomic.Bool // someone holds the turn: the pool or a poster
	suspended atomic.Bool // by the supervisor, after a panic, until it resumes
	invoker   actor.MessageInvoker
	dispatch  actor.Dispatcher
	state     *mailboxState
}

// mailboxState is what an actor reads of its own mailbox.
type mailboxState struct {
	posted, received atomic.Int64
	// posterForwards is how many more Publishes the actor may forward to be
	// run on the goroutine running this turn: posterTurns while the turn runs
	// on the goroutine that posted its message (mailbox.runHere), else 0 (a
	// turn that releases a backlog of held emits sends the rest the usual
	// way). Written only by the holder of the turn, read only inside Receive:
	// the turn's own goroutine.
	posterForwards int
}

// forwardHere reports whether a Publish forwarded now may ask to be run on
// the poster's goroutine, and counts it.
func (s *mailboxState) forwardHere() bool {
	if s.posterForwards <= 0 {
		return false
	}
	s.posterForwards--
	return true
}

// depth is the messages posted and not yet handled (/debug/actors).
func (s *mailboxState) depth() int64 { return max(s.posted.Load()-s.received.Load(), 0) }

// props makes each actor spawned with them a mailbox sharing s.
func (s *mailboxState) props() actor.PropsOption {
	return actor.WithMailbox(func() actor.Mailbox { return &mailbox{state: s} })
}

// posterTurns bounds the messages a poster runs: its own and those queued
// just before it, not a busy actor's backlog.
const posterTurns = 4

// postedToRun reports whether msg asks to be run by its poster, and clears the
// request so that a later post of the same message (a project actor forwards
// a Publish) asks only if it sets it again.
func postedToRun(msg any) bool {
	p, ok := msg.(*Publish)
	if !ok || !p.posterRuns {
		return false
	}
	p.posterRuns = false
	return true
}

func (m *mailbox) PostUserMessage(msg any) {
	here := postedToRun(msg) // before the push: after it the message is the actor's
	m.state.posted.Add(1)
	m.mu.Lock()
	m.user.push(msg)
	m.mu.Unlock()
	if here {
		m.runHere()
		return
	}
	m.schedule()
}

func (m *mailbox) PostSystemMessage(msg any) {
	m.state.posted.Add(1)
	m.mu.Lock()
	m.sys.push(msg)
	m.mu.Unlock()
	m.schedule()
}

func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatch = invoker, dispatcher
}

func (m *mailbox) Start() {}

func (m *mailbox) UserMessageCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.user.len()
}

// schedule hands the turn to the pool unless someone holds it already.
func (m *mailbox) schedule() {
	if m.running.CompareAndSwap(false, true) {
		m.dispatch.Schedule(m.processMessages)
	}
}

// processMessages is the pool's turn: until nothing is left to run.
func (m *mailbox) processMessages() {
	for {
		m.run(0)
		m.running.Store(false)
		// A message posted after the last pop found the turn still held.
		if !m.pending() || !m.running.CompareAndSwap(false, true) {
			return
		}
	}
}

// runHere is the poster's turn, taken only if nobody holds it; what is left
// after posterTurns messages goes to the pool.
func (m *mailbox) runHere() {
	if !m.running.CompareAndSwap(false, true) {
		return // the holder runs it
	}
	m.state.posterForwards = posterTurns
	defer func() { // deferred: nothing that escapes run may leave the turn held
		m.state.posterForwards = 0
		m.running.Store(false)
		if m.pending() {
			m.schedule()
		}
	}()
	m.run(posterTurns)
}

// pending reports whether a message is waiting that the actor may take now.
func (m *mailbox) pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sys.len() > 0 || (!m.suspended.Load() && m.user.len() > 0)
}

// run handles messages, system ones first, until none is left that the
// actor may take, or limit of them when limit > 0. A panic ends the run and
// goes to the supervisor, which suspends the mailbox and then resumes it.
func (m *mailbox) run(limit int) {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	throughput := m.dispatch.Throughput()
	for i := 1; limit <= 0 || i <= limit; i++ {
		if limit <= 0 && throughput > 0 && i%throughput == 0 {
			runtime.Gosched() // a long queue still lets other goroutines run
		}
		var system, ok bool
		m.mu.Lock()
		if msg, ok = m.sys.pop(); ok {
			system = true
		} else if !m.suspended.Load() {
			msg, ok = m.user.pop()
		}
		m.mu.Unlock()
		if !ok {
			return
		}
		if !system {
			m.invoker.InvokeUserMessage(msg)
		} else {
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended.Store(true)
			case *actor.ResumeMailbox:
				m.suspended.Store(false)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
		}
		m.state.received.Add(1)
	}
}

// fifo is a queue on one slice that reuses its consumed front before it
// grows, so a mailbox that never quite empties does not grow without end.
type fifo struct {
	items []any
	head  int
}

func (q *fifo) len() int { return len(q.items) - q.head }

func (q *fifo) push(m any) {
	// Full with a consumed front of at least half: move the rest down
	// rather than grow. Under half, growing keeps each push O(1) on average
	// (moving a long backlog for a short front on every push would not).
	if q.head > 0 && q.head >= len(q.items)/2 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, m)
}

func (q *fifo) pop() (any, bool) {
	if q.head == len(q.items) {
		return nil, false
	}
	m := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) { // empty: start again at the front
		q.items, q.head = q.items[:0], 0
		if cap(q.items) > fifoKeep {
			q.items = nil // a burst's backlog is not kept for the actor's life
		}
	}
	return m, true
}

// fifoKeep is the capacity an emptied queue keeps.
const fifoKeep = 256

var _ actor.Mailbox = (*mailbox)(nil)
