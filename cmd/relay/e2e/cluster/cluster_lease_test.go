//go:build cluster

package cluster

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// TestClusterLeasedBackstop: with a backstop of 400 a minute each node
// spends leases of 8 units (CLUSTER.md › Project budgets are the
// cluster's). Emits round robin over three nodes until every node refuses:
// the cluster accepts exactly the backstop (every unit leased is spent, a
// unit given back by a refusing channel too), each answer's remaining is
// within the documented tolerance of the cluster's, and the refusals are
// the spec's 429.
func TestClusterLeasedBackstop(t *testing.T) {
	const backstop, share, channelCap = 400, 8, 20
	cl := startCluster(t, 10*time.Second, []string{"A", "B", "C"},
		fmt.Sprintf("PROJECT_RATE_LIMIT_PER_MINUTE=%d", backstop), fmt.Sprintf("EMIT_RATE_LIMIT_PER_MINUTE=%d", channelCap))
	owner := cl.nodes[0].on(t).Signup("alice@example.com")
	p := owner.CreateProject("leases")
	clients := []*relaytest.Client{cl.nodes[0].on(t).Client(), cl.nodes[1].on(t).Client(), cl.nodes[2].on(t).Client()}

	// Budgets are fixed wall-clock minutes: keep the emits inside one.
	awaitWindow(t, time.Minute, 15*time.Second, 100*time.Millisecond)
	accepted := 0
	// The channel budget refuses the 21st emit on "hot" through A: its
	// backstop unit goes back to A's share.
	for i := range channelCap + 1 {
		r := clients[0].Emit(p.SecretKey, fmt.Sprintf(`{"channel":"hot","payload":%d}`, i))
		if i < channelCap {
			expectEmitted(t, r, "hot")
			accepted++
			continue
		}
		if r.Status != http.StatusTooManyRequests || r.JSON["error"] != "channel_rate_limited" {
			t.Fatalf("emit %d on hot: %d %s; want 429 channel_rate_limited", i+1, r.Status, r.Raw)
		}
	}
	refusedInARow, acceptedAt := make([]int, 3), make([][]time.Time, 3)
	for i := 0; refusedInARow[0] < 3 || refusedInARow[1] < 3 || refusedInARow[2] < 3; i++ {
		if i > backstop+100 {
			t.Fatalf("%d emits and the nodes still accept (%d accepted, refusals in a row %v)", i, accepted, refusedInARow)
		}
		node := i % 3
		now := time.Now()
		r := clients[node].Emit(p.SecretKey, fmt.Sprintf(`{"channel":"c%d","payload":%d}`, i/3%40, i))
		if r.Status == http.StatusOK {
			accepted++
			refusedInARow[node] = 0
			acceptedAt[node] = append(acceptedAt[node], now)
			// Remaining: the grain's at its last answer to this node (at
			// most a second old) plus the node's share: above the cluster's
			// by at most what the others accepted since, below by at most
			// the others' shares.
			b, _ := r.JSON["project_rate_limit"].(map[string]any)
			truth, since := backstop-accepted, 0
			for other, ats := range acceptedAt {
				for j := len(ats) - 1; other != node && j >= 0 && now.Sub(ats[j]) < 1500*time.Millisecond; j-- {
					since++
				}
			}
			if rem := int(relaytest.Num(b, "remaining")); rem > truth+since || rem < truth-2*(share+share/2) {
				t.Fatalf("emit %d through %s: project remaining %d, the cluster's is %d (others accepted %d in the last 1.5 s and hold at most %d): %s",
					i, cl.nodes[node].name, rem, truth, since, 2*(share+share/2), r.Raw)
			}
			continue
		}
		if r.Status != http.StatusTooManyRequests || r.JSON["error"] != "project_rate_limited" || len(r.JSON) != 3 {
			t.Fatalf("emit %d through %s after %d accepted: %d %s; want 429 project_rate_limited", i, cl.nodes[node].name, accepted, r.Status, r.Raw)
		}
		relaytest.Budget(t, now, r, "project_rate_limit", backstop, 0)
		refusedInARow[node]++
	}
	if accepted != backstop {
		t.Fatalf("the cluster accepted %d emits in the minute, want the backstop %d", accepted, backstop)
	}

	// A socket's client emits are answered in order while the first waits
	// for the project grain (its clientId's window, then a share: the
	// project is new on B): the second, refused at rule 2, and the third,
	// at rule 7, answer after the first's ack.
	q := owner.CreateProject("order")
	secret := owner.Do("PATCH", "/api/projects/"+q.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: q.ID, Channel: "room",
		ClientID: "u1", Types: []string{"t"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s := cl.nodes[1].on(t).PresenceSub(t, q.PublicKey, "room", "u1")
	s.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	s.Send(relaytest.EmitFrame("room", "t", "1", tok))
	s.Send(`{"action":"emit","channel":"room","type":"t","payload":1}`)
	s.Send(`{"action":"emit","channel":"room","type":"t","payload":"` + strings.Repeat("x", 140<<10) + `","token":"` + tok + `"}`)
	s.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
	s.Expect(`{"error":"token_and_type_required","channel":"room"}`)
	s.Expect(`{"error":"payload_too_large","channel":"room"}`)

	// The project grain's node frozen: a node goes on with its share. Its
	// emits, spread over the second after which its last answer from the
	// grain is too old to report the remaining on, wait at most the 300 ms
	// the grain has to answer, not until the frozen node is dropped from
	// the cluster (3 s here) or the edge gives up (5 s).
	c := cl.nodes[2]
	var frozen relaytest.Project
	for i := 0; frozen.ID == ""; i++ {
		if i == 20 {
			t.Fatal("no project grain of 20 started on C")
		}
		q := owner.CreateProject(fmt.Sprintf("frozen-%d", i))
		expectEmitted(t, clients[0].Emit(q.SecretKey, `{"channel":"warm","payload":0}`), "warm")
		if c.hostsProject(t, q.ID) {
			frozen = q
		}
	}
	var channel string // its grain not on C either
	for i := 0; channel == ""; i++ {
		if i == 30 {
			t.Fatal("no channel grain of 30 started off C")
		}
		ch := fmt.Sprintf("off-c-%d", i)
		expectEmitted(t, clients[0].Emit(frozen.SecretKey, `{"channel":"`+ch+`","payload":0}`), ch)
		if !c.hostsGrain(t, frozen.ID+"/"+ch) {
			channel = ch
		}
	}
	if err := syscall.Kill(c.pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	tick := time.NewTicker(550 * time.Millisecond) // the emits' rate: the third comes past leaseFresh (1 s)
	defer tick.Stop()
	var took []time.Duration
	for i := range 3 {
		<-tick.C
		t0 := time.Now()
		r := clients[0].Emit(frozen.SecretKey, fmt.Sprintf(`{"channel":"%s","payload":%d}`, channel, i))
		took = append(took, time.Since(t0).Round(time.Millisecond))
		if r.Status != http.StatusOK || took[i] > time.Second {
			syscall.Kill(c.pid(), syscall.SIGCONT)
			t.Fatalf("emit %d through A with the project grain's node C frozen: %d %s after %v; want 200 within 1 s", i, r.Status, r.Raw, took[i])
		}
	}
	frozenFor := time.Since(stopped)
	if err := syscall.Kill(c.pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("3 emits through A with C (the project grain's node) frozen for %v: answered in %v", frozenFor.Round(time.Millisecond), took)
	if frozenFor > 2800*time.Millisecond {
		t.Fatalf("the emits took %v: C may have been dropped from the cluster (3 s), so the grain was not frozen throughout", frozenFor)
	}
}
