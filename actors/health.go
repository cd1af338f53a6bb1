package actors

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayhq/relay/proto/clusterpb"
)

// Delivery health: the live figures a project's owner sees (README.md ›
// Delivery health). Each node keeps, per project that had traffic in the
// last hour, two rings of counters: 5-second slots for the last minute and
// 1-minute slots for the last hour. The hot path adds to them with atomics
// beside the system-wide Counters (one slot lookup and a few adds per
// publish, two adds per socket write); nothing touches the store. A cluster
// sums every member's figures.

// healthCounter names one count of a slot.
type healthCounter int

const (
	hEmitsHTTP      healthCounter = iota // HTTP emits accepted (batch entries too)
	hEmitsClient                         // client emits accepted
	hDeliveries                          // messages handed to subscribers' sockets
	hDrops                               // deliveries refused by a gone or slow socket
	hSlowClosed                          // sockets closed as slow consumers (1013)
	hLimitedChannel                      // 429 channel_rate_limited
	hLimitedProject                      // 429 project_rate_limited
	hLimitedClient                       // client_emit_rate_limited
	numHealthCounters
)

// latencyBuckets split fan-out latency (emit accepted to written to the
// socket) in µs on a √2 scale: bucket 2k holds [2^k, 1.5·2^k), bucket
// 2k+1 holds [1.5·2^k, 2^(k+1)); the last also holds everything above
// 2^24 µs (16.8 s).
const latencyBuckets = 48

func latencyBucket(micros int64) int {
	if micros < 1 {
		micros = 1
	}
	b := bits.Len64(uint64(micros)) // 2^(b-1) <= micros < 2^b
	i := 2 * (b - 1)
	if b >= 2 && micros>>(b-2)&1 == 1 {
		i++
	}
	return min(i, latencyBuckets-1)
}

// latencyBound is the upper edge of bucket i, in µs: quantiles are reported
// as the edge of their bucket, so they err on the slow side by under 50%.
func latencyBound(i int) float64 {
	k := float64(int64(1) << (i / 2))
	if i%2 == 0 {
		return 1.5 * k
	}
	return 2 * k
}

type healthSlot struct {
	period  atomic.Int64 // which period (unix time / slot width) the counts are of
	counts  [numHealthCounters]atomic.Int64
	latency [latencyBuckets]atomic.Int64
}

// healthRing is a ring of slots of one width; a slot is cleared when the
// first add of a new period reaches it. A slot is made on its first add: a
// project with a little traffic holds a few (a slot is about 500 bytes, the
// two rings 72 of them).
type healthRing struct {
	width int64 // nanoseconds
	mu    sync.Mutex
	slots []atomic.Pointer[healthSlot]
}

func newHealthRing(width, span time.Duration) healthRing {
	return healthRing{width: int64(width), slots: make([]atomic.Pointer[healthSlot], span/width)}
}

func (r *healthRing) at(now int64) *healthSlot {
	period := now / r.width
	at := &r.slots[period%int64(len(r.slots))]
	s := at.Load()
	if s != nil && s.period.Load() == period {
		return s
	}
	r.mu.Lock()
	if s = at.Load(); s == nil {
		s = &healthSlot{}
		s.period.Store(period)
		at.Store(s)
	} else if s.period.Load() != period {
		for i := range s.counts {
			s.counts[i].Store(0)
		}
		for i := range s.latency {
			s.latency[i].Store(0)
		}
		s.period.Store(period)
	}
	r.mu.Unlock()
	return s
}

// sum adds the slots of the periods within the ring's span ending now.
func (r *healthRing) sum(now int64, into *HealthWindow) {
	current := now / r.width
	for i := range r.slots {
		s := r.slots[i].Load()
		if s == nil {
			continue
		}
		p := s.period.Load()
		if p > current || p <= current-int64(len(r.slots)) {
			continue
		}
		for c := range s.counts {
			into.counts[c] += s.counts[c].Load()
		}
		for b := range s.latency {
			into.latency[b] += s.latency[b].Load()
		}
	}
}

const (
	minuteSlotWidth = 5 * time.Second
	hourSlotWidth   = time.Minute
)

// projectHealth is one project's figures on this node.
type projectHealth struct {
	minute, hour healthRing
	// undrained is what the usage rollup has not taken yet (DrainHealth).
	undrained healthSlot
	last      atomic.Int64 // unix nanos of the last add, for eviction
}

