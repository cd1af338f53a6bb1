//go:build cluster

package cluster

// The owner of busy channels crashes (kill -9, then a restart on the same
// cluster address) and freezes (SIGSTOP longer than its etcd lease) under
// load, with subscribers on every node; a checker then reads every
// subscriber's record message by message. What a subscriber may rely on
// (proto/PROTOCOL.md › Replay and seq): every acknowledged emit reaches it or
// is covered by a replay_gap it got, no message twice, seq rising. With the
// project's channel history on, no replay_gap at all: what an owner stored
// and did not deliver before it died, its successor reads from the store.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// chaosRecord is what one subscriber saw, across its reconnects.
type chaosRecord struct {
	mu     sync.Mutex
	events []chaosEvent
	last   int64 // the last seq seen: a reconnect resumes with since=last
}

// chaosEvent is a message (id, seq) or a replay_gap (gap, since).
type chaosEvent struct {
	gap   bool
	since int64
	id    int64
	seq   int64
}

// chaosSubscriber stays subscribed to ch until stop, on the node pick gives
// it, reconnecting with since after any close.
func chaosSubscriber(t *testing.T, publicKey, ch string, pick func(attempt int) string, rec *chaosRecord, stop <-chan struct{}, ready chan<- struct{}) {
	first := true
	for attempt := 0; ; attempt++ {
		select {
		case <-stop:
			return
		default:
		}
		base := pick(attempt)
		d := websocket.Dialer{HandshakeTimeout: 2 * time.Second}
		conn, _, err := d.Dial("ws://"+strings.TrimPrefix(base, "http://")+"/ws?publicKey="+publicKey, nil)
		if err != nil {
			select { // the node is down: try the next one shortly
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		rec.mu.Lock()
		sub := fmt.Sprintf(`{"action":"subscribe","channel":%q}`, ch)
		if rec.last > 0 {
			sub = fmt.Sprintf(`{"action":"subscribe","channel":%q,"since":%d}`, ch, rec.last)
		}
		rec.mu.Unlock()
		conn.WriteMessage(websocket.TextMessage, []byte(sub))
		done := make(chan struct{})
		go func() {
			select {
			case <-stop:
			case <-done:
			}
			conn.Close()
		}()
		for {
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, data, err := conn.ReadMessage()
			if err != nil {
				break
			}
			var f struct {
				Action  string          `json:"action"`
				Type    string          `json:"type"`
				OK      bool            `json:"ok"`
				Since   int64           `json:"since"`
				Seq     int64           `json:"seq"`
				Payload json.RawMessage `json:"payload"`
			}
			if err := json.Unmarshal(data, &f); err != nil {
				t.Errorf("subscriber on %s: not JSON: %q", ch, data)
				continue
			}
			rec.mu.Lock()
			switch {
			case f.Seq > 0:
				var p struct{ ID int64 }
				json.Unmarshal(f.Payload, &p)
				rec.events = append(rec.events, chaosEvent{id: p.ID, seq: f.Seq})
				rec.last = max(rec.last, f.Seq)
			case f.Type == "replay_gap":
				rec.events = append(rec.events, chaosEvent{gap: true, since: f.Since})
			case f.Action == "subscribe" && f.OK && first:
				first = false
				ready <- struct{}{}
			}
			rec.mu.Unlock()
		}
		close(done)
	}
}

// stallWindow is when a failed emit counts as stalled: sent from from while
// the window is open. The next fault waits (settle) until every emit sent
// while it was open has its answer, so that a failure is the restart's and
// not the next fault's: an emit sent just before a SIGSTOP to the node that
// owns its channel waits for the freeze, and its 503 says nothing of the
// restart.
type stallWindow struct {
	from    int64
	mu      sync.Mutex
	closed  bool
	pending sync.WaitGroup // emits sent while open, until answered
}

// enter counts an emit about to be sent, while the window is open (counted:
// call pending.Done once it is answered; it stalled if it failed and was
// sent at or after from).
func (w *stallWindow) enter() (counted bool) {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.pending.Add(1)
	}
	return !w.closed
}

// settle closes the window and waits for the answers of the emits sent
// while it was open: at most the emits' client timeout and a margin.
func (w *stallWindow) settle(t *testing.T) {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	done := make(chan struct{})
	go func() { w.pending.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("emits sent in the restart's window still unanswered 10 s after it closed")
	}
}

// chaosAck is an acknowledged emit.
type chaosAck struct {
	id, seq int64
	ch      string
}

func TestClusterChaos(t *testing.T) {
	t.Run("ring", func(t *testing.T) { clusterChaos(t, false, crashAndFreeze) })
	t.Run("history", func(t *testing.T) { clusterChaos(t, true, crashAndFreeze) })
}

// TestClusterOutages: the same load and checker, the faults etcd down for
// about 5 s (past its 3 s lease), then the database for about 4 s (the
// cluster's own PostgreSQL server): every node keeps serving and stays a member, and
// nothing is lost, doubled or covered by a replay_gap. It checks what
// happens, not how fast, so it runs beside the other tests.
func TestClusterOutages(t *testing.T) {
	t.Parallel()
	clusterChaos(t, false, outages)
}

// chaosFault is what clusterChaos does to the cluster under load.
type chaosFault int

const (
	crashAndFreeze chaosFault = iota // kill -9 of the victim, a restart on its address, then SIGSTOP
	partitioned                      // the victim cut off from etcd and the others (partition)
	outages                          // etcd stopped and started again, then PostgreSQL
)

func clusterChaos(t *testing.T, history bool, fault chaosFault) {
	// Budgets out of the way: the load is what the test is about.
	limits := []string{"EMIT_RATE_LIMIT_PER_MINUTE=1000000", "PROJECT_RATE_LIMIT_PER_MINUTE=1000000", "LOG_LEVEL=info"}
	var cl *testCluster
	var stopDB, startDB func()
	if fault == outages {
		var url string
		url, stopDB, startDB = storetest.OwnPostgres(t)
		cl = startClusterOn(t, 30*time.Second, url, []string{"A", "B"}, limits...)
	} else {
		cl = startCluster(t, 30*time.Second, []string{"A", "B"}, limits...)
	}
	victimAddr, uid := relaytest.FreeAddr(t), 0
	if fault == partitioned { // the partition tells the victim's packets by their address and owner
		victimAddr, uid = partitionAddr(t), partitionUID
	}
	victimEnv := append(slices.Clone(limits), "RELAY_CLUSTER_ADDR="+victimAddr)
	victim := cl.nodeAs(t, "C", uid, victimEnv...)
	victims := []*clusterNode{victim}
	a, b := cl.nodes[0], cl.nodes[1]
	for _, n := range []*clusterNode{a, b, victim} {
		n.waitMembers(t, 3, 30*time.Second)
	}
	owner := a.on(t).Signup("alice@example.com")
	p := owner.CreateProject("chaos")
	if history {
		if r := owner.Do("PATCH", "/api/projects/"+p.ID+"/settings", `{"historyRetentionSeconds":3600}`); r.Status != http.StatusOK {
			t.Fatalf("history on: %d %s", r.Status, r.Raw)
		}
	}
	viaA := a.on(t).Client()

	// Channels whose grains live on the victim, and one that does not.
	var chans []string
	for i := range 4 {
		chans = append(chans, channelHostedBy(t, victim, viaA, p, fmt.Sprintf("busy%d", i)))
	}

	// Where each node serves; the victim's changes when it restarts.
	var bases sync.Map // name → base URL ("" while down)
	bases.Store("A", a.proc.Base)
	bases.Store("B", b.proc.Base)
	bases.Store("C", victim.proc.Base)
	names := []string{"A", "B", "C"}
	baseOf := func(i int) string {
		for k := range names {
			if v, _ := bases.Load(names[(i+k)%3]); v != "" {
				return v.(string)
			}
		}
		return a.proc.Base
	}

	// Two subscribers per channel on every node.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	ready := make(chan struct{}, 64)
	type subscriber struct {
		ch   string
		node int
		rec  *chaosRecord
	}
	var subs []subscriber
	for _, ch := range chans {
		for node := range 3 {
			for range 2 {
				s := subscriber{ch: ch, node: node, rec: &chaosRecord{}}
				subs = append(subs, s)
				wg.Add(1)
				go func() {
					defer wg.Done()
					chaosSubscriber(t, p.PublicKey, s.ch, func(attempt int) string { return baseOf(s.node + attempt) }, s.rec, stop, ready)
				}()
			}
		}
	}
	for range subs {
		select {
		case <-ready:
		case <-time.After(20 * time.Second):
			t.Fatal("subscribers not subscribed within 20 s")
		}
	}

	// Emitters through every node, open loop (an emit waiting for a
	// failover does not hold the next one back): about 150 emits a second.
	var (
		ackMu    sync.Mutex
		acks     []chaosAck
		ids      atomic.Int64
		refused  atomic.Int64
		emitStop = make(chan struct{})
		ewg      sync.WaitGroup
		inFlight = make(chan struct{}, 512)
		ackedOne = make(chan struct{}, 1<<16) // a token per acknowledged emit
		// Emits sent through A or B from one second after a restarted
		// victim answered /readyz until 600 more were acknowledged (the
		// window of the last restart), that failed, whenever answered.
		window  atomic.Pointer[stallWindow]
		stalled atomic.Int64
		// Emits through the victim acknowledged while it is cut off (from
		// the cut until the heal), and all emits through it meanwhile.
		cutOff             atomic.Bool
		cutAcked, cutTried atomic.Int64
	)
	// stopEmits ends the load and waits for the emits under way, once: at
	// the end of the run, or when the test fails before it.
	stopEmits := sync.OnceFunc(func() { close(emitStop); ewg.Wait() })
	t.Cleanup(stopEmits)
	// untilAcked waits for n more acknowledged emits, for within at most.
	untilAcked := func(n int, within time.Duration) int {
		for drained := false; !drained; { // tokens of earlier emits do not count
			select {
			case <-ackedOne:
			default:
				drained = true
			}
		}
		deadline := time.After(within)
		for got := 0; got < n; got++ {
			select {
			case <-ackedOne:
			case <-deadline:
				return got
			}
		}
		return n
	}
	hc := &http.Client{Timeout: 6 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	ewg.Add(1)
	go func() {
		defer ewg.Done()
		tick := time.NewTicker(time.Second / 150)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-emitStop:
				return
			case <-tick.C:
			}
			select {
			case inFlight <- struct{}{}:
			default:
				refused.Add(1) // 512 waiting already
				continue
			}
			id := ids.Add(1)
			ch := chans[rand.IntN(len(chans))]
			base := baseOf(i)
			ewg.Add(1)
			go func() {
				defer func() { <-inFlight; ewg.Done() }()
				w := window.Load()
				counted, sent := w.enter(), time.Now().UnixNano()
				if counted {
					defer w.pending.Done()
				}
				viaCutOff := cutOff.Load() && base == victim.proc.Base
				if viaCutOff {
					cutTried.Add(1)
				}
				r, err := emitAt(hc, base, p.SecretKey, ch, fmt.Sprintf(`{"id":%d}`, id))
				if viaCutOff && err == nil && r.Status == http.StatusOK {
					cutAcked.Add(1)
				}
				if err != nil || r.Status != http.StatusOK {
					refused.Add(1)
					if counted && sent >= w.from && (base == a.proc.Base || base == b.proc.Base) {
						stalled.Add(1)
						t.Logf("stalled emit %d on %s through %s, sent %v after the window opened, answered %v later: %d %s %v",
							id, ch, base, time.Duration(sent-w.from), time.Since(time.Unix(0, sent)).Round(time.Millisecond), r.Status, r.Raw, err)
					}
					return
				}
				ackMu.Lock()
				acks = append(acks, chaosAck{id: id, seq: int64(relaytest.Num(r.JSON, "seq")), ch: ch})
				ackMu.Unlock()
				select {
				case ackedOne <- struct{}{}:
				default:
				}
			}()
		}
	}()

	if n := untilAcked(300, 10*time.Second); n < 300 { // load before the fault
		t.Fatalf("%d emits acknowledged in 10 s before the fault, want 300", n)
	}
	// restartVictim starts the victim again on its address and watches the
	// emits through the survivors from one second after it is ready.
	restartVictim := func(when string) {
		victim = cl.node(t, "C", victimEnv...)
		victims = append(victims, victim)
		relaytest.Eventually(t, 10*time.Second, func() bool {
			r, err := relaytest.Do(nil, "GET", victim.proc.Base+"/readyz", "", nil)
			return err == nil && r.Status == http.StatusOK
		}, "the restarted victim ready")
		w := &stallWindow{from: time.Now().Add(time.Second).UnixNano()}
		window.Store(w)
		bases.Store("C", victim.proc.Base)
		t.Logf("victim restarted on %s %s", victimAddr, when)
		victim.waitMembers(t, 3, 20*time.Second)
		untilAcked(600, 10*time.Second) // about 4 s of load on the restarted node's channels
		w.settle(t)
	}

	switch fault {
	case outages:
		for _, o := range []struct {
			what        string
			stop, start func()
		}{{"etcd", cl.etcd.Stop, cl.etcd.Start}, {"PostgreSQL", stopDB, startDB}} {
			o.stop()
			down, before := time.Now(), refused.Load()
			acked := untilAcked(600, 10*time.Second) // about 4 s of load: with etcd's restart, past its 3 s lease
			o.start()
			failed := refused.Load() - before
			t.Logf("%s down %v: %d emits acknowledged meanwhile, %d refused or unanswered", o.what,
				time.Since(down).Round(time.Millisecond), acked, failed)
			if acked < 600 || failed > 0 {
				t.Errorf("with %s down, %d emits acknowledged in 10 s and %d refused or unanswered, want 600 and none: every node serves", o.what, acked, failed)
			}
			untilAcked(150, 10*time.Second)
			for _, n := range []*clusterNode{a, b, victim} {
				select {
				case <-n.proc.Exited:
					t.Fatalf("node %s exited during or after the %s outage:\n%s", n.name, o.what, n.proc.Logs)
				default:
				}
				if ms, err := n.members(t); err != nil || len(ms) != 3 {
					t.Errorf("node %s lists %v after the %s outage (%v), want all three", n.name, ms, o.what, err)
				}
			}
		}
	case partitioned:
		// Cut off until the others have dropped it and 600 more emits were
		// acknowledged (about 4 s of load, with the victim still taking
		// emits from its clients); healed, it finds itself dropped and leaves.
		heal := partition(t, victim.addr, []string{a.addr, b.addr}, cl.etcd.Endpoint)
		cut := time.Now()
		cutOff.Store(true)
		a.waitMembers(t, 2, 20*time.Second)
		b.waitMembers(t, 2, 20*time.Second)
		t.Logf("the others dropped the cut-off node %v after the cut", time.Since(cut).Round(time.Millisecond))
		untilAcked(600, 10*time.Second)
		select {
		case <-victim.proc.Exited: // it heard of its drop: the cut leaked
			t.Fatalf("the cut-off node left during the cut (exit %d):\n%s", victim.proc.Cmd.ProcessState.ExitCode(), victim.proc.Logs)
		default:
		}
		cutOff.Store(false)
		heal()
		healed := time.Now()
		t.Logf("healed %v after the cut; through the cut-off node meanwhile, %d of %d emits acknowledged",
			healed.Sub(cut).Round(time.Millisecond), cutAcked.Load(), cutTried.Load())
		if cutAcked.Load() == 0 {
			t.Error("the cut-off node acknowledged no emit during the cut: it should serve its clients on its own channels")
		}
		code := victim.waitExit(t, 20*time.Second)
		t.Logf("the cut-off node left %v after the heal (exit %d)", time.Since(healed).Round(time.Millisecond), code)
		if code != 1 || !strings.Contains(victim.proc.Logs.String(), "cluster membership lost") {
			t.Errorf("the cut-off node exited %d, want 1 after it logged that its membership was lost:\n%s", code, victim.proc.Logs)
		}
		bases.Store("C", "") // its subscribers resume on the others
	case crashAndFreeze:
		// kill -9 of the channels' owner, restarted on the same address at
		// once, as a supervisor does (its previous life is still a member).
		if err := syscall.Kill(victim.pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		bases.Store("C", "")
		<-victim.proc.Exited
		restartVictim("at once")

		// SIGSTOP of the owner until the others drop it (its etcd lease, 3 s,
		// runs out): they take its channels over, and it leaves once it runs
		// again.
		if err := syscall.Kill(victim.pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		bases.Store("C", "")
		frozen := time.Now()
		a.waitMembers(t, 2, 20*time.Second)
		b.waitMembers(t, 2, 20*time.Second)
		if err := syscall.Kill(victim.pid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		t.Logf("the victim was frozen %v, until the others dropped it", time.Since(frozen).Round(time.Millisecond))
		select {
		case <-victim.proc.Exited:
			t.Logf("the frozen node left after it resumed (exit %d)", victim.proc.Cmd.ProcessState.ExitCode())
		case <-time.After(20 * time.Second):
			t.Fatal("the frozen node did not leave within 20 s of resuming")
		}
		// Restarted once the others dropped it (and its peers may still be
		// sending to its address).
		restartVictim("after it was dropped")
	}
	if n := untilAcked(300, 10*time.Second); n < 300 { // load after the faults
		t.Errorf("%d emits acknowledged in 10 s after the faults, want 300", n)
	}
	stopEmits()
	// The last deliveries and reconnects: every subscriber has reached the
	// last acknowledged seq of its channel (or the checker says what it lacks).
	lastAcked := map[string]int64{}
	for _, ack := range acks {
		lastAcked[ack.ch] = max(lastAcked[ack.ch], ack.seq)
	}
	caughtUp := func() bool {
		for _, s := range subs {
			s.rec.mu.Lock()
			last := s.rec.last
			s.rec.mu.Unlock()
			if last < lastAcked[s.ch] {
				return false
			}
		}
		return true
	}
	if !relaytest.Within(10*time.Second, caughtUp) {
		t.Error("not every subscriber reached its channel's last acknowledged seq within 10 s")
	}
	close(stop)
	wg.Wait()

	// The checker.
	bySeq := map[string]map[int64]int64{} // channel → seq → id, of acknowledged emits
	seqOf := map[int64]int64{}            // id → seq it was acknowledged with
	for _, ack := range acks {
		if bySeq[ack.ch] == nil {
			bySeq[ack.ch] = map[int64]int64{}
		}
		if prev, dup := bySeq[ack.ch][ack.seq]; dup {
			t.Errorf("seq conflict: %s seq %d acknowledged for ids %d and %d", ack.ch, ack.seq, prev, ack.id)
		}
		bySeq[ack.ch][ack.seq] = ack.id
		seqOf[ack.id] = ack.seq
	}
	var lost, gaps, delivered, reported int
	for i, s := range subs {
		s.rec.mu.Lock()
		events := s.rec.events
		s.rec.mu.Unlock()
		got := map[int64]bool{}
		ids := map[int64]int64{}
		var covered [][2]int64 // (since, next seq) of each gap
		var prev int64
		for k, e := range events {
			if e.gap {
				gaps++
				next := int64(1 << 62)
				for _, f := range events[k+1:] {
					if !f.gap {
						next = f.seq
						break
					}
				}
				covered = append(covered, [2]int64{e.since, next})
				continue
			}
			delivered++
			if e.seq <= prev {
				if reported < 20 {
					t.Errorf("subscriber %d (%s, node %d): seq %d after %d (a duplicate or out of order)", i, s.ch, s.node, e.seq, prev)
				}
				reported++
			}
			prev = max(prev, e.seq)
			got[e.seq] = true
			if other, twice := ids[e.id]; twice && other != e.seq {
				t.Errorf("subscriber %d (%s): id %d stamped twice, seq %d and %d", i, s.ch, e.id, other, e.seq)
			}
			ids[e.id] = e.seq
			if acked, ok := seqOf[e.id]; ok && acked != e.seq {
				t.Errorf("subscriber %d (%s): id %d arrived with seq %d, acknowledged with %d", i, s.ch, e.id, e.seq, acked)
			}
		}
		for seq, id := range bySeq[s.ch] {
			if got[seq] || slices.ContainsFunc(covered, func(c [2]int64) bool { return c[0] < seq && seq < c[1] }) {
				continue
			}
			lost++
			if reported < 20 {
				t.Errorf("subscriber %d (%s, node %d): acknowledged id %d (seq %d) silently lost", i, s.ch, s.node, id, seq)
			}
			reported++
		}
	}
	t.Logf("%d emits acknowledged, %d refused or unanswered; %d subscribers: %d deliveries, %d replay_gaps, %d silently lost",
		len(acks), refused.Load(), len(subs), delivered, gaps, lost)
	if os.Getenv("CHAOS_LOGS") != "" { // a directory for every node's log, to look into a failure
		for i, n := range append([]*clusterNode{a, b}, victims...) {
			os.WriteFile(fmt.Sprintf("%s/%d-%s.log", os.Getenv("CHAOS_LOGS"), i, n.name), []byte(n.proc.Logs.String()), 0o644)
		}
	}
	if n := stalled.Load(); n > 0 { // issue 28: a restart on the same address does not stall
		t.Errorf("%d emits through the survivors failed from 1 s after the restarted node answered /readyz", n)
		for i, node := range append([]*clusterNode{a, b}, victims...) { // what the nodes said of it
			for _, line := range strings.Split(node.proc.Logs.String(), "\n") {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
					t.Logf("%s (life %d): %s", node.name, i, line)
				}
			}
		}
	}
	if len(acks) < 500 {
		t.Errorf("only %d emits acknowledged: the load did not run", len(acks))
	}
	if (history || fault == outages) && gaps > 0 {
		t.Errorf("%d replay_gaps (history %v, fault %d), want none", gaps, history, fault)
	}
	// With history, seq goes on from the stored last one after a crash: no
	// jump to the clock. It skips at most the emits that failed after they
	// were stamped (503: stored or not, never delivered).
	if history {
		for ch, seqs := range bySeq {
			sorted := slices.Sorted(maps.Keys(seqs))
			var widest int64
			for i := 1; i < len(sorted); i++ {
				widest = max(widest, sorted[i]-sorted[i-1])
			}
			t.Logf("%s: %d acknowledged seqs, widest step %d", ch, len(sorted), widest)
			if widest > 1+refused.Load() {
				t.Errorf("%s: seq jumped by %d (%d emits failed in all)", ch, widest, refused.Load())
			}
		}
	}
}

// A node started on the cluster address of a live member waits for that
// registration to lapse, as after a crash, and gives up with an error that
// names the address: two nodes configured with one address.
func TestClusterAddressTaken(t *testing.T) {
	t.Parallel() // checks what happens, not how fast: see doc.go
	addr := relaytest.FreeAddr(t)
	cl := startCluster(t, 30*time.Second, []string{"A"}, "RELAY_CLUSTER_ADDR="+addr)
	code, out := relaytest.RunBinary(t, 30*time.Second, append(cl.nodeEnv(t, addr), "DATABASE_URL="+cl.dbURL, "RELAY_CLUSTER_NAME=relaytest")...)
	if code == 0 || !strings.Contains(out, "another member is registered at "+addr) || !strings.Contains(out, "two nodes with one RELAY_CLUSTER_ADDR?") {
		t.Fatalf("a second node on %s: exit %d, output:\n%s", addr, code, out)
	}
	cl.nodes[0].waitMembers(t, 1, 5*time.Second) // A was left alone
}
