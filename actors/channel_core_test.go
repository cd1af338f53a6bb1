package actors

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/transport"
)

// coreHarness drives a channel core as its hosts do, with a fixed clock,
// and writes down what it hands each node's fan-out and the webhooks.
type coreHarness struct {
	core   *channelCore
	base   uint64 // the core's first seq: seqs are shown above it
	now    time.Time
	events []string
	gone   map[string]int // node → sockets its fan-out finds closed at the next delivery
}

func (h *coreHarness) deliver(m *stamped) int {
	gone := 0
	for node, subs := range h.core.nodes {
		if len(subs) == 0 {
			continue
		}
		skip := ""
		if m.client && node == m.skipNode {
			skip = fmt.Sprintf(" skip %d", m.skipConn)
		}
		h.events = append(h.events, fmt.Sprintf("deliver %s #%d %s%s", node, m.seq-h.base, transport.FramePayload(m.buf), skip))
		gone += h.gone[node]
		delete(h.gone, node)
	}
	return gone
}

func (h *coreHarness) presence(node, event, clientID string, except uint64) {
	h.events = append(h.events, fmt.Sprintf("presence %s %s %s except %d", node, event, clientID, except))
}

func newCoreHarness(t *testing.T, cfg Config) *coreHarness {
	t.Helper()
	h := &coreHarness{now: time.Date(2026, 11, 27, 10, 0, 30, 0, time.UTC), gone: map[string]int{}}
	cfg.Now = func() time.Time { return h.now }
	cfg.ReplayTTL, cfg.ReplayMaxBytes = 20*time.Second, 1<<20
	cfg.counters = &Counters{}
	cfg.Webhooks = func(_, _ string, ev WebhookEvent) {
		h.events = append(h.events, strings.TrimSpace("hook "+ev.Kind+" "+ev.ClientID))
	}
	hooks := channelHooks{known: true, target: &hookTarget{url: "http://hooks.test", channel: true, presence: true}}
	h.core = newChannelCore("p", "room", &cfg, &replayBudget{}, hooks, h)
	h.base = h.core.seq
	return h
}

// The steps of a case, each with what it returns and what it hands the
// fan-outs and webhooks, in order.
type coreStep struct {
	do   func(h *coreHarness) string
	want string
}

func emit(payload string) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		return h.emitOutcome(&emitRequest{payload: []byte(payload), at: h.now, limit: 2, accepted: 1})
	}
}

func emitFrom(node string, conn uint64, clientID, payload string) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		return h.emitOutcome(&emitRequest{payload: []byte(payload), at: h.now, limit: 2, client: true,
			node: node, conn: conn, clientID: clientID, msgType: "t", accepted: 1})
	}
}

func (h *coreHarness) emitOutcome(e *emitRequest) string {
	o := h.core.publish(e)
	if o.err != "" {
		return fmt.Sprintf("%s remaining %d", o.err, o.channel.Remaining)
	}
	return fmt.Sprintf("#%d subscribers %d delivered %d remaining %d", int64(o.seq-h.base), o.subscribers, o.delivered, o.channel.Remaining)
}

func join(node string, conn uint64, presence bool, clientID string) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		return h.joinOutcome(&joinRequest{node: node, conn: conn, sub: coreSub{presence: presence, clientID: clientID}})
	}
}

func joinSince(node string, conn uint64, since uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		return h.joinOutcome(&joinRequest{node: node, conn: conn, hasSince: true, since: float64(h.base + since)})
	}
}

func (h *coreHarness) joinOutcome(j *joinRequest) string {
	o := h.core.join(j, h.now)
	if o.refused != "" {
		return fmt.Sprintf("%s kept %v %+v", o.refused, o.subscribed, o.kept)
	}
	var b strings.Builder
	if o.gap {
		fmt.Fprintf(&b, "gap since #%d, ", uint64(o.gapSince)-h.base)
	}
	fmt.Fprintf(&b, "replay %d", len(o.replay))
	if j.sub.presence {
		fmt.Fprintf(&b, ", sync %v", o.members)
	}
	return b.String()
}

func leave(node string, conn uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string { h.core.leave(node, conn); return "" }
}

func dropNode(node string) func(h *coreHarness) string {
	return func(h *coreHarness) string { h.core.dropNode(node); return "" }
}