// slots are the three places each add goes: the minute ring's and the hour
// ring's current slot, and the rollup's.
func (h *projectHealth) slots(now int64) [3]*healthSlot {
	return [3]*healthSlot{h.minute.at(now), h.hour.at(now), &h.undrained}
}

func newProjectHealth() *projectHealth {
	return &projectHealth{
		minute: newHealthRing(minuteSlotWidth, time.Minute),
		hour:   newHealthRing(hourSlotWidth, time.Hour),
	}
}

// add counts n of c at now (unix nanos). A nil record counts nothing.
func (h *projectHealth) add(c healthCounter, n int64, now int64) {
	if h == nil || n == 0 {
		return
	}
	for _, s := range h.slots(now) {
		s.counts[c].Add(n)
	}
	h.touch(now)
}

// emitKind is the counter of an accepted emit: a client's or an HTTP one.
func emitKind(client bool) healthCounter {
	if client {
		return hEmitsClient
	}
	return hEmitsHTTP
}

// fanout counts the deliveries and drops of one message's fan-out on this
// node (its emit is counted where it is accepted: settleEmit).
func (h *projectHealth) fanout(delivered, dropped int, now int64) {
	if h == nil || delivered+dropped == 0 {
		return
	}
	for _, s := range h.slots(now) {
		if delivered > 0 {
			s.counts[hDeliveries].Add(int64(delivered))
		}
		if dropped > 0 {
			s.counts[hDrops].Add(int64(dropped))
		}
	}
	h.touch(now)
}

// written records one socket write's fan-out latency.
func (h *projectHealth) written(accepted, now int64) {
	if h == nil {
		return
	}
	b := latencyBucket((now - accepted) / int64(time.Microsecond))
	for _, s := range h.slots(now) {
		s.latency[b].Add(1)
	}
}

// touch keeps the record from eviction; it is written at most once a second.
func (h *projectHealth) touch(now int64) {
	if now-h.last.Load() > int64(time.Second) {
		h.last.Store(now)
	}
}

// healthBook holds the records of this node's projects.
type healthBook struct {
	mu sync.Mutex
	m  map[string]*projectHealth
}

// of returns the project's record, made on first use.
func (b *healthBook) of(project string) *projectHealth {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.m[project]
	if h == nil {
		h = newProjectHealth()
		h.last.Store(time.Now().UnixNano())
		b.m[project] = h
	}
	return h
}

// peek returns the project's record, or nil: reading makes none.
func (b *healthBook) peek(project string) *projectHealth {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[project]
}

// evict drops the records idle for more than an hour whose project has no
// socket on this node (keep says which do); actors that still hold one
// keep counting into it unseen until they stop, which a project with no
// traffic for an hour has long done.
func (b *healthBook) evict(now int64, keep func(project string) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, h := range b.m {
		if now-h.last.Load() > int64(time.Hour+hourSlotWidth) && !keep(id) {
			delete(b.m, id)
		}
	}
}

// HealthDrain is one project's figures since the last DrainHealth.
type HealthDrain struct {
	ProjectID string
	Window    HealthWindow
}

// DrainHealth takes every project's figures counted since the last call
// (the usage rollup's daily columns), resetting them, then drops the records
// of projects gone quiet (evict).
func (s *System) DrainHealth() []HealthDrain {
	b := s.cfg.health
	var out []HealthDrain
	b.mu.Lock()
	for id, h := range b.m {
		d := HealthDrain{ProjectID: id}
		counted := false
		for i := range h.undrained.counts {
			d.Window.counts[i] = h.undrained.counts[i].Swap(0)
			counted = counted || d.Window.counts[i] != 0
		}
		for i := range h.undrained.latency {
			d.Window.latency[i] = h.undrained.latency[i].Swap(0)
			counted = counted || d.Window.latency[i] != 0
		}
		if counted {
			out = append(out, d)
		}
	}
	b.mu.Unlock()
	b.evict(s.cfg.Now().UnixNano(), func(id string) bool {
		s.liveMu.Lock()
		defer s.liveMu.Unlock()
		return s.live[id] > 0
	})
	return out
}

// forget drops a deleted project's record.
func (b *healthBook) forget(project string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, project)
}

// HealthWindow is one window's sums; HealthFigures turns it into figures.
type HealthWindow struct {
	counts  [numHealthCounters]int64
	latency [latencyBuckets]int64
}

