//go:build cluster

package cluster

// Several nodes as one relay, black-box: `make test-cluster` (go test -tags
// cluster, without -race: protoactor's cluster races in its own member list,
// and these tests run real processes anyway). The test starts its own etcd
// (Debian's etcd-server) and PostgreSQL, and real relay processes, all on
// loopback; it ends only the processes it started, by their pids.
//
// This file: membership, control-plane changes applied on every node before
// the API answers, and a node out of the membership stopping. Messages
// across nodes (channel grains): cluster_fanout_test.go.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// clusterNode is one relay process of the cluster.
type clusterNode struct {
	name string
	addr string // RELAY_CLUSTER_ADDR: its actor remote
	proc *relaytest.Process
}

// on is the node behind the package's helpers, for test t.
func (n *clusterNode) on(t *testing.T) *relaytest.Server { return relaytest.ServerOf(t, n.proc) }

func (n *clusterNode) pid() int { return n.proc.Cmd.Process.Pid }

// testCluster is one etcd, one PostgreSQL database and the relay nodes
// sharing them.
type testCluster struct {
	etcd  *relaytest.Etcd
	dbURL string
	ca    string // directory of the cluster CA (relay cert ca)
	nodes []*clusterNode
}

// startCluster starts etcd, PostgreSQL and a node per name, the nodes at
// once as a deployment starts them, then waits until every node sees all
// of them as members, each within within. env is added to every node's
// environment (see node).
func startCluster(t *testing.T, within time.Duration, names []string, env ...string) *testCluster {
	t.Helper()
	return startClusterOn(t, within, storetest.PostgresURL(t), names, env...)
}

// startClusterOn is startCluster on the database at dbURL.
func startClusterOn(t *testing.T, within time.Duration, dbURL string, names []string, env ...string) *testCluster {
	t.Helper()
	began := time.Now()
	c := &testCluster{etcd: relaytest.StartEtcd(t), dbURL: dbURL, ca: filepath.Join(t.TempDir(), "ca")}
	relaytest.CommandOK(t, nil, "cert", "ca", "--out", c.ca)
	c.nodes = make([]*clusterNode, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() { // a start that fails says why and leaves its node nil
			defer wg.Done()
			t0 := time.Now()
			c.nodes[i] = c.node(t, name, env...)
			t.Logf("node %s serving %v after its start (it joins before it listens)", name, time.Since(t0).Round(time.Millisecond))
		}()
	}
	wg.Wait()
	if slices.Contains(c.nodes, nil) {
		t.FailNow()
	}
	for _, n := range c.nodes {
		n.waitMembers(t, len(names), within)
	}
	t.Logf("%d members seen by every node %v after the first start", len(names), time.Since(began).Round(time.Millisecond))
	return c
}

// node starts `relay serve` as a member of the cluster, with env (KEY=VALUE)
// after the defaults below, so that it wins; it returns once the node
// serves (it joins before it listens). The node is killed when t ends.
func (c *testCluster) node(t *testing.T, name string, env ...string) *clusterNode {
	t.Helper()
	return c.nodeAs(t, name, 0, env...)
}

// nodeAs is node run as the user uid (0: as the test; else in the group
// partitionGID), for partition.
func (c *testCluster) nodeAs(t *testing.T, name string, uid int, env ...string) *clusterNode {
	t.Helper()
	addr := relaytest.FreeAddr(t)
	for _, kv := range env { // the caller's, for its certificate too (the last one wins, as for exec)
		if v, ok := strings.CutPrefix(kv, "RELAY_CLUSTER_ADDR="); ok {
			addr = v
		}
	}
	base := append(c.nodeEnv(t, addr), "DATABASE_URL="+c.dbURL, "RELAY_CLUSTER_NAME=relaytest",
		"MAX_CONNECTIONS_PER_ADDRESS=100000", "SHUTDOWN_TIMEOUT_SECONDS=10")
	env = append(base, env...)
	if uid != 0 {
		return &clusterNode{name: name, addr: addr, proc: relaytest.StartBinaryAs(t, uid, partitionGID, env...)}
	}
	return &clusterNode{name: name, addr: addr, proc: relaytest.StartBinary(t, env...)}
}

