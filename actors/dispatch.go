package actors

import (
	"runtime"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// poolDispatcher runs mailbox turns on a fixed set of long-lived goroutines.
// protoactor's default starts a goroutine for every turn (each time an idle
// mailbox gets a message); on the emit path that goroutine's stack then grows
// through Receive and the fan-out, and profiles showed the stack copying
// alone at about 9 % of the server's CPU under HTTP emit load. A pool
// goroutine keeps its grown stack. When every pool goroutine is busy the
// turn gets a goroutine of its own, as before, so a turn never waits behind
// another actor's (and an idle actor still holds no goroutine).
type poolDispatcher struct {
	turns      chan func()
	quit       chan struct{}
	stopOnce   sync.Once
	throughput int
}

// dispatcherThroughput is protoactor's default: messages per turn before the
// mailbox yields.
const dispatcherThroughput = 300

func newPoolDispatcher(goroutines int) *poolDispatcher {
	d := &poolDispatcher{turns: make(chan func()), quit: make(chan struct{}), throughput: dispatcherThroughput}
	for range goroutines {
		go d.serve()
	}
	return d
}

// serve runs turns until the pool's actor system shuts down; later turns
// (a timer's message to an actor that is gone) get goroutines of their own.
func (d *poolDispatcher) serve() {
	for {
		select {
		case fn := <-d.turns:
			fn()
		case <-d.quit:
			return
		}
	}
}

// stop ends the pool's goroutines.
func (d *poolDispatcher) stop() { d.stopOnce.Do(func() { close(d.quit) }) }

func (d *poolDispatcher) Schedule(fn func()) {
	select {
	case d.turns <- fn: // an idle pool goroutine took it
	default:
		go fn()
	}
}

func (d *poolDispatcher) Throughput() int { return d.throughput }

var _ actor.Dispatcher = (*poolDispatcher)(nil)

// newSystemDispatcher is the pool every actor of one actor system runs on
// (one per system, so that a test's system takes its goroutines with it,
// and a testing/synctest bubble holds all of them).
func newSystemDispatcher() *poolDispatcher { return newPoolDispatcher(4 * runtime.GOMAXPROCS(0)) }
