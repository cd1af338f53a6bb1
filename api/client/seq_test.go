package client

import (
	"context"
	"encoding/json"
	"math"
	"testing"
)

// TestParseSeq: a seq is read from its JSON text exactly, past 2^53 too.
func TestParseSeq(t *testing.T) {
	for in, want := range map[string]uint64{
		"1763921800123456":     1763921800123456,
		"9007199254740993":     1<<53 + 1, // a float64 would read 2^53
		"18446744073709551615": math.MaxUint64,
		"0":                    0,
		"1.5":                  1,
		"1.7639218001234e15":   1763921800123400,
		"1e300":                math.MaxUint64,
		"-3":                   0,
		`"12"`:                 0,
		"null":                 0,
	} {
		if got := parseSeq(json.RawMessage(in)); got != want {
			t.Errorf("parseSeq(%s) = %d, want %d", in, got, want)
		}
	}
}

// TestGapSinceExact: a replay_gap's since reaches Gap.Since as the exact
// uint64, and the frame's other fields still count.
func TestGapSinceExact(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &Client{ctx: ctx, subs: map[string]*Subscription{}, waitSub: map[string][]*pending{}, waitUnsub: map[string][]*pending{}, waitEmit: map[string][]*pending{}}
	s := &Subscription{c: c, channel: "feed", events: make(chan Event, 4), done: make(chan struct{})}
	c.subs["feed"] = s
	c.dispatch([]byte(`{"type":"replay_gap","channel":"feed","since":9007199254740993}`))
	c.dispatch([]byte(`{"channel":"feed","payload":1,"seq":9007199254740995,"replay":true}`))
	if ev := <-s.events; ev.Gap == nil || ev.Gap.Since != 1<<53+1 {
		t.Fatalf("gap %+v, want since 9007199254740993", ev.Gap)
	}
	if ev := <-s.events; ev.Message == nil || ev.Message.Seq != 1<<53+3 || !ev.Message.Replay {
		t.Fatalf("message %+v, want seq 9007199254740995", ev.Message)
	}
	if seq, ok := s.LastSeq(); !ok || seq != 1<<53+3 {
		t.Fatalf("LastSeq %d %v", seq, ok)
	}
}

// TestSubscribeFrameSince: the since of a subscribe goes out as the exact
// integer.
func TestSubscribeFrameSince(t *testing.T) {
	got := string(subscribeFrame("feed", SubscribeOptions{}, 1<<53+1, true, ""))
	if want := `{"action":"subscribe","channel":"feed","since":9007199254740993}`; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
	if got := string(subscribeFrame("feed", SubscribeOptions{}, 0, false, "")); got != `{"action":"subscribe","channel":"feed"}` {
		t.Fatalf("without since: %s", got)
	}
}
