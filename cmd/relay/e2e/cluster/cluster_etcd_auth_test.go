//go:build cluster

package cluster

// Nodes that log in to etcd with a user and password
// (RELAY_CLUSTER_ETCD_USERNAME, _PASSWORD), against a real etcd with its
// authentication on. Run with `make test-cluster` (or -run
// '^TestClusterEtcdAuth').
//
// The etcd of relaytest also asks for a client certificate, and etcd 3.4
// (--client-cert-auth) takes that certificate's CommonName as the user when
// a request carries no token: the test certificate's CN is "relay", so a
// user of that name would let a node in without any password. The nodes'
// user here is named otherwise (etcdAuthUser), so the certificate alone is
// no user (the last subtest) and only the password's token lets a node in.
// A password is always checked, whatever the certificate: etcd's
// Authenticate refuses a wrong one, and a token wins over the CN.

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// etcdAuthUser is not the CN of relaytest's client certificate ("relay").
const etcdAuthUser, etcdAuthPassword = "relay-node", "s3cret-of-the-nodes"

func TestClusterEtcdAuth(t *testing.T) {
	t.Parallel() // checks what happens, not how fast: see doc.go
	etcd := relaytest.StartEtcd(t)
	etcd.EnableAuth(t, etcdAuthUser, etcdAuthPassword)
	// startCluster's etcd has no users: the cluster is put together here, as it does.
	c := &testCluster{etcd: etcd, dbURL: storetest.PostgresURL(t), ca: filepath.Join(t.TempDir(), "ca")}
	relaytest.CommandOK(t, nil, "cert", "ca", "--out", c.ca)
	user := []string{"RELAY_CLUSTER_ETCD_USERNAME=" + etcdAuthUser, "RELAY_CLUSTER_ETCD_PASSWORD=" + etcdAuthPassword}
	a, b := c.node(t, "A", user...), c.node(t, "B", user...)
	a.waitMembers(t, 2, 10*time.Second)
	b.waitMembers(t, 2, 10*time.Second)

	t.Run("an emit on one node reaches a subscriber on the other", func(t *testing.T) {
		tsA, tsB := a.on(t), b.on(t)
		owner := tsA.Signup("alice@example.com")
		p := owner.CreateProject("etcd-auth")
		sub := tsB.DialWS(p.PublicKey)
		sub.Send(`{"action":"subscribe","channel":"room"}`)
		sub.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
		r := owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`)
		if r.Status != http.StatusOK || relaytest.Num(r.JSON, "subscriberCount") != 1 {
			t.Fatalf("emit on A: %d %s, want 200 and B's subscriber counted", r.Status, r.Raw)
		}
		sub.Expect(fmt.Sprintf(`{"channel":"room","payload":1,"seq":%d}`, int64(relaytest.Num(r.JSON, "seq"))))
	})

	// A node that etcd refuses exits before it serves, naming etcd and why.
	refused := func(t *testing.T, want string, env ...string) {
		t.Helper()
		base := append(c.nodeEnv(t, relaytest.FreeAddr(t)), "DATABASE_URL="+c.dbURL, "RELAY_CLUSTER_NAME=relaytest")
		code, out := relaytest.RunBinary(t, 20*time.Second, append(base, env...)...)
		if code == 0 || !strings.Contains(out, "RELAY_CLUSTER_ETCD") || !strings.Contains(out, want) {
			t.Fatalf("exit %d, want non-zero and %q in the output:\n%s", code, want, out)
		}
		if strings.Contains(out, "s3cret") || strings.Contains(out, "wrong-password") {
			t.Fatalf("a password in the output:\n%s", out)
		}
		t.Logf("refused: %s", lastLine(out))
	}

	// etcd's Authenticate refuses it as the node's etcd client is made
	// (clientv3.New, in JoinCluster), before the start probe.
	t.Run("wrong password refused", func(t *testing.T) {
		refused(t, "authentication failed, invalid user ID or password",
			"RELAY_CLUSTER_ETCD_USERNAME="+etcdAuthUser, "RELAY_CLUSTER_ETCD_PASSWORD=wrong-password")
	})

	t.Run("client certificate alone is no user", func(t *testing.T) {
		refused(t, "refuses this node (etcd authentication")
	})

	// Neither refused node registered.
	for _, n := range []*clusterNode{a, b} {
		if ms, err := n.members(t); err != nil || len(ms) != 2 {
			t.Errorf("%s sees %+v (%v), want the 2 nodes", n.name, ms, err)
		}
	}
}

// lastLine is out's last non-empty line.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
