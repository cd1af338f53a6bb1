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
	throughput int
}

// dispatcherThroughput is protoactor's default: messages per turn before the
// mailbox yields.
const dispatcherThroughput = 300

func newPoolDispatcher(goroutines int) *poolDispatcher {
	d := &poolDispatcher{turns: make(chan func()), throughput: dispatcherThroughput}
	for range goroutines {
		go d.serve()
	}
	return d
}

// serve runs turns for the life of the process: the pool is small and fixed,
// and actor systems in one process share it.
func (d *poolDispatcher) serve() {
	for fn := range d.turns {
		fn()
	}
}

func (d *poolDispatcher) Schedule(fn func()) {
	select {
	case d.turns <- fn: // an idle pool goroutine took it
	default:
		go fn()
	}
}

func (d *poolDispatcher) Throughput() int { return d.throughput }

var _ actor.Dispatcher = (*poolDispatcher)(nil)

// dispatcher is the pool every actor of the process runs on.
var dispatcher = sync.OnceValue(func() *poolDispatcher { return newPoolDispatcher(4 * runtime.GOMAXPROCS(0)) })
