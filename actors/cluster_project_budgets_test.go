package actors

import (
	"testing"
	"time"

	"github.com/relayhq/relay/proto/clusterpb"
)

// TestBackstopLease: a node's share of the cluster's backstop, as the
// project grain's answers fill it (fixedWindow.lease on the grain's side).
func TestBackstopLease(t *testing.T) {
	start := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	grain := fixedWindow{size: time.Minute}
	var l backstopLease
	ask := func(now time.Time, want int) {
		t.Helper()
		w, n := grain.lease(now, 20, want)
		l.grant(&clusterpb.ProjectTaken{Leased: int32(n), Project: budgetToProto(w), Leases: true, ResetInNanos: int64(w.ResetAt.Sub(now))}, now)
	}
	spend := func(now time.Time, wantOK, wantDecided bool, remaining int) {
		t.Helper()
		b, ok, decided := l.take(now, false)
		if ok != wantOK || decided != wantDecided || (decided && (b.Remaining != remaining || b.Limit != 20 || !b.ResetAt.Equal(start.Add(time.Minute)))) {
			t.Fatalf("take at %v: %+v ok %v decided %v; want ok %v decided %v remaining %d", now.Sub(start), b, ok, decided, wantOK, wantDecided, remaining)
		}
	}

	at := start.Add(time.Second)
	spend(at, false, false, 0) // nothing granted yet: ask
	if l.want(8) != 8 {
		t.Fatalf("want %d with no share, want 8", l.want(8))
	}
	ask(at, 8)
	spend(at, true, true, 19) // the grain's 12 plus the 7 left
	for _, remaining := range []int{18, 17, 16} {
		spend(at, true, true, remaining)
	}
	if l.units != 4 || l.want(8) != 0 {
		t.Fatalf("units %d want %d; want 4 and 0 (half a share left: ask for the remaining only)", l.units, l.want(8))
	}
	ask(at, l.want(8)) // a peek: nothing granted, the grain's remaining
	if l.units != 4 || l.left != 12 {
		t.Fatalf("after a peek: units %d left %d", l.units, l.left)
	}
	spend(at, true, true, 15)
	if l.want(8) != 8 {
		t.Fatalf("want %d with 3 left of a share of 8", l.want(8))
	}

	// An answer older than leaseFresh: ask again before spending.
	later := at.Add(leaseFresh + time.Millisecond)
	spend(later, false, false, 0)
	ask(later, 8) // 8 more of the grain's 12
	spend(later, true, true, 4+10)
	if _, ok, decided := l.take(later.Add(leaseFresh+time.Millisecond), true); !ok || !decided || l.units != 9 {
		t.Fatalf("an old answer with the grain slow to answer: ok %v decided %v units %d; want the share spent", ok, decided, l.units)
	}
	l.units++ // as before that emit

	// A refund of this window goes back to the share; one of the last window does not.
	l.refund(start.Add(time.Minute))
	l.refund(start)
	if l.units != 11 {
		t.Fatalf("units %d after one refund of this window's, want 11", l.units)
	}

	// The grain runs dry: a partial grant, then nothing; once the share is
	// spent the node refuses without asking, even past leaseFresh.
	ask(later, 8) // the grain's last 4
	if l.units != 15 || l.left != 0 || !l.dry {
		t.Fatalf("units %d left %d dry %v after the last 4", l.units, l.left, l.dry)
	}
	for range 15 {
		spend(later, true, true, l.units-1)
	}
	spend(later.Add(10*time.Second), false, true, 0)

	// The next window: the last one's share is void; ask.
	next := start.Add(time.Minute)
	spend(next, false, false, 0)
	w, n := grain.lease(next, 20, 8)
	l.grant(&clusterpb.ProjectTaken{Leased: int32(n), Project: budgetToProto(w), Leases: true, ResetInNanos: int64(w.ResetAt.Sub(next))}, next)
	if l.units != 8 || l.dry || l.left != 12 || !l.resetAt.Equal(start.Add(2*time.Minute)) {
		t.Fatalf("the next window's share: %+v", l)
	}

	// This node's clock 3 s ahead of the grain's: the share ends 40 s after
	// the answer by this node's clock too, not at the grain's resetAt read
	// on this clock (which would void it 3 s early and make it ask again
	// and again until the grain's window ends).
	ahead := next.Add(20*time.Second + 3*time.Second)
	l.grant(&clusterpb.ProjectTaken{Leased: 2, Project: budgetToProto(Budget{Limit: 20, Remaining: 10, ResetAt: start.Add(2 * time.Minute)}),
		Leases: true, ResetInNanos: int64(40 * time.Second)}, ahead)
	if b, ok, decided := l.take(ahead.Add(39*time.Second), true); !ok || !decided || b.Remaining != 10+9 || !b.ResetAt.Equal(start.Add(2*time.Minute)) {
		t.Fatalf("39 s after the answer, by this clock: %+v ok %v decided %v", b, ok, decided)
	}
	if _, _, decided := l.take(ahead.Add(40*time.Second), true); decided {
		t.Fatal("40 s after the answer, by this clock: the share is not void")
	}
	l.units = 8

	// A grain of an older version (a rolling upgrade) answers a lease ask
	// as an ask for one emit: it took one unit, unless it refused.
	l.grant(&clusterpb.ProjectTaken{Project: budgetToProto(Budget{Limit: 20, Remaining: 11, ResetAt: start.Add(2 * time.Minute)})}, next)
	l.grant(&clusterpb.ProjectTaken{ProjectDenied: true, Project: budgetToProto(Budget{Limit: 20, Remaining: 0, ResetAt: start.Add(2 * time.Minute)})}, next)
	if l.units != 9 || !l.dry {
		t.Fatalf("after an older grain's unit and its refusal: units %d dry %v; want 9 and dry", l.units, l.dry)
	}
}
