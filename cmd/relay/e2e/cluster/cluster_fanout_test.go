//go:build cluster

package cluster

// Cross-node fan-out, black-box: channels as cluster grains (kind
// "relay-channel", identity projectId/channel), the single writer of a
// channel's seq, replay ring, channel budget and presence roster, with every
// node's local channel actor registered with the grain. Run with
// `make test-cluster` (or -run '^TestClusterFanout'). Like TestCluster, it
// starts its own etcd, PostgreSQL and relay processes on loopback and ends
// only the processes it started, by their pids.
//
// The subtests share one cluster and run in order; each uses channels of its
// own, and the last one kills node C.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// emitAt posts {"channel":ch,"payload":payload} to base's /emit (a node's
// or HAProxy's) with the secret key. It returns errors instead of failing,
// for use off the test's goroutine.
func emitAt(hc *http.Client, base, secretKey, ch, payload string) (relaytest.Response, error) {
	h := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + secretKey}}
	return relaytest.Do(hc, "POST", base+"/emit", `{"channel":"`+ch+`","payload":`+payload+`}`, h)
}

// emitted is a 200 answer of POST /emit, decoded.
type emitted struct {
	seq, delivered, subscriberCount int64
}

// expectEmitted fails unless r is a 200 of POST /emit for ch and returns its numbers.
func expectEmitted(t *testing.T, r relaytest.Response, ch string) emitted {
	t.Helper()
	if r.Status != http.StatusOK || r.JSON["ok"] != true || r.JSON["channel"] != ch || relaytest.Num(r.JSON, "seq") <= 0 {
		t.Fatalf("emit on %s: %d %s", ch, r.Status, r.Raw)
	}
	return emitted{seq: int64(relaytest.Num(r.JSON, "seq")), delivered: int64(relaytest.Num(r.JSON, "delivered")), subscriberCount: int64(relaytest.Num(r.JSON, "subscriberCount"))}
}

// message is a message frame from POST /emit (PROTOCOL.md › Server frames):
// exactly {"channel","payload","seq"}, plus "replay":true when replayed.
type message struct {
	channel string
	payload string // compact JSON
	seq     int64
	replay  bool
}

// parseMessage decodes f as a message frame; anything else is an error.
func parseMessage(f relaytest.Frame) (message, error) {
	if f.Closed || f.Err != nil {
		return message{}, fmt.Errorf("socket over (close %d %q, err %v)", f.CloseCode, f.Reason, f.Err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(f.Text), &m); err != nil {
		return message{}, fmt.Errorf("not a JSON object: %q", f.Text)
	}
	var out message
	var seq float64
	if json.Unmarshal(m["channel"], &out.channel) != nil || json.Unmarshal(m["seq"], &seq) != nil || m["payload"] == nil || seq <= 0 {
		return message{}, fmt.Errorf("not a message frame: %s", f.Text)
	}
	out.seq = int64(seq)
	var payload any
	json.Unmarshal(m["payload"], &payload)
	out.payload = relaytest.Canonical(payload)
	keys := 3
	if r, ok := m["replay"]; ok {
		if string(r) != "true" {
			return message{}, fmt.Errorf("replay is %s: %s", r, f.Text)
		}
		out.replay = true
		keys++
	}
	if len(m) != keys {
		return message{}, fmt.Errorf("a message frame with other fields: %s", f.Text)
	}
	return out, nil
}

// collect reads c's frames until it has want of them or until passes, then
// goes on until nothing more arrives for grace (a late duplicate). It stops
// at a close or a failed socket. It does not touch t: goroutines use it.
func collect(c *relaytest.WS, want int, until time.Time, grace time.Duration) []relaytest.Frame {
	var got []relaytest.Frame
	add := func(f relaytest.Frame) bool {
		got = append(got, f)
		return !f.Closed && f.Err == nil
	}
	for len(got) < want {
		f, ok := c.Next(time.Until(until))
		if !ok || !add(f) {
			return got
		}
	}
	for {
		f, ok := c.Next(grace)
		if !ok || !add(f) {
			return got
		}
	}
}

// collectEach runs collect on every socket at once; frames[i] is socks[i]'s.
func collectEach(socks []*relaytest.WS, want int, until time.Time, grace time.Duration) [][]relaytest.Frame {
	frames := make([][]relaytest.Frame, len(socks))
	var wg sync.WaitGroup
	for i, s := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			frames[i] = collect(s, want, until, grace)
		}()
	}
	wg.Wait()
	return frames
}

// sameJSON tells whether text is the JSON value want.
func sameJSON(text, want string) bool {
	var g, w any
	if json.Unmarshal([]byte(text), &g) != nil || json.Unmarshal([]byte(want), &w) != nil {
		return false
	}
	return relaytest.Canonical(g) == relaytest.Canonical(w)
}

