package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/proto"
)

// gatedLoader is a settings loader that waits until released, or fails while
// failing is set, counting its calls.
type gatedLoader struct {
	gate    chan struct{}
	failing atomic.Bool
	missing atomic.Bool
	calls   atomic.Int64
}

func newGatedLoader() *gatedLoader { return &gatedLoader{gate: make(chan struct{})} }

func (l *gatedLoader) load(ctx context.Context, _ string) (Settings, error) {
	l.calls.Add(1)
	select {
	case <-l.gate:
	case <-ctx.Done():
		return Settings{}, ctx.Err()
	}
	switch {
	case l.missing.Load():
		return Settings{}, fmt.Errorf("load: %w", ErrProjectNotFound)
	case l.failing.Load():
		return Settings{}, errors.New("database is down")
	}
	return Settings{}, nil
}

func (l *gatedLoader) release() { close(l.gate) }

// loadingSubscribed is a System whose project "p" is still loading its
// settings (until l.release), with one subscriber k on channel "c", acked:
// a subscribe does not wait for the load.
func loadingSubscribed(t *testing.T) (l *gatedLoader, sys *System, k *sink) {
	t.Helper()
	l = newGatedLoader()
	sys = newTestSystem(t, Config{LoadSettings: l.load})
	return l, sys, subscribeOne(t, sys, "p", "c", 1)
}

// runningProjects is what /debug/actors counts.
func runningProjects(t *testing.T, sys *System) int {
	t.Helper()
	in, err := sys.Inspect(context.Background(), "", "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return in.ProjectsTotal
}

// An HTTP emit whose edge gave up while the project loaded is answered
// ErrTimeout (the client gets a 503) and is never delivered afterwards; an
// emit still waiting when the load finishes runs.
func TestPublishWhileLoadingIsNeverDeliveredLate(t *testing.T) {
	l, sys, k := loadingSubscribed(t)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := sys.Publish(ctx, "p", "c", []byte(`"late"`)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("publish while loading: err %v, want ErrTimeout", err)
	}
	ref, _ := sys.projects.Load("p")
	posted := ref.(*projectRef).state.Load()
	waiting := make(chan PublishResult, 1)
	go func() {
		r, _ := sys.Publish(context.Background(), "p", "c", []byte(`"waited"`))
		waiting <- r
	}()
	// The second emit is held behind the load, beside the abandoned first
	// one (dropped, never delivered, when the load answers).
	waitFor(t, "the second emit posted", func() bool { return ref.(*projectRef).state.Load() > posted })
	waitFor(t, "the second emit held", func() bool {
		in, err := sys.Inspect(context.Background(), "p", "", 0, 0)
		return err == nil && len(in.Projects) == 1 && in.Projects[0].HeldEmits == 2
	})
	l.release()
	r := <-waiting
	if r.Err != nil || r.Delivered != 1 {
		t.Fatalf("held publish after the load: %+v", r)
	}
	after, _ := sys.Publish(context.Background(), "p", "c", []byte(`"after"`))
	if after.Seq != r.Seq+1 {
		t.Errorf("seq %d after %d: the abandoned emit took a seq", after.Seq, r.Seq)
	}
	waitFor(t, "two deliveries", func() bool { return len(k.messages(t)) == 3 })
	for _, m := range k.messages(t)[1:] {
		if m["payload"] == "late" {
			t.Fatalf("the abandoned emit was delivered: %v", m)
		}
	}
	st, _, _ := sys.ProjectStats(context.Background(), "p")
	if st.Emits != 2 {
		t.Errorf("usage emits %d, want 2 (the abandoned one not counted)", st.Emits)
	}
}

// A failed load answers emits service_unavailable at once (HTTP and client),
// and the load is retried until it succeeds.
func TestFailedLoadAnswersUnavailableAndRetries(t *testing.T) {
	l := newGatedLoader()
	l.failing.Store(true)
	l.release()
	sys := newTestSystem(t, Config{LoadSettings: l.load})
	k := &sink{id: 1}
	sess := openConn(sys, "p", k)
	waitFor(t, "a failed load", func() bool { return l.calls.Load() >= 1 })
	var r PublishResult
	waitFor(t, "unavailable", func() bool {
		r, _ = sys.Publish(context.Background(), "p", "c", []byte(`1`))
		return r.Err != nil
	})
	if r.Err.Code != proto.CodeUnavailable {
		t.Fatalf("publish after a failed load: %+v, want service_unavailable", r.Err)
	}
	sess.HandleMessage([]byte(`{"action":"emit","channel":"c","type":"t","token":"x"}`))
	waitFor(t, "client emit refusal", func() bool { return len(k.messages(t)) == 1 })
	if m := k.messages(t)[0]; m["error"] != string(proto.CodeUnavailable) || m["channel"] != "c" {
		t.Errorf("client emit while unavailable: %v", m)
	}
	l.failing.Store(false) // the database is back: the retry (after 1 s) succeeds
	waitFor(t, "ready after the retry", func() bool {
		r, _ = sys.Publish(context.Background(), "p", "c", []byte(`1`))
		return r.Err == nil
	})
}

// A project the store does not know (deleted while a handshake was under
// way) closes what it holds and its actor stops, instead of retrying.
func TestProjectNotFoundStopsItsActor(t *testing.T) {
	l := newGatedLoader()
	l.missing.Store(true)
	sys := newTestSystem(t, Config{LoadSettings: l.load})
	k := &sink{id: 1}
	openConn(sys, "gone", k)
	l.release()
	waitFor(t, "close", func() bool { return k.closed.Load() == proto.CloseProjectDeleted })
	waitFor(t, "actor stopped", func() bool { return runningProjects(t, sys) == 0 })
	if n := l.calls.Load(); n != 1 {
		t.Errorf("settings loaded %d times, want 1 (no retry loop)", n)
	}
	// Used again (a late emit), it starts, finds nothing, and stops again.
	r, _ := sys.Publish(context.Background(), "gone", "c", []byte(`1`))
	if r.Err == nil || r.Err.Code != proto.CodeUnavailable {
		t.Errorf("emit to a missing project: %+v", r)
	}
	waitFor(t, "actor stopped again", func() bool { return runningProjects(t, sys) == 0 })
}

// A loading project holds at most maxHeld emits; more are refused at once.
func TestLoadingHoldsABoundedNumberOfEmits(t *testing.T) {
	l := newGatedLoader()
	sys := newTestSystem(t, Config{LoadSettings: l.load, EmitRatePerMinute: 1 << 20, ProjectRatePerMinute: 1 << 20})
	var wg sync.WaitGroup
	var refused, delivered atomic.Int64
	for range maxHeld + 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
			switch {
			case r.Err != nil && r.Err.Code == proto.CodeUnavailable:
				refused.Add(1)
			case r.Err == nil && r.Seq != 0:
				delivered.Add(1)
			}
		}()
	}
	waitFor(t, "the overflow refused", func() bool { return refused.Load() == 10 })
	l.release()
	wg.Wait()
	if n := refused.Load(); n != 10 {
		t.Errorf("%d refused, want 10", n)
	}
	if n := delivered.Load(); n != maxHeld {
		t.Errorf("%d held emits applied after the load, want %d", n, maxHeld)
	}
}