// Add merges another node's window (a cluster sums its members).
func (w *HealthWindow) Add(o HealthWindow) {
	for i := range w.counts {
		w.counts[i] += o.counts[i]
	}
	for i := range w.latency {
		w.latency[i] += o.latency[i]
	}
}

// Health is a project's live figures over the last minute and hour, and
// its open sockets.
type Health struct {
	Minute, Hour HealthWindow
	Connections  int
}

// Add merges another node's figures.
func (h *Health) Add(o Health) {
	h.Minute.Add(o.Minute)
	h.Hour.Add(o.Hour)
	h.Connections += o.Connections
}

// HealthFigures is a window as the JSON route and the dashboard show it.
type HealthFigures struct {
	Emits                 int64    `json:"emits"`
	EmitsHTTP             int64    `json:"emitsHttp"`
	EmitsClient           int64    `json:"emitsClient"`
	Deliveries            int64    `json:"deliveries"`
	Dropped               int64    `json:"dropped"`
	SlowClosed            int64    `json:"slowConsumersClosed"`
	ChannelRateLimited    int64    `json:"channelRateLimited"`
	ProjectRateLimited    int64    `json:"projectRateLimited"`
	ClientEmitRateLimited int64    `json:"clientEmitRateLimited"`
	Writes                int64    `json:"latencySamples"`
	P50Ms                 *float64 `json:"latencyP50Ms"` // null with no sample
	P99Ms                 *float64 `json:"latencyP99Ms"`
}

// Figures reads the window.
func (w HealthWindow) Figures() HealthFigures {
	f := HealthFigures{
		EmitsHTTP: w.counts[hEmitsHTTP], EmitsClient: w.counts[hEmitsClient],
		Deliveries: w.counts[hDeliveries], Dropped: w.counts[hDrops], SlowClosed: w.counts[hSlowClosed],
		ChannelRateLimited: w.counts[hLimitedChannel], ProjectRateLimited: w.counts[hLimitedProject],
		ClientEmitRateLimited: w.counts[hLimitedClient],
	}
	f.Emits = f.EmitsHTTP + f.EmitsClient
	for _, n := range w.latency {
		f.Writes += n
	}
	f.P50Ms, f.P99Ms = w.quantile(f.Writes, 0.50), w.quantile(f.Writes, 0.99)
	return f
}

// quantile is the upper edge, in ms, of the bucket holding quantile q.
func (w HealthWindow) quantile(total int64, q float64) *float64 {
	if total == 0 {
		return nil
	}
	rank := int64(q*float64(total) + 0.999999) // the ceil'th sample
	var seen int64
	for i, n := range w.latency {
		if seen += n; seen >= rank {
			ms := latencyBound(i) / 1000
			return &ms
		}
	}
	return nil
}

// windowOf rebuilds a window from its raw sums (the cluster's wire form);
// extra or missing entries are ignored, so members of other versions mix.
func windowOf(counts, latency []int64) HealthWindow {
	var w HealthWindow
	copy(w.counts[:], counts)
	copy(w.latency[:], latency)
	return w
}

// ProjectHealth is a project's live figures: this node's, and in a cluster
// every other member's that answers within the control-plane bound.
func (s *System) ProjectHealth(projectID string) Health {
	out := s.healthHere(projectID)
	c := s.cluster.Load()
	if c == nil || c.leaving.Load() {
		return out
	}
	c.broadcastTo(c.peers(), projectID, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_HealthQuery{HealthQuery: &clusterpb.HealthQuery{}}},
		func(ack *clusterpb.BroadcastAck) {
			h := ack.GetHealth()
			out.Add(Health{
				Minute:      windowOf(h.GetMinuteCounts(), h.GetMinuteLatency()),
				Hour:        windowOf(h.GetHourCounts(), h.GetHourLatency()),
				Connections: int(h.GetConnections()),
			})
		})
	return out
}

// healthHere is this node's figures of the project.
func (s *System) healthHere(projectID string) Health {
	var out Health
	s.liveMu.Lock()
	out.Connections = s.live[projectID]
	s.liveMu.Unlock()
	if h := s.cfg.health.peek(projectID); h != nil {
		now := s.cfg.Now().UnixNano()
		h.minute.sum(now, &out.Minute)
		h.hour.sum(now, &out.Hour)
	}
	return out
}
