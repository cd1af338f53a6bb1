package actors

import (
	"slices"
	"time"
)

// answerMemory remembers the answer a grain gave to each request id for
// dedupeWindow, so that a retry (a sender that heard nothing in time) is
// answered the same instead of being applied twice. Owned by one actor.
type answerMemory[T any] struct {
	byID    map[string]T
	order   []answeredID // oldest first from expired on
	expired int          // order[:expired] are forgotten
}

type answeredID struct {
	id string
	at time.Time
}

func newAnswerMemory[T any]() answerMemory[T] { return answerMemory[T]{byID: map[string]T{}} }

func (m *answerMemory[T]) get(id string) (T, bool) {
	a, ok := m.byID[id]
	return a, ok
}

func (m *answerMemory[T]) remember(id string, at time.Time, a T) {
	m.byID[id] = a
	m.order = append(m.order, answeredID{id: id, at: at})
}

// forget drops the answers older than dedupeWindow. It runs on every
// request: the forgotten prefix is only cut off once it is half the slice,
// so a request does not shift every remembered id.
func (m *answerMemory[T]) forget(now time.Time) {
	for m.expired < len(m.order) && now.Sub(m.order[m.expired].at) > dedupeWindow {
		delete(m.byID, m.order[m.expired].id)
		m.order[m.expired] = answeredID{}
		m.expired++
	}
	if m.expired > 0 && m.expired*2 >= len(m.order) {
		n := copy(m.order, m.order[m.expired:])
		m.order = m.order[:n]
		m.expired = 0
	}
}

func (m *answerMemory[T]) len() int { return len(m.byID) }

// each visits the remembered answers, oldest first.
func (m *answerMemory[T]) each(f func(id string, at time.Time, a T)) {
	for _, e := range m.order[m.expired:] {
		f(e.id, e.at, m.byID[e.id])
	}
}

// adopt adds an answer given elsewhere (a handed-over state) unless one is
// known for the id; call resort after the last.
func (m *answerMemory[T]) adopt(id string, at time.Time, a T) {
	if _, ok := m.byID[id]; !ok {
		m.remember(id, at, a)
	}
}

// resort puts the remembered ids back in order, oldest first, after adopt.
func (m *answerMemory[T]) resort() {
	slices.SortStableFunc(m.order[m.expired:], func(a, b answeredID) int { return a.at.Compare(b.at) })
}

// clientWindows are the per-clientId fixed 1-second client-emit windows
// (client-emit rule 6). Owned by one actor.
type clientWindows map[string]*fixedWindow

// maxIdleClientWindows: past this many windows, a new clientId first drops
// the windows that ran out.
const maxIdleClientWindows = 4096

// take counts one emit of clientID if its window has room under limit.
func (cw clientWindows) take(clientID string, now time.Time, limit int) bool {
	w, ok := cw[clientID]
	if !ok {
		if len(cw) >= maxIdleClientWindows {
			for id, w := range cw {
				if w.idle(now) {
					delete(cw, id)
				}
			}
		}
		w = &fixedWindow{size: time.Second}
		cw[clientID] = w
	}
	_, ok = w.take(now, limit)
	return ok
}

// idle: no window holds anything a fresh one would forget.
func (cw clientWindows) idle(now time.Time) bool {
	for _, w := range cw {
		if !w.idle(now) {
			return false
		}
	}
	return true
}
