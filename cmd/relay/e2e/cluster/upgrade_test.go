//go:build cluster

package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestUpgradeMixedVersions is a rolling upgrade half done: node A runs
// another version of the relay (RELAY_OLD_BINARY; `make test-upgrade` builds
// it from git), B and C this one. Every node lists all three (the
// registrations of both versions read each other), and one clientId's
// client emits through A and B are counted exactly for the cluster, over
// projects whose grains land on old and new nodes alike (a new node holds
// the windows of a new grain, recalled when the old node's emit comes; an
// old grain is asked per emit), with nothing refused on the cluster wire.
// Not in make test (its name does not start with TestCluster): it needs the
// other version built.
func TestUpgradeMixedVersions(t *testing.T) {
	old := os.Getenv("RELAY_OLD_BINARY")
	if old == "" {
		t.Fatal("RELAY_OLD_BINARY is not set: run make test-upgrade")
	}
	c := &testCluster{etcd: relaytest.StartEtcd(t), dbURL: storetest.PostgresURL(t), ca: filepath.Join(t.TempDir(), "ca")}
	relaytest.CommandOK(t, nil, "cert", "ca", "--out", c.ca)
	env := []string{fmt.Sprintf("CLIENT_EMIT_RATE_LIMIT_PER_SECOND=%d", clusterClientCap)}
	addrA := relaytest.FreeAddr(t)
	base := append(c.nodeEnv(t, addrA), "DATABASE_URL="+c.dbURL, "RELAY_CLUSTER_NAME=relaytest",
		"MAX_CONNECTIONS_PER_ADDRESS=100000", "SHUTDOWN_TIMEOUT_SECONDS=10")
	a := &clusterNode{name: "A(old)", addr: addrA, proc: relaytest.StartBinaryFile(t, old, append(base, env...)...)}
	b := c.node(t, "B", env...)
	cc := c.node(t, "C", env...)
	nodes := []*clusterNode{a, b, cc}
	for _, n := range nodes {
		n.waitMembers(t, 3, 20*time.Second)
	}
	owner := b.on(t).Signup("alice@example.com")
	// Six projects at least, and more until their grains have run on both
	// the old node and a new one.
	onOld, onNew := 0, 0
	for p := 0; p < 6 || (onOld == 0 || onNew == 0) && p < 24; p++ {
		q := owner.CreateProject(fmt.Sprintf("p%d", p))
		secret := owner.Do("PATCH", "/api/projects/"+q.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: q.ID, Channel: "room",
			ClientID: "u9", Types: []string{"t"}, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		socks := []*relaytest.WS{a.on(t).PresenceSub(t, q.PublicKey, "room", "u9"), b.on(t).PresenceSub(t, q.PublicKey, "room", "u9")}
		collectEach(socks, 1, time.Now().Add(5*time.Second), 300*time.Millisecond)
		for round := range 3 {
			awaitWindow(t, time.Second, time.Second, 50*time.Millisecond)
			// B first, alone (a hold, if the grain is new), then both.
			socks[1].Send(relaytest.EmitFrame("room", "t", "1", tok))
			if f, ok := socks[1].Next(5 * time.Second); !ok || !strings.HasPrefix(f.Text, `{"action":"emit"`) {
				t.Fatalf("B's first emit of the window: %+v", f)
			}
			for _, s := range socks {
				s.Send(relaytest.EmitFrame("room", "t", "1", tok))
				s.Send(relaytest.EmitFrame("room", "t", "1", tok))
			}
			frames := collectEach(socks, 2, time.Now().Add(5*time.Second), 700*time.Millisecond)
			acks, limited := countEmitAnswers(t, frames, func(i int) string { return nodes[i].name })
			acks++ // B's first
			t.Logf("project %d round %d: %d accepted, %d limited (of 5)", p, round, acks, limited)
			if acks != clusterClientCap || limited != 5-clusterClientCap {
				t.Errorf("project %d round %d: %d accepted and %d refused of 5 in one window, want %d and %d", p, round, acks, limited,
					clusterClientCap, 5-clusterClientCap)
			}
		}
		if a.hostsProject(t, q.ID) {
			onOld++
		} else {
			onNew++
		}
	}
	if onOld == 0 || onNew == 0 {
		t.Errorf("project grains: %d on the old node, %d on new ones; want both kinds", onOld, onNew)
	}
	t.Logf("project grains: %d on the old node, %d on new ones", onOld, onNew)
	for _, n := range nodes {
		for _, bad := range []string{"unknown message type", "panic", "level=ERROR"} {
			if strings.Contains(n.proc.Logs.String(), bad) {
				t.Errorf("%s logged %q:\n%s", n.name, bad, n.proc.Logs)
			}
		}
	}
}
