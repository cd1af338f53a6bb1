package wire

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	relay "github.com/relayhq/relay/api/client"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// seqMap is an application's SeqStore: a map, as a file or a row would be.
type seqMap struct {
	mu    sync.Mutex
	seqs  map[string]uint64
	saves int
}

func (s *seqMap) LoadSeq(channel string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.seqs[channel]
	return seq, ok
}

func (s *seqMap) SaveSeq(channel string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seqs[channel] = seq
	s.saves++
}

func (s *seqMap) get(channel string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seqs[channel]
}

// TestGoClientSeqStore: with Options.Seqs the Go client saves each delivered
// message's seq, and a later client (the application restarted) subscribing
// without Since starts from the saved one: what came meanwhile is replayed,
// each message once, nothing the first client had. Since, when given, wins;
// a channel with nothing saved starts from now on.
func TestGoClientSeqStore(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("seqs")
	ctx := context.Background()
	emit := func(ch, payload string) uint64 {
		t.Helper()
		r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":%q,"payload":%q}`, ch, payload))
		if r.Status != 200 {
			t.Fatalf("emit: %s", r.Raw)
		}
		return uint64(relaytest.Num(r.JSON, "seq"))
	}
	store := &seqMap{seqs: map[string]uint64{}}
	dial := func() *relay.Client {
		t.Helper()
		c, err := relay.Dial(ctx, ts.Base, p.PublicKey, relay.Options{Seqs: store})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	first := dial()
	sub, err := first.Subscribe(ctx, "feed", relay.SubscribeOptions{}) // nothing saved: from now on
	if err != nil {
		t.Fatal(err)
	}
	one, two := emit("feed", "one"), emit("feed", "two")
	for _, want := range []uint64{one, two} {
		if m := relaytest.NextMessage(t, sub); m.Seq != want || m.Replay {
			t.Fatalf("first client got %+v, want seq %d live", m, want)
		}
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return store.get("feed") == two }, "the store holds the last seq")
	first.Close()

	three, four := emit("feed", "three"), emit("feed", "four")
	second := dial()
	sub, err = second.Subscribe(ctx, "feed", relay.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint64{three, four} {
		if m := relaytest.NextMessage(t, sub); m.Seq != want || !m.Replay {
			t.Fatalf("restarted client got %+v, want seq %d replayed", m, want)
		}
	}
	five := emit("feed", "five")
	if m := relaytest.NextMessage(t, sub); m.Seq != five || m.Replay {
		t.Fatalf("then %+v, want seq %d live", m, five)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return store.get("feed") == five }, "the store holds seq five")

	// Since given: it wins over the store.
	third := dial()
	sub, err = third.Subscribe(ctx, "feed", relay.SubscribeOptions{Since: &three})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint64{four, five} {
		if m := relaytest.NextMessage(t, sub); m.Seq != want || !m.Replay {
			t.Fatalf("with Since %d got %+v, want seq %d replayed", three, m, want)
		}
	}
}
