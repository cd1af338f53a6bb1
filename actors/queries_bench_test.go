package actors

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkQueries measures each server-side query on one node through the
// edge, the project actor and the channel actor(s): a channel with 1000
// subscribers (100 of them presence members), a ring of 100 messages, and
// for occupancy a project of 1, 100 or 1000 channels.
func BenchmarkQueries(b *testing.B) {
	ctx := context.Background()
	setup := func(b *testing.B, channels int) *System {
		sys := newTestSystem(b, Config{EmitRatePerMinute: 1 << 30, ProjectRatePerMinute: 1 << 30})
		for i := range 1000 {
			sys.root.Send(sys.testProject("p"), &subscribe{channel: "c", sink: &nullSink{id: uint64(i + 1)},
				presence: i < 100, clientID: fmt.Sprint("u", i)})
		}
		for i := 1; i < channels; i++ {
			sys.root.Send(sys.testProject("p"), &subscribe{channel: fmt.Sprint("c", i), sink: &nullSink{id: uint64(10000 + i)}})
		}
		for range 100 {
			sys.Publish(ctx, "p", "c", []byte(`{"text":"a message of some forty bytes"}`))
		}
		for {
			occ, _ := sys.Occupancy(ctx, "p")
			if len(occ) == channels {
				return sys
			}
		}
	}
	sys := setup(b, 1)
	for _, k := range []struct {
		name string
		kind QueryKind
	}{{"count", QueryCount}, {"members=100", QueryMembers}, {"messages=100", QueryMessages}} {
		b.Run(k.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := sys.Channel(ctx, "p", "c", k.kind, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("disconnect-none", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := sys.DisconnectClient(ctx, "p", "nobody"); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("occupancy-channels=%d", n), func(b *testing.B) {
			sys := setup(b, n)
			b.ReportAllocs()
			for b.Loop() {
				if occ, err := sys.Occupancy(ctx, "p"); err != nil || len(occ) != n {
					b.Fatal(len(occ), err)
				}
			}
		})
	}
}
