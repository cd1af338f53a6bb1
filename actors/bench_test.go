package actors

import (
	"context"
	"fmt"
	"testing"

	"github.com/gobwas/ws"
)

// nullSink counts deliveries like a transport queue that always has room.
type nullSink struct {
	id uint64
	n  int
}

func (s *nullSink) ID() uint64                  { return s.id }
func (s *nullSink) Send(f []byte) bool          { s.n++; return true }
func (s *nullSink) Close(ws.StatusCode, string) {}

// BenchmarkFanout measures one emit delivered to N subscribers through the
// project and channel actors: ns and allocations per delivery.
func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		b.Run(fmt.Sprintf("subs=%d", n), func(b *testing.B) {
			sys := newTestSystem(b, Config{EmitRatePerMinute: 1 << 30, ProjectRatePerMinute: 1 << 30})
			for i := 0; i < n; i++ {
				sys.root.Send(sys.project("p"), &subscribe{channel: "c", sink: &nullSink{id: uint64(i + 1)}})
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
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, _ := sys.Publish(context.Background(), "p", "c", payload)
				if r.Delivered != n {
					b.Fatalf("delivered %d of %d", r.Delivered, n)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/delivery")
		})
	}
}

// signalSink reports every frame on a channel, so a benchmark can wait for acks.
type signalSink struct {
	id uint64
	ch chan struct{}
}

func (s *signalSink) ID() uint64                  { return s.id }
func (s *signalSink) Send([]byte) bool            { s.ch <- struct{}{}; return true }
func (s *signalSink) Close(ws.StatusCode, string) {}

// BenchmarkSubscribeUnsubscribe measures one subscribe and one unsubscribe,
// each through the connection, project and channel actors and acked, on a
// channel that already has 1 000 other subscribers.
func BenchmarkSubscribeUnsubscribe(b *testing.B) {
	sys := newTestSystem(b, Config{})
	for i := 0; i < 1000; i++ {
		sys.root.Send(sys.project("p"), &subscribe{channel: "c", sink: &nullSink{id: uint64(i + 1)}})
	}
	k := &signalSink{id: 1 << 40, ch: make(chan struct{}, 1)}
	sess := sys.Open("p", k)
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
