package relaytest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/relayhq/relay/actors/clustertls"
)

// EnableAuth turns etcd's authentication on: user, with password, may read
// and write the keys under /relay/relaytest/ (the cluster suite's nodes'
// registrations) and no others; root, which etcd 3.4 requires before it turns
// authentication on, gets a password nobody knows. Nodes then need
// RELAY_CLUSTER_ETCD_USERNAME and _PASSWORD (user and password).
//
// etcd runs with --client-cert-auth, and etcd 3.4 then takes the client
// certificate's CommonName as the user of a request that carries no token
// (no password needed); a token, got with a user and password, wins over
// the CommonName, and a wrong password is refused whatever the certificate.
// Cert's CommonName is "relay": a user of that name would let in a node
// that has the certificate and no password. Name user otherwise to test
// the password (TestClusterEtcdAuth uses "relay-node").
func (e *Etcd) EnableAuth(t testing.TB, user, password string) {
	t.Helper()
	cli, err := e.adminClient()
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []struct {
		what string
		do   func() error
	}{
		{"add user root", func() error { _, err := cli.UserAdd(ctx, "root", rand.Text()); return err }},
		{"grant role root to root", func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err }},
		{"add role readwrite", func() error { _, err := cli.RoleAdd(ctx, "readwrite"); return err }},
		// What CLUSTER.md says a node needs: the keys under /relay/NAME/
		// (the suite's cluster name is relaytest), and no others.
		{"grant readwrite on /relay/relaytest/", func() error {
			_, err := cli.RoleGrantPermission(ctx, "readwrite", "/relay/relaytest/", clientv3.GetPrefixRangeEnd("/relay/relaytest/"),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"add user " + user, func() error { _, err := cli.UserAdd(ctx, user, password); return err }},
		{"grant role readwrite to " + user, func() error { _, err := cli.UserGrantRole(ctx, user, "readwrite"); return err }},
		{"enable authentication", func() error { _, err := cli.AuthEnable(ctx); return err }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("etcd auth: %s: %v", s.what, err)
		}
	}
}

// adminClient is a clientv3 client of this etcd with its client certificate and
// no user.
func (e *Etcd) adminClient() (*clientv3.Client, error) {
	pair, err := tls.LoadX509KeyPair(e.Cert, e.Key)
	if err != nil {
		return nil, err
	}
	roots, err := clustertls.LoadCA(e.CA)
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second,
		TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}})
}