// Project actors with nothing to keep stop after the quiet period, and a
// project used again gets a fresh actor with the same budgets from the store.
func TestIdleProjectActorsStop(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	var loads atomic.Int64
	sys := newTestSystem(t, Config{ActorDormancy: 20 * time.Millisecond,
		Now: func() time.Time { return time.Unix(0, clock.Load()) },
		LoadSettings: func(context.Context, string) (Settings, error) {
			loads.Add(1)
			return Settings{ChannelRateLimit: 7}, nil // the store's override, which a new actor must load again
		}})
	for i := range 200 {
		if r, err := sys.Publish(context.Background(), fmt.Sprint("p", i), "c", []byte(`1`)); err != nil || r.Err != nil {
			t.Fatalf("publish: %v %+v", err, r)
		}
	}
	k := subscribeOne(t, sys, "kept", "c", 1) // a project with a connection stays
	sys.DrainUsage(context.Background())      // counts rolled up: nothing left to keep
	clock.Add(int64(2 * time.Minute))         // budget windows run out
	waitFor(t, "idle projects to stop", func() bool { return runningProjects(t, sys) == 1 })
	if k.closed.Load() != 0 {
		t.Fatal("the connected project's socket was closed")
	}
	if r, _ := sys.Publish(context.Background(), "kept", "c", []byte(`1`)); r.Delivered != 1 {
		t.Errorf("kept project: %+v", r)
	}
	before := loads.Load()
	if r, _ := sys.Publish(context.Background(), "p7", "c", []byte(`1`)); r.Err != nil || r.Seq == 0 || r.Channel.Limit != 7 {
		t.Errorf("a stopped project used again: %+v, want its channel budget of 7 from the store", r)
	}
	if loads.Load() != before+1 {
		t.Errorf("settings loaded %d times for the project used again, want 1", loads.Load()-before)
	}
}