// nodeEnv is what a node at addr needs to join: etcd over TLS with its
// client certificate, and its own certificate of the cluster CA (made as
// an operator would, with relay cert node).
func (c *testCluster) nodeEnv(t *testing.T, addr string) []string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "node")
	relaytest.CommandOK(t, nil, "cert", "node", "--ca", c.ca, "--addr", addr, "--out", dir)
	return append(c.etcd.Env(), "RELAY_CLUSTER_ADDR="+addr, "RELAY_CLUSTER_TLS_CA="+filepath.Join(c.ca, "ca.pem"),
		"RELAY_CLUSTER_TLS_CERT="+filepath.Join(dir, "node.pem"), "RELAY_CLUSTER_TLS_KEY="+filepath.Join(dir, "node-key.pem"))
}

type memberView struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Self    bool   `json:"self"`
}

// members asks a node's /debug/actors for the member list it sees.
func (n *clusterNode) members(t *testing.T) ([]memberView, error) {
	r, err := relaytest.Do(nil, "GET", n.proc.Debug+"/debug/actors", "", nil)
	if err != nil {
		return nil, err
	}
	var v struct {
		Cluster *struct {
			Members []memberView `json:"members"`
		} `json:"cluster"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &v); err != nil {
		return nil, err
	}
	if v.Cluster == nil {
		return nil, fmt.Errorf("%s: no cluster in /debug/actors: %s", n.name, r.Raw)
	}
	return v.Cluster.Members, nil
}

// waitMembers waits until the node sees want members and returns how long it took.
func (n *clusterNode) waitMembers(t *testing.T, want int, timeout time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	var last []memberView
	relaytest.EventuallyNil(t, timeout, func() error {
		ms, err := n.members(t)
		if err != nil {
			return err
		}
		last = ms
		if len(ms) != want {
			return fmt.Errorf("%s sees %d members, want %d: %+v", n.name, len(ms), want, ms)
		}
		return nil
	})
	selfs := 0
	for _, m := range last {
		if m.Self {
			selfs++
		}
	}
	if selfs != 1 && want > 0 {
		t.Fatalf("%s: %d members marked self: %+v", n.name, selfs, last)
	}
	return time.Since(began)
}

// metric reads one unlabelled sample of the node's /metrics.
func (n *clusterNode) metric(t *testing.T, name string) float64 {
	t.Helper()
	return relaytest.ScrapeMetrics(t, n.proc.Debug+"/metrics").Get(t, name, "")
}

// waitExit waits for the node's process to exit and returns its exit code.
func (n *clusterNode) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-n.proc.Exited:
		return n.proc.Cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s still running after %v:\n%s", n.name, timeout, n.proc.Logs)
		return 0
	}
}

// closing is how a socket ended and when the end arrived.
type closing struct {
	relaytest.Frame
	at time.Time
}

// closeWatch records when and how a socket is closed, from now on.
func closeWatch(c *relaytest.WS) <-chan closing {
	out := make(chan closing, 1)
	go func() {
		for {
			f, ok := c.Next(10 * time.Second)
			switch {
			case !ok:
				out <- closing{Frame: relaytest.Frame{Err: fmt.Errorf("no close within 10 s")}}
				return
			case f.Closed || f.Err != nil:
				out <- closing{Frame: f, at: time.Now()}
				return
			}
		}
	}()
	return out
}

// closedAt checks the close code and returns when the close arrived.
func closedAt(t *testing.T, what string, ch <-chan closing, code int) time.Time {
	t.Helper()
	f := <-ch
	if f.Err != nil || f.CloseCode != code {
		t.Fatalf("%s: closed %d %q (err %v), want %d", what, f.CloseCode, f.Reason, f.Err, code)
	}
	return f.at
}

// TestCluster's project budgets (PROJECT_RATE_LIMIT_PER_MINUTE,
// CLIENT_EMIT_RATE_LIMIT_PER_SECOND): small, so that one count for the
// cluster shows.
const clusterBackstop, clusterClientCap = 8, 3

// clusterConnCap is TestCluster's MAX_CONNECTIONS_PER_PROJECT, for the
// whole cluster.
const clusterConnCap = 4

// awaitWindow waits, when less than room is left of the current wall-clock
// window of period, until after past the start of the next one. Time by
// nature: the budgets count fixed wall-clock windows (minutes; seconds for
// the client-emit window), and a test must keep its emits inside one.
func awaitWindow(t *testing.T, period, room, after time.Duration) {
	t.Helper()
	if left := time.Until(time.Now().Truncate(period).Add(period)); left < room {
		if period >= time.Minute {
			t.Logf("waiting %v for the next budget window", left.Round(time.Millisecond))
		}
		time.Sleep(left + after)
	}
}

func TestCluster(t *testing.T) {
	began := time.Now()
	t.Run("SQLite refused", func(t *testing.T) {
		code, out := relaytest.RunBinary(t, 15*time.Second,
			"RELAY_CLUSTER_ETCD=127.0.0.1:1", "RELAY_CLUSTER_ADDR="+relaytest.FreeAddr(t))
		if code == 0 || !strings.Contains(out, "RELAY_CLUSTER_ETCD") || !strings.Contains(out, "needs PostgreSQL") {
			t.Fatalf("a cluster on SQLite: exit %d, output:\n%s", code, out)
		}
	})

	// Small project budgets, so that the cluster-wide counts show: the
	// backstop and the per-clientId window are each the project grain's.
	cl := startCluster(t, 5*time.Second, []string{"A", "B", "C"},
		fmt.Sprintf("PROJECT_RATE_LIMIT_PER_MINUTE=%d", clusterBackstop), fmt.Sprintf("CLIENT_EMIT_RATE_LIMIT_PER_SECOND=%d", clusterClientCap),
		fmt.Sprintf("MAX_CONNECTIONS_PER_PROJECT=%d", clusterConnCap))
	etcd, nodes := cl.etcd, cl.nodes
	a, b, c := nodes[0], nodes[1], nodes[2]

	t.Run("every node sees three members", func(t *testing.T) {
		// startCluster waited until each sees three, one marked self.
		for _, n := range nodes {
			if got := n.metric(t, "relay_cluster_members"); got != 3 {
				t.Errorf("%s: relay_cluster_members %v", n.name, got)
			}
		}
		// All three agree on who is who.
		ma, err := a.members(t)
		if err != nil || len(ma) != 3 {
			t.Fatalf("A's members: %+v, %v", ma, err)
		}
		for _, n := range nodes[1:] {
			mn, err := n.members(t)
			if err != nil || len(mn) != len(ma) {
				t.Fatalf("A sees %+v, %s sees %+v (%v)", ma, n.name, mn, err)
			}
			for i := range ma {
				if ma[i].ID != mn[i].ID || ma[i].Address != mn[i].Address {
					t.Fatalf("A sees %+v, %s sees %+v", ma, n.name, mn)
				}
			}
		}
	})

	owner := a.on(t).Signup("alice@example.com")

	t.Run("project backstop counted once for the cluster", func(t *testing.T) {
		q := owner.CreateProject("burst")
		// Budgets are fixed wall-clock minutes: keep the emits inside one.
		awaitWindow(t, time.Minute, 5*time.Second, 100*time.Millisecond)
		clients := []*relaytest.Client{a.on(t).Client(), b.on(t).Client(), c.on(t).Client()}
		for i := range clusterBackstop + 3 {
			n := nodes[i%3]
			// A channel per emit: only the project's budget can refuse.
			r := clients[i%3].Emit(q.SecretKey, fmt.Sprintf(`{"channel":"c%d","payload":%d}`, i, i))
			now := time.Now()
			if i < clusterBackstop {
				expectEmitted(t, r, fmt.Sprintf("c%d", i))
				relaytest.Budget(t, now, r, "project_rate_limit", clusterBackstop, clusterBackstop-1-i)
				continue
			}
			if r.Status != http.StatusTooManyRequests || r.JSON["error"] != "project_rate_limited" || len(r.JSON) != 3 {
				t.Fatalf("emit %d (through %s) after %d accepted in the cluster: %d %s; want 429 project_rate_limited", i+1, n.name, clusterBackstop, r.Status, r.Raw)
			}
			relaytest.Budget(t, now, r, "project_rate_limit", clusterBackstop, 0)
			relaytest.Budget(t, now, r, "rate_limit", 600, 600)
		}
	})

	t.Run("per-clientId client-emit window counted once for the cluster", func(t *testing.T) {
		q := owner.CreateProject("clients")
		secret := owner.Do("PATCH", "/api/projects/"+q.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: q.ID, Channel: "room",
			ClientID: "u9", Types: []string{"t"}, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// The same clientId on every node, each socket emitting twice at once.
		socks := []*relaytest.WS{a.on(t).PresenceSub(t, q.PublicKey, "room", "u9"),
			b.on(t).PresenceSub(t, q.PublicKey, "room", "u9"), c.on(t).PresenceSub(t, q.PublicKey, "room", "u9")}
		collectEach(socks, 1, time.Now().Add(5*time.Second), 300*time.Millisecond) // the syncs
		for round := 1; ; round++ {
			// Windows are whole seconds on the grain's clock: start just after one begins.
			awaitWindow(t, time.Second, time.Second, 50*time.Millisecond)
			began := time.Now()
			for _, s := range socks {
				s.Send(relaytest.EmitFrame("room", "t", "1", tok))
				s.Send(relaytest.EmitFrame("room", "t", "1", tok))
			}
			// Each socket: its two answers and the messages the others had accepted.
			frames := collectEach(socks, 2, time.Now().Add(5*time.Second), 500*time.Millisecond)
			took := time.Since(began) - 500*time.Millisecond
			acks, limited := countEmitAnswers(t, frames, func(i int) string { return nodes[i].name })
			t.Logf("round %d: %d accepted, %d client_emit_rate_limited, answers within %v", round, acks, limited, took.Round(time.Millisecond))
			if acks == clusterClientCap && limited == 6-clusterClientCap {
				return
			}
			if took < 800*time.Millisecond || round == 3 { // one window, and still not counted once
				t.Fatalf("6 emits of clientId u9 through three nodes within one second: %d accepted, %d refused; want %d and %d",
					acks, limited, clusterClientCap, 6-clusterClientCap)
			}
		}
	})

	t.Run("connection cap counted across the cluster", func(t *testing.T) {
		q := owner.CreateProject("crowd")
		tsA, tsB, tsC := a.on(t), b.on(t), c.on(t)
		refused := func(ts *relaytest.Server) {
			t.Helper()
			ts.Handshake("/ws?publicKey="+q.PublicKey).Expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`)
		}
		// The counts travel between nodes once a second
		// (actors/cluster_conns.go); each node's /debug/actors says what it
		// last heard, and a refusal is checked once every node has heard.
		heard := func(n *clusterNode, want int) {
			t.Helper()
			relaytest.Eventually(t, 10*time.Second, func() bool { return n.connsElsewhere(t, q.ID) == want },
				"%s hears of %d connections on the other nodes", n.name, want)
		}
		tsC.DialWS(q.PublicKey)
		onA := []*relaytest.WS{tsA.DialWS(q.PublicKey), tsA.DialWS(q.PublicKey)}
		tsB.DialWS(q.PublicKey) // the 4th of the cluster
		heard(a, 2)
		heard(b, 3)
		heard(c, 3)
		refused(tsA)
		refused(tsB)
		refused(tsC)
		onA[0].Conn.Close()
		heard(c, 2) // A's 1 and B's 1
		heard(b, 2) // A's 1 and C's 1: the 3 below can only be C's new one
		tsC.DialWS(q.PublicKey)
		heard(b, 3) // A's 1 and C's 2
		refused(tsB)
	})

	t.Run("project budgets move with their grain when a node joins and when it stops", func(t *testing.T) {
		// Fixed wall-clock minutes: keep the whole subtest inside one. It
		// takes about 3.4 s here (10 runs of make test); 15 s of room leaves
		// a loaded machine four times that.
		awaitWindow(t, time.Minute, 15*time.Second, 100*time.Millisecond)
		// Projects whose backstop is used up, their grains on A, B and C.
		viaA := a.on(t).Client()
		var spent []relaytest.Project
		for i := range 20 {
			q := owner.CreateProject(fmt.Sprintf("spent-%d", i))
			for j := range clusterBackstop {
				expectEmitted(t, viaA.Emit(q.SecretKey, fmt.Sprintf(`{"channel":"c%d","payload":1}`, j)), fmt.Sprintf("c%d", j))
			}
			spent = append(spent, q)
		}
		refusedEverywhere := func(when string) {
			t.Helper()
			for i, q := range spent {
				n := nodes[i%3]
				r := n.on(t).Client().Emit(q.SecretKey, `{"channel":"more","payload":1}`)
				if r.Status != http.StatusTooManyRequests || r.JSON["error"] != "project_rate_limited" {
					t.Fatalf("%s: project %d (backstop %d used up) through %s: %d %s; want 429 project_rate_limited",
						when, i, clusterBackstop, n.name, r.Status, r.Raw)
				}
			}
		}
		e := cl.node(t, "E")
		for _, n := range []*clusterNode{a, b, c, e} {
			n.waitMembers(t, 4, 10*time.Second)
		}
		refusedEverywhere("after E joined") // the emits start the moved grains on E
		var onE []int
		for i, q := range spent {
			if e.hostsProject(t, q.ID) {
				onE = append(onE, i)
			}
		}
		t.Logf("%d of %d project grains moved to E when it joined", len(onE), len(spent))
		if len(onE) == 0 {
			t.Fatalf("no project grain moved to E: the join was not tested")
		}
		stopped := time.Now()
		if err := syscall.Kill(e.pid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := e.waitExit(t, 15*time.Second); code != 0 {
			t.Fatalf("E exited %d after SIGTERM:\n%s", code, e.proc.Logs)
		}
		t.Logf("E exited %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
		for _, n := range []*clusterNode{a, b, c} {
			n.waitMembers(t, 3, 10*time.Second)
		}
		refusedEverywhere("after E stopped")
	})

	p := owner.CreateProject("spread")

	t.Run("client-emit secret regenerated through A: B refuses the old one at once", func(t *testing.T) {
		tsB := b.on(t)
		secret1 := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		mint := func(secret string, issued time.Time) string {
			tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room",
				ClientID: "u1", Types: []string{"t"}, TTL: time.Minute, Now: issued})
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}
		sock := tsB.PresenceSub(t, p.PublicKey, "room", "u1")
		sock.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		old := mint(secret1, time.Now())
		sock.Send(relaytest.EmitFrame("room", "t", "1", old))
		sock.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq") // B holds secret 1

		r := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{"regenerate":true}`)
		secret2 := r.Str("clientEmitSecret")
		if r.Status != http.StatusOK || secret2 == secret1 {
			t.Fatalf("regenerate: %d %s", r.Status, r.Raw)
		}
		sock.Send(relaytest.EmitFrame("room", "t", "1", old)) // right after the answer
		sock.Expect(`{"error":"invalid_emit_token","channel":"room"}`)
		sock.Send(relaytest.EmitFrame("room", "t", "1", mint(secret2, time.Now())))
		sock.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")

		// A token revocation through A (stored, then applied on every node).
		early := mint(secret2, time.Now().Add(-2*time.Second))
		owner.Revoke(p.SecretKey, `{"clientId":"u1"}`).Expect(t, http.StatusOK, `{"ok":true}`)
		sock.Send(relaytest.EmitFrame("room", "t", "1", early))
		sock.Expect(`{"error":"emit_token_revoked","channel":"room"}`)
	})

	t.Run("secret key rotated through A: refused on B at once", func(t *testing.T) {
		viaB := b.on(t).Client()
		if r := viaB.Emit(p.SecretKey, `{"channel":"x","payload":1}`); r.Status != http.StatusOK {
			t.Fatalf("emit on B: %d %s", r.Status, r.Raw) // B now holds the key in its cache
		}
		r := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"secret"}`)
		fresh := r.Str("key", "raw")
		if r.Status != http.StatusCreated || fresh == "" {
			t.Fatalf("rotate: %d %s", r.Status, r.Raw)
		}
		if r := viaB.Emit(p.SecretKey, `{"channel":"x","payload":2}`); r.Status != http.StatusUnauthorized {
			t.Fatalf("old secret key on B after the rotation: %d %s", r.Status, r.Raw)
		}
		if r := viaB.Emit(fresh, `{"channel":"x","payload":3}`); r.Status != http.StatusOK {
			t.Fatalf("new secret key on B: %d %s", r.Status, r.Raw)
		}
		p.SecretKey = fresh
	})

	t.Run("public key rotated through A: sockets on B and C close with 4001", func(t *testing.T) {
		tsB, tsC := b.on(t), c.on(t)
		onB, onC := tsB.Subscribed(t, p.PublicKey, "room"), tsC.Subscribed(t, p.PublicKey, "room")
		closeB, closeC := closeWatch(onB), closeWatch(onC)
		sent := time.Now()
		r := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public"}`)
		answered := time.Now()
		fresh := r.Str("key", "raw")
		if r.Status != http.StatusCreated || fresh == "" {
			t.Fatalf("rotate: %d %s", r.Status, r.Raw)
		}
		// Every node has the change queued before A answers, so the old
		// key is refused on B from the answer on...
		if _, status, err := tsB.TryDialWS(p.PublicKey); err == nil || status != http.StatusUnauthorized {
			t.Fatalf("old public key on B after the answer: status %d, %v", status, err)
		}
		// ...and the sockets close promptly: their close frames are written
		// as B and C apply it, about when A answers.
		for _, w := range []struct {
			name string
			ch   <-chan closing
		}{{"B", closeB}, {"C", closeC}} {
			at := closedAt(t, w.name, w.ch, 4001)
			t.Logf("close 4001 on %s: %+.1f ms from the answer (request took %.1f ms)", w.name,
				float64(at.Sub(answered).Microseconds())/1000, float64(answered.Sub(sent).Microseconds())/1000)
			if at.After(answered.Add(500 * time.Millisecond)) {
				t.Errorf("%s closed %v after the answer", w.name, at.Sub(answered))
			}
		}
		p.PublicKey = fresh
	})

	t.Run("project deleted through A: sockets on B and C close with 4004", func(t *testing.T) {
		onB, onC := b.on(t).Subscribed(t, p.PublicKey, "room"), c.on(t).Subscribed(t, p.PublicKey, "room")
		closeB, closeC := closeWatch(onB), closeWatch(onC)
		r := owner.Do("DELETE", "/api/projects/"+p.ID, "")
		answered := time.Now()
		if r.Status != http.StatusOK && r.Status != http.StatusNoContent {
			t.Fatalf("delete: %d %s", r.Status, r.Raw)
		}
		for name, ch := range map[string]<-chan closing{"B": closeB, "C": closeC} {
			at := closedAt(t, name, ch, 4004)
			t.Logf("close 4004 on %s: %+.1f ms from the answer", name, float64(at.Sub(answered).Microseconds())/1000)
		}
	})

	t.Run("broadcast counters", func(t *testing.T) {
		sent, acked := a.metric(t, "relay_cluster_broadcasts_sent_total"), a.metric(t, "relay_cluster_broadcasts_acked_total")
		if sent == 0 || acked != sent || a.metric(t, "relay_cluster_broadcasts_timed_out_total") != 0 {
			t.Fatalf("A sent %v, acked %v, timed out %v", sent, acked, a.metric(t, "relay_cluster_broadcasts_timed_out_total"))
		}
		for _, n := range []*clusterNode{b, c} {
			if got := n.metric(t, "relay_cluster_broadcasts_received_total"); got != sent/2 {
				t.Errorf("%s received %v changes, A sent %v to each of 2", n.name, got, sent/2)
			}
		}
	})

	q := owner.CreateProject("after")
	t.Run("kill -9 of C: A and B drop it", func(t *testing.T) {
		timedOut := a.metric(t, "relay_cluster_broadcasts_timed_out_total")
		if err := syscall.Kill(c.pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		// A change made before the others notice waits for C's ack, at most
		// the bound (2 s), and is counted.
		took := make(chan time.Duration, 1)
		go func() {
			t0 := time.Now()
			owner.Try("PATCH", "/api/projects/"+q.ID+"/client-emit-secret", `{"regenerate":true}`, "application/json", nil)
			took <- time.Since(t0)
		}()
		for _, n := range []*clusterNode{a, b} {
			n.waitMembers(t, 2, 15*time.Second)
			t.Logf("%s dropped C %v after kill -9", n.name, time.Since(killed).Round(10*time.Millisecond))
		}
		if d := <-took; d > 2500*time.Millisecond {
			t.Errorf("a change during C's death took %v", d)
		} else {
			t.Logf("a change made right after the kill took %v", d.Round(time.Millisecond))
		}
		if got := a.metric(t, "relay_cluster_broadcasts_timed_out_total"); got != timedOut+1 {
			t.Errorf("timed out %v, want %v", got, timedOut+1)
		}
		t0 := time.Now()
		owner.Do("PATCH", "/api/projects/"+q.ID+"/client-emit-secret", `{"regenerate":true}`)
		if d := time.Since(t0); d > 500*time.Millisecond {
			t.Errorf("a change once C is dropped took %v", d)
		}
	})

	t.Run("etcd down: no node can join; the members serve and changes still reach them", func(t *testing.T) {
		d := cl.node(t, "D")
		for _, n := range []*clusterNode{a, b} {
			n.waitMembers(t, 3, 5*time.Second)
		}
		etcd.Stop()
		stopped := time.Now()
		// A node stopped meanwhile cannot deregister: it gives up after 5 s
		// and exits 0; the others drop it once etcd is back and its lease runs out.
		if err := syscall.Kill(d.pid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, out := relaytest.RunBinary(t, 20*time.Second, append(cl.nodeEnv(t, relaytest.FreeAddr(t)), "DATABASE_URL="+cl.dbURL)...)
		if code == 0 || !strings.Contains(out, "does not answer") {
			t.Fatalf("a node started with etcd down: exit %d:\n%s", code, out)
		}
		t.Logf("a node started with etcd down exits %d after %v", code, time.Since(stopped).Round(100*time.Millisecond))
		received := b.metric(t, "relay_cluster_broadcasts_received_total")
		if r := owner.Do("PATCH", "/api/projects/"+q.ID+"/client-emit-secret", `{"regenerate":true}`); r.Status != http.StatusOK {
			t.Fatalf("regenerate with etcd down: %d %s", r.Status, r.Raw)
		}
		if got := b.metric(t, "relay_cluster_broadcasts_received_total"); got != received+1 {
			t.Errorf("B received %v changes with etcd down, want %v", got, received+1)
		}
		if code := d.waitExit(t, 15*time.Second); code != 0 {
			t.Fatalf("D exited %d after SIGTERM with etcd down:\n%s", code, d.proc.Logs)
		}
		t.Logf("D, stopped with etcd down, exited 0 %v after SIGTERM", time.Since(stopped).Round(100*time.Millisecond))
		relaytest.Eventually(t, 10*time.Second, func() bool { return a.metric(t, "relay_cluster_etcd_up") == 0 }, "A reports etcd down")
		// Time by nature: the outage itself, well past the 3 s lease.
		time.Sleep(time.Until(stopped.Add(8 * time.Second)))
		etcd.Start()
		relaytest.Eventually(t, 10*time.Second, func() bool {
			return a.metric(t, "relay_cluster_etcd_up") == 1 && b.metric(t, "relay_cluster_etcd_up") == 1
		}, "A and B report etcd up")
		// Neither exits within 5 s, past a lease the members might have lost.
		select {
		case <-a.proc.Exited:
			t.Fatalf("A exited after the etcd outage:\n%s", a.proc.Logs)
		case <-b.proc.Exited:
			t.Fatalf("B exited after the etcd outage:\n%s", b.proc.Logs)
		case <-time.After(5 * time.Second):
		}
		for _, n := range []*clusterNode{a, b} {
			n.waitMembers(t, 2, 10*time.Second) // D dropped: etcd back, its lease run out
		}
		t.Logf("etcd down %v: A and B stayed members", time.Since(stopped).Round(100*time.Millisecond))
	})

	t.Run("a node whose lease lapses (stopped until the others drop it) stops serving and exits non-zero", func(t *testing.T) {
		if err := syscall.Kill(b.pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		a.waitMembers(t, 1, 15*time.Second)
		// A dropping B shows its lease lapsed: B resumes now.
		t.Logf("A dropped the stopped B %v after SIGSTOP", time.Since(stopped).Round(10*time.Millisecond))
		if err := syscall.Kill(b.pid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		resumed := time.Now()
		if code := b.waitExit(t, 15*time.Second); code == 0 {
			t.Fatalf("B exited 0 after losing its membership:\n%s", b.proc.Logs)
		}
		if !strings.Contains(b.proc.Logs.String(), "out of the cluster") {
			t.Fatalf("B did not say why it stopped:\n%s", b.proc.Logs)
		}
		t.Logf("B exited non-zero %v after it resumed", time.Since(resumed).Round(10*time.Millisecond))
	})

	t.Run("graceful leave: the others drop the node at once; it exits 0", func(t *testing.T) {
		d := cl.node(t, "D")
		a.waitMembers(t, 2, 5*time.Second)
		if err := syscall.Kill(d.pid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		term := time.Now()
		t.Logf("A dropped D %v after SIGTERM", a.waitMembers(t, 1, 5*time.Second).Round(time.Millisecond))
		if code := d.waitExit(t, 15*time.Second); code != 0 {
			t.Fatalf("D exited %d:\n%s", code, d.proc.Logs)
		}
		t.Logf("D exited 0 %v after SIGTERM", time.Since(term).Round(10*time.Millisecond))
	})
	// Last, on the member left: hostile peers must not disturb the runs above.
	t.Run("the actor remote takes only the cluster's certificates", func(t *testing.T) { checkRemoteWire(t, cl, a) })
	t.Logf("cluster tests took %v", time.Since(began).Round(100*time.Millisecond))
}

// countEmitAnswers counts the client-emit acks and client_emit_rate_limited
// refusals on room among each socket's frames (socket i on the node named
// node(i)); a frame that is neither, nor a message of room, fails the test.
func countEmitAnswers(t *testing.T, frames [][]relaytest.Frame, node func(int) string) (acks, limited int) {
	t.Helper()
	for i, fs := range frames {
		for _, f := range fs {
			switch {
			case sameJSON(f.Text, `{"error":"client_emit_rate_limited","channel":"room"}`):
				limited++
			case strings.HasPrefix(f.Text, `{"action":"emit"`):
				acks++
			case strings.HasPrefix(f.Text, `{"channel":"room"`):
			default:
				t.Fatalf("socket on %s: unexpected %+v", node(i), f)
			}
		}
	}
	return acks, limited
}
