package transport

import (
	"errors"

	"golang.org/x/sys/unix"
)

// poller is a thin epoll wrapper. Registrations are one-shot: after an event
// the connection is disarmed until its worker re-arms it, so at most one
// worker reads a connection at a time. Events carry the connection id, never
// the fd, because fd numbers are reused as soon as a socket closes.
type poller struct {
	epfd int
	wake int // eventfd that interrupts EpollWait at shutdown
}

const (
	readEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT
	wakeID     = 0 // connection ids start at 1
)

func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	p := &poller{epfd: epfd, wake: wake}
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
	return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, event(id, readEvents))
}

func (p *poller) rearm(fd int, id uint64) error {
	return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, fd, event(id, readEvents))
}

func (p *poller) remove(fd int) error {
	return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
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
	unix.Close(p.wake)
	unix.Close(p.epfd)
}
