package clustertls

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"
)

// Credentials are what a node presents to its peers and what it trusts.
type Credentials struct {
	CAs  *x509.CertPool
	Cert tls.Certificate
}

// ServerConfig is the remote's listener: a peer must present a certificate
// the CA signed, or the handshake fails before any gRPC stream opens.
func (c *Credentials) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.Cert},
		ClientCAs:    c.CAs,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

// ClientConfig is for dialing a peer: it presents this node's certificate
// and checks that the peer's is the CA's and names the address dialed (gRPC
// sets ServerName from it), so a node's certificate serves only its own address.
func (c *Credentials) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.Cert},
		RootCAs:      c.CAs,
	}
}

// LoadCA reads a PEM file of CA certificates. It may hold several: during a
// CA rotation nodes trust the old CA and the new one.
func LoadCA(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if !cert.IsCA {
			return nil, fmt.Errorf("%s: %q is not a CA certificate", file, cert.Subject.CommonName)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no PEM CERTIFICATE block", file)
	}
	return pool, nil
}

// LoadNode reads a node's certificate and key and checks, against cas, what
// would otherwise fail only at the first handshake: that the CA signed it,
// that it is valid at now, and that it may serve and dial.
func LoadNode(certFile, keyFile string, cas *x509.CertPool, now time.Time) (tls.Certificate, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return tls.Certificate{}, err
		}
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: cas, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return tls.Certificate{}, fmt.Errorf("%s is not valid now (valid %s to %s)", certFile,
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	case err != nil:
		return tls.Certificate{}, fmt.Errorf("%s does not verify against the cluster CA: %w", certFile, err)
	}
	// Verify accepts any one of KeyUsages; a node needs both.
	if !hasUsage(leaf, x509.ExtKeyUsageServerAuth) || !hasUsage(leaf, x509.ExtKeyUsageClientAuth) {
		return tls.Certificate{}, fmt.Errorf("%s: a node certificate needs both server and client auth (make it with relay cert node)", certFile)
	}
	pair.Leaf = leaf
	return pair, nil
}

func hasUsage(c *x509.Certificate, u x509.ExtKeyUsage) bool {
	for _, have := range c.ExtKeyUsage {
		if have == u || have == x509.ExtKeyUsageAny {
			return true
		}
	}
	return false
}
