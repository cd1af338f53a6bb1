package actors

import "time"

// Budget is one rate-limit window as the emit answers show it (proto/PROTOCOL.md › POST /emit): {limit, remaining, resetAt}.
type Budget struct {
	Limit     int       `json:"limit"`
	Remaining int       `json:"remaining"`
	ResetAt   time.Time `json:"resetAt"`
}

// fixedWindow counts events in fixed windows aligned to multiples of size
// (wall-clock minutes for the emit budgets). Owned by one actor; no locks.
type fixedWindow struct {
	size  time.Duration
	start time.Time
	count int
}

// roll moves the window to now's when now is past it. An event timed a
// little before the window (an HTTP emit is timed on its way in, so two
// racing a boundary can arrive in the other order) counts in it: going back
// would start an empty window, and the next event a second empty one, so
// the current window's count would be lost. Only a clock stepped back by
// more than a window starts over.
func (w *fixedWindow) roll(now time.Time) {
	if !now.Before(w.start.Add(w.size)) || now.Before(w.start.Add(-w.size)) {
		w.start = now.Truncate(w.size)
		w.count = 0
	}
}

// take counts one event if the window has room under limit.
func (w *fixedWindow) take(now time.Time, limit int) (Budget, bool) {
	w.roll(now)
	if w.count >= limit {
		return w.budget(limit), false
	}
	w.count++
	return w.budget(limit), true
}

// lease counts up to want events at once, as many as the window has room
// for under limit (none when it is full): a project grain's grant of
// backstop units to a node (cluster_project_budgets.go).
func (w *fixedWindow) lease(now time.Time, limit, want int) (Budget, int) {
	w.roll(now)
	n := min(want, max(limit-w.count, 0))
	w.count += n
	return w.budget(limit), n
}

// peek reports the window without counting.
func (w *fixedWindow) peek(now time.Time, limit int) Budget {
	w.roll(now)
	return w.budget(limit)
}

// refund gives back one event taken in the window that ends at end (the
// resetAt its taker reported), if that is still the current one.
func (w *fixedWindow) refund(end time.Time) {
	if w.count > 0 && w.start.Add(w.size).Equal(end) {
		w.count--
	}
}

// merge adds a handed-over window's count when it is this window, takes
// it when this one holds nothing or the handed one is later (this clock is
// behind: what was counted there must stay counted), and drops it when it
// is earlier.
func (w *fixedWindow) merge(start time.Time, count int) {
	switch {
	case w.count == 0 || start.After(w.start):
		w.start, w.count = start, count
	case w.start.Equal(start):
		w.count += count
	}
}

// idle reports whether the window holds nothing that a fresh one would forget.
func (w *fixedWindow) idle(now time.Time) bool {
	return w.count == 0 || !now.Before(w.start.Add(w.size))
}

func (w *fixedWindow) budget(limit int) Budget {
	return Budget{Limit: limit, Remaining: max(limit-w.count, 0), ResetAt: w.start.Add(w.size).UTC()}
}
