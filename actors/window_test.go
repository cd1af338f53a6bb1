package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// An emit timed just before a minute's start that reaches the actors after
// that minute's first emits (two handlers racing the boundary: an HTTP emit
// is timed on its way in) counts in the new minute. It used to start an
// empty window for the old minute, and the next emit another empty one for
// the new minute: a whole budget more got through.
func TestLateEmitKeepsTheWindows(t *testing.T) {
	for _, tc := range []struct {
		name           string
		channel, proj  int
		channelOfEmits func(i int) string
	}{
		{"channel budget", 3, 1000, func(int) string { return "c" }},
		{"project backstop", 1000, 3, func(i int) string { return string(rune('a' + i)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boundary := time.Now().Truncate(time.Minute).Add(time.Minute)
			var clock atomic.Int64
			clock.Store(boundary.Add(time.Millisecond).UnixNano())
			sys := newTestSystem(t, Config{EmitRatePerMinute: tc.channel, ProjectRatePerMinute: tc.proj,
				Now: func() time.Time { return time.Unix(0, clock.Load()) }})
			ctx := context.Background()
			emit := func(i int) *PublishResult {
				res, err := sys.Publish(ctx, "p", tc.channelOfEmits(i), []byte(`1`))
				if err != nil {
					t.Fatal(err)
				}
				return &res
			}
			for i := range 3 {
				if res := emit(i); res.Err != nil {
					t.Fatalf("emit %d: %v", i, res.Err)
				}
			}
			clock.Store(boundary.Add(-time.Millisecond).UnixNano()) // timed in the minute before
			if res := emit(3); res.Err == nil {
				t.Fatal("the late emit was counted in a fresh window")
			}
			clock.Store(boundary.Add(2 * time.Millisecond).UnixNano())
			for i := 4; i < 7; i++ {
				if res := emit(i); res.Err == nil {
					t.Fatalf("emit %d accepted in a minute whose budget of 3 is spent", i)
				}
			}
		})
	}
}

// A window goes back only for a clock stepped back by more than a window.
func TestWindowAfterAClockStep(t *testing.T) {
	w := fixedWindow{size: time.Minute}
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for range 3 {
		w.take(start.Add(time.Second), 3)
	}
	if _, ok := w.take(start.Add(-time.Second), 3); ok {
		t.Fatal("an event a second before the window opened a fresh one")
	}
	b, ok := w.take(start.Add(-2*time.Minute), 3) // the clock went back two minutes
	if !ok || b.Remaining != 2 || !b.ResetAt.Equal(start.Add(-time.Minute)) {
		t.Fatalf("after the clock went back: %+v %v, want a fresh window ending %v", b, ok, start.Add(-time.Minute))
	}
}

// TestFixedWindowMerge: a handed-over window's count adds up with this
// one's when it is the same window, replaces it when it is later (this
// grain's clock is behind: the count must stay counted) or when this one
// holds nothing, and is dropped when it is earlier.
func TestFixedWindowMerge(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name        string
		start       time.Time
		count       int
		handedStart time.Time
		handed      int
		wantStart   time.Time
		wantCount   int
	}{
		{"same window", t0, 3, t0, 4, t0, 7},
		{"this one empty", time.Time{}, 0, t0, 4, t0, 4},
		{"handed later", t0, 3, t0.Add(time.Minute), 4, t0.Add(time.Minute), 4},
		{"handed earlier", t0.Add(time.Minute), 3, t0, 4, t0.Add(time.Minute), 3},
	}
	for _, c := range cases {
		w := fixedWindow{size: time.Minute, start: c.start, count: c.count}
		w.merge(c.handedStart, c.handed)
		if !w.start.Equal(c.wantStart) || w.count != c.wantCount {
			t.Errorf("%s: start %v count %d, want %v %d", c.name, w.start, w.count, c.wantStart, c.wantCount)
		}
	}
}

// TestFixedWindowRefund: a refund names the window its event was counted
// in (the resetAt it reported): given back while that window is current,
// also for an event timed a little before it (counted in it, see roll),
// and not once the window has moved on.
func TestFixedWindowRefund(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	w := fixedWindow{size: time.Minute}
	w.take(t0.Add(time.Second), 5)
	late, _ := w.take(t0.Add(-time.Millisecond), 5) // timed before the window, counted in it
	if !late.ResetAt.Equal(t0.Add(time.Minute)) || w.count != 2 {
		t.Fatalf("the late event: %+v, count %d", late, w.count)
	}
	w.refund(late.ResetAt)
	w.refund(t0) // the window before: nothing to give back
	if w.count != 1 {
		t.Fatalf("count %d after one refund of this window and one of the last, want 1", w.count)
	}
	next, _ := w.take(t0.Add(time.Minute), 5) // the window moves on
	w.refund(late.ResetAt)
	if w.count != 1 || next.Remaining != 4 {
		t.Fatalf("a refund of the last window changed the next: count %d", w.count)
	}
}