// waitFor reads c's frames until one is want or deadline passes, and returns
// every frame read (want last when it came) with its arrival time; it does
// not touch t.
func waitFor(c *relaytest.WS, want string, deadline time.Time) (frames []string, at []time.Time, found bool) {
	for {
		f, ok := c.Next(time.Until(deadline))
		if !ok {
			return frames, at, false
		}
		text := f.Text
		if f.Closed || f.Err != nil {
			text = fmt.Sprintf("socket over (close %d %q, err %v)", f.CloseCode, f.Reason, f.Err)
		}
		frames, at = append(frames, text), append(at, time.Now())
		if f.Closed || f.Err != nil {
			return frames, at, false
		}
		if sameJSON(f.Text, want) {
			return frames, at, true
		}
	}
}

// sumMetric adds up an unlabelled counter over nodes (a node without the
// sample, or not answering, adds 0) and says what each node had.
func sumMetric(nodes []*clusterNode, name string) (float64, string) {
	var sum float64
	var each []string
	for _, n := range nodes {
		r, err := relaytest.Do(nil, "GET", n.proc.Debug+"/metrics", "", nil)
		if err != nil {
			each = append(each, n.name+": "+err.Error())
			continue
		}
		m, err := relaytest.ParseMetrics(r.Raw)
		v, ok := m.Value(name, "")
		if err != nil || !ok {
			each = append(each, n.name+": no sample")
			continue
		}
		sum += v
		each = append(each, fmt.Sprintf("%s: %v", n.name, v))
	}
	return sum, strings.Join(each, ", ")
}

// presenceFrame is a presence join/leave frame.
func presenceFrame(ch, event, clientID string) string {
	return `{"type":"presence","channel":"` + ch + `","event":"` + event + `","clientId":"` + clientID + `"}`
}

func syncFrame(ch string, members ...string) string {
	b, _ := json.Marshal(append([]string{}, members...))
	return `{"type":"presence","channel":"` + ch + `","event":"sync","members":` + string(b) + `}`
}

// presenceTrio subscribes u1 on a, then u2 on b, then u3 on c to ch with
// presence, and checks that each gets the sync of those before it and those
// before it a join: one roster for the cluster.
func presenceTrio(t *testing.T, publicKey, ch string, a, b, c *relaytest.Server) (u1, u2, u3 *relaytest.WS) {
	t.Helper()
	u1 = a.PresenceSub(t, publicKey, ch, "u1")
	u1.Expect(syncFrame(ch))
	u2 = b.PresenceSub(t, publicKey, ch, "u2")
	u2.Expect(syncFrame(ch, "u1"))
	u1.Expect(presenceFrame(ch, "join", "u2"))
	u3 = c.PresenceSub(t, publicKey, ch, "u3")
	u3.Expect(syncFrame(ch, "u1", "u2"))
	u1.Expect(presenceFrame(ch, "join", "u3"))
	u2.Expect(presenceFrame(ch, "join", "u3"))
	return u1, u2, u3
}

// channelHostedBy emits on PREFIX-0, PREFIX-1, … through via until n hosts
// the channel's grain, and returns that channel; it fails after 60.
func channelHostedBy(t *testing.T, n *clusterNode, via *relaytest.Client, p relaytest.Project, prefix string) string {
	t.Helper()
	for i := range 60 {
		name := fmt.Sprintf("%s-%d", prefix, i)
		expectEmitted(t, via.Emit(p.SecretKey, `{"channel":"`+name+`","payload":0}`), name)
		if n.hostsGrain(t, p.ID+"/"+name) {
			return name
		}
	}
	t.Fatalf("%s hosts none of 60 channels", n.name)
	return ""
}

