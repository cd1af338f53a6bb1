package clustertls

import (
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A node certificate names exactly the hosts asked for, serves and dials,
// and loads against its CA; LoadNode refuses one of another CA, an expired
// one and a mismatched key before any handshake would.
func TestNodeCertificates(t *testing.T) {
	now := time.Now()
	dir := t.TempDir()
	ca, err := NewCA("test CA", now)
	if err != nil {
		t.Fatal(err)
	}
	node, err := NewNode(ca, []string{"10.0.0.5", "relay-1.internal"}, now)
	if err != nil {
		t.Fatal(err)
	}
	cert, _, err := ParsePair(node)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.ParseIP("10.0.0.5")) ||
		len(cert.DNSNames) != 1 || cert.DNSNames[0] != "relay-1.internal" {
		t.Errorf("SANs: IPs %v, DNS %v", cert.IPAddresses, cert.DNSNames)
	}
	if cert.IsCA || !hasUsage(cert, x509.ExtKeyUsageServerAuth) || !hasUsage(cert, x509.ExtKeyUsageClientAuth) {
		t.Errorf("IsCA %v, extended key usage %v", cert.IsCA, cert.ExtKeyUsage)
	}
	if err := cert.VerifyHostname("10.0.0.6"); err == nil {
		t.Error("the certificate verifies for an address it does not name")
	}

	caFile := write(t, dir, "ca.pem", ca.CertPEM)
	cas, err := LoadCA(caFile)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := write(t, dir, "node.pem", node.CertPEM), write(t, dir, "node-key.pem", node.KeyPEM)
	if _, err := LoadNode(certFile, keyFile, cas, now); err != nil {
		t.Fatalf("LoadNode: %v", err)
	}
	if _, err := LoadNode(certFile, keyFile, cas, now.Add(NodeValidity+time.Hour)); err == nil || !strings.Contains(err.Error(), "not valid now") {
		t.Errorf("expired: %v", err)
	}
	other, _ := NewCA("other CA", now)
	otherCAs, err := LoadCA(write(t, dir, "other.pem", other.CertPEM))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadNode(certFile, keyFile, otherCAs, now); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("another CA: %v", err)
	}
	node2, _ := NewNode(ca, []string{"10.0.0.6"}, now)
	if _, err := LoadNode(certFile, write(t, dir, "other-key.pem", node2.KeyPEM), cas, now); err == nil {
		t.Error("a key of another certificate was accepted")
	}
	// A node certificate is not a CA: nothing can be signed with it.
	if _, err := LoadCA(certFile); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("LoadCA of a node certificate: %v", err)
	}
	if _, err := NewNode(node, []string{"x"}, now); err == nil {
		t.Error("NewNode signed with a node certificate")
	}
	// Two CAs in one file (a CA rotation): certificates of either load.
	both, err := LoadCA(write(t, dir, "both.pem", append(append([]byte{}, ca.CertPEM...), other.CertPEM...)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadNode(certFile, keyFile, both, now); err != nil {
		t.Errorf("with both CAs: %v", err)
	}
}
