package actors

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/transport"
)

// nullSink counts deliveries like a transport queue that always has room.
type nullSink struct {
	id uint64
	n  int
}

func (s *nullSink) ID() uint64                        { return s.id }
func (s *nullSink) Send(f []byte) bool                { s.n++; return true }
func (s *nullSink) SendAt(f []byte, _ int64) bool     { return s.Send(f) }
func (s *nullSink) Close(transport.CloseCode, string) {}

// BenchmarkFanout measures one emit delivered to N subscribers through the
// project and channel actors: ns and allocations per delivery.
func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		b.Run(fmt.Sprintf("subs=%d", n), func(b *testing.B) {
			sys := newTestSystem(b, Config{EmitRatePerMinute: 1 << 30, ProjectRatePerMinute: 1 << 30})
			for i := 0; i < n; i++ {
				sys.root.Send(sys.testProject("p"), &subscribe{channel: "c", sink: &nullSink{id: uint64(i + 1)}})
			}
			payload := []byte(`{"text":"hello, this is a hundred bytes of payload for the benchmark, more or less ok"}`)
			// Wait until every subscription is in.
			for {
				r, _ := sys.Publish(context.Background(), "p", "c", payload)
				if r.Subscribers == n {
					break
				}
			}
			b.ReportAllocs()
			// Every goroutine's allocations count (the actors run on their
			// own), as for allocs/op; per delivery they are what the fan-out
			// costs beyond the one encode it shares.
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, _ := sys.Publish(context.Background(), "p", "c", payload)
				if r.Delivered != n {
					b.Fatalf("delivered %d of %d", r.Delivered, n)
				}
			}
			b.StopTimer()
			runtime.ReadMemStats(&after)
			deliveries := float64(b.N * n)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/deliveries, "ns/delivery")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/deliveries, "allocs/delivery")
		})
	}
}

// signalSink reports every frame on a channel, so a benchmark can wait for acks.
type signalSink struct {
	id uint64
	ch chan struct{}
}

func (s *signalSink) ID() uint64                        { return s.id }
func (s *signalSink) Send([]byte) bool                  { s.ch <- struct{}{}; return true }
func (s *signalSink) SendAt(f []byte, _ int64) bool     { return s.Send(f) }
func (s *signalSink) Close(transport.CloseCode, string) {}

// BenchmarkSubscribeUnsubscribe measures one subscribe and one unsubscribe,
// each through the connection, project and channel actors and acked, on a
// channel that already has 1 000 other subscribers.
func BenchmarkSubscribeUnsubscribe(b *testing.B) {
	sys := newTestSystem(b, Config{})
	for i := 0; i < 1000; i++ {
		sys.root.Send(sys.testProject("p"), &subscribe{channel: "c", sink: &nullSink{id: uint64(i + 1)}})
	}
	k := &signalSink{id: 1 << 40, ch: make(chan struct{}, 1)}
	sess := openConn(sys, "p", k)
	sub := []byte(`{"action":"subscribe","channel":"c"}`)
	unsub := []byte(`{"action":"unsubscribe","channel":"c"}`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sess.HandleMessage(sub)
		<-k.ch
		sess.HandleMessage(unsub)
		<-k.ch
	}
}

// BenchmarkPresenceJoinLeave: 1 000 presence members join a channel (each
// gets its ack and sync, the others a join) and then leave (the others get a
// leave). One op is the whole round, 1 000 joins and 1 000 leaves. Each round
// checks that every frame arrived: member j (0-based) gets one ack, one sync
// listing the j members before it, a join from each of the members-1-j after
// it and a leave from each of the j that leave before it.
func BenchmarkPresenceJoinLeave(b *testing.B) {
	sys := newTestSystem(b, Config{})
	const members = 1000
	sinks := make([]*presenceSink, members)
	for i := range sinks {
		sinks[i] = &presenceSink{id: uint64(i + 1)}
	}
	done := &signalSink{id: 1 << 40, ch: make(chan struct{}, 1)}
	pid := sys.testProject("p")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j, k := range sinks {
			sys.root.Send(pid, &subscribe{channel: "room", sink: k, presence: true, clientID: fmt.Sprint("m", j)})
		}
		for _, k := range sinks {
			sys.root.Send(pid, &unsubscribe{channel: "room", connID: k.id, sink: k, silent: true})
		}
		sys.root.Send(pid, &unsubscribe{channel: "room", connID: done.id, sink: done}) // acked after the rest
		<-done.ch
		for j, k := range sinks { // the channel actor sent all of it before done's ack
			want := presenceCounts{acks: 1, syncs: 1, syncMembers: j, joins: members - 1 - j, leaves: j}
			if k.got != want {
				b.Fatalf("round %d, member %d: got %+v, want %+v", i, j, k.got, want)
			}
			k.got = presenceCounts{}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2*members), "ns/join-or-leave")
}

