package actors

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	protobuf "google.golang.org/protobuf/proto"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/proto/clusterpb"
)

// The cluster's own logic without a cluster: the node actor, the broadcast
// with its bound and counters, and the membership checks. No remote is
// started, so these run with -race; cmd/relay's cluster tests (make
// test-cluster) run real nodes over etcd.

func newTestCluster(t *testing.T, sys *System, changed func(string)) *Cluster {
	t.Helper()
	c, err := sys.newCluster(ClusterConfig{Name: "t", Addr: "127.0.0.1:1", AckTimeout: 300 * time.Millisecond, RemoteChange: changed})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A change reaches a node actor, is applied to that node's running project
// (a revoked key closes its sockets), the key-cache hook runs, and it is acked.
func TestNodeActorAppliesAndAcks(t *testing.T) {
	sys := newTestSystem(t, Config{})
	var mu sync.Mutex
	var changed []string
	c := newTestCluster(t, sys, func(id string) { mu.Lock(); changed = append(changed, id); mu.Unlock() })
	k := subscribeOne(t, sys, "p", "room", 1) // opened with "pk-hash"

	b := &clusterpb.Broadcast{Change: &clusterpb.Broadcast_KeysRevoked{KeysRevoked: &clusterpb.KeysRevoked{KeyHashes: []string{"pk-hash"}}}}
	if n, _ := c.broadcastTo([]*actor.PID{c.node}, "p", b, nil); n != 1 {
		t.Fatalf("acked by %d, want 1", n)
	}
	waitFor(t, "close 4001", func() bool { return k.closed.Load() == int32(proto.CloseKeyRevoked) })
	mu.Lock()
	if len(changed) != 1 || changed[0] != "p" {
		t.Errorf("hook called with %q", changed)
	}
	mu.Unlock()
	st := c.Stats()
	if st.BroadcastsSent != 1 || st.BroadcastsAcked != 1 || st.BroadcastsTimedOut != 0 || st.BroadcastsReceived != 1 {
		t.Errorf("stats %+v", st)
	}

	c.broadcastTo([]*actor.PID{c.node}, "p", &clusterpb.Broadcast{Change: &clusterpb.Broadcast_ProjectDeleted{ProjectDeleted: &clusterpb.ProjectDeleted{}}}, nil)
	k2 := subscribeOne(t, sys, "q", "room", 2)
	c.broadcastTo([]*actor.PID{c.node}, "q", &clusterpb.Broadcast{Change: &clusterpb.Broadcast_ProjectDeleted{ProjectDeleted: &clusterpb.ProjectDeleted{}}}, nil)
	waitFor(t, "close 4004", func() bool { return k2.closed.Load() == int32(proto.CloseProjectDeleted) })
	// A change of a kind this version does not know (a newer member's) is acked, not applied.
	if n, _ := c.broadcastTo([]*actor.PID{c.node}, "q", &clusterpb.Broadcast{}, nil); n != 1 {
		t.Errorf("an unknown change: acked by %d", n)
	}
}

// A member without a node actor answers at once (dead letter) and one that
// never answers is given up after the bound; both are counted as timed out.
func TestBroadcastBound(t *testing.T) {
	sys := newTestSystem(t, Config{})
	c := newTestCluster(t, sys, nil)
	silent := sys.root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	gone := sys.as.NewLocalPID("no-such-actor")

	began := time.Now()
	n, _ := c.broadcastTo([]*actor.PID{gone}, "p", &clusterpb.Broadcast{Change: &clusterpb.Broadcast_SettingsChanged{SettingsChanged: &clusterpb.SettingsChanged{}}}, nil)
	if took := time.Since(began); n != 0 || took > 200*time.Millisecond {
		t.Errorf("a member without a node actor: %d acks after %v", n, took)
	}
	began = time.Now()
	n, _ = c.broadcastTo([]*actor.PID{c.node, silent}, "p", &clusterpb.Broadcast{Change: &clusterpb.Broadcast_SettingsChanged{SettingsChanged: &clusterpb.SettingsChanged{}}}, nil)
	took := time.Since(began)
	if n != 1 || took < 300*time.Millisecond || took > time.Second {
		t.Errorf("one silent member of two: %d acks after %v, want 1 after the 300 ms bound", n, took)
	}
	if st := c.Stats(); st.BroadcastsSent != 3 || st.BroadcastsAcked != 1 || st.BroadcastsTimedOut != 2 {
		t.Errorf("stats %+v", st)
	}
}

// Token revocations keep their times across the wire.
func TestRevocationsCrossIntact(t *testing.T) {
	at := time.Date(2026, 11, 23, 10, 0, 0, 123456789, time.UTC)
	revs := []Revocation{{Kind: RevokeJTI, Value: "j", RevokedAt: at, ExpiresAt: at.Add(11 * time.Minute)},
		{Kind: RevokeClient, Value: "c", RevokedAt: at, ExpiresAt: at.Add(time.Minute)}}
	b, err := protobuf.Marshal(&clusterpb.TokensRevoked{Revocations: revocationsToProto(revs)})
	if err != nil {
		t.Fatal(err)
	}
	var back clusterpb.TokensRevoked
	if err := protobuf.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got := revocationsFromProto(back.Revocations)
	for i := range revs {
		if got[i].Kind != revs[i].Kind || got[i].Value != revs[i].Value || !got[i].RevokedAt.Equal(revs[i].RevokedAt) || !got[i].ExpiresAt.Equal(revs[i].ExpiresAt) {
			t.Errorf("%+v came back as %+v", revs[i], got[i])
		}
	}
}

// With a cluster, every control-plane method of System sends its change to
// the other members (here: a member at this system's own address, whose node
// actor is this one) and returns once it is acked.
func TestControlPlaneMethodsReachOtherMembers(t *testing.T) {
	sys := newTestSystem(t, Config{})
	var mu sync.Mutex
	var changed []string
	c := newTestCluster(t, sys, func(id string) { mu.Lock(); changed = append(changed, id); mu.Unlock() })
	c.view.Store(&memberView{members: []Member{{ID: c.self, Address: c.addr, Self: true}, {ID: "t@other", Address: sys.as.Address()}},
		owners: pcluster.NewRendezvous()})
	sys.cluster.Store(c)
	sys.ProjectDeleted("p1")
	sys.KeysRevoked("p2", nil) // a secret key: no socket to close, caches to drop
	sys.SettingsChanged("p3")
	sys.ClientEmitSecretChanged("p4", "s")
	sys.Revoke("p5", []Revocation{{Kind: RevokeJTI, Value: "j", RevokedAt: time.Now(), ExpiresAt: time.Now().Add(time.Minute)}})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"p1", "p2", "p3", "p4", "p5"}; !slices.Equal(changed, want) {
		t.Errorf("changes applied on the other member: %q, want %q", changed, want)
	}
	if st := c.Stats(); st.BroadcastsSent != 5 || st.BroadcastsAcked != 5 || st.BroadcastsReceived != 5 {
		t.Errorf("stats %+v", st)
	}
}

