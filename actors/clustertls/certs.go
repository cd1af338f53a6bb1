package clustertls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Validity of what New* make. A CA outlives several rounds of node
// certificates, so that node certificates can be rotated without a new CA.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	NodeValidity = 2 * 365 * 24 * time.Hour
	// backdate absorbs clock skew between the node that signs and the
	// nodes that verify.
	backdate = time.Hour
)

// Pair is a certificate and its private key, PEM-encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed cluster CA (ECDSA P-256) named commonName.
func NewCA(commonName string, now time.Time) (Pair, error) {
	return issue(&x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// The CA signs node certificates only, never another CA.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}, now, CAValidity, nil, nil)
}

// NewNode makes a node certificate for hosts (IP addresses or DNS names),
// signed by ca, good both as a gRPC server's and as a client's: every node
// serves its remote and dials the others' with the same certificate.
func NewNode(ca Pair, hosts []string, now time.Time) (Pair, error) {
	if len(hosts) == 0 {
		return Pair{}, errors.New("no host: a node certificate names the address the other nodes dial")
	}
	caCert, caKey, err := ParsePair(ca)
	if err != nil {
		return Pair{}, fmt.Errorf("CA: %w", err)
	}
	if !caCert.IsCA {
		return Pair{}, errors.New("CA: the certificate is not a CA's")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return issue(tmpl, now, NodeValidity, caCert, caKey)
}

// issue makes a new key and its certificate from tmpl, valid from a little
// before now for validity (never past its issuer's end), signed by parent
// and parentKey, or by itself when parent is nil.
func issue(tmpl *x509.Certificate, now time.Time, validity time.Duration, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	// Random, 128 bits: unique without a counter to keep.
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128)); err != nil {
		return Pair{}, err
	}
	tmpl.Subject.Organization = []string{"Relay cluster"}
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-backdate), now.Add(validity)
	if parent == nil {
		parent, parentKey = tmpl, key
	} else if tmpl.NotAfter.After(parent.NotAfter) {
		tmpl.NotAfter = parent.NotAfter // a certificate cannot outlive its issuer
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return Pair{}, err
	}
	return encode(der, key)
}

// ParsePair decodes a PEM certificate and its ECDSA key (as NewCA writes them).
func ParsePair(p Pair) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(p.CertPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, errors.New("no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	kb, _ := pem.Decode(p.KeyPEM)
	if kb == nil {
		return nil, nil, errors.New("no PEM key block")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("key: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, errors.New("the key does not match the certificate")
	}
	return cert, key, nil
}

func encode(der []byte, key *ecdsa.PrivateKey) (Pair, error) {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	}, nil
}