func replaceNode(node string, subs map[uint64]coreSub) func(h *coreHarness) string {
	return func(h *coreHarness) string { return fmt.Sprintf("roster changed %v", h.core.replaceNode(node, subs)) }
}

func query(kind QueryKind, since uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		if since != NoSince {
			since += h.base
		}
		a := h.core.answer(kind, since, h.now)
		return fmt.Sprintf("subscribers %d members %d %v messages %d gap %v", a.Subscribers, a.MemberCount, a.Members, len(a.Messages), a.Gap)
	}
}

func after(seq uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		gap, msgs := h.core.after(h.base+seq, h.now)
		var seqs []int64
		for _, m := range msgs {
			seqs = append(seqs, int64(m.seq-h.base))
		}
		return fmt.Sprintf("gap %v %v", gap, seqs)
	}
}

// raise: a node reports it delivered up to base+seq.
func raise(seq uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string { h.core.raise(h.base + seq); return "" }
}

// mergeState hands the core a previous owner's ring of msgs (seqs below
// base, complete after the first's predecessor) and a window of count.
func mergeState(count int, msgs ...uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		var older []replayEntry
		for _, back := range msgs {
			older = append(older, replayEntry{seq: h.base - back, at: h.now, msg: fmt.Appendf(nil, `{"old":%d}`, back)})
		}
		h.core.merge(older, h.base-msgs[0]-1, h.base-msgs[len(msgs)-1], 0, h.now.Truncate(time.Minute), count)
		return ""
	}
}

// stored: the channel keeps history, its stored last seq base-back (the
// host read it); the core's seq after, from base.
func stored(back uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		h.core.continueFrom(h.base - back)
		return fmt.Sprintf("seq %d", int64(h.core.seq-h.base))
	}
}

// mergeEmpty hands the core a previous owner's state with an empty ring:
// its low water base-lowBack, its seq base-seqBack (the stamps between
// failed: nothing delivered after the low water).
func mergeEmpty(lowBack, seqBack uint64) func(h *coreHarness) string {
	return func(h *coreHarness) string {
		h.core.merge(nil, h.base-lowBack, h.base-seqBack, h.base-lowBack, h.now.Truncate(time.Minute), 0)
		return ""
	}
}

func wait(d time.Duration) func(h *coreHarness) string {
	return func(h *coreHarness) string { h.now = h.now.Add(d); return "" }
}

func goneAtNext(node string, n int) func(h *coreHarness) string {
	return func(h *coreHarness) string { h.gone[node] = n; return "" }
}

func idle() func(h *coreHarness) string {
	return func(h *coreHarness) string { return fmt.Sprintf("idle %v", h.core.idle(h.now)) }
}

