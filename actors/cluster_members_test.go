package actors

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	gproto "google.golang.org/protobuf/proto"
)

// Two members of a cluster in one process, each its own actor system, with
// no remote: what one sends to the other's address is copied as the remote
// would serialize it (a message that is not protobuf fails the test) and
// handed to the other system's actor. Grains are started on their owner
// through the placement's local lookup. Under -race, on the real clock:
// the dead letters a cluster makes as grains move (a watch ended on an
// actor that stopped) start protoactor's log throttle, whose goroutine
// would outlive a testing/synctest bubble.

// member is one of the two.
type member struct {
	c      *Cluster
	addr   string
	down   atomic.Bool // crashed: nothing reaches it or leaves it
	grains startedGrains

	mu      sync.Mutex
	watched map[string]watch // watches of this member's actors by the other's, by watchee and watcher
}

// watch is one actor of the other member watching one of this member's.
type watch struct{ watchee, watcher *actor.PID }

// crash stops m answering, as a kill -9 would, and tells the other member's
// watchers of m's actors that they ended, as protoactor's remote does when
// its connection to a member breaks.
func (m *member) crash(other *member) {
	m.down.Store(true)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.watched {
		if p, ok := other.c.sys.as.ProcessRegistry.GetLocal(w.watcher.Id); ok {
			p.SendSystemMessage(w.watcher, &actor.Terminated{Who: w.watchee, Why: actor.TerminatedReason_AddressTerminated})
		}
	}
}