// Emits racing actors that stop and restart all get an answer: the edge
// never posts to an actor that decided to stop (projectRef).
func TestRetireRacesEmits(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	sys := newTestSystem(t, Config{ActorDormancy: time.Millisecond, EmitRatePerMinute: 1 << 30, ProjectRatePerMinute: 1 << 30,
		Now: func() time.Time { return time.Unix(0, clock.Add(int64(time.Minute))) }}) // every reading a minute later
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				if r, err := sys.Publish(ctx, fmt.Sprint("p", (w+i)%5), "c", []byte(`1`)); err != nil || r.Err != nil || r.Seq == 0 {
					t.Errorf("publish %d of worker %d: %+v %v", i, w, r, err)
					return
				}
				if i%50 == 0 {
					sys.DrainUsage(ctx)
					// Time by nature, not a wait for an event: a gap in this
					// worker's emits, on the real clock the dormancy ticks run
					// on (two 1 ms ticks), so that actors stop while the other
					// workers' emits race them. Waiting until this worker's
					// project stopped would line the workers up instead.
					time.Sleep(3 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
}

// Usage counts an emit only where a channel accepts it, so a refusal that
// arrives after a rollup cannot leave a negative count.
func TestUsageNeverNegative(t *testing.T) {
	sys := newTestSystem(t, Config{EmitRatePerMinute: 1})
	sys.Publish(context.Background(), "p", "c", []byte(`1`))
	u := sys.DrainUsage(context.Background())
	if len(u) != 1 || u[0].Emits != 1 {
		t.Fatalf("first drain: %+v", u)
	}
	if r, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`)); r.Err == nil || r.Err.Code != proto.CodeChannelRateLimited {
		t.Fatalf("second emit: %+v", r)
	}
	u = sys.DrainUsage(context.Background())
	if len(u) != 1 || u[0].Emits != 0 {
		t.Errorf("after a refused emit: %+v, want 0 emits", u)
	}
	st, _, _ := sys.ProjectStats(context.Background(), "p")
	if st.Emits != 0 {
		t.Errorf("stats emits %d", st.Emits)
	}
}

// An HTTP emit whose channel actor panics after taking it is answered
// service_unavailable at once: its edge has stopped counting the timeout by
// then, and used to wait for the answer for ever. The channel carries on.
func TestPublishAnsweredWhenTheChannelPanics(t *testing.T) {
	sys := newTestSystem(t, Config{})
	k := subscribeOne(t, sys, "p", "c", 1)

	k.panics.Store(true)
	type answer struct {
		res PublishResult
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		res, err := sys.PublishWithin(context.Background(), 5*time.Second, "p", "c", []byte(`"boom"`))
		answered <- answer{res, err}
	}()
	select {
	case a := <-answered:
		if a.err != nil || a.res.Err == nil || a.res.Err.Code != proto.CodeUnavailable {
			t.Fatalf("emit through a panicking fan-out: %+v, %v; want service_unavailable", a.res, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the emit was never answered")
	}

	k.panics.Store(false)
	res, err := sys.PublishWithin(context.Background(), time.Second, "p", "c", []byte(`"after"`))
	if err != nil || res.Err != nil || res.Delivered != 1 {
		t.Fatalf("emit after the panic: %+v, %v; want delivered to the one subscriber", res, err)
	}
}

// Emits held while the project loads are applied in the order they came
// when the load ends: seqs and deliveries follow it, more of them than a
// poster runs in one turn (posterTurns).
func TestHeldEmitsKeepTheirOrder(t *testing.T) {
	l, sys, k := loadingSubscribed(t)

	const n = 3*posterTurns + 1
	seqs := make([]uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := sys.PublishWithin(context.Background(), 5*time.Second, "p", "c", []byte(fmt.Sprint(i)))
			if err != nil || r.Err != nil {
				t.Errorf("held emit %d: %+v, %v", i, r, err)
			}
			seqs[i] = r.Seq
		}()
		// The next is posted only once this one is held: the order is known.
		waitFor(t, "the emit held", func() bool {
			in, err := sys.Inspect(context.Background(), "p", "", 0, 0)
			return err == nil && len(in.Projects) == 1 && in.Projects[0].HeldEmits == i+1
		})
	}
	l.release()
	wg.Wait()
	for i := 1; i < n; i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("seqs %v: not in the order the emits came", seqs)
		}
	}
	waitFor(t, "every held emit delivered", func() bool { return len(k.messages(t)) == 1+n })
	for i, m := range k.messages(t)[1:] {
		if m["payload"] != float64(i) {
			t.Fatalf("delivery %d has payload %v, want %d", i, m["payload"], i)
		}
	}
}
