package actors

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/proto"
)

// TestReplayRingByteCap: past its byte cap the ring drops its oldest
// messages, and lowWater moves with them so that a since older than the
// dropped part is a gap.
func TestReplayRingByteCap(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	r := replayRing{ttl: time.Minute, maxBytes: 1000, lowWater: 99}
	msg := []byte(strings.Repeat("x", 100))
	for seq := uint64(100); seq < 125; seq++ { // 2 500 bytes into 1 000
		r.add(seq, at, msg)
	}
	if r.bytes != 1000 {
		t.Fatalf("ring holds %d bytes, want the cap, 1000", r.bytes)
	}
	var kept []uint64
	for _, e := range r.entries[r.head:] {
		kept = append(kept, e.seq)
	}
	if len(kept) != 10 || kept[0] != 115 || kept[9] != 124 {
		t.Fatalf("kept seqs %v, want 115…124", kept)
	}
	for since, gap := range map[float64]bool{99: true, 113: true, 113.5: true, 114: false, 120: false, 124: false} {
		if got := r.gapAfter(since); got != gap {
			t.Errorf("gapAfter(%v) = %v, want %v", since, got, gap)
		}
	}
	n := 0
	r.each(113, func(uint64, []byte) { n++ })
	if n != 10 {
		t.Errorf("each(113) gave %d messages, want the 10 kept", n)
	}
	// One message bigger than the cap: it replaces everything, and is not kept.
	r.add(125, at, []byte(strings.Repeat("y", 1001)))
	if !r.empty() || r.bytes != 0 || !r.gapAfter(124) || r.gapAfter(125) {
		t.Errorf("after an oversized message: empty %v, bytes %d, lowWater %d", r.empty(), r.bytes, r.lowWater)
	}
}

// TestReplayByteCapPartialReplay: a channel takes more than the 1 MiB ring
// holds; a subscriber whose since is older than the evicted part gets
// replay_gap, then the part still held, in order and flagged, then its ack.
func TestReplayByteCapPartialReplay(t *testing.T) {
	start := time.Now()
	sys := newTestSystem(t, Config{EmitRatePerMinute: 1 << 20, ProjectRatePerMinute: 1 << 20,
		Now: func() time.Time { return start }}) // nothing expires by age: only the byte cap
	payload := []byte(`"` + strings.Repeat("x", 10_000) + `"`)
	const emits = 150 // ≈ 1.5 MB
	var seqs []uint64
	for range emits {
		res, err := sys.Publish(context.Background(), "p", "c", payload)
		if err != nil || res.Err != nil {
			t.Fatalf("publish: %v %v", err, res.Err)
		}
		seqs = append(seqs, res.Seq)
	}
	// Each buffered message is the object {"channel","payload","seq"}; seqs
	// here all have the same number of digits.
	size := len(proto.AppendMessage(nil, "c", payload, seqs[0]))
	keep := DefaultReplayMaxBytes / size
	if keep >= emits || keep < 2 {
		t.Fatalf("test setup: %d of %d messages fit", keep, emits)
	}
	firstKept := seqs[emits-keep]

	cases := []struct {
		since uint64
		gap   bool
		from  uint64 // first seq replayed
	}{
		{seqs[0] - 1, true, firstKept},   // older than anything the ring ever had
		{seqs[5], true, firstKept},       // inside the evicted part
		{firstKept - 2, true, firstKept}, // the last evicted message is missing
		{firstKept - 1, false, firstKept},
		{seqs[emits-3], false, seqs[emits-2]},
		{seqs[emits-1], false, 0},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint("since=", c.since), func(t *testing.T) {
			k := &sink{id: uint64(100 + i)}
			sess := openConn(sys, "p", k)
			sess.HandleMessage(fmt.Appendf(nil, `{"action":"subscribe","channel":"c","since":%d}`, c.since))
			var want []string
			if c.gap {
				want = append(want, fmt.Sprintf(`{"type":"replay_gap","channel":"c","since":%d}`, c.since))
			}
			if c.from != 0 {
				for _, s := range seqs {
					if s >= c.from {
						want = append(want, fmt.Sprintf(`{"channel":"c","payload":%s,"seq":%d,"replay":true}`, payload, s))
					}
				}
			}
			want = append(want, `{"action":"subscribe","channel":"c","ok":true}`)
			waitFor(t, "the subscribe ack", func() bool { return len(k.messages(t)) >= len(want) })
			got := k.messages(t)
			if len(got) != len(want) {
				t.Fatalf("%d frames, want %d", len(got), len(want))
			}
			for j, m := range got {
				if g := canonicalJSON(t, m); g != canonicalJSON(t, decode(t, want[j])) {
					t.Fatalf("frame %d: %.120s…, want %.120s…", j, g, want[j])
				}
			}
			if c.gap && c.from == firstKept && len(got) != keep+2 {
				t.Fatalf("partial replay of %d messages, want the %d the cap holds", len(got)-2, keep)
			}
		})
	}
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("bad JSON %q: %v", s, err)
	}
	return m
}