func TestClusterFanout(t *testing.T) {
	began := time.Now()
	cl := startCluster(t, 10*time.Second, []string{"A", "B", "C"})
	nodes := cl.nodes
	a, b, c := nodes[0], nodes[1], nodes[2]

	owner := a.on(t).Signup("alice@example.com")
	p := owner.CreateProject("fanout")
	// ownerOn is the owner's session on node n, for subtest t.
	ownerOn := func(t *testing.T, n *clusterNode) *relaytest.Client {
		oc := n.on(t).Client()
		oc.HTTP.Jar = owner.HTTP.Jar
		return oc
	}

	t.Run("1 emit through A reaches subscribers on A, B and C", func(t *testing.T) {
		const ch = "one"
		var subs []*relaytest.WS
		for _, n := range nodes {
			subs = append(subs, n.on(t).Subscribed(t, p.PublicKey, ch))
		}
		t0 := time.Now()
		r := a.on(t).Client().Emit(p.SecretKey, `{"channel":"one","payload":{"text":"hi","n":[1,2]}}`)
		e := expectEmitted(t, r, ch)
		t.Logf("emit through A answered in %v: %s", time.Since(t0).Round(time.Microsecond), r.Raw)
		if e.delivered != 3 || e.subscriberCount != 3 {
			t.Errorf("delivered %d, subscriberCount %d; want 3 and 3 (one socket on each node): %s", e.delivered, e.subscriberCount, r.Raw)
		}
		for i, s := range subs {
			s.Expect(fmt.Sprintf(`{"channel":"one","payload":{"text":"hi","n":[1,2]},"seq":%d}`, e.seq))
			t.Logf("subscriber on %s got it %v after the emit", nodes[i].name, time.Since(t0).Round(time.Microsecond))
		}
		// One grain holds the channel, and it sent the message to the two
		// other nodes: the operator's figures say so.
		for _, m := range []struct {
			name string
			min  float64
		}{{"relay_cluster_grains", 1}, {"relay_cluster_grain_activations_total", 1}, {"relay_cluster_cross_node_messages_total", 2}} {
			if sum, each := sumMetric(nodes, m.name); sum < m.min {
				t.Errorf("%s summed over the nodes is %v, want >= %v (%s)", m.name, sum, m.min, each)
			}
		}
	})

	t.Run("2 concurrent emits through A, B and C: one seq order, each message once everywhere", func(t *testing.T) {
		const ch, perNode = "busy", 100
		var subs []*relaytest.WS
		for _, n := range nodes {
			subs = append(subs, n.on(t).Subscribed(t, p.PublicKey, ch))
		}
		type ack struct {
			key string // "A/17": emitted through A, the 18th
			res relaytest.Response
			err error
		}
		acks := make([][]ack, len(nodes))
		var wg sync.WaitGroup
		start := make(chan struct{})
		t0 := time.Now()
		for i, n := range nodes {
			wg.Add(1)
			go func(i int, n *clusterNode) {
				defer wg.Done()
				hc := &http.Client{Timeout: 10 * time.Second}
				<-start
				for j := range perNode {
					res, err := emitAt(hc, n.proc.Base, p.SecretKey, ch, fmt.Sprintf(`{"node":%q,"i":%d}`, n.name, j))
					acks[i] = append(acks[i], ack{key: fmt.Sprintf("%s/%d", n.name, j), res: res, err: err})
				}
			}(i, n)
		}
		close(start)
		wg.Wait()
		t.Logf("%d emits (%d through each node, concurrently) answered in %v", perNode*len(nodes), perNode, time.Since(t0).Round(time.Millisecond))

		seqOf := map[string]int64{} // payload key -> acknowledged seq
		keyOf := map[int64]string{} // acknowledged seq -> payload key
		refused := map[string]int{} // node -> non-200 answers
		for i, list := range acks {
			for _, k := range list {
				if k.err != nil || k.res.Status != http.StatusOK || relaytest.Num(k.res.JSON, "seq") <= 0 {
					if refused[nodes[i].name]++; refused[nodes[i].name] <= 3 {
						t.Errorf("emit %s: %d %s %v", k.key, k.res.Status, k.res.Raw, k.err)
					}
					continue
				}
				seq := int64(relaytest.Num(k.res.JSON, "seq"))
				if other, dup := keyOf[seq]; dup {
					t.Errorf("seq %d acknowledged twice: to %s and to %s", seq, other, k.key)
				}
				seqOf[k.key], keyOf[seq] = seq, k.key
			}
		}
		if len(refused) > 0 {
			t.Errorf("emits not answered 200, by node: %v", refused)
		}

		// Read what each subscriber got: every acknowledged message, then
		// 300 ms more for a late duplicate.
		got := collectEach(subs, len(seqOf), time.Now().Add(10*time.Second), 300*time.Millisecond)
		for i, frames := range got {
			name := nodes[i].name
			seen := map[string]int{}
			var last int64
			var dups, unordered, mismatched int
			for _, f := range frames {
				m, err := parseMessage(f)
				if err == nil && (m.channel != ch || m.replay) {
					err = fmt.Errorf("not a live message of %s: %s", ch, f.Text)
				}
				if err != nil {
					t.Errorf("subscriber on %s: %v", name, err)
					continue
				}
				var pl struct {
					Node string `json:"node"`
					I    int    `json:"i"`
				}
				json.Unmarshal([]byte(m.payload), &pl)
				key := fmt.Sprintf("%s/%d", pl.Node, pl.I)
				if seen[key]++; seen[key] > 1 {
					dups++
				}
				if m.seq <= last {
					if unordered++; unordered <= 3 {
						t.Errorf("subscriber on %s: seq %d (%s) after %d", name, m.seq, key, last)
					}
				}
				last = max(last, m.seq)
				if want, ok := seqOf[key]; !ok || want != m.seq {
					if mismatched++; mismatched <= 3 {
						t.Errorf("subscriber on %s: %s with seq %d, acknowledged with seq %d (%v)", name, key, m.seq, want, ok)
					}
				}
			}
			missing := map[string]int{} // by the node the emit went through
			for key := range seqOf {
				if seen[key] == 0 {
					missing[strings.Split(key, "/")[0]]++
				}
			}
			t.Logf("subscriber on %s: %d frames for %d acknowledged emits; %d duplicates, %d out of order, %d with another seq, missing by emitting node %v",
				name, len(frames), len(seqOf), dups, unordered, mismatched, missing)
			if dups != 0 || unordered != 0 || mismatched != 0 || len(missing) != 0 || len(frames) != len(seqOf) {
				t.Errorf("subscriber on %s: want each of the %d acknowledged messages exactly once in rising seq; got %d frames, %d duplicates, %d out of order, missing %v",
					name, len(seqOf), len(frames), dups, unordered, missing)
			}
		}
	})

	t.Run("3 replay from another node: since on C replays what was emitted through A", func(t *testing.T) {
		const ch = "replayed"
		onB := b.on(t).Subscribed(t, p.PublicKey, ch)
		viaA := a.on(t).Client()
		var seqs []int64
		for i := 1; i <= 3; i++ {
			seqs = append(seqs, expectEmitted(t, viaA.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"replayed","payload":{"n":%d}}`, i)), ch).seq)
		}
		for i, seq := range seqs {
			onB.Expect(fmt.Sprintf(`{"channel":"replayed","payload":{"n":%d},"seq":%d}`, i+1, seq))
		}
		onC := c.on(t).DialWS(p.PublicKey)
		onC.Send(fmt.Sprintf(`{"action":"subscribe","channel":"replayed","since":%d}`, seqs[0]))
		// No replay_gap: the next frames are the 2nd and 3rd message, then the ack.
		onC.Expect(fmt.Sprintf(`{"channel":"replayed","payload":{"n":2},"seq":%d,"replay":true}`, seqs[1]))
		onC.Expect(fmt.Sprintf(`{"channel":"replayed","payload":{"n":3},"seq":%d,"replay":true}`, seqs[2]))
		onC.Expect(`{"action":"subscribe","channel":"replayed","ok":true}`)
		onC.ExpectSilence(200 * time.Millisecond)
	})

	t.Run("4 presence across nodes: one roster for the cluster", func(t *testing.T) {
		const ch = "lobby"
		u1, u2, u3 := presenceTrio(t, p.PublicKey, ch, a.on(t), b.on(t), c.on(t))

		// u2 unsubscribes on B: A and C get leave.
		u2.Send(`{"action":"unsubscribe","channel":"lobby"}`)
		u2.Expect(`{"action":"unsubscribe","channel":"lobby","ok":true}`)
		u1.Expect(presenceFrame(ch, "leave", "u2"))
		u3.Expect(presenceFrame(ch, "leave", "u2"))

		// u2 back on the same socket, then the socket dropped (no close frame).
		u2.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"u2"}`)
		u2.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
		u2.Expect(syncFrame(ch, "u1", "u3"))
		u1.Expect(presenceFrame(ch, "join", "u2"))
		u3.Expect(presenceFrame(ch, "join", "u2"))

		// Subscribing again (PROTOCOL.md › subscribe): under another clientId,
		// the old one leaves and the new one joins; without presence, it
		// leaves; with presence again, it joins. The roster on the grain
		// follows what B's relay tells it.
		u2.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"u2b"}`)
		u2.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
		u2.Expect(syncFrame(ch, "u1", "u3"))
		for _, u := range []*relaytest.WS{u1, u3} {
			u.Expect(presenceFrame(ch, "leave", "u2"))
			u.Expect(presenceFrame(ch, "join", "u2b"))
		}
		u2.Send(`{"action":"subscribe","channel":"lobby"}`)
		u2.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
		u1.Expect(presenceFrame(ch, "leave", "u2b"))
		u3.Expect(presenceFrame(ch, "leave", "u2b"))
		u2.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"u2"}`)
		u2.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
		u2.Expect(syncFrame(ch, "u1", "u3"))
		u1.Expect(presenceFrame(ch, "join", "u2"))
		u3.Expect(presenceFrame(ch, "join", "u2"))
		u2.ExpectSilence(50 * time.Millisecond)

		u2.Conn.Close()
		closed := time.Now()
		u1.Expect(presenceFrame(ch, "leave", "u2"))
		u3.Expect(presenceFrame(ch, "leave", "u2"))
		t.Logf("leave of u2 on A and C %v after its socket on B was dropped", time.Since(closed).Round(time.Microsecond))
		u1.ExpectSilence(100 * time.Millisecond)
		u3.ExpectSilence(50 * time.Millisecond)
	})

	t.Run("5 channel budget counted once for the cluster", func(t *testing.T) {
		const ch, limit = "limited", 5
		q := ownerOn(t, a).CreateProject("budget")
		page := "/projects/" + q.ID
		dc := a.on(t).Dash(t)
		dc.HTTP.Jar = owner.HTTP.Jar
		dc.Submit(page, page+"/budget", url.Values{"limit": {fmt.Sprint(limit)}}).ExpectRedirect(t, page+"?done=budget-saved")

		// Budgets are fixed wall-clock minutes: keep the emits inside one.
		awaitWindow(t, time.Minute, 5*time.Second, 100*time.Millisecond)
		clients := map[*clusterNode]*relaytest.Client{a: a.on(t).Client(), b: b.on(t).Client(), c: c.on(t).Client()}
		for i := range limit + 3 {
			n := nodes[i%3]
			r := clients[n].Emit(q.SecretKey, fmt.Sprintf(`{"channel":"limited","payload":%d}`, i))
			now := time.Now()
			if i < limit {
				expectEmitted(t, r, ch)
				relaytest.Budget(t, now, r, "rate_limit", limit, limit-1-i)
				budgetShape(t, now, r, "project_rate_limit", 6000)
				continue
			}
			if r.Status != http.StatusTooManyRequests || r.JSON["error"] != "channel_rate_limited" || len(r.JSON) != 3 {
				t.Fatalf("emit %d (through %s) after %d accepted in the cluster: %d %s; want 429 channel_rate_limited", i+1, n.name, limit, r.Status, r.Raw)
			}
			relaytest.Budget(t, now, r, "rate_limit", limit, 0)
			budgetShape(t, now, r, "project_rate_limit", 6000)
		}
	})

	// D holds back the first attempt of every publish it sends to a channel
	// grain by 800 ms and retries after 300 ms: the grain gets the retry
	// first and the first attempt later, as a duplicate. Started here, on the
	// test's t, D stays a member until the test ends (a node started in a
	// subtest is killed when the subtest ends).
	t0 := time.Now()
	d := cl.node(t, "D", "RELAY_TEST_FIRST_SEND_DELAY=800ms")
	for _, n := range []*clusterNode{a, b, c, d} {
		n.waitMembers(t, 4, 10*time.Second)
	}
	t.Logf("D (RELAY_TEST_FIRST_SEND_DELAY=800ms) serving and seen by every node %v after its start", time.Since(t0).Round(time.Millisecond))

	t.Run("6 a publish retried by its node is delivered once", func(t *testing.T) {
		const ch = "retried"
		viaD := d.on(t).Client()
		// A first emit, before anyone subscribes, so that D's channel
		// relay has found the grain: the hook holds back only a publish
		// sent to a known grain (on a fresh relay the first publish waits
		// for the lookup and goes without the delay).
		t0 := time.Now()
		expectEmitted(t, viaD.Emit(p.SecretKey, `{"channel":"retried","payload":"warm-up"}`), ch)
		t.Logf("warm-up emit through D (no subscriber yet) answered in %v", time.Since(t0).Round(time.Millisecond))

		subs := []*relaytest.WS{a.on(t).Subscribed(t, p.PublicKey, ch), b.on(t).Subscribed(t, p.PublicKey, ch)}
		t0 = time.Now()
		e := expectEmitted(t, viaD.Emit(p.SecretKey, `{"channel":"retried","payload":{"once":true}}`), ch)
		answered := time.Now()
		took := answered.Sub(t0)
		t.Logf("emit through D answered in %v: seq %d, delivered %d, subscriberCount %d", took.Round(time.Millisecond), e.seq, e.delivered, e.subscriberCount)
		if e.delivered != 2 || e.subscriberCount != 2 {
			t.Errorf("delivered %d, subscriberCount %d; want 2 and 2 (one socket on A, one on B)", e.delivered, e.subscriberCount)
		}
		got := collectEach(subs, 1, answered.Add(5*time.Second), 2*time.Second)
		want := fmt.Sprintf(`{"channel":"retried","payload":{"once":true},"seq":%d}`, e.seq)
		for i, frames := range got {
			var texts []string
			for _, f := range frames {
				texts = append(texts, fmt.Sprintf("%q (close %d, err %v)", f.Text, f.CloseCode, f.Err))
			}
			if len(frames) != 1 || !sameJSON(frames[0].Text, want) {
				t.Errorf("subscriber on %s: got %d frames %v; want exactly %s", []string{"A", "B"}[i], len(frames), texts, want)
			}
		}
		const metric = "relay_cluster_duplicates_dropped_total"
		var sum float64
		var each string
		relaytest.Within(3*time.Second, func() bool { // judged below either way
			sum, each = sumMetric([]*clusterNode{a, b, c, d}, metric)
			return sum >= 1
		})
		t.Logf("%s: %s", metric, each)
		if retries := d.metric(t, "relay_cluster_publish_retries_total"); retries < 1 {
			t.Errorf("relay_cluster_publish_retries_total on D is %v: its held-back publish was not sent again", retries)
		}
		if sum < 1 {
			hint := ""
			if took < 250*time.Millisecond {
				hint = "; the emit was answered before the 300 ms retry, so its first attempt was not held back"
			}
			t.Errorf("%s summed over A, B, C and D is %v, want >= 1 (%s)%s", metric, sum, each, hint)
		}
	})

	t.Run("7 kill -9 of C: its presence member leaves, emits reach B again", func(t *testing.T) {
		const ch = "survivors"
		tsA, tsB := a.on(t), b.on(t)
		u1, u2, _ := presenceTrio(t, p.PublicKey, ch, tsA, tsB, c.on(t))

		// A plain subscriber on B on several channels: some of their grains
		// are likely to live on C.
		var after []string
		watcher := tsB.DialWS(p.PublicKey)
		for i := range 8 {
			name := fmt.Sprintf("after-%d", i)
			after = append(after, name)
			watcher.Send(`{"action":"subscribe","channel":"` + name + `"}`)
			watcher.Expect(`{"action":"subscribe","channel":"` + name + `","ok":true}`)
		}

		// A channel whose grain (and ring) lives on C, with two messages in it.
		viaA := tsA.Client()
		lost := channelHostedBy(t, c, viaA, p, "lost")
		lostSeq := expectEmitted(t, viaA.Emit(p.SecretKey, `{"channel":"`+lost+`","payload":1}`), lost).seq

		if err := syscall.Kill(c.pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		defer func() {
			// The ring C held is gone: resuming from before it is an honest
			// replay_gap, and seq goes on rising from where it was.
			resumed := tsA.DialWS(p.PublicKey)
			resumed.Send(fmt.Sprintf(`{"action":"subscribe","channel":"%s","since":%d}`, lost, lostSeq-1))
			resumed.Expect(fmt.Sprintf(`{"type":"replay_gap","channel":"%s","since":%d}`, lost, lostSeq-1))
			resumed.Expect(`{"action":"subscribe","channel":"` + lost + `","ok":true}`)
			next := expectEmitted(t, viaA.Emit(p.SecretKey, `{"channel":"`+lost+`","payload":2}`), lost)
			if next.seq <= lostSeq {
				t.Errorf("seq after the crash %d, not above %d", next.seq, lostSeq)
			}
			resumed.Expect(fmt.Sprintf(`{"channel":"%s","payload":2,"seq":%d}`, lost, next.seq))
		}()
		select {
		case <-c.proc.Exited:
		case <-time.After(5 * time.Second):
			t.Fatal("C still running 5 s after SIGKILL")
		}

		// Leave of u3 on A and on B within 10 s of the kill, and nothing
		// else (no other member leaves or joins again).
		leave := presenceFrame(ch, "leave", "u3")
		type arrivals struct {
			frames []string
			at     []time.Time
			found  bool
		}
		got := make([]arrivals, 2)
		var wg sync.WaitGroup
		for i, s := range []*relaytest.WS{u1, u2} {
			wg.Add(1)
			go func(i int, s *relaytest.WS) {
				defer wg.Done()
				frames, at, found := waitFor(s, leave, killed.Add(10*time.Second))
				got[i] = arrivals{frames, at, found}
			}(i, s)
		}
		wg.Wait()
		for i, g := range got {
			name := []string{"A", "B"}[i]
			var seen []string
			for k, f := range g.frames {
				seen = append(seen, fmt.Sprintf("+%v %s", g.at[k].Sub(killed).Round(time.Millisecond), f))
			}
			switch {
			case !g.found:
				t.Errorf("presence subscriber on %s: no %s within 10 s of the kill; got %v", name, leave, seen)
			case len(slices.DeleteFunc(slices.Clone(g.frames), func(f string) bool {
				return strings.HasPrefix(f, `{"type":"replay_gap","channel":"`+ch+`"`) // the owner may have been C (PROTOCOL.md › Replay and seq)
			})) != 1:
				t.Errorf("presence subscriber on %s: want only %s, got %v", name, leave, seen)
			default:
				t.Logf("leave u3 on %s %v after kill -9 of C", name, g.at[0].Sub(killed).Round(time.Millisecond))
			}
		}
		if ms, err := a.members(t); err == nil {
			t.Logf("A sees %d members %v after the kill", len(ms), time.Since(killed).Round(time.Millisecond))
		}

		// An emit through A reaches the subscriber on B, on every channel,
		// retried for up to 10 s while the cluster settles.
		settle := time.Now()
		deadline := settle.Add(10 * time.Second)
		hc := &http.Client{Timeout: 10 * time.Second}
		sent := map[int64]string{} // seq acknowledged -> its channel
		received := map[int64]bool{}
		gapped := map[string]bool{}
		retry := time.NewTicker(100 * time.Millisecond) // a refused emit is sent again at the next tick
		defer retry.Stop()
		for _, name := range after {
			attempts := 0
			var last string
			for done := false; !done; {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no emit through A reached B within 10 s (%d attempts; last: %s)", name, attempts, last)
				}
				attempts++
				r, err := emitAt(hc, a.proc.Base, p.SecretKey, name, fmt.Sprint(attempts))
				if err != nil || r.Status != http.StatusOK {
					last = fmt.Sprintf("%d %s %v", r.Status, r.Raw, err)
					<-retry.C
					continue
				}
				seq := int64(relaytest.Num(r.JSON, "seq"))
				sent[seq] = name
				last = r.Raw
				wait := min(time.Second, time.Until(deadline))
				for until := time.Now().Add(wait); ; {
					f, ok := watcher.Next(time.Until(until))
					if !ok {
						break // not yet: emit again
					}
					var gap struct{ Type, Channel string }
					if json.Unmarshal([]byte(f.Text), &gap) == nil && gap.Type == "replay_gap" && slices.Contains(after, gap.Channel) && !gapped[gap.Channel] {
						// The channel's owner died: B's relay cannot know whether it
						// stamped something it never sent on (PROTOCOL.md › Replay and seq).
						gapped[gap.Channel] = true
						continue
					}
					m, err := parseMessage(f)
					if err != nil || m.replay || sent[m.seq] != m.channel {
						t.Fatalf("subscriber on B, waiting for %s: %s (%v)", name, f.Text, err)
					}
					if received[m.seq] {
						t.Errorf("subscriber on B got seq %d of %s twice", m.seq, m.channel)
					}
					received[m.seq] = true
					if m.seq == seq {
						done = true
						break
					}
					// an earlier attempt, delivered late: wait on for this one
				}
			}
			t.Logf("%s: reached B %v after the kill (%v after the leaves were checked), %d attempts",
				name, time.Since(killed).Round(time.Millisecond), time.Since(settle).Round(time.Millisecond), attempts)
		}

		// Once A and B have dropped C (and the grains it held live
		// elsewhere), the presence subscribers have had nothing more.
		for _, n := range []*clusterNode{a, b} {
			n.waitMembers(t, 3, 15*time.Second) // A, B and D (started before subtest 6)
		}
		t.Logf("A and B see A, B and D %v after the kill", time.Since(killed).Round(time.Millisecond))
		for i, s := range []*relaytest.WS{u1, u2} {
			var extra []string
			for _, f := range collect(s, 0, time.Now(), 300*time.Millisecond) {
				extra = append(extra, f.Text)
			}
			if len(extra) > 0 {
				t.Errorf("presence subscriber on %s after the leave of u3: %v; want nothing (u1 and u2 never left)", []string{"A", "B"}[i], extra)
			}
		}
	})

	t.Run("8 graceful stop of D: its grains move with their rings; a client resumes on A without replay_gap", func(t *testing.T) {
		tsA, tsD := a.on(t), d.on(t)
		viaA := tsA.Client()
		ch := channelHostedBy(t, d, viaA, p, "handoff") // its grain lives on D
		onD := tsD.Subscribed(t, p.PublicKey, ch)
		onA := tsA.Subscribed(t, p.PublicKey, ch)
		var seqs []int64
		for i := 1; i <= 3; i++ {
			seqs = append(seqs, expectEmitted(t, viaA.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"%s","payload":{"n":%d}}`, ch, i)), ch).seq)
		}
		for i, seq := range seqs {
			want := fmt.Sprintf(`{"channel":"%s","payload":{"n":%d},"seq":%d}`, ch, i+1, seq)
			onD.Expect(want)
			onA.Expect(want)
		}
		closed := closeWatch(onD)
		stopped := time.Now()
		if err := syscall.Kill(d.pid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		closedAt(t, "D's socket", closed, 1001)
		t.Logf("D's socket closed with 1001 %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))

		// The client of D resumes on A with the seq it saw first: the rest
		// comes from the ring D handed over, with no replay_gap.
		resumed := tsA.DialWS(p.PublicKey)
		resumed.Send(fmt.Sprintf(`{"action":"subscribe","channel":"%s","since":%d}`, ch, seqs[0]))
		resumed.Expect(fmt.Sprintf(`{"channel":"%s","payload":{"n":2},"seq":%d,"replay":true}`, ch, seqs[1]))
		resumed.Expect(fmt.Sprintf(`{"channel":"%s","payload":{"n":3},"seq":%d,"replay":true}`, ch, seqs[2]))
		resumed.Expect(`{"action":"subscribe","channel":"` + ch + `","ok":true}`)
		t.Logf("resumed on A %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))

		// seq goes on rising from the handed-over one, for both sockets.
		next := expectEmitted(t, viaA.Emit(p.SecretKey, `{"channel":"`+ch+`","payload":{"n":4}}`), ch)
		if next.seq <= seqs[2] {
			t.Errorf("seq after the handoff %d, not above %d", next.seq, seqs[2])
		}
		want := fmt.Sprintf(`{"channel":"%s","payload":{"n":4},"seq":%d}`, ch, next.seq)
		resumed.Expect(want)
		onA.Expect(want)
		if code := d.waitExit(t, 15*time.Second); code != 0 {
			t.Errorf("D exited %d after SIGTERM:\n%s", code, d.proc.Logs)
		}
		if !strings.Contains(d.proc.Logs.String(), "handed off channel grains") {
			t.Errorf("D's log does not report the handoff:\n%s", d.proc.Logs)
		}
	})
	t.Logf("fan-out tests took %v", time.Since(began).Round(100*time.Millisecond))
}

// hostsGrain reports whether the node's /debug/actors lists the channel grain.
func (n *clusterNode) hostsGrain(t *testing.T, identity string) bool {
	t.Helper()
	grains, _ := n.grains(t)
	return slices.Contains(grains, identity)
}

// hostsProject tells whether n runs the project grain of project id.
func (n *clusterNode) hostsProject(t *testing.T, id string) bool {
	t.Helper()
	_, projects := n.grains(t)
	return slices.Contains(projects, id)
}

// grains are the channel and project grains n runs, from /debug/actors.
func (n *clusterNode) grains(t *testing.T) (channels, projects []string) {
	t.Helper()
	r, err := relaytest.Do(nil, "GET", n.proc.Debug+"/debug/actors", "", nil)
	if err != nil {
		t.Fatalf("%s /debug/actors: %v", n.name, err)
	}
	var v struct {
		Cluster struct {
			Grains        []string `json:"grains"`
			ProjectGrains []string `json:"projectGrains"`
		} `json:"cluster"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &v); err != nil {
		t.Fatalf("%s /debug/actors: %v: %s", n.name, err, r.Raw)
	}
	return v.Cluster.Grains, v.Cluster.ProjectGrains
}

// connsElsewhere is what n's connection cap counts of project id on the
// other nodes (its /debug/actors), -1 while n has no actor for the project.
func (n *clusterNode) connsElsewhere(t *testing.T, id string) int {
	t.Helper()
	r, err := relaytest.Do(nil, "GET", n.proc.Debug+"/debug/actors?project="+id, "", nil)
	if err != nil {
		t.Fatalf("%s /debug/actors: %v", n.name, err)
	}
	var v struct {
		Projects []struct {
			Elsewhere int `json:"connectionsOnOtherNodes"`
		} `json:"projects"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &v); err != nil {
		t.Fatalf("%s /debug/actors: %v: %s", n.name, err, r.Raw)
	}
	if len(v.Projects) == 0 {
		return -1
	}
	return v.Projects[0].Elsewhere
}

// budgetShape checks a budget object's fields: exactly limit, remaining
// (0 to limit) and resetAt, the end of now's wall-clock minute.
func budgetShape(t *testing.T, now time.Time, r relaytest.Response, field string, limit int) {
	t.Helper()
	bud, _ := r.JSON[field].(map[string]any)
	var keys []string
	for k := range bud {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	reset, _ := bud["resetAt"].(string)
	at, err := time.Parse(time.RFC3339, reset)
	if strings.Join(keys, ",") != "limit,remaining,resetAt" || int(relaytest.Num(bud, "limit")) != limit ||
		relaytest.Num(bud, "remaining") < 0 || relaytest.Num(bud, "remaining") > float64(limit) || err != nil || !at.Equal(now.Truncate(time.Minute).Add(time.Minute)) {
		t.Fatalf("%s = %v, want {limit:%d, remaining, resetAt: end of this minute}: %s", field, bud, limit, r.Raw)
	}
}
