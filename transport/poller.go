package transport

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// poller is a thin epoll wrapper. Registrations are one-shot: after an event
// the connection is disarmed until its worker re-arms it, so at most one
// worker reads a connection at a time. Events carry the connection id, never
// the fd, because fd numbers are reused as soon as a socket closes.
type poller struct {
	epfd   int
	wake   int    // eventfd that interrupts EpollWait at shutdown
	events uint32 // what a registration waits for

	// mu makes close wait for an epoll_ctl under way, and closed refuses
	// later ones: after close the descriptor number may name another file.
	// (An upgrade that outlives Shutdown's deadline registers afterwards.)
	mu     sync.RWMutex
	closed bool
}

// errPollerClosed: the server has shut down; the connection cannot be watched.
var errPollerClosed = errors.New("transport: poller closed")

const (
	readEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT
	// writeEvents: a slow peer's socket has room again (Conn.waitWritable).
	writeEvents = unix.EPOLLOUT | unix.EPOLLONESHOT
	wakeID      = 0 // connection ids start at 1
)

// newPoller makes an epoll set whose registrations wait for events.
func newPoller(events uint32) (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	p := &poller{epfd: epfd, wake: wake, events: events}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func event(id uint64, events uint32) *unix.EpollEvent {
	return &unix.EpollEvent{Events: events, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
}

func eventID(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

func (p *poller) add(fd int, id uint64) error {
	return p.ctl(unix.EPOLL_CTL_ADD, fd, event(id, p.events))
}

func (p *poller) rearm(fd int, id uint64) error {
	return p.ctl(unix.EPOLL_CTL_MOD, fd, event(id, p.events))
}

func (p *poller) remove(fd int) error {
	return p.ctl(unix.EPOLL_CTL_DEL, fd, nil)
}

func (p *poller) ctl(op, fd int, ev *unix.EpollEvent) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errPollerClosed
	}
	return unix.EpollCtl(p.epfd, op, fd, ev)
}

// wait blocks until events arrive and calls fn for each connection event. It
// returns when interrupt is called.
func (p *poller) wait(fn func(id uint64, events uint32)) error {
	events := make([]unix.EpollEvent, 256)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		for i := range n {
			id := eventID(&events[i])
			if id == wakeID {
				return nil
			}
			fn(id, events[i].Events)
		}
	}
}

func (p *poller) interrupt() {
	var one = [8]byte{1}
	unix.Write(p.wake, one[:])
}

func (p *poller) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	unix.Close(p.wake)
	unix.Close(p.epfd)
}