// twoMembers starts members 127.0.0.1:1 and :2, joined long ago, each
// hosting both kinds of grain.
func twoMembers(t *testing.T, cfg Config) (a, b *member) {
	t.Helper()
	ms := make([]*member, 2)
	for i := range ms {
		sys := newTestSystem(t, cfg)
		addr := fmt.Sprintf("127.0.0.1:%d", i+1)
		sys.as.ProcessRegistry.Address = addr
		c, err := sys.newCluster(ClusterConfig{Name: "t", Addr: addr, AckTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = &member{c: c, addr: addr, watched: map[string]watch{}}
	}
	kinds := []string{ChannelKind, ProjectKind}
	top := &pcluster.ClusterTopology{}
	for i, m := range ms {
		top.Members = append(top.Members, &pcluster.Member{Id: m.c.self, Host: "127.0.0.1", Port: int32(i + 1), Kinds: kinds})
	}
	for i, m := range ms {
		other := ms[1-i]
		m.c.topology(top)
		m.c.moves.joinedAt.Store(time.Now().Add(-time.Hour).UnixNano())
		m.c.place = &placement{c: m.c, local: func(kind, identity string) *actor.PID {
			owner := m
			if m.c.ownerAddress(kind, identity) == other.addr {
				owner = other
			}
			if owner.down.Load() {
				return nil // the owner asked does not answer: the lookup is tried again
			}
			pid := owner.grain(kind, identity)
			return actor.NewPID(pid.Address, pid.Id) // this member's own PID value
		}}
		m.c.sys.as.ProcessRegistry.RegisterAddressResolver(func(to *actor.PID) (actor.Process, bool) {
			if to.Address != other.addr {
				return nil, false
			}
			return crossing{t: t, from: m, to: other}, true
		})
		m.c.sys.cluster.Store(m.c)
	}
	return ms[0], ms[1]
}

// hosts tells whether m started the grain of kind and identity.
func (m *member) hosts(kind, identity string) bool { return m.grains.has(kind, identity) }

// grain starts the grain of kind and identity here on first use.
func (m *member) grain(kind, identity string) *actor.PID {
	return m.grains.get(kind, identity, func() *actor.PID {
		if kind == ProjectKind {
			return startProjectGrain(m.c, identity)
		}
		return startGrain(m.c, identity)
	})
}

// crossing is the other member's actors as this one reaches them: each
// message is copied, as the remote's serialization would, with fresh PIDs.
type crossing struct {
	t        *testing.T
	from, to *member
}

// local is the actor pid names on the other member; nothing while either
// member is down (the message is lost, as on a dead connection).
func (x crossing) local(pid *actor.PID) actor.Process {
	to := x.to.c.sys.as
	if x.from.down.Load() || x.to.down.Load() {
		return lost{}
	}
	p, ok := to.ProcessRegistry.GetLocal(pid.Id)
	if !ok {
		return gone{from: x.from}
	}
	return p
}

// gone is an actor of the other member that has stopped: a watch is
// answered Terminated, as protoactor's remote answers it, and the rest is
// dropped, as the remote drops what it cannot deliver.
type gone struct{ from *member }

func (g gone) SendUserMessage(*actor.PID, any) {}
func (g gone) SendSystemMessage(pid *actor.PID, msg any) {
	if w, ok := msg.(*actor.Watch); ok {
		g.from.c.sys.root.Send(w.Watcher, &actor.Terminated{Who: actor.NewPID(pid.Address, pid.Id), Why: actor.TerminatedReason_NotFound})
	}
}
func (g gone) Stop(*actor.PID) {}

func (x crossing) copied(msg any) any {
	if env, ok := msg.(*actor.MessageEnvelope); ok {
		out := &actor.MessageEnvelope{Header: env.Header, Message: x.copied(env.Message)}
		if env.Sender != nil {
			out.Sender = actor.NewPID(env.Sender.Address, env.Sender.Id)
		}
		return out
	}
	m, ok := msg.(gproto.Message)
	if !ok {
		x.t.Errorf("a %T crossed members: only protobuf messages can", msg)
		return msg
	}
	return gproto.Clone(m)
}

// lost drops what is sent to or from a member that is down.
type lost struct{}

func (lost) SendUserMessage(*actor.PID, any)   {}
func (lost) SendSystemMessage(*actor.PID, any) {}
func (lost) Stop(*actor.PID)                   {}

func (x crossing) SendUserMessage(pid *actor.PID, msg any) {
	x.local(pid).SendUserMessage(actor.NewPID(pid.Address, pid.Id), x.copied(msg))
}

func (x crossing) SendSystemMessage(pid *actor.PID, msg any) {
	x.to.mu.Lock()
	switch m := msg.(type) {
	case *actor.Watch:
		x.to.watched[pid.Id+" "+m.Watcher.Id] = watch{actor.NewPID(pid.Address, pid.Id), actor.NewPID(m.Watcher.Address, m.Watcher.Id)}
	case *actor.Unwatch:
		delete(x.to.watched, pid.Id+" "+m.Watcher.Id)
	}
	x.to.mu.Unlock()
	x.local(pid).SendSystemMessage(actor.NewPID(pid.Address, pid.Id), x.copied(msg))
}

func (x crossing) Stop(pid *actor.PID) { x.local(pid).Stop(actor.NewPID(pid.Address, pid.Id)) }

// quiet fails when k has other than n messages after a while: a
// duplicate, or a late copy. Time by nature: a silence is checked over a
// time.
func quiet(t *testing.T, k *sink, n int) {
	t.Helper()
	<-time.After(200 * time.Millisecond)
	if msgs := k.messages(t); len(msgs) != n {
		t.Fatalf("socket %d got %d messages, want %d: %v", k.id, len(msgs), n, msgs)
	}
}

// ownedProjectChannel is a project whose project grain and a channel of it whose grain
// m owns.
func (m *member) ownedProjectChannel(t *testing.T) (project, channel string) {
	t.Helper()
	for i := range 1000 {
		p := fmt.Sprintf("proj-%d", i)
		if m.c.ownerAddress(ProjectKind, p) != m.addr {
			continue
		}
		for j := range 1000 {
			ch := fmt.Sprintf("ch-%d", j)
			if m.c.ownerAddress(ChannelKind, p+"/"+ch) == m.addr {
				return p, ch
			}
		}
	}
	t.Fatal("no project and channel owned by " + m.addr)
	return "", ""
}

// An emit through one member on a channel the other owns: the grain there
// stamps it and both members' subscribers get it once, with the seq the
// emit reports; the project's grain there counts it.
func TestTwoMembersEmitAcross(t *testing.T) {
	a, b := twoMembers(t, Config{ProjectRatePerMinute: 400})
	project, channel := b.ownedProjectChannel(t)
	onA := subscribeOne(t, a.c.sys, project, channel, 1)
	onB := subscribeOne(t, b.c.sys, project, channel, 2)

	res := publishOK(t, a.c.sys, project, channel, []byte(`{"n":1}`))
	if res.Seq == 0 || res.Subscribers != 2 || res.Delivered != 2 || res.Project.Limit != 400 {
		t.Fatalf("emit through A: %+v; want seq, 2 subscribers, 2 delivered, the project's backstop", res)
	}
	waitFor(t, "the message on both sockets", func() bool { return len(onA.messages(t)) == 2 && len(onB.messages(t)) == 2 })
	for _, k := range []*sink{onA, onB} {
		quiet(t, k, 2)
		msgs := k.messages(t)
		if len(msgs) != 2 || msgs[1]["seq"] != float64(res.Seq) || fmt.Sprint(msgs[1]["payload"]) != "map[n:1]" {
			t.Fatalf("socket %d got %v, want the ack and the message at seq %d", k.id, msgs, res.Seq)
		}
	}
	if !b.hosts(ChannelKind, project+"/"+channel) || !b.hosts(ProjectKind, project) || a.hosts(ChannelKind, project+"/"+channel) {
		t.Fatal("want the project's grains on B, none on A")
	}
}

// The member that owns a channel crashes with an emit in flight: the other
// member's relay sends it again once it has dropped the crashed member from
// its list, to the grain that now starts on the survivor. The emit is
// answered, stamped once, above what the subscriber had; the subscriber on
// the survivor gets a replay_gap for what the dead grain may have stamped,
// then the emit, once.
func TestTwoMembersOwnerCrashes(t *testing.T) {
	a, b := twoMembers(t, Config{ProjectRatePerMinute: 400})
	project, channel := b.ownedProjectChannel(t)
	onA := subscribeOne(t, a.c.sys, project, channel, 1)
	first := publishOK(t, a.c.sys, project, channel, []byte(`{"n":1}`))

	b.crash(a)
	type result struct {
		res PublishResult
		err error
	}
	second := make(chan result, 1)
	go func() {
		res, err := a.c.sys.PublishWithin(context.Background(), 5*time.Second, project, channel, []byte(`{"n":2}`))
		second <- result{res, err}
	}()
	select { // unanswered, sent again every publishRetryAfter
	case r := <-second:
		t.Fatalf("an emit was answered while the channel's owner was down and still listed: %+v", r)
	case <-time.After(time.Second):
	}
	a.c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{
		{Id: a.c.self, Host: "127.0.0.1", Port: 1, Kinds: []string{ChannelKind, ProjectKind}}}})
	r := <-second
	if r.err != nil || r.res.Err != nil || r.res.Seq <= first.Seq {
		t.Fatalf("the emit in flight: %+v, %v; want answered above seq %d", r.res, r.err, first.Seq)
	}
	waitFor(t, "the emit on A's socket", func() bool { return len(onA.messages(t)) == 4 })
	quiet(t, onA, 4)
	// The new grain cannot know whether the dead one stamped more after
	// the last seq the subscriber had: a replay_gap from there, then the
	// emit, once.
	got := onA.messages(t)[1:]
	want := fmt.Sprint([]map[string]any{
		{"channel": channel, "payload": map[string]any{"n": 1.0}, "seq": float64(first.Seq)},
		{"channel": channel, "type": "replay_gap", "since": float64(first.Seq)},
		{"channel": channel, "payload": map[string]any{"n": 2.0}, "seq": float64(r.res.Seq)},
	})
	if fmt.Sprint(got) != want {
		t.Fatalf("the subscriber on A got %v, want %v", got, want)
	}
	if !a.hosts(ChannelKind, project+"/"+channel) {
		t.Fatal("no channel grain started on the survivor")
	}
}

