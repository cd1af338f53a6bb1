package webhook

import (
	"container/list"
	"time"
)

// The last deliveries of each project, for the dashboard and
// GET /api/projects/{projectId}/webhook-deliveries. They are kept in this
// node's memory, as the retries are: a delivery changes several times a
// second under load, which the store should not have to write, and what it
// shows is how this node's sender is doing now (a restart starts the list
// afresh; in a cluster, each node lists the deliveries it sent).

// Delivery statuses (Record.Status).
const (
	StatusPending   = "pending"   // waiting for a worker, or its attempt under way
	StatusRetrying  = "retrying"  // an attempt failed; the next one is at NextAttemptAt
	StatusDelivered = "delivered" // a 2xx answer
	StatusFailed    = "failed"    // given up: an answer that is not retried, or the retry bound reached
	StatusRefused   = "refused"   // not sent: the URL leads to a non-public address, or is invalid
	StatusDropped   = "dropped"   // not retried for lack of room in the queue, or at shutdown
)

// Record is one delivery as it stands.
type Record struct {
	ID            string    // the event's id
	Event         string    // its type
	CreatedAt     time.Time // when it was queued
	Status        string    // a Status… constant
	Attempts      int       // attempts begun
	StatusCode    int       // the last answer's status, 0 if none
	LastError     string    // why the last failed attempt failed, "" if none did
	LastAttemptAt time.Time // zero before the first
	NextAttemptAt time.Time // while retrying
}

// history is the last records of each project, over a bounded number of
// projects (the least recently active forgotten first). Guarded by
// Dispatcher.mu.
type history struct {
	per, projects int
	byID          map[string]*list.Element // of *projectHistory
	lru           list.List                // most recently active first
}

type projectHistory struct {
	id   string
	recs []*Record // oldest first, at most per
}

func newHistory(per, projects int) history {
	return history{per: per, projects: projects, byID: map[string]*list.Element{}}
}

func (h *history) add(project string, r *Record) {
	e := h.byID[project]
	if e == nil {
		e = h.lru.PushFront(&projectHistory{id: project})
		h.byID[project] = e
		if h.lru.Len() > h.projects {
			old := h.lru.Remove(h.lru.Back()).(*projectHistory)
			delete(h.byID, old.id)
		}
	} else {
		h.lru.MoveToFront(e)
	}
	ph := e.Value.(*projectHistory)
	if len(ph.recs) == h.per {
		copy(ph.recs, ph.recs[1:])
		ph.recs[len(ph.recs)-1] = r
		return
	}
	ph.recs = append(ph.recs, r)
}

// list copies project's records, newest first.
func (h *history) list(project string) []Record {
	e := h.byID[project]
	if e == nil {
		return []Record{}
	}
	recs := e.Value.(*projectHistory).recs
	out := make([]Record, len(recs))
	for i, r := range recs {
		out[len(recs)-1-i] = *r
	}
	return out
}

// Deliveries returns the last deliveries of project this node made (at
// most Config.History), newest first.
func (d *Dispatcher) Deliveries(project string) []Record {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.history.list(project)
}
