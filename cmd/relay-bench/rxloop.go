package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rxLoop reads subscribed sockets: a level-triggered epoll set, one read per
// ready socket per wake-up (whatever it did not take is reported again), the
// frames parsed in the connection's buffer. The Go connection stays open for
// writes (pongs, close frames) and owns the descriptor; only the loop closes
// it. Events carry the connection's id, never its fd, since fd numbers are
// reused as soon as a socket closes.
//
// The loop waits in the Go scheduler, not in a blocking epoll_wait: the epoll
// descriptor is itself registered with the runtime's poller (os.NewFile on a
// non-blocking fd), and the loop asks it for events with a zero timeout when
// the runtime says it is readable. Under load it never parks at all.
type rxLoop struct {
	epfd int
	ep   *os.File
	mu   sync.Mutex
	subs map[uint64]*wsSub
}

var (
	rxOnce  sync.Once
	rxLoops []*rxLoop
	rxErr   error
)

// registerRx hands a subscribed connection to its loop (one per core,
// started on first use and kept for the life of the process).
func registerRx(s *wsSub) error {
	rxOnce.Do(func() {
		for range max(runtime.GOMAXPROCS(0), 1) {
			epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
			if err == nil {
				err = unix.SetNonblock(epfd, true)
			}
			if err != nil {
				rxErr = fmt.Errorf("epoll: %w", err)
				return
			}
			l := &rxLoop{epfd: epfd, ep: os.NewFile(uintptr(epfd), "epoll"), subs: map[uint64]*wsSub{}}
			rxLoops = append(rxLoops, l)
			go l.run()
		}
	})
	if rxErr != nil {
		return rxErr
	}
	return rxLoops[s.id%uint64(len(rxLoops))].add(s)
}

func (l *rxLoop) add(s *wsSub) error {
	sc, ok := s.conn.(syscall.Conn)
	if !ok {
		return errors.New("connection has no file descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) }) // no dup: the Go connection keeps owning it
	s.fdMu.Lock()
	s.fd = fd
	s.fdMu.Unlock()
	l.mu.Lock() // publishes s's state to the loop
	l.subs[s.id] = s
	l.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(uint32(s.id)), Pad: int32(uint32(s.id >> 32))}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		l.mu.Lock()
		delete(l.subs, s.id)
		l.mu.Unlock()
		return err
	}
	return nil
}

const closeCheckEvery = 100 * time.Millisecond

var errCloseTimeout = errors.New("the server did not answer our close frame within 2 s")

func (l *rxLoop) run() {
	events := make([]unix.EpollEvent, 256)
	ready := make([]*wsSub, 0, len(events))
	lastCheck := time.Now()
	rc, err := l.ep.SyscallConn()
	if err != nil {
		panic(err)
	}
	var n int
	var werr error
	wait := func(fd uintptr) bool {
		n, werr = unix.EpollWait(int(fd), events, 0)
		return n > 0 || (werr != nil && werr != unix.EINTR)
	}
	for {
		n = 0
		l.ep.SetReadDeadline(time.Now().Add(closeCheckEvery))
		if err := rc.Read(wait); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			warn("waiting on epoll: %v", err)
			time.Sleep(closeCheckEvery)
		}
		if werr != nil && werr != unix.EINTR {
			warn("epoll_wait: %v", werr)
			time.Sleep(closeCheckEvery)
		}
		ready = ready[:0]
		l.mu.Lock()
		for i := range max(n, 0) {
			id := uint64(uint32(events[i].Fd)) | uint64(uint32(events[i].Pad))<<32
			if s := l.subs[id]; s != nil {
				ready = append(ready, s)
			}
		}
		l.mu.Unlock()
		for _, s := range ready {
			s.readOnce()
			if s.ended {
				l.finish(s)
			}
		}
		if n > 0 {
			runtime.Gosched() // busy, it never parks: let the emitter and the rest run
		}
		if now := time.Now(); now.Sub(lastCheck) >= closeCheckEvery {
			lastCheck = now
			l.expireCloses(now.UnixNano())
		}
	}
}

// readOnce takes what one read brings and parses it.
func (s *wsSub) readOnce() {
	m, err := unix.Read(s.fd, s.buf[s.n:])
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		return
	case err != nil:
		s.endRead(err)
		return
	case m == 0:
		s.endRead(io.EOF)
		return
	}
	s.n += m
	s.reads++
	s.consume(time.Now().UnixNano())
}

// expireCloses tears down the connections whose close the server left unanswered.
func (l *rxLoop) expireCloses(now int64) {
	var expired []*wsSub
	l.mu.Lock()
	for _, s := range l.subs {
		if by := s.closeBy.Load(); by != 0 && now > by {
			expired = append(expired, s)
		}
	}
	l.mu.Unlock()
	for _, s := range expired {
		s.closeTimeout, s.err = true, errCloseTimeout
		l.finish(s)
	}
}

func (l *rxLoop) finish(s *wsSub) {
	l.mu.Lock()
	delete(l.subs, s.id)
	l.mu.Unlock()
	s.fdMu.Lock()
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, s.fd, nil)
	s.fd = -1
	s.conn.Close()
	s.fdMu.Unlock()
	s.buf, s.msg = nil, nil
	close(s.done)
}

// shutdown ends a socket without a close frame; its loop then reads EOF.
func shutdown(fd int) { unix.Shutdown(fd, unix.SHUT_RDWR) }
