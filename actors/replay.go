package actors

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultReplayMaxBytes caps one channel's replay ring whatever its TTL: at
// the default budget (600 a minute, 20 s window) that is 200 messages of
// 5 KiB, or 8 of the largest allowed.
const DefaultReplayMaxBytes = 1 << 20

// replayRing keeps a channel's recent messages for `since` (proto/PROTOCOL.md ›
// Replay and seq), bounded by age and by bytes. Owned by the channel actor.
type replayRing struct {
	ttl      time.Duration
	maxBytes int
	// project counts the bytes of every ring of the project; over
	// projectMax (when set) each ring gives up its oldest messages.
	project    *replayBudget
	projectMax int64

	entries []replayEntry // oldest first; entries[head:] are live
	head    int
	bytes   int
	// lowWater: every message with a greater seq is still buffered. It starts
	// at the actor's first seq, since what came before (an earlier life of the
	// channel) is unknown.
	lowWater uint64
}

type replayEntry struct {
	seq uint64
	at  time.Time
	msg []byte // the message object, shared with the frame that carried it
}

func (r *replayRing) add(seq uint64, at time.Time, msg []byte) {
	r.entries = append(r.entries, replayEntry{seq: seq, at: at, msg: msg})
	r.bytes += len(msg)
	if r.project != nil {
		r.project.add(at, len(msg))
	}
	r.expire(at)
}

// expire drops messages older than the TTL, then the oldest while over the
// byte cap or while the project's rings together are over theirs (a message
// dropped early is reported as a replay_gap, never silently missing).
func (r *replayRing) expire(now time.Time) {
	cutoff := now.Add(-r.ttl)
	for r.head < len(r.entries) {
		e := &r.entries[r.head]
		if !e.at.Before(cutoff) && r.bytes <= r.maxBytes && !r.projectOver(now) {
			break
		}
		r.bytes -= len(e.msg)
		if r.project != nil {
			r.project.remove(e.at, len(e.msg))
		}
		r.lowWater = e.seq
		*e = replayEntry{}
		r.head++
	}
	// Compact once the dead prefix is most of the slice.
	if r.head > 0 && r.head*2 >= len(r.entries) {
		n := copy(r.entries, r.entries[r.head:])
		clear(r.entries[n:])
		r.entries = r.entries[:n]
		r.head = 0
		if n == 0 && cap(r.entries) > 64 {
			r.entries = nil // give a burst's memory back
		}
	}
}

func (r *replayRing) empty() bool { return r.head == len(r.entries) }

// live is the buffered messages, oldest first (read only).
func (r *replayRing) live() []replayEntry { return r.entries[r.head:] }

// prepend puts an earlier life's messages (a leaving owner's ring, every
// message up to lastSeq, complete after lowWater) in front of this ring's.
// fresh: this ring has held nothing yet. If the two could overlap, the ring
// stays as it is: a replay_gap is then the honest answer.
func (r *replayRing) prepend(older []replayEntry, lowWater, lastSeq uint64, fresh bool) {
	switch {
	case len(older) > 0 && (fresh || (!r.empty() && lastSeq < r.entries[r.head].seq)):
		for _, e := range older {
			r.bytes += len(e.msg)
			if r.project != nil {
				r.project.add(e.at, len(e.msg))
			}
		}
		r.entries = append(older, r.live()...)
		r.head = 0
		r.lowWater = lowWater
	case fresh && lowWater > 0:
		// Nothing the earlier life delivered after lowWater is missing (its
		// stamps after it, if any, failed and were never delivered); a low
		// water above lastSeq is a fresh life's clock start, no message's.
		r.lowWater = min(lowWater, lastSeq)
	case fresh:
		r.lowWater = max(r.lowWater, lastSeq)
	}
}

// release gives the ring's bytes back to the project's count (the ring's
// owner is stopping with messages still in it).
func (r *replayRing) release() {
	if r.project != nil {
		for _, e := range r.live() {
			r.project.remove(e.at, len(e.msg))
		}
	}
	r.entries, r.head, r.bytes = nil, 0, 0
}

func (r *replayRing) projectOver(now time.Time) bool {
	return r.projectMax > 0 && r.project.over(now, r.ttl, r.projectMax)
}

// replayBudget counts the bytes a project's rings hold together, by the
// second their messages were emitted, so that what is past the TTL stops
// counting at once rather than when its ring is next touched: an idle
// channel's expired messages must not crowd out another channel's new ones
// (MAX_REPLAY_BYTES_PER_PROJECT; the oldest go first). What rings still hold
// past the TTL is bounded too: with it, twice the cap at most.
type replayBudget struct {
	all atomic.Int64 // every byte held, past the TTL or not: the fast path and the hard bound

	mu      sync.Mutex
	total   int64           // bytes of the seconds still counted
	seconds map[int64]int64 // those bytes by emit second (unix)
	from    int64           // the first second still counted: earlier ones are past every TTL seen
}

func (b *replayBudget) add(at time.Time, n int) {
	b.all.Add(int64(n))
	sec := at.Unix()
	b.mu.Lock()
	if sec >= b.from { // else expired already
		if b.seconds == nil {
			b.seconds = map[int64]int64{}
		}
		b.seconds[sec] += int64(n)
		b.total += int64(n)
	}
	b.mu.Unlock()
}

// remove takes back a message's bytes, unless its second has stopped
// counting already.
func (b *replayBudget) remove(at time.Time, n int) {
	b.all.Add(-int64(n))
	sec := at.Unix()
	b.mu.Lock()
	if left, ok := b.seconds[sec]; ok {
		if left -= int64(n); left > 0 {
			b.seconds[sec] = left
		} else {
			delete(b.seconds, sec)
		}
		b.total -= int64(n)
	}
	b.mu.Unlock()
}

// over: the rings hold more than max bytes of messages younger than ttl,
// or more than twice max in all. Under max in all, no lock is taken.
func (b *replayBudget) over(now time.Time, ttl time.Duration, max int64) bool {
	switch all := b.all.Load(); {
	case all <= max:
		return false
	case all > 2*max:
		return true
	}
	return b.held(now, ttl) > max
}

// held is the bytes of messages younger than ttl at now, give or take a
// second: a second stops counting once all of it is past the TTL.
func (b *replayBudget) held(now time.Time, ttl time.Duration) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cutoff := now.Add(-ttl).Unix(); cutoff > b.from {
		for sec, n := range b.seconds {
			if sec < cutoff {
				delete(b.seconds, sec)
				b.total -= n
			}
		}
		b.from = cutoff
	}
	return b.total
}

// request answers a subscribe with since, counting it: true when some message
// after since is no longer buffered (a replay_gap goes first); then each
// gives the buffered ones.
func (r *replayRing) request(since float64, now time.Time, c *Counters) (gap bool) {
	c.ReplayRequests.Add(1)
	r.expire(now)
	if gap = r.gapAfter(since); gap {
		c.ReplayGaps.Add(1)
	}
	return gap
}

// gapAfter: some message after since is no longer buffered.
func (r *replayRing) gapAfter(since float64) bool { return since < float64(r.lowWater) }

// each calls fn for every buffered message with seq > since, in seq order.
func (r *replayRing) each(since float64, fn func(seq uint64, msg []byte)) {
	for _, e := range r.entries[r.head:] {
		if float64(e.seq) > since {
			fn(e.seq, e.msg)
		}
	}
}