// canonicalJSON encodes a decoded object with sorted keys, for comparison.
func canonicalJSON(t *testing.T, m map[string]any) string {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A project's expired replay bytes stop counting against
// MAX_REPLAY_BYTES_PER_PROJECT at once: channel a's messages aged out of
// the window (its ring not touched since) no longer push out channel b's
// new one. They did until a's ring was next touched, up to
// ACTOR_DORMANCY_SECONDS later.
func TestExpiredReplayBytesFreeTheProjectCap(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	payload := []byte(`"` + strings.Repeat("x", 1000) + `"`)
	sys := newTestSystem(t, Config{
		MaxReplayBytesPerProject: 3 * 1100, // three messages
		Now:                      func() time.Time { return time.Unix(0, clock.Load()) },
	})
	for range 3 {
		if res, err := sys.Publish(context.Background(), "p", "a", payload); err != nil || res.Err != nil {
			t.Fatalf("publish a: %v %v", err, res.Err)
		}
	}
	clock.Add(int64(25 * time.Second)) // a's messages are past the 20 s window
	res, err := sys.Publish(context.Background(), "p", "b", payload)
	if err != nil || res.Err != nil {
		t.Fatalf("publish b: %v %v", err, res.Err)
	}
	k := &sink{id: 1}
	sess := openConn(sys, "p", k)
	sess.HandleMessage(fmt.Appendf(nil, `{"action":"subscribe","channel":"b","since":%d}`, res.Seq-1))
	waitFor(t, "ack", func() bool {
		got := k.messages(t)
		return len(got) > 0 && got[len(got)-1]["action"] == "subscribe"
	})
	if got := k.messages(t); len(got) != 2 || got[0]["replay"] != true {
		t.Fatalf("subscribe b since=%d: frames %v; want the one buffered message (replay:true) then the ack", res.Seq-1, got)
	}
}

// replayBudget counts by emit second; a second stops counting once all of it
// is past the TTL, and a message removed after that is not taken off twice.
func TestReplayBudget(t *testing.T) {
	var b replayBudget
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	b.add(t0, 100)
	b.add(t0.Add(500*time.Millisecond), 50)
	b.add(t0.Add(2*time.Second), 10)
	if n := b.held(t0.Add(2*time.Second), 20*time.Second); n != 160 {
		t.Fatalf("held %d, want 160", n)
	}
	if n := b.held(t0.Add(20*time.Second+900*time.Millisecond), 20*time.Second); n != 160 {
		t.Fatalf("held %d with second 0 not wholly past the TTL, want 160", n)
	}
	if n := b.held(t0.Add(21*time.Second), 20*time.Second); n != 10 {
		t.Fatalf("held %d once second 0 is past the TTL, want 10", n)
	}
	b.remove(t0, 100) // its ring expires it later: already discounted
	b.remove(t0.Add(2*time.Second), 10)
	if n := b.total; n != 0 {
		t.Fatalf("bytes %d after every message left, want 0", n)
	}
	b.add(t0, 5) // a message from a second no longer counted
	if n := b.total; n != 0 {
		t.Fatalf("bytes %d after adding an expired second's message, want 0", n)
	}
	b.remove(t0, 5)

	// over: under the cap in all, no; expired bytes alone, no, up to twice
	// the cap; live bytes over the cap, yes.
	var c replayBudget
	c.add(t0, 60)
	now, ttl := t0.Add(30*time.Second), 20*time.Second
	if c.over(now, ttl, 100) {
		t.Fatal("over with 60 of 100")
	}
	c.add(t0, 100) // 160 held, all past the TTL at now
	if c.over(now, ttl, 100) {
		t.Fatal("over with nothing inside the window")
	}
	c.add(t0, 50) // 210 held: more than twice the cap, expired or not
	if !c.over(now, ttl, 100) {
		t.Fatal("not over with 210 held for a cap of 100")
	}
	var d replayBudget
	d.add(now, 120)
	if !d.over(now, ttl, 100) {
		t.Fatal("not over with 120 live for a cap of 100")
	}
}