// bothTopology and onlyTopology are member lists of a and b, and of m alone.
func bothTopology(a, b *member) *pcluster.ClusterTopology {
	kinds := []string{ChannelKind, ProjectKind}
	return &pcluster.ClusterTopology{Members: []*pcluster.Member{
		{Id: a.c.self, Host: "127.0.0.1", Port: 1, Kinds: kinds}, {Id: b.c.self, Host: "127.0.0.1", Port: 2, Kinds: kinds}}}
}

func onlyTopology(m *member, port int32) *pcluster.ClusterTopology {
	return &pcluster.ClusterTopology{Members: []*pcluster.Member{{Id: m.c.self, Host: "127.0.0.1", Port: port, Kinds: []string{ChannelKind, ProjectKind}}}}
}

// A member joins and becomes a channel's owner: the old owner hands the
// grain's state over (moveOut, handOver), the new grain waits for it, and
// seq goes on from the old ring, so the subscriber gets every message once,
// with no replay_gap, and a since from before the join replays from the
// handed ring.
func TestTwoMembersJoinHandsTheChannelOver(t *testing.T) {
	a, b := twoMembers(t, Config{})
	project, channel := b.ownedProjectChannel(t) // B's once it is a member
	a.c.topology(onlyTopology(a, 1))             // before B joined: A alone owns everything
	onA := subscribeOne(t, a.c.sys, project, channel, 1)
	var seqs []uint64
	emit := func(n int) {
		seqs = append(seqs, publishOK(t, a.c.sys, project, channel, fmt.Appendf(nil, `{"n":%d}`, n)).Seq)
	}
	emit(1)
	emit(2)
	if !a.hosts(ChannelKind, project+"/"+channel) {
		t.Fatal("the channel's grain is not on A before the join")
	}

	b.c.moves.joinedAt.Store(time.Now().UnixNano()) // B has just joined
	a.c.topology(bothTopology(a, b))
	emit(3)
	emit(4)
	if !b.hosts(ChannelKind, project+"/"+channel) {
		t.Fatal("the channel's grain did not move to B")
	}
	waitFor(t, "4 messages on A's socket", func() bool { return len(onA.messages(t)) == 5 })
	quiet(t, onA, 5)
	var got []string
	for _, m := range onA.messages(t)[1:] {
		got = append(got, fmt.Sprint(m["type"], m["seq"]))
	}
	var want []string
	for _, s := range seqs {
		want = append(want, fmt.Sprint(nil, float64(s)))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || seqs[2] != seqs[1]+1 {
		t.Fatalf("the subscriber on A got %v, want %v: every message once, no gap, seq going on from the old ring", got, want)
	}

	// A socket on B resuming from the first message: replayed from the
	// ring B's grain took over (before the ack), without a gap.
	k := &sink{id: 2}
	openConn(b.c.sys, project, k).HandleMessage(fmt.Appendf(nil, `{"action":"subscribe","channel":%q,"since":%d}`, channel, seqs[0]))
	waitFor(t, "the replay and the ack", func() bool { return len(k.messages(t)) == 4 })
	quiet(t, k, 4)
	var replayed []string
	for _, m := range k.messages(t) {
		replayed = append(replayed, fmt.Sprint(m["type"], m["seq"], m["replay"], m["ok"]))
	}
	wantReplay := []string{}
	for _, s := range seqs[1:] {
		wantReplay = append(wantReplay, fmt.Sprint(nil, float64(s), true, nil))
	}
	wantReplay = append(wantReplay, fmt.Sprint(nil, nil, nil, true))
	if fmt.Sprint(replayed) != fmt.Sprint(wantReplay) {
		t.Fatalf("a since=%d on B got %v, want seqs %v replayed, then the ack", seqs[0], k.messages(t), seqs[1:])
	}
}

// One clientId's client-emit window (rule 6) is the cluster's: its project
// grain, on the other member, counts the emits of both members' sockets,
// and each socket gets its answers in the order it emitted.
func TestTwoMembersClientEmitsShareOneWindow(t *testing.T) {
	now := time.Now()
	const secret = "0123456789abcdef0123456789abcdef"
	a, b := twoMembers(t, Config{
		ClientEmitRatePerSecond: 3,
		Now:                     func() time.Time { return now }, // one 1-second window throughout
		LoadSettings:            func(context.Context, string) (Settings, error) { return Settings{ClientEmitSecret: secret}, nil },
	})
	project, channel := b.ownedProjectChannel(t)
	tok := mintForTest(t, secret, project, channel, "ann", now)
	var socks []*Session
	var sinks []*sink
	for i, m := range []*member{a, b} {
		k := &sink{id: uint64(i + 1)}
		sess := openConn(m.c.sys, project, k)
		sess.HandleMessage(fmt.Appendf(nil, `{"action":"subscribe","channel":%q,"presence":true,"clientId":"ann"}`, channel))
		waitFor(t, "subscribe ack", func() bool { return len(k.messages(t)) >= 2 }) // the ack and the sync
		socks, sinks = append(socks, sess), append(sinks, k)
	}
	for i := range 6 { // A, B, A, B, A, B
		socks[i%2].HandleMessage(fmt.Appendf(nil, `{"action":"emit","channel":%q,"type":"msg","payload":%d,"token":%q}`, channel, i, tok))
	}
	answers := func(k *sink) []string {
		var out []string
		for _, m := range k.messages(t) {
			switch {
			case m["action"] == "emit" && m["ok"] == true:
				out = append(out, fmt.Sprint("ack ", m["payload"]))
			case m["error"] != nil:
				out = append(out, fmt.Sprint(m["error"]))
			}
		}
		return out
	}
	waitFor(t, "every answer", func() bool { return len(answers(sinks[0])) == 3 && len(answers(sinks[1])) == 3 })
	acks := 0
	for _, k := range sinks {
		got := answers(k)
		for i, ans := range got {
			switch {
			case strings.HasPrefix(ans, "ack "):
				acks++
				if i > 0 && got[i-1] == "client_emit_rate_limited" {
					t.Errorf("socket %d: %v; an emit accepted after a refused one in one window", k.id, got)
				}
			case ans != "client_emit_rate_limited":
				t.Errorf("socket %d: %v; want acks and client_emit_rate_limited only", k.id, got)
			}
		}
	}
	if acks != 3 {
		t.Fatalf("%d of 6 emits of one clientId through two members accepted in one window, want 3: A %v, B %v",
			acks, answers(sinks[0]), answers(sinks[1]))
	}
	if !b.hosts(ProjectKind, project) || a.hosts(ProjectKind, project) {
		t.Fatal("want the project grain on B only")
	}
}

// A member stops gracefully: it hands its grains to the other before it
// goes, so the channel's next grain there goes on from the handed ring,
// and the subscriber gets every message once, with no replay_gap.
func TestTwoMembersGracefulLeave(t *testing.T) {
	a, b := twoMembers(t, Config{})
	project, channel := b.ownedProjectChannel(t)
	onA := subscribeOne(t, a.c.sys, project, channel, 1)
	var seqs []uint64
	emit := func(n int) {
		seqs = append(seqs, publishOK(t, a.c.sys, project, channel, fmt.Appendf(nil, `{"n":%d}`, n)).Seq)
	}
	emit(1)
	emit(2)

	b.c.deregistered.Store(true) // no etcd here to leave
	st, err := b.c.HandOff(context.Background())
	if err != nil || st.Grains != 1 || st.Failed != 0 || st.Members != 1 {
		t.Fatalf("B's handoff: %+v, %v; want its one channel grain handed to A", st, err)
	}
	a.c.topology(onlyTopology(a, 1)) // B is gone from the member list
	emit(3)
	if !a.hosts(ChannelKind, project+"/"+channel) || seqs[2] != seqs[1]+1 {
		t.Fatalf("seqs %v: want the channel's grain on A, going on from B's ring", seqs)
	}
	waitFor(t, "3 messages on A's socket", func() bool { return len(onA.messages(t)) == 4 })
	quiet(t, onA, 4)
	for i, m := range onA.messages(t)[1:] {
		if m["type"] != nil || m["seq"] != float64(seqs[i]) {
			t.Fatalf("the subscriber on A got %v, want seqs %v and no gap", onA.messages(t)[1:], seqs)
		}
	}
}

// pausedOwner makes m a member that was just paused longer than pauseLimit
// (SIGSTOP, a stalled VM): its pulse runs, its fence is up, and it asks
// etcd for its registration, which answers rev from the time the test calls
// answer on (every later check too: a pulse late again under load finds the
// same answer).
func (m *member) pausedOwner(t *testing.T) (answer func(rev int64)) {
	var rev atomic.Int64
	answered := make(chan struct{})
	m.c.fence.registration = func(ctx context.Context) (int64, error) {
		select {
		case <-answered:
			return rev.Load(), nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	m.c.fence.rev = 7
	m.c.fence.start = time.Now()
	m.c.fence.fenced.Store(true) // what the pulse does on a late beat
	go m.c.pulse()
	go m.c.liftFence()
	t.Cleanup(func() { close(m.c.stop) })
	return func(r int64) { rev.Store(r); close(answered) }
}

// unanswered fails if the emit of res is answered within d.
func unanswered[T any](t *testing.T, res <-chan T, d time.Duration, what string) {
	t.Helper()
	select {
	case r := <-res:
		t.Fatalf("%s: answered %+v", what, r)
	case <-time.After(d):
	}
}

type publishAnswer struct {
	res PublishResult
	err error
}

// publishLater emits payload through sys, answered on the channel returned.
func publishLater(sys *System, project, channel string, payload []byte) <-chan publishAnswer {
	out := make(chan publishAnswer, 1)
	go func() {
		res, err := sys.PublishWithin(context.Background(), 10*time.Second, project, channel, payload)
		out <- publishAnswer{res, err}
	}()
	return out
}

// The owner of a channel wakes from a pause fenced: until etcd confirms its
// registration is the one it made at join, its grain stamps nothing, and
// the other member's relay sends the emit again. Once confirmed, the grain
// stamps it, once, next after what it had: no gap for the subscriber.
func TestTwoMembersFencedOwnerStampsAfterConfirmation(t *testing.T) {
	a, b := twoMembers(t, Config{ProjectRatePerMinute: 400})
	project, channel := b.ownedProjectChannel(t)
	onA := subscribeOne(t, a.c.sys, project, channel, 1)
	first := publishOK(t, a.c.sys, project, channel, []byte(`{"n":1}`))

	etcdAnswers := b.pausedOwner(t)
	second := publishLater(a.c.sys, project, channel, []byte(`{"n":2}`))
	unanswered(t, second, time.Second, "an emit to a fenced owner")
	if got := onA.messages(t); len(got) != 2 {
		t.Fatalf("the subscriber got %v while the owner was fenced, want the ack and the first emit only", got)
	}
	etcdAnswers(7) // the registration of the join, still
	r := <-second
	if r.err != nil || r.res.Err != nil || r.res.Seq != first.Seq+1 {
		t.Fatalf("the emit after the fence lifted: %+v, %v; want seq %d", r.res, r.err, first.Seq+1)
	}
	waitFor(t, "the emit on A's socket", func() bool { return len(onA.messages(t)) == 3 })
	quiet(t, onA, 3)
	if m := onA.messages(t)[2]; m["type"] != nil || m["seq"] != float64(r.res.Seq) {
		t.Fatalf("the subscriber got %v, want the emit at seq %d and no gap", m, r.res.Seq)
	}
	if !b.hosts(ChannelKind, project+"/"+channel) || a.hosts(ChannelKind, project+"/"+channel) {
		t.Fatal("want the channel's grain on B still, none on A")
	}
}

// The owner wakes fenced and etcd says it was dropped during the pause (its
// key is another's now): it reports the membership lost and its grain
// stamps nothing for good. The emit waits until the other member's list
// drops it, then the grain started there stamps it above what the
// subscriber had, after an honest replay_gap.
func TestTwoMembersDroppedOwnerStaysFenced(t *testing.T) {
	a, b := twoMembers(t, Config{ProjectRatePerMinute: 400})
	project, channel := b.ownedProjectChannel(t)
	onA := subscribeOne(t, a.c.sys, project, channel, 1)
	first := publishOK(t, a.c.sys, project, channel, []byte(`{"n":1}`))

	b.pausedOwner(t)(8) // etcd: another registration under this node's name
	select {
	case err := <-b.c.Lost():
		if err == nil {
			t.Fatal("Lost delivered no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a member dropped during its pause did not report the membership lost")
	}
	second := publishLater(a.c.sys, project, channel, []byte(`{"n":2}`))
	unanswered(t, second, time.Second, "an emit to an owner dropped while paused")
	if !b.c.fenced() {
		t.Fatal("the dropped member's fence came down")
	}
	a.c.topology(onlyTopology(a, 1)) // the others dropped B
	r := <-second
	if r.err != nil || r.res.Err != nil || r.res.Seq <= first.Seq {
		t.Fatalf("the emit once B was dropped: %+v, %v; want answered above seq %d", r.res, r.err, first.Seq)
	}
	waitFor(t, "the gap and the emit on A's socket", func() bool { return len(onA.messages(t)) == 4 })
	quiet(t, onA, 4)
	want := fmt.Sprint([]map[string]any{
		{"channel": channel, "type": "replay_gap", "since": float64(first.Seq)},
		{"channel": channel, "payload": map[string]any{"n": 2.0}, "seq": float64(r.res.Seq)},
	})
	if got := fmt.Sprint(onA.messages(t)[2:]); got != want {
		t.Fatalf("the subscriber on A got %v, want %v", got, want)
	}
}
