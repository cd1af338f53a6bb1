package relaytest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

// NewCA makes a cluster CA with `relay cert ca`, as an operator would, and
// returns its directory (ca.pem, ca-key.pem).
func NewCA(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ca")
	CommandOK(t, nil, "cert", "ca", "--out", dir)
	return dir
}

// NodeCert makes a node certificate of the CA in caDir for addr with `relay
// cert node` and loads it.
func NodeCert(t testing.TB, caDir, addr string) tls.Certificate {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "node")
	CommandOK(t, nil, "cert", "node", "--ca", caDir, "--addr", addr, "--out", dir)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// CertPool is the certificates of the PEM file at path, as a pool to trust.
func CertPool(t testing.TB, path string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("no certificate in %s", path)
	}
	return pool
}