type presenceCounts struct{ acks, syncs, syncMembers, joins, leaves, other int }

// presenceSink counts what a presence member of "room" receives, by kind.
// Only the channel actor writes it, and the benchmark reads it after the
// actor's last frame of the round.
type presenceSink struct {
	id  uint64
	got presenceCounts
}

var (
	presenceAck    = []byte(`{"action":"subscribe","channel":"room","ok":true}`)
	presencePrefix = `{"type":"presence","channel":"room","event":"`
)

func (s *presenceSink) ID() uint64 { return s.id }

func (s *presenceSink) SendAt(f []byte, _ int64) bool { return s.Send(f) }

// Send classifies by the byte after presencePrefix (the prefix itself is
// checked on syncs only: comparing it on all million frames of a round would
// cost a third of what is measured).
func (s *presenceSink) Send(f []byte) bool {
	body := f[2:] // server frames: a 2-byte header, 4 from 126 bytes on
	if f[1] == 126 {
		body = f[4:]
	}
	n := len(presencePrefix)
	switch {
	case len(body) <= n || body[2] != 't':
		if bytes.Equal(body, presenceAck) {
			s.got.acks++
		} else {
			s.got.other++
		}
	case body[n] == 'j' && body[n+4] == '"':
		s.got.joins++
	case body[n] == 'l' && body[n+5] == '"':
		s.got.leaves++
	case string(body[:n]) == presencePrefix && bytes.HasPrefix(body[n:], []byte(`sync","members":[`)):
		s.got.syncs++
		if !bytes.HasSuffix(body, []byte(`[]}`)) {
			s.got.syncMembers += bytes.Count(body, []byte(",")) - 2 // three commas before the list
		}
	default:
		s.got.other++
	}
	return true
}
func (s *presenceSink) Close(transport.CloseCode, string) {}

// BenchmarkReplayFullRing: a subscriber asks for the whole ring of a channel
// that took 100 messages/s for 20 s (2 000 messages of 100 bytes).
func BenchmarkReplayFullRing(b *testing.B) {
	start := time.Now()
	var clock atomic.Int64
	clock.Store(start.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	sys := newTestSystem(b, Config{EmitRatePerMinute: 1 << 30, ProjectRatePerMinute: 1 << 30, Now: now, ReplayTTL: 25 * time.Second})
	payload := []byte(`{"text":"hello, this is a hundred bytes of payload for the benchmark, more or less ok"}`)
	var first uint64
	for i := 0; i < 2000; i++ {
		clock.Store(start.Add(time.Duration(i) * 10 * time.Millisecond).UnixNano())
		r, _ := sys.Publish(context.Background(), "p", "c", payload)
		if i == 0 {
			first = r.Seq
		}
	}
	k := &countingSink{id: 1 << 40, ch: make(chan int, 1)}
	sess := openConn(sys, "p", k)
	sub := []byte(fmt.Sprintf(`{"action":"subscribe","channel":"c","since":%d}`, first-1))
	unsub := []byte(`{"action":"unsubscribe","channel":"c"}`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k.reset(2001) // 2 000 replayed + the ack
		sess.HandleMessage(sub)
		<-k.ch
		k.reset(1)
		sess.HandleMessage(unsub)
		<-k.ch
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2000), "ns/replayed-msg")
}

// countingSink signals once it has had want frames.
type countingSink struct {
	id   uint64
	ch   chan int
	n    atomic.Int64
	want atomic.Int64
}

func (s *countingSink) reset(want int64) { s.n.Store(0); s.want.Store(want) }
func (s *countingSink) ID() uint64       { return s.id }
func (s *countingSink) Send([]byte) bool {
	if s.n.Add(1) == s.want.Load() {
		s.ch <- 1
	}
	return true
}
func (s *countingSink) SendAt(f []byte, _ int64) bool     { return s.Send(f) }
func (s *countingSink) Close(transport.CloseCode, string) {}

