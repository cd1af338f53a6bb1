package actors

import (
	"testing"
	"time"
)

func TestLatencyBuckets(t *testing.T) {
	for _, c := range []struct {
		micros int64
		bucket int
	}{
		{-5, 0}, {0, 0}, {1, 0}, {2, 2}, {3, 3}, {4, 4}, {5, 4}, {6, 5}, {7, 5}, {8, 6},
		{1000, 19}, {1 << 23, 46}, {3 << 22, 47}, {1 << 40, latencyBuckets - 1},
	} {
		if got := latencyBucket(c.micros); got != c.bucket {
			t.Errorf("latencyBucket(%d) = %d, want %d", c.micros, got, c.bucket)
		}
		// Every value is below its bucket's upper edge (but the last, open one).
		if b := latencyBucket(c.micros); b < latencyBuckets-1 && float64(max(c.micros, 1)) >= latencyBound(b) {
			t.Errorf("%d µs at or above bucket %d's edge %v", c.micros, b, latencyBound(b))
		}
	}
}

func TestHealthWindows(t *testing.T) {
	h := newProjectHealth()
	start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC).UnixNano()
	at := func(d time.Duration) int64 { return start + int64(d) }

	h.add(hEmitsHTTP, 1, at(0))
	h.fanout(10, 1, at(0))
	h.add(hEmitsClient, 1, at(2*time.Second))
	h.fanout(5, 0, at(2*time.Second))
	h.add(hLimitedChannel, 2, at(3*time.Second))
	h.fanout(4, 0, at(4*time.Second))
	for range 98 {
		h.written(at(0), at(3*time.Millisecond)) // 3 ms: bucket [2048, 3072) µs
	}
	h.written(at(0), at(40*time.Millisecond))
	h.written(at(0), at(900*time.Millisecond))

	read := func(now time.Duration) Health {
		var out Health
		h.minute.sum(at(now), &out.Minute)
		h.hour.sum(at(now), &out.Hour)
		return out
	}
	got := read(10 * time.Second)
	for name, w := range map[string]HealthWindow{"minute": got.Minute, "hour": got.Hour} {
		f := w.Figures()
		if f.Emits != 2 || f.EmitsHTTP != 1 || f.EmitsClient != 1 || f.Deliveries != 19 || f.Dropped != 1 || f.ChannelRateLimited != 2 || f.Writes != 100 {
			t.Errorf("%s: %+v", name, f)
		}
		if f.P50Ms == nil || *f.P50Ms != 3.072 || f.P99Ms == nil || *f.P99Ms != 49.152 {
			t.Errorf("%s quantiles: p50 %v p99 %v", name, f.P50Ms, f.P99Ms)
		}
	}
	// 61 s on: out of the minute, still in the hour.
	got = read(61 * time.Second)
	if f := got.Minute.Figures(); f.Emits != 0 || f.Writes != 0 || f.P50Ms != nil {
		t.Errorf("minute after 61 s: %+v", f)
	}
	if f := got.Hour.Figures(); f.Emits != 2 || f.Deliveries != 19 {
		t.Errorf("hour after 61 s: %+v", f)
	}
	// A new add an hour on reuses the slot, cleared.
	h.add(hEmitsHTTP, 1, at(time.Hour+time.Second))
	h.fanout(1, 0, at(time.Hour+time.Second))
	got = read(time.Hour + 2*time.Second)
	if f := got.Hour.Figures(); f.Emits != 1 || f.Deliveries != 1 || f.Writes != 0 {
		t.Errorf("hour an hour on: %+v", f)
	}
	if f := got.Minute.Figures(); f.Emits != 1 {
		t.Errorf("minute an hour on: %+v", f)
	}
}

func TestHealthBookEviction(t *testing.T) {
	b := healthBook{m: map[string]*projectHealth{}}
	if b.peek("p") != nil {
		t.Fatal("peek made a record")
	}
	h := b.of("p")
	if b.of("p") != h || b.peek("p") != h {
		t.Fatal("a second record for one project")
	}
	now := h.last.Load()
	b.evict(now+int64(30*time.Minute), func(string) bool { return false })
	if b.peek("p") == nil {
		t.Fatal("evicted while recent")
	}
	b.evict(now+int64(2*time.Hour), func(string) bool { return true })
	if b.peek("p") == nil {
		t.Fatal("evicted with sockets open")
	}
	b.evict(now+int64(2*time.Hour), func(string) bool { return false })
	if b.peek("p") != nil {
		t.Fatal("kept an hour idle")
	}
}

// A project's ring slots are made as they are first written: a record
// with one add holds one slot per ring, not 72; a later period in another
// slot makes that one, and the same slot in a later period is reused.
func TestHealthSlotsMadeOnUse(t *testing.T) {
	h := newProjectHealth()
	made := func(r *healthRing) (n int) {
		for i := range r.slots {
			if r.slots[i].Load() != nil {
				n++
			}
		}
		return n
	}
	start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC).UnixNano()
	if made(&h.minute)+made(&h.hour) != 0 {
		t.Fatal("slots made before any add")
	}
	h.add(hEmitsHTTP, 1, start)
	if made(&h.minute) != 1 || made(&h.hour) != 1 {
		t.Fatalf("after one add: %d minute and %d hour slots, want 1 and 1", made(&h.minute), made(&h.hour))
	}
	h.add(hEmitsHTTP, 1, start+int64(10*time.Second)) // another minute slot, the same hour slot
	h.add(hEmitsHTTP, 1, start+int64(time.Minute))    // the first minute slot again, a new hour slot
	if made(&h.minute) != 2 || made(&h.hour) != 2 {
		t.Fatalf("after three adds: %d minute and %d hour slots, want 2 and 2", made(&h.minute), made(&h.hour))
	}
	var w HealthWindow
	h.minute.sum(start+int64(time.Minute), &w)
	if w.counts[hEmitsHTTP] != 2 { // the emit a minute ago went with its slot's reuse
		t.Fatalf("the minute ending now counts %d emits, want 2", w.counts[hEmitsHTTP])
	}
}
