package actors

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/gobwas/ws"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// sink records frames like a socket would receive them.
type sink struct {
	id     uint64
	mu     sync.Mutex
	frames [][]byte
	closed atomic.Int32 // close code, 0 while open
	refuse atomic.Bool  // Send reports the socket gone
	panics atomic.Bool  // SendAt panics, as a broken sink would
}

func (s *sink) ID() uint64 { return s.id }

func (s *sink) Send(f []byte) bool {
	if s.refuse.Load() {
		return false
	}
	s.mu.Lock()
	s.frames = append(s.frames, f)
	s.mu.Unlock()
	return true
}

func (s *sink) SendAt(f []byte, _ int64) bool {
	if s.panics.Load() {
		panic("sink failed")
	}
	return s.Send(f)
}

func (s *sink) Close(code transport.CloseCode, _ string) { s.closed.Store(int32(code)) }

// messages decodes the JSON of every frame received so far.
func (s *sink) messages(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]map[string]any, 0, len(s.frames))
	for _, f := range s.frames {
		h, err := ws.ReadHeader(bytesReader(f))
		if err != nil || !h.Fin || h.OpCode != ws.OpText || h.Masked {
			t.Fatalf("bad frame header %+v: %v", h, err)
		}
		body := f[len(f)-int(h.Length):]
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("frame is not JSON: %q", body)
		}
		out = append(out, m)
	}
	return out
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !within(5*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// advance moves a testing/synctest bubble's clock on by d, then waits until
// every goroutine of the bubble is blocked again: what the timers due by
// then set off has all happened.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// within polls cond every 2 ms until it holds (true) or timeout passes
// (false), for a caller that reports the failure itself. The state it
// waits on changes with no event to wait for (actors' mailboxes, maps).
func within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond) // the poll's interval
	}
	return true
}