// BenchmarkIdleProjects touches 100 000 distinct projects once each (an
// emit), then waits for their actors to stop as dormant: heap per project
// while they live, and what stays per project once all have stopped.
// -short (make test's bench-once, which checks that benchmarks run): 10 000.
func BenchmarkIdleProjects(b *testing.B) {
	projects := 100_000
	if testing.Short() {
		projects = 10_000
	}
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	for range b.N {
		sys := newTestSystem(b, Config{ActorDormancy: time.Second,
			Now: func() time.Time { return time.Unix(0, clock.Load()) }})
		heap := func() float64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return float64(m.HeapAlloc)
		}
		sys.Publish(context.Background(), "warm-up", "c", []byte(`1`)) // the actor pool and registry exist
		before := heap()
		for i := range projects {
			if r, err := sys.Publish(context.Background(), fmt.Sprint("p", i), "c", []byte(`1`)); err != nil || r.Err != nil {
				b.Fatalf("publish: %v %+v", err, r)
			}
		}
		live := heap()
		sys.DrainUsage(context.Background())
		clock.Add(int64(2 * time.Minute)) // every budget window has run out
		// The edge's map of project actors empty (what Inspect counts, read
		// without sorting 100 000 ids at each poll).
		if !within(time.Minute, func() bool {
			empty := true
			sys.projects.Range(func(_, _ any) bool { empty = false; return false })
			return empty
		}) {
			in, _ := sys.Inspect(context.Background(), "", "", 0, 1)
			b.Fatalf("%d project actors still running", in.ProjectsTotal)
		}
		// Time by nature, before the measurement: each actor's last quiet
		// tick is a real-clock timer (Config.Now does not drive it) that fires
		// ActorDormancy (1 s) after the actor retired, holding its PID until
		// then and ending as a dead letter; nothing observable says the last
		// has fired. 3 s: the dormancy, and the stops and dead letters after.
		time.Sleep(3 * time.Second)
		after := heap()
		b.ReportMetric((live-before)/float64(projects), "heapB/live-project")
		b.ReportMetric((after-before)/float64(projects), "heapB/stopped-project")
	}
}

// BenchmarkIdleConnectionHeap opens 10 000 idle connections of a project
// with channel authorization on, without and with a connection token (a
// user each), and reports the heap the actors hold per connection: what a
// token adds to an idle connection.
func BenchmarkIdleConnectionHeap(b *testing.B) {
	const conns = 10_000
	az := &ProjectAuthz{On: true, Secrets: []string{authSecret}}
	for _, withToken := range []bool{false, true} {
		b.Run(fmt.Sprintf("token=%v", withToken), func(b *testing.B) {
			tokens := make([]string, conns)
			if withToken {
				for i := range tokens {
					var err error
					tokens[i], err = backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: authSecret,
						UserID: fmt.Sprint("user-", i), TTL: time.Hour, Now: authT0})
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			sinks := make([]nullSink, conns+1)
			sessions := make([]*Session, conns+1)
			heap := func() float64 {
				runtime.GC()
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				return float64(m.HeapAlloc)
			}
			for range b.N {
				sys := newTestSystem(b, Config{Now: func() time.Time { return authT0 },
					LoadSettings: func(context.Context, string) (Settings, error) { return Settings{Authz: *az}, nil }})
				open := func(i int) {
					l, ok := sys.Reserve("p", "addr")
					if !ok {
						b.Fatal("reserve refused")
					}
					var id *Identity
					if tokens[i%conns] != "" && i < conns {
						var err error
						if id, err = VerifyConnectionToken(tokens[i], az.Secrets, authT0); err != nil {
							b.Fatal(err)
						}
					}
					sinks[i] = nullSink{id: uint64(i + 1)}
					sessions[i] = sys.OpenAuthorized(l, "key", &sinks[i], az, id)
				}
				open(conns) // the project's actor, its settings and the pools exist
				waitConnections(b, sys, 1)
				before := heap()
				for i := range conns {
					open(i)
				}
				waitConnections(b, sys, conns+1)
				after := heap()
				b.ReportMetric((after-before)/conns, "heapB/conn")
				for i := range sessions {
					sessions[i].HandleClose(CloseStatus{})
				}
				sys.Shutdown(context.Background())
				clear(sessions) // the next round's first reading holds none of these
			}
			runtime.KeepAlive(tokens)
		})
	}
}

// waitConnections waits until project p's actor holds n connections.
func waitConnections(b *testing.B, sys *System, n int) {
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		in, err := sys.Inspect(context.Background(), "p", "", 0, 1)
		if err == nil && len(in.Projects) == 1 && in.Projects[0].Connections == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("project actor holds not %d connections: %+v %v", n, in, err)
		}
		<-tick.C
	}
}