// peers leave out this node and a stale entry at its own address.
func TestPeers(t *testing.T) {
	sys := newTestSystem(t, Config{})
	c := newTestCluster(t, sys, nil)
	c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{
		{Id: c.self, Host: "127.0.0.1", Port: 1},
		{Id: "t@old-life", Host: "127.0.0.1", Port: 1},
		{Id: "t@other", Host: "127.0.0.1", Port: 2},
	}})
	ps := c.peers()
	if len(ps) != 1 || ps[0].Address != "127.0.0.1:2" || ps[0].Id != NodeActorName {
		t.Fatalf("peers %v", ps)
	}
	if ms := c.Members(); len(ms) != 3 || ms[0].Address != "127.0.0.1:1" {
		t.Fatalf("members %+v", ms)
	}
}

// Once a member, a topology without this node means its lease lapsed: Lost
// says so, once. Leaving is not losing.
func TestLapseIsLost(t *testing.T) {
	sys := newTestSystem(t, Config{})
	c := newTestCluster(t, sys, nil)
	me := &pcluster.Member{Id: c.self, Host: "127.0.0.1", Port: 1}
	other := &pcluster.Member{Id: "t@other", Host: "127.0.0.1", Port: 2}
	c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{other}}) // before joining: nothing
	select {
	case err := <-c.Lost():
		t.Fatalf("lost before joining: %v", err)
	default:
	}
	c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{me, other}})
	c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{other}})
	c.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{}})
	select {
	case err := <-c.Lost():
		if err == nil {
			t.Fatal("lost with no error")
		}
	case <-time.After(time.Second):
		t.Fatal("a lapse was not reported")
	}
	select {
	case err := <-c.Lost():
		t.Fatalf("reported twice: %v", err)
	default:
	}

	leaving := newTestClusterNamed(t, "u")
	leaving.topology(&pcluster.ClusterTopology{Members: []*pcluster.Member{{Id: leaving.self, Host: "127.0.0.1", Port: 1}}})
	leaving.leaving.Store(true)
	leaving.topology(&pcluster.ClusterTopology{})
	select {
	case err := <-leaving.Lost():
		t.Fatalf("leaving reported as lost: %v", err)
	default:
	}
}

