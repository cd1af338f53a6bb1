package main

import (
	"crypto/tls"
	"net"
	"os"
	"strings"
	"time"

	"github.com/relayhq/relay/actors/clustertls"
)

// The cluster's TLS settings (cmd/relay/README.md › Configuration): the actor
// remote's mutual TLS and the etcd client's TLS and user. Files are read and
// checked here, at start, so that a bad one stops the process naming its
// variable instead of failing the first handshake.

// Variables of the actor remote's mutual TLS.
const (
	clusterTLSCA   = "RELAY_CLUSTER_TLS_CA"
	clusterTLSCert = "RELAY_CLUSTER_TLS_CERT"
	clusterTLSKey  = "RELAY_CLUSTER_TLS_KEY"
	clusterInsec   = "RELAY_CLUSTER_INSECURE"
)

// Variables of the etcd client.
const (
	etcdCAVar   = "RELAY_CLUSTER_ETCD_CA"
	etcdCertVar = "RELAY_CLUSTER_ETCD_CERT"
	etcdKeyVar  = "RELAY_CLUSTER_ETCD_KEY"
	etcdUserVar = "RELAY_CLUSTER_ETCD_USERNAME"
	etcdPassVar = "RELAY_CLUSTER_ETCD_PASSWORD"
)

// clusterTLSVars are the variables that mean nothing on one node.
var clusterTLSVars = []string{clusterTLSCA, clusterTLSCert, clusterTLSKey, etcdCAVar, etcdCertVar, etcdKeyVar, etcdUserVar, etcdPassVar}

// clusterSecurity reads and loads the TLS settings into c. A cluster node
// needs the remote's three files, or RELAY_CLUSTER_INSECURE=true.
func (p *envParser) clusterSecurity(c *Config, now time.Time) {
	c.ClusterTLSCA, _ = p.get(clusterTLSCA)
	c.ClusterTLSCert, _ = p.get(clusterTLSCert)
	c.ClusterTLSKey, _ = p.get(clusterTLSKey)
	c.ClusterInsecure = p.oneOf(clusterInsec, "false", "true", "false") == "true"
	c.EtcdCA, _ = p.get(etcdCAVar)
	c.EtcdCert, _ = p.get(etcdCertVar)
	c.EtcdKey, _ = p.get(etcdKeyVar)
	c.EtcdUsername, _ = p.get(etcdUserVar)
	c.EtcdPassword, _ = p.get(etcdPassVar)

	if _, clustered := p.get("RELAY_CLUSTER_ETCD"); !clustered {
		for _, v := range append(clusterTLSVars, clusterInsec) {
			if val, set := p.get(v); set {
				p.fail(v, redactIf(v, val), "means nothing without RELAY_CLUSTER_ETCD (unset it to run one node)")
			}
		}
		return
	}
	p.remoteTLS(c, now)
	p.etcdAccess(c)
}

func redactIf(name, v string) string {
	if name == etcdPassVar {
		return "xxxxx"
	}
	return v
}

// remoteTLS loads the actor remote's credentials.
func (p *envParser) remoteTLS(c *Config, now time.Time) {
	files := map[string]string{clusterTLSCA: c.ClusterTLSCA, clusterTLSCert: c.ClusterTLSCert, clusterTLSKey: c.ClusterTLSKey}
	var missing []string
	for _, v := range []string{clusterTLSCA, clusterTLSCert, clusterTLSKey} {
		if files[v] == "" {
			missing = append(missing, v)
		}
	}
	if c.ClusterInsecure {
		if len(missing) < 3 {
			p.fail(clusterInsec, "true", "set together with RELAY_CLUSTER_TLS_*: choose TLS (unset "+clusterInsec+") or none")
		}
		return
	}
	if len(missing) > 0 {
		p.fail(missing[0], "", "a cluster node needs "+strings.Join([]string{clusterTLSCA, clusterTLSCert, clusterTLSKey}, ", ")+
			" (PEM files: the cluster CA, this node's certificate and key; make them with relay cert); missing: "+
			strings.Join(missing, ", ")+". "+clusterInsec+"=true runs without TLS, for loopback tests only")
		return
	}
	cas, err := clustertls.LoadCA(c.ClusterTLSCA)
	if err != nil {
		p.fail(clusterTLSCA, c.ClusterTLSCA, err.Error())
		return
	}
	if _, err := os.ReadFile(c.ClusterTLSKey); err != nil {
		p.fail(clusterTLSKey, c.ClusterTLSKey, err.Error())
		return
	}
	cert, err := clustertls.LoadNode(c.ClusterTLSCert, c.ClusterTLSKey, cas, now)
	if err != nil {
		p.fail(clusterTLSCert, c.ClusterTLSCert, err.Error()+" (key "+clusterTLSKey+"="+c.ClusterTLSKey+")")
		return
	}
	// The other nodes dial RELAY_CLUSTER_ADDR and check that the certificate
	// names its host: a certificate for another host would fail every peer.
	if host, _, err := net.SplitHostPort(c.ClusterAddr); err == nil && c.ClusterAddr != "" {
		if err := cert.Leaf.VerifyHostname(host); err != nil {
			p.fail(clusterTLSCert, c.ClusterTLSCert, "does not name RELAY_CLUSTER_ADDR's host "+host+
				", which the other nodes dial (relay cert node --addr "+c.ClusterAddr+")")
			return
		}
	}
	c.ClusterTLS = &clustertls.Credentials{CAs: cas, Cert: cert}
}

// together fails the one of variables a and b left empty when the other is
// set (why says more); false then.
func (p *envParser) together(a, va, b, vb, why string) bool {
	switch {
	case va == "" && vb != "":
		p.fail(a, "", "required with "+b+why)
	case vb == "" && va != "":
		p.fail(b, "", "required with "+a+why)
	default:
		return true
	}
	return false
}

// etcdAccess builds the etcd client's TLS (on with any of its files or an
// https:// endpoint) and checks the user settings.
func (p *envParser) etcdAccess(c *Config) {
	p.together(etcdUserVar, c.EtcdUsername, etcdPassVar, c.EtcdPassword, "")
	if !p.together(etcdCertVar, c.EtcdCert, etcdKeyVar, c.EtcdKey, ": a client certificate and its key go together") {
		return
	}
	https, plain := false, ""
	for _, e := range c.ClusterEtcd {
		lower := strings.ToLower(e)
		https = https || strings.HasPrefix(lower, "https://")
		if strings.HasPrefix(lower, "http://") {
			plain = e
		}
	}
	wantTLS := https || c.EtcdCA != "" || c.EtcdCert != ""
	if !wantTLS {
		return
	}
	if plain != "" {
		// The etcd client dials http:// endpoints without TLS whatever it is given.
		p.fail("RELAY_CLUSTER_ETCD", plain, "an http:// endpoint with TLS to etcd (https:// or "+etcdCAVar+"/"+etcdCertVar+"): use https:// or HOST:PORT")
		return
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12} // etcd 3.4 speaks TLS 1.2
	if c.EtcdCA != "" {
		cas, err := clustertls.LoadCA(c.EtcdCA)
		if err != nil {
			p.fail(etcdCAVar, c.EtcdCA, err.Error())
			return
		}
		cfg.RootCAs = cas
	}
	if c.EtcdCert != "" {
		pair, err := tls.LoadX509KeyPair(c.EtcdCert, c.EtcdKey)
		if err != nil {
			p.fail(etcdCertVar, c.EtcdCert, err.Error()+" (key "+etcdKeyVar+"="+c.EtcdKey+")")
			return
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	c.EtcdTLS = cfg
}
