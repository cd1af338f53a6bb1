package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/actors/clustertls"
)

// certDirs runs relay cert as an operator would: a CA in dir/ca and a
// node certificate for addr in dir/NAME.
func certDirs(t *testing.T, dir, addr string, names ...string) (ca string, nodes []string) {
	t.Helper()
	ca = filepath.Join(dir, "ca")
	if err := runCert([]string{"ca", "--out", ca}, &bytes.Buffer{}, &bytes.Buffer{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		out := filepath.Join(dir, n)
		if err := runCert([]string{"node", "--ca", ca, "--addr", addr, "--out", out}, &bytes.Buffer{}, &bytes.Buffer{}, time.Now()); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, out)
	}
	return ca, nodes
}

// relay cert ca and node write what a node loads; keys are 0600; nothing
// is overwritten; a bad command line exits 2.
func TestCertCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca")
	var out bytes.Buffer
	if err := runCommandTo(context.Background(), []string{"cert", "ca", "--out", ca}, cfgEnv(nil), &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), filepath.Join(ca, "ca-key.pem")) {
		t.Errorf("output %q does not name the key it wrote", out.String())
	}
	for name, mode := range map[string]os.FileMode{"ca.pem": 0o644, "ca-key.pem": 0o600} {
		st, err := os.Stat(filepath.Join(ca, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", name, st.Mode().Perm(), mode)
		}
	}
	key, _ := os.ReadFile(filepath.Join(ca, "ca-key.pem"))
	err := runCommandTo(context.Background(), []string{"cert", "ca", "--out", ca}, cfgEnv(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second relay cert ca into the same directory: %v", err)
	}
	if again, _ := os.ReadFile(filepath.Join(ca, "ca-key.pem")); !bytes.Equal(again, key) {
		t.Fatal("the CA key was overwritten")
	}

	node := filepath.Join(dir, "n1")
	args := []string{"cert", "node", "--ca", ca, "--addr", "10.0.0.5:7946", "--host", "relay-1.internal", "--out", node}
	if err := runCommandTo(context.Background(), args, cfgEnv(nil), &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(node, "node-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("node-key.pem: %v %v", st, err)
	}
	cas, err := clustertls.LoadCA(filepath.Join(ca, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := clustertls.LoadNode(filepath.Join(node, "node.pem"), filepath.Join(node, "node-key.pem"), cas, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"10.0.0.5", "relay-1.internal"} {
		if err := cert.Leaf.VerifyHostname(h); err != nil {
			t.Errorf("the node certificate does not name %s: %v", h, err)
		}
	}
	for _, h := range []string{"127.0.0.1", "localhost", "10.0.0.6"} {
		if cert.Leaf.VerifyHostname(h) == nil {
			t.Errorf("the node certificate names %s, which was not asked for", h)
		}
	}
	if err := runCommandTo(context.Background(), args, cfgEnv(nil), &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("a second relay cert node into the same directory overwrote it")
	}

	for _, bad := range [][]string{
		{"cert"}, {"cert", "bogus"}, {"cert", "ca"},
		{"cert", "node", "--ca", ca, "--out", node + "x"},
		{"cert", "node", "--ca", ca, "--addr", "0.0.0.0:7946", "--out", node + "x"},
		{"cert", "node", "--ca", ca, "--addr", "10.0.0.5", "--out", node + "x"},
	} {
		err := runCommandTo(context.Background(), bad, cfgEnv(nil), &bytes.Buffer{}, &bytes.Buffer{})
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("%q: %v, want a usage error (exit 2)", bad, err)
		}
	}
	// A node certificate cannot sign another.
	err = runCommandTo(context.Background(), []string{"cert", "node", "--ca", node, "--addr", "10.0.0.7:1", "--out", node + "y"},
		cfgEnv(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("relay cert node signed with a node's certificate")
	}
}

// TestLoadConfigClusterTLS: a cluster node needs the remote's three files
// (or RELAY_CLUSTER_INSECURE=true); a bad file stops it naming the variable.
func TestLoadConfigClusterTLS(t *testing.T) {
	t.Parallel()
	const pg = "postgres://u:p@db.internal:5432/relay?sslmode=disable"
	dir := t.TempDir()
	ca, nodes := certDirs(t, dir, "10.0.0.5:7946", "n1")
	otherCA, others := certDirs(t, filepath.Join(dir, "other"), "10.0.0.5:7946", "n1")
	_, elsewhere := certDirs(t, filepath.Join(dir, "elsewhere"), "10.0.0.9:7946", "n1")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster := func(extra map[string]string) map[string]string {
		v := map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "e1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946",
			"RELAY_CLUSTER_TLS_CA": filepath.Join(ca, "ca.pem"), "RELAY_CLUSTER_TLS_CERT": filepath.Join(nodes[0], "node.pem"),
			"RELAY_CLUSTER_TLS_KEY": filepath.Join(nodes[0], "node-key.pem")}
		for k, x := range extra {
			if x == "-" {
				delete(v, k)
			} else {
				v[k] = x
			}
		}
		return v
	}

	c, err := LoadConfig(cfgEnv(cluster(nil)))
	if err != nil {
		t.Fatal(err)
	}
	if c.ClusterTLS == nil || c.ClusterInsecure || c.EtcdTLS != nil {
		t.Fatalf("TLS %v, insecure %v, etcd TLS %v", c.ClusterTLS, c.ClusterInsecure, c.EtcdTLS)
	}
	c, err = LoadConfig(cfgEnv(cluster(map[string]string{"RELAY_CLUSTER_TLS_CA": "-", "RELAY_CLUSTER_TLS_CERT": "-", "RELAY_CLUSTER_TLS_KEY": "-",
		"RELAY_CLUSTER_INSECURE": "true"})))
	if err != nil || c.ClusterTLS != nil || !c.ClusterInsecure {
		t.Fatalf("insecure: %v, TLS %v", err, c.ClusterTLS)
	}
	c, err = LoadConfig(cfgEnv(cluster(map[string]string{"RELAY_CLUSTER_ETCD": "https://e1:2379,e2:2379",
		"RELAY_CLUSTER_ETCD_CA": filepath.Join(otherCA, "ca.pem"), "RELAY_CLUSTER_ETCD_CERT": filepath.Join(others[0], "node.pem"),
		"RELAY_CLUSTER_ETCD_KEY": filepath.Join(others[0], "node-key.pem"), "RELAY_CLUSTER_ETCD_USERNAME": "relay",
		"RELAY_CLUSTER_ETCD_PASSWORD": "s3cret-etcd"})))
	if err != nil {
		t.Fatal(err)
	}
	if c.EtcdTLS == nil || c.EtcdTLS.RootCAs == nil || len(c.EtcdTLS.Certificates) != 1 || c.EtcdUsername != "relay" || c.EtcdPassword != "s3cret-etcd" {
		t.Fatalf("etcd: TLS %+v, user %q", c.EtcdTLS, c.EtcdUsername)
	}
	if c, err = LoadConfig(cfgEnv(cluster(map[string]string{"RELAY_CLUSTER_ETCD": "https://e1:2379"}))); err != nil || c.EtcdTLS == nil {
		t.Fatalf("https:// alone (the system's roots): %v, TLS %v", err, c.EtcdTLS)
	}

	for _, tc := range []struct {
		why   string
		vars  map[string]string
		names []string
		says  string
	}{
		{"no TLS", cluster(map[string]string{"RELAY_CLUSTER_TLS_CA": "-", "RELAY_CLUSTER_TLS_CERT": "-", "RELAY_CLUSTER_TLS_KEY": "-"}),
			[]string{"RELAY_CLUSTER_TLS_CA", "RELAY_CLUSTER_TLS_CERT", "RELAY_CLUSTER_TLS_KEY", "RELAY_CLUSTER_INSECURE"}, "needs"},
		{"no key", cluster(map[string]string{"RELAY_CLUSTER_TLS_KEY": "-"}), []string{"RELAY_CLUSTER_TLS_KEY"}, "missing"},
		{"CA file missing", cluster(map[string]string{"RELAY_CLUSTER_TLS_CA": filepath.Join(dir, "nope.pem")}),
			[]string{"RELAY_CLUSTER_TLS_CA"}, "no such file"},
		{"CA file not PEM", cluster(map[string]string{"RELAY_CLUSTER_TLS_CA": garbage}), []string{"RELAY_CLUSTER_TLS_CA"}, "no PEM"},
		{"CA file a node certificate", cluster(map[string]string{"RELAY_CLUSTER_TLS_CA": filepath.Join(nodes[0], "node.pem")}),
			[]string{"RELAY_CLUSTER_TLS_CA"}, "not a CA"},
		{"key file missing", cluster(map[string]string{"RELAY_CLUSTER_TLS_KEY": filepath.Join(dir, "nope-key.pem")}),
			[]string{"RELAY_CLUSTER_TLS_KEY"}, "no such file"},
		{"key of another certificate", cluster(map[string]string{"RELAY_CLUSTER_TLS_KEY": filepath.Join(others[0], "node-key.pem")}),
			[]string{"RELAY_CLUSTER_TLS_CERT"}, "private key does not match"},
		{"certificate of another CA", cluster(map[string]string{"RELAY_CLUSTER_TLS_CERT": filepath.Join(others[0], "node.pem"),
			"RELAY_CLUSTER_TLS_KEY": filepath.Join(others[0], "node-key.pem")}), []string{"RELAY_CLUSTER_TLS_CERT"}, "does not verify"},
		{"certificate for another host", cluster(map[string]string{"RELAY_CLUSTER_TLS_CA": filepath.Join(dir, "elsewhere", "ca", "ca.pem"),
			"RELAY_CLUSTER_TLS_CERT": filepath.Join(elsewhere[0], "node.pem"), "RELAY_CLUSTER_TLS_KEY": filepath.Join(elsewhere[0], "node-key.pem")}),
			[]string{"RELAY_CLUSTER_TLS_CERT", "RELAY_CLUSTER_ADDR"}, "does not name"},
		{"insecure with files", cluster(map[string]string{"RELAY_CLUSTER_INSECURE": "true"}), []string{"RELAY_CLUSTER_INSECURE"}, "choose"},
		{"insecure not a boolean", cluster(map[string]string{"RELAY_CLUSTER_INSECURE": "yes"}), []string{"RELAY_CLUSTER_INSECURE"}, "true"},
		{"TLS on one node", map[string]string{"RELAY_CLUSTER_TLS_CA": filepath.Join(ca, "ca.pem"), "RELAY_CLUSTER_INSECURE": "true"},
			[]string{"RELAY_CLUSTER_TLS_CA", "RELAY_CLUSTER_INSECURE"}, "without RELAY_CLUSTER_ETCD"},
		{"etcd CA not PEM", cluster(map[string]string{"RELAY_CLUSTER_ETCD_CA": garbage}), []string{"RELAY_CLUSTER_ETCD_CA"}, "no PEM"},
		{"etcd certificate without key", cluster(map[string]string{"RELAY_CLUSTER_ETCD_CERT": filepath.Join(others[0], "node.pem")}),
			[]string{"RELAY_CLUSTER_ETCD_KEY"}, "go together"},
		{"etcd key not PEM", cluster(map[string]string{"RELAY_CLUSTER_ETCD_CERT": filepath.Join(others[0], "node.pem"), "RELAY_CLUSTER_ETCD_KEY": garbage}),
			[]string{"RELAY_CLUSTER_ETCD_CERT", "RELAY_CLUSTER_ETCD_KEY"}, "PEM"},
		{"http:// with TLS to etcd", cluster(map[string]string{"RELAY_CLUSTER_ETCD": "http://e1:2379", "RELAY_CLUSTER_ETCD_CA": filepath.Join(ca, "ca.pem")}),
			[]string{"RELAY_CLUSTER_ETCD"}, "http:// endpoint"},
		{"etcd password without user", cluster(map[string]string{"RELAY_CLUSTER_ETCD_PASSWORD": "s3cret-etcd"}),
			[]string{"RELAY_CLUSTER_ETCD_USERNAME"}, "required"},
		{"etcd user without password", cluster(map[string]string{"RELAY_CLUSTER_ETCD_USERNAME": "relay"}),
			[]string{"RELAY_CLUSTER_ETCD_PASSWORD"}, "required"},
		{"etcd password on one node", map[string]string{"RELAY_CLUSTER_ETCD_PASSWORD": "s3cret-etcd"},
			[]string{"RELAY_CLUSTER_ETCD_PASSWORD"}, "without RELAY_CLUSTER_ETCD"},
	} {
		t.Run(tc.why, func(t *testing.T) {
			_, err := LoadConfig(cfgEnv(tc.vars))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, n := range append(tc.names, tc.says) {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not say %s", err, n)
				}
			}
			if strings.Contains(err.Error(), "s3cret-etcd") {
				t.Errorf("error %q shows the etcd password", err)
			}
		})
	}
	// relay serve stops at start, before touching the database.
	serveRefused(t, map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "127.0.0.1:7946"},
		"RELAY_CLUSTER_TLS_CA", "RELAY_CLUSTER_INSECURE")
}