// The channel's rules, one table for both hosts: node "" is one node's own
// sockets (the channel actor), "a" and "b" two nodes' relays (the grain).
func TestChannelCore(t *testing.T) {
	cases := []struct {
		name       string
		maxMembers int
		steps      []coreStep
	}{
		{name: "an emit with nobody subscribed is stamped and kept", steps: []coreStep{
			{emit(`1`), "#1 subscribers 0 delivered 0 remaining 1"},
			{query(QueryMessages, NoSince), "subscribers 0 members 0 [] messages 1 gap false"},
		}},
		{name: "one message for each node with subscribers; delivered counts every node", steps: []coreStep{
			{join("a", 1, false, ""), "replay 0 | hook channel_occupied"},
			{join("a", 2, false, ""), "replay 0"},
			{join("b", 3, false, ""), "replay 0"},
			{join("c", 4, false, ""), "replay 0"},
			{leave("c", 4), ""},
			{emit(`{"x":1}`), `#1 subscribers 3 delivered 3 remaining 1 | deliver a #1 {"channel":"room","payload":{"x":1},"seq":SEQ1} | deliver b #1 {"channel":"room","payload":{"x":1},"seq":SEQ1}`},
		}},
		{name: "sockets a fan-out finds closed are not delivered", steps: []coreStep{
			{join("", 1, false, ""), "replay 0 | hook channel_occupied"},
			{join("", 2, false, ""), "replay 0"},
			{goneAtNext("", 1), ""},
			{emit(`2`), `#1 subscribers 2 delivered 1 remaining 1 | deliver  #1 {"channel":"room","payload":2,"seq":SEQ1}`},
		}},
		{name: "the channel window refuses past its limit; the project's refusal takes nothing", steps: []coreStep{
			{emit(`1`), "#1 subscribers 0 delivered 0 remaining 1"},
			{func(h *coreHarness) string {
				return h.emitOutcome(&emitRequest{payload: []byte(`2`), at: h.now, limit: 2, projectDenied: true})
			}, "project_rate_limited remaining 1"},
			{emit(`2`), "#2 subscribers 0 delivered 0 remaining 0"},
			{emit(`3`), "channel_rate_limited remaining 0"},
			{wait(30 * time.Second), ""},
			{emit(`4`), "#3 subscribers 0 delivered 0 remaining 1"},
		}},
		{name: "rule 4: a client emit needs its connection's presence subscription under its clientId", steps: []coreStep{
			{join("a", 1, true, "ann"), "replay 0, sync [] | hook channel_occupied | hook member_added ann | presence a join ann except 1"},
			{join("b", 2, false, ""), "replay 0"},
			{emitFrom("a", 9, "ann", `1`), "emit_identity_mismatch remaining 0"},
			{emitFrom("a", 1, "bob", `1`), "emit_identity_mismatch remaining 0"},
			{emitFrom("b", 2, "", `1`), "emit_identity_mismatch remaining 0"},
			{emitFrom("a", 1, "ann", `1`), `#1 subscribers 2 delivered 1 remaining 1 | deliver a #1 {"channel":"room","type":"t","payload":1,"seq":SEQ1,"clientId":"ann"} skip 1 | deliver b #1 {"channel":"room","type":"t","payload":1,"seq":SEQ1,"clientId":"ann"}`},
		}},
		{name: "presence: sync lists the others, joins and leaves reach every node but the socket they are about", steps: []coreStep{
			{join("a", 1, true, "ann"), "replay 0, sync [] | hook channel_occupied | hook member_added ann | presence a join ann except 1"},
			{join("b", 2, false, ""), "replay 0"},
			{join("b", 3, true, "bob"), "replay 0, sync [ann] | hook member_added bob | presence a join bob except 0 | presence b join bob except 3"},
			{join("b", 3, true, "bob"), "replay 0, sync [ann]"},     // repeated: nothing new
			{join("a", 4, true, "bob"), "replay 0, sync [ann bob]"}, // bob's second socket: no join
			{join("a", 4, true, "cat"), "replay 0, sync [ann bob] | hook member_added cat | presence a join cat except 4 | presence b join cat except 0"}, // bob stays: another socket has it
			{leave("b", 3), "| hook member_removed bob | presence a leave bob except 0 | presence b leave bob except 3"},
			{join("a", 1, false, ""), "replay 0 | hook member_removed ann | presence a leave ann except 1 | presence b leave ann except 0"},
			{query(QueryMembers, 0), "subscribers 3 members 1 [cat] messages 0 gap false"},
		}},
		{name: "the presence cap refuses a new member and keeps what the socket had", maxMembers: 2, steps: []coreStep{
			{join("a", 1, true, "ann"), "replay 0, sync [] | hook channel_occupied | hook member_added ann | presence a join ann except 1"},
			{join("a", 2, true, "bob"), "replay 0, sync [ann] | hook member_added bob | presence a join bob except 2"},
			{join("b", 3, true, "cat"), "too_many_presence_members kept false {presence:false clientID:}"},
			{join("a", 2, true, "cat"), "replay 0, sync [ann] | hook member_removed bob | presence a leave bob except 2 | presence b leave bob except 0 | hook member_added cat | presence a join cat except 2 | presence b join cat except 0"}, // bob's only socket: room for cat
			{join("b", 3, true, "dan"), "too_many_presence_members kept false {presence:false clientID:}"},
			{join("b", 3, true, "ann"), "replay 0, sync [ann cat]"},
			{join("b", 3, true, "dan"), "too_many_presence_members kept true {presence:true clientID:ann}"}, // ann has another socket
		}},
		{name: "since: the replay after it, a gap when the ring no longer covers it", steps: []coreStep{
			{emit(`1`), "#1 subscribers 0 delivered 0 remaining 1"},
			{emit(`2`), "#2 subscribers 0 delivered 0 remaining 0"},
			{joinSince("a", 1, 1), "replay 1 | hook channel_occupied"},
			{joinSince("a", 2, 0), "replay 2"},
			{wait(31 * time.Second), ""}, // #1 and #2 expire; a new window
			{emit(`3`), "#3 subscribers 2 delivered 2 remaining 1 | deliver a #3 {\"channel\":\"room\",\"payload\":3,\"seq\":SEQ3}"},
			{joinSince("b", 3, 1), "gap since #1, replay 1"},
			{query(QueryMessages, 0), "subscribers 3 members 0 [] messages 1 gap true"},
			{query(QueryMessages, 2), "subscribers 3 members 0 [] messages 1 gap false"},
			{query(QueryMessages, 3), "subscribers 3 members 0 [] messages 0 gap false"},
			{after(1), "gap true [3]"},
			{after(3), "gap false []"},
		}},
		{name: "a node that goes away takes its subscribers and members with it", steps: []coreStep{
			{join("a", 1, true, "ann"), "replay 0, sync [] | hook channel_occupied | hook member_added ann | presence a join ann except 1"},
			{join("b", 2, true, "bob"), "replay 0, sync [ann] | hook member_added bob | presence a join bob except 0 | presence b join bob except 2"},
			{dropNode("a"), "| hook member_removed ann | presence a leave ann except 1 | presence b leave ann except 0"},
			{dropNode("b"), "| hook member_removed bob | presence b leave bob except 2 | hook channel_vacated"},
			{idle(), "idle true"},
		}},
		{name: "a node's register replaces its list without events; members it no longer has are removed", steps: []coreStep{
			{join("a", 1, true, "ann"), "replay 0, sync [] | hook channel_occupied | hook member_added ann | presence a join ann except 1"},
			{replaceNode("a", map[uint64]coreSub{1: {true, "ann"}}), "roster changed false"},
			{replaceNode("b", map[uint64]coreSub{7: {true, "bob"}}), "roster changed true"},
			{query(QueryMembers, 0), "subscribers 2 members 2 [ann bob] messages 0 gap false"},
			{replaceNode("a", map[uint64]coreSub{}), "roster changed true | hook member_removed ann"},
			{replaceNode("b", nil), "roster changed true | hook member_removed bob | hook channel_vacated"},
		}},
		{name: "a handed-over state: its ring before this one's, its window counted, seq going on from it", steps: []coreStep{
			{mergeState(1, 3, 2, 1), ""}, // the previous owner stamped base-3, base-2, base-1
			{joinSince("a", 1, 0), "replay 0 | hook channel_occupied"},
			{func(h *coreHarness) string {
				o := h.core.join(&joinRequest{node: "b", conn: 2, hasSince: true, since: float64(h.base - 3)}, h.now)
				return fmt.Sprintf("gap %v replay %d", o.gap, len(o.replay))
			}, "gap false replay 2"},
			{emit(`1`), `#0 subscribers 2 delivered 2 remaining 0 | deliver a #0 {"channel":"room","payload":1,"seq":SEQ0} | deliver b #0 {"channel":"room","payload":1,"seq":SEQ0}`},
			{emit(`2`), "channel_rate_limited remaining 0"}, // the handed-over emit counts in this window
		}},
		{name: "a handed-over state whose last stamps failed: no gap after its low water, seq going on above them", steps: []coreStep{
			{mergeEmpty(5, 2), ""},
			{after(-5 + 1<<64), "gap false []"}, // a relay that saw base-5 missed nothing
			{after(-6 + 1<<64), "gap true []"},  // one that saw less did
			{emit(`1`), "#-1 subscribers 0 delivered 0 remaining 1"},
		}},
		{name: "a handed-over state to a core that stamped already: seq from the higher", steps: []coreStep{
			{emit(`1`), "#1 subscribers 0 delivered 0 remaining 1"},
			{mergeState(0, 3, 2, 1), ""},
			{emit(`2`), "#2 subscribers 0 delivered 0 remaining 0"},
		}},
		{name: "a fresh previous owner hands on no seq: this core's stays", steps: []coreStep{
			{func(h *coreHarness) string {
				prev := newChannelCore("p", "room", h.core.cfg, &replayBudget{}, channelHooks{}, h)
				h.core.merge(nil, prev.replay.lowWater, prev.handedSeq(), prev.landed, h.now, 0)
				return fmt.Sprintf("handed %d seq %d", prev.handedSeq(), int64(h.core.seq-h.base))
			}, "handed 0 seq 0"},
			{stored(100), "seq -100"}, // still fresh: it goes on from the store
		}},
		{name: "a node that delivered past this core's seq: seq goes on from there, with a gap before it", steps: []coreStep{
			{emit(`1`), "#1 subscribers 0 delivered 0 remaining 1"},
			{raise(10), ""},
			{raise(5), ""},             // lower: nothing changes
			{after(0), "gap true [1]"}, // #1 is still held, but what followed it up to #10 never was
			{emit(`2`), "#11 subscribers 0 delivered 0 remaining 0"},
			{after(10), "gap false [11]"},
		}},
		{name: "a history channel's new life goes on from its stored last seq, not from the clock", steps: []coreStep{
			{stored(100), "seq -100"},
			{emit(`1`), "#-99 subscribers 0 delivered 0 remaining 1"},
			{joinSince("a", 1, 0), "replay 0 | hook channel_occupied"}, // since from before: nothing the ring holds (the host reads the store)
			{after(-100 + 1<<64), "gap false [-99]"},
			{stored(99), "seq -99"}, // read again: nothing to raise
		}},
		{name: "…from what a node delivered, if a relay said more than the store holds", steps: []coreStep{
			{raise(-50 + 1<<64), ""}, // a relay delivered base-50 (below the clock's start: seq stays)
			{stored(100), "seq -50"},
			{emit(`1`), "#-49 subscribers 0 delivered 0 remaining 1"},
		}},
		{name: "a core that stamped does not go back", steps: []coreStep{
			{emit(`1`), "#1 subscribers 0 delivered 0 remaining 1"},
			{stored(100), "seq 1"},
			{stored(-5 + 1<<64), "seq 5"}, // a higher stored seq raises it
		}},
		{name: "nor one that took a handed-over state", steps: []coreStep{
			{mergeState(0, 3, 2, 1), ""},
			{stored(100), "seq -1"},
		}},
		{name: "idle only when nobody listens, the window ran out and the ring is empty", steps: []coreStep{
			{idle(), "idle true"},
			{emit(`1`), "#1 subscribers 0 delivered 0 remaining 1"},
			{idle(), "idle false"},
			{wait(25 * time.Second), ""},
			{idle(), "idle false"}, // the window: this minute
			{wait(10 * time.Second), ""},
			{idle(), "idle true"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newCoreHarness(t, Config{MaxPresenceMembers: tc.maxMembers})
			for i, s := range tc.steps {
				h.events = nil
				got := s.do(h)
				if len(h.events) > 0 {
					got = strings.TrimSpace(got + " | " + strings.Join(nodeOrder(h.events), " | "))
				}
				want := s.want
				for n := 0; n <= 3; n++ {
					want = strings.ReplaceAll(want, fmt.Sprintf("SEQ%d", n), fmt.Sprint(h.base+uint64(n)))
				}
				if got != want {
					t.Fatalf("step %d:\n got %s\nwant %s", i+1, got, want)
				}
			}
		})
	}
}

// nodeOrder sorts each run of events of one kind (deliver, presence) by
// node: the core hands an event to the nodes in no particular order.
func nodeOrder(events []string) []string {
	kind := func(e string) string { k, _, _ := strings.Cut(e, " "); return k }
	for i := 0; i < len(events); {
		j := i + 1
		for j < len(events) && kind(events[j]) == kind(events[i]) && kind(events[i]) != "hook" {
			j++
		}
		slices.Sort(events[i:j])
		i = j
	}
	return events
}

// A client emit's delivered counts every subscriber but the emitter, which
// gets the ack instead.
func TestChannelCoreClientEmitCountsTheEmitterOut(t *testing.T) {
	h := newCoreHarness(t, Config{})
	for conn := uint64(1); conn <= 3; conn++ {
		h.core.join(&joinRequest{node: localNode, conn: conn, sub: coreSub{presence: true, clientID: "ann"}}, h.now)
	}
	o := h.core.publish(&emitRequest{payload: []byte(`1`), at: h.now, limit: 10, client: true, conn: 2, clientID: "ann"})
	if o.err != "" || o.subscribers != 3 || o.delivered != 2 {
		t.Fatalf("client emit to 3 subscribers: %+v, want 3 subscribers, 2 delivered", o)
	}
}