func newTestSystem(t testing.TB, cfg Config) *System {
	if cfg.EmitRatePerMinute == 0 {
		cfg.EmitRatePerMinute = 600
	}
	if cfg.ProjectRatePerMinute == 0 {
		cfg.ProjectRatePerMinute = 6000
	}
	if cfg.LoadSettings == nil {
		cfg.LoadSettings = func(context.Context, string) (Settings, error) { return Settings{}, nil }
	}
	s := NewSystem(cfg)
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

func subscribeOne(t *testing.T, sys *System, project, channel string, id uint64) *sink {
	t.Helper()
	k := &sink{id: id}
	sess := openConn(sys, project, k)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"` + channel + `"}`))
	waitFor(t, "subscribe ack", func() bool { return len(k.messages(t)) == 1 })
	return k
}

func TestPublishFansOutOneFrame(t *testing.T) {
	sys := newTestSystem(t, Config{})
	a := subscribeOne(t, sys, "p1", "room", 1)
	b := subscribeOne(t, sys, "p1", "room", 2)
	other := subscribeOne(t, sys, "p2", "room", 3) // same name, other project

	res, err := sys.Publish(context.Background(), "p1", "room", []byte(`{"x":1}`))
	if err != nil || res.Err != nil {
		t.Fatalf("publish: %v %v", err, res.Err)
	}
	if res.Delivered != 2 || res.Subscribers != 2 {
		t.Fatalf("delivered %d of %d, want 2 of 2", res.Delivered, res.Subscribers)
	}
	waitFor(t, "deliveries", func() bool { return len(a.messages(t)) == 2 && len(b.messages(t)) == 2 })
	if &a.frames[1][0] != &b.frames[1][0] {
		t.Error("subscribers got different frame buffers; want one encoding shared")
	}
	got := a.messages(t)[1]
	if got["channel"] != "room" || got["seq"].(float64) != float64(res.Seq) || got["payload"].(map[string]any)["x"] != 1.0 {
		t.Errorf("message = %v", got)
	}
	if len(other.messages(t)) != 1 {
		t.Error("a subscriber of another project received the message")
	}
	res2, _ := sys.Publish(context.Background(), "p1", "room", []byte(`2`))
	if res2.Seq <= res.Seq {
		t.Errorf("seq went %d → %d; want strictly increasing", res.Seq, res2.Seq)
	}
}

func TestChannelBudget(t *testing.T) {
	sys := newTestSystem(t, Config{EmitRatePerMinute: 3, ProjectRatePerMinute: 100})
	for i := 0; i < 3; i++ {
		res, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
		if res.Err != nil || res.Channel.Remaining != 2-i {
			t.Fatalf("emit %d: %+v", i, res)
		}
	}
	res, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
	if res.Err == nil || res.Err.Code != proto.CodeChannelRateLimited {
		t.Fatalf("4th emit: %+v, want channel_rate_limited", res)
	}
	if res.Channel.Remaining != 0 || res.Project.Remaining != 97 || res.Project.Limit != 100 {
		t.Errorf("budgets after refusal: %+v %+v", res.Channel, res.Project)
	}
	// Another channel has its own budget.
	if res, _ := sys.Publish(context.Background(), "p", "d", []byte(`1`)); res.Err != nil {
		t.Errorf("other channel refused: %+v", res.Err)
	}
}

func TestProjectBackstop(t *testing.T) {
	sys := newTestSystem(t, Config{EmitRatePerMinute: 100, ProjectRatePerMinute: 2})
	sys.Publish(context.Background(), "p", "a", []byte(`1`))
	sys.Publish(context.Background(), "p", "b", []byte(`1`))
	res, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
	if res.Err == nil || res.Err.Code != proto.CodeProjectRateLimited {
		t.Fatalf("3rd emit: %+v, want project_rate_limited", res)
	}
	if res.Project.Remaining != 0 || res.Channel.Remaining != 100 {
		t.Errorf("budgets: %+v %+v", res.Project, res.Channel)
	}
}

func TestGoneSubscriberIsPruned(t *testing.T) {
	sys := newTestSystem(t, Config{})
	a := subscribeOne(t, sys, "p", "c", 1)
	subscribeOne(t, sys, "p", "c", 2)
	a.refuse.Store(true)
	res, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
	if res.Subscribers != 2 || res.Delivered != 1 {
		t.Fatalf("delivered %d of %d, want 1 of 2", res.Delivered, res.Subscribers)
	}
	res, _ = sys.Publish(context.Background(), "p", "c", []byte(`1`))
	if res.Subscribers != 1 {
		t.Fatalf("subscribers after prune = %d, want 1", res.Subscribers)
	}
}

func TestUnsubscribeAndClose(t *testing.T) {
	sys := newTestSystem(t, Config{})
	stay := subscribeOne(t, sys, "p", "c", 1)

	// Closing a socket removes all its subscriptions at once.
	gone := &sink{id: 2}
	sg := openConn(sys, "p", gone)
	sg.HandleMessage([]byte(`{"action":"subscribe","channel":"c"}`))
	sg.HandleMessage([]byte(`{"action":"subscribe","channel":"d"}`))
	waitFor(t, "acks", func() bool { return len(gone.messages(t)) == 2 })
	sg.HandleClose(CloseStatus{})
	waitFor(t, "close cleanup", func() bool {
		c, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
		d, _ := sys.Publish(context.Background(), "p", "d", []byte(`1`))
		return c.Subscribers == 1 && d.Subscribers == 0
	})

	// Unsubscribe acks, and nothing follows the ack.
	left := &sink{id: 3}
	sl := openConn(sys, "p", left)
	sl.HandleMessage([]byte(`{"action":"subscribe","channel":"c"}`))
	sl.HandleMessage([]byte(`{"action":"unsubscribe","channel":"c"}`))
	waitFor(t, "unsubscribe ack", func() bool { return len(left.messages(t)) == 2 })
	if m := left.messages(t)[1]; m["action"] != "unsubscribe" || m["ok"] != true || m["channel"] != "c" {
		t.Errorf("ack = %v", m)
	}
	n := len(stay.messages(t))
	sys.Publish(context.Background(), "p", "c", []byte(`1`))
	waitFor(t, "delivery to the staying subscriber", func() bool { return len(stay.messages(t)) > n })
	if len(left.messages(t)) != 2 {
		t.Errorf("unsubscribed connection still received: %v", left.messages(t))
	}
}

func TestProjectDeletedClosesConnections(t *testing.T) {
	sys := newTestSystem(t, Config{})
	a := subscribeOne(t, sys, "p", "c", 1)
	sys.ProjectDeleted("p")
	waitFor(t, "close", func() bool { return a.closed.Load() == int32(proto.CloseProjectDeleted) })
}

func TestDormantChannelStopsAndSeqKeepsRising(t *testing.T) {
	now := time.Now()
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	sys := newTestSystem(t, Config{ActorDormancy: 20 * time.Millisecond,
		Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	first, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
	clock.Add(int64(2 * time.Minute)) // the window runs out: nothing left to remember
	waitFor(t, "channel to stop", func() bool {
		st, _, _ := sys.ProjectStats(context.Background(), "p")
		return st.Channels == 0
	})
	second, _ := sys.Publish(context.Background(), "p", "c", []byte(`1`))
	if second.Seq <= first.Seq {
		t.Errorf("seq after restart %d ≤ %d", second.Seq, first.Seq)
	}
}

func TestSessionErrors(t *testing.T) {
	sys := newTestSystem(t, Config{})
	k := &sink{id: 1}
	s := openConn(sys, "p", k)
	cases := []struct{ in, want string }{
		{`{`, `{"error":"invalid_json"}`},
		{`{"action":"dance"}`, `{"error":"unknown_action"}`},
		{`{"action":"subscribe","channel":"bad channel"}`, `{"error":"invalid_channel","channel":"bad channel"}`},
		{`{"action":"ping"}`, `{"action":"pong","ok":true}`},
	}
	for i, c := range cases {
		s.HandleMessage([]byte(c.in))
		waitFor(t, c.in, func() bool { return len(k.messages(t)) == i+1 })
		k.mu.Lock()
		f := k.frames[i]
		k.mu.Unlock()
		if got := string(f[2:]); got != c.want {
			t.Errorf("%s → %s, want %s", c.in, got, c.want)
		}
	}
}

// testProject returns the project's actor, starting it (benchmarks send it
// messages directly).
func (s *System) testProject(id string) *actor.PID {
	for {
		if v, ok := s.projects.Load(id); ok {
			return v.(*projectRef).pid
		}
		s.spawnProject(id)
	}
}

// openConn opens a connection of project on sink, as a handshake with the
// key "pk-hash" from 127.0.0.1 would.
func openConn(sys *System, project string, s Sink) *Session {
	l, ok := sys.Reserve(project, "ip:127.0.0.1")
	if !ok {
		panic("no connection slot for " + project)
	}
	return sys.Open(l, "pk-hash", s)
}