func newTestClusterNamed(t *testing.T, name string) *Cluster {
	sys := newTestSystem(t, Config{})
	c, err := sys.newCluster(ClusterConfig{Name: name, Addr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Without a cluster, the control-plane methods stay local (and do not block).
func TestOneNodeStaysLocal(t *testing.T) {
	sys := newTestSystem(t, Config{})
	k := subscribeOne(t, sys, "p", "room", 1)
	began := time.Now()
	sys.KeysRevoked("p", []string{"pk-hash"})
	sys.KeysRevoked("p", nil)
	sys.SettingsChanged("p")
	sys.ClientEmitSecretChanged("p", "s")
	sys.Revoke("p", nil)
	if took := time.Since(began); took > 50*time.Millisecond || sys.Cluster() != nil {
		t.Errorf("one node: took %v, cluster %v", took, sys.Cluster())
	}
	waitFor(t, "close 4001", func() bool { return k.closed.Load() == int32(proto.CloseKeyRevoked) })
}

// Other members' live connection counts reach Reserve: the cap counts them,
// a change message updates one project, and a member that leaves takes its
// connections with it.
func TestConnectionCapCountsOtherMembers(t *testing.T) {
	sys := newTestSystem(t, Config{MaxConnections: 3})
	c := newTestCluster(t, sys, nil)
	elsewhere := func(project string, want int) {
		t.Helper()
		if !within(2*time.Second, func() bool { return sys.connectionsElsewhere(project) == want }) {
			t.Fatalf("%s elsewhere: %d, want %d", project, sys.connectionsElsewhere(project), want)
		}
	}
	c.view.Store(newMemberView([]*pcluster.Member{{Id: "m2", Host: "10.0.0.2", Port: 7000}, {Id: "m3", Host: "10.0.0.3", Port: 7000}}, c.self))
	m2, m3 := actor.NewPID("10.0.0.2:7000", NodeActorName), actor.NewPID("10.0.0.3:7000", NodeActorName)
	// A member speaks only for itself: m3's node cannot send m2's counts,
	// and a count without a sender, or from no member, is dropped; only the
	// first two are refused as forged (a member not listed yet may be real).
	sendFrom(c, c.node, m3, &clusterpb.NodeConnections{Member: "m2", Full: true, Counts: map[string]int32{"p": 3}})
	sys.root.Send(c.node, &clusterpb.NodeConnections{Member: "m2", Full: true, Counts: map[string]int32{"p": 3}})
	sendFrom(c, c.node, actor.NewPID("10.0.0.9:7000", NodeActorName), &clusterpb.NodeConnections{Member: "m9", Full: true, Counts: map[string]int32{"p": 3}})
	sendFrom(c, c.node, m2, &clusterpb.NodeConnections{Member: "m2", Full: true, Counts: map[string]int32{"p": 1, "q": 5}})
	sendFrom(c, c.node, m3, &clusterpb.NodeConnections{Member: "m3", Full: true, Counts: map[string]int32{"p": 1}})
	elsewhere("p", 2)
	if n := c.badContent.Load(); n != 2 {
		t.Errorf("refused %d counts, want 2", n)
	}
	elsewhere("q", 5)
	if _, ok := sys.Reserve("p", "addr"); !ok {
		t.Fatal("the 3rd connection of the cluster refused")
	}
	if _, ok := sys.Reserve("p", "addr"); ok {
		t.Fatal("a 4th connection of the cluster accepted (cap 3)")
	}
	sendFrom(c, c.node, m2, &clusterpb.NodeConnections{Member: "m2", Counts: map[string]int32{"p": 0}}) // m2 closed its one
	elsewhere("p", 1)
	elsewhere("q", 5) // not in the change: as it was
	if _, ok := sys.Reserve("p", "addr"); !ok {
		t.Fatal("refused after another member's connection closed")
	}
	sys.root.Send(c.node, &membersChanged{ids: map[string]bool{"m2": true}}) // m3 is gone
	elsewhere("p", 0)
	sendFrom(c, c.node, m2, &clusterpb.NodeConnections{Member: "m2", Full: true, Counts: map[string]int32{}}) // nothing left
	elsewhere("q", 0)
}

// A grain's memory of answers: a repeat is found, old ones are forgotten,
// and adopted answers are put back in order, oldest first.
func TestAnswerMemory(t *testing.T) {
	m := newAnswerMemory[int]()
	t0 := time.Unix(1000, 0)
	m.remember("a", t0, 1)
	m.remember("b", t0.Add(time.Second), 2)
	m.adopt("z", t0.Add(500*time.Millisecond), 9) // handed over: older than b
	m.adopt("a", t0, 7)                           // known: kept as it was
	m.resort()
	var order []string
	m.each(func(id string, _ time.Time, v int) { order = append(order, id) })
	if v, ok := m.get("a"); !ok || v != 1 || !slices.Equal(order, []string{"a", "z", "b"}) {
		t.Fatalf("a=%d,%v order %v", v, ok, order)
	}
	m.forget(t0.Add(dedupeWindow + 700*time.Millisecond)) // a and z are older than the window
	if _, ok := m.get("a"); ok || m.len() != 1 {
		t.Fatalf("after forget: %d remembered, a still there: %v", m.len(), ok)
	}
	if v, ok := m.get("b"); !ok || v != 2 {
		t.Fatalf("b = %d, %v", v, ok)
	}
}
