package main

import (
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// The cluster settings (cmd/relay/README.md › Configuration): parsed here, checked
// together by clusterNeeds once every variable is read.

// etcdEndpoints reads comma-separated etcd client endpoints, each HOST:PORT,
// http://HOST:PORT or https://HOST:PORT (TLS: see clusterEtcdAccess).
func (p *envParser) etcdEndpoints(name string) []string {
	v, _ := p.get(name)
	var out []string
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		hostPort, scheme := e, ""
		if i := strings.Index(e, "://"); i >= 0 {
			scheme, hostPort = strings.ToLower(e[:i]), e[i+3:]
		}
		if scheme != "" && scheme != "http" && scheme != "https" {
			p.fail(name, e, "want HOST:PORT, http://HOST:PORT or https://HOST:PORT")
			continue
		}
		if !validHostPort(hostPort, false) {
			p.fail(name, e, "want HOST:PORT, http://HOST:PORT or https://HOST:PORT, comma-separated")
			continue
		}
		out = append(out, e)
	}
	if v != "" && len(out) == 0 && strings.Trim(v, ", ") == "" {
		p.fail(name, v, "no endpoint: want HOST:PORT, http://HOST:PORT or https://HOST:PORT, comma-separated")
	}
	return out
}

// clusterAddr reads the address the actor remote listens on and advertises to
// the other nodes: so a concrete host (not 0.0.0.0 or ::) and a port.
func (p *envParser) clusterAddr(name string) string {
	v, ok := p.get(name)
	if !ok {
		return ""
	}
	if !validHostPort(v, true) {
		p.fail(name, v, "want HOST:PORT that the other nodes can reach, for example 10.0.0.5:7946 (not 0.0.0.0, not port 0)")
		return ""
	}
	if host, _, _ := net.SplitHostPort(v); strings.Contains(host, ":") {
		// protoactor writes a member's address as host + ":" + port.
		p.fail(name, v, "an IPv6 address cannot be advertised to the other nodes: use an IPv4 address or a host name")
		return ""
	}
	return v
}

// clusterNameRe: the name is part of etcd keys and member ids, which
// protoactor splits on '/'.
var clusterNameRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func (p *envParser) clusterName(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if !clusterNameRe.MatchString(v) {
		p.fail(name, v, "want 1 to 64 letters, digits, '.', '_' or '-' (no '/')")
		return def
	}
	return v
}

// clusterNeeds checks the cluster settings against each other and the store:
// RELAY_CLUSTER_ADDR goes with RELAY_CLUSTER_ETCD, and a cluster shares one
// PostgreSQL database (on SQLite each node would have a store of its own).
func (p *envParser) clusterNeeds(c Config) {
	etcd, clustered := p.get("RELAY_CLUSTER_ETCD")
	addr, addrSet := p.get("RELAY_CLUSTER_ADDR")
	switch {
	case clustered && !addrSet:
		p.fail("RELAY_CLUSTER_ADDR", "", "required with RELAY_CLUSTER_ETCD: the HOST:PORT this node's actor remote listens on and advertises")
	case !clustered && addrSet:
		p.fail("RELAY_CLUSTER_ADDR", addr, "means nothing without RELAY_CLUSTER_ETCD (unset it to run one node)")
	}
	if clustered && strings.HasPrefix(c.DatabaseURL, "sqlite:") {
		p.fail("RELAY_CLUSTER_ETCD", etcd, "a cluster needs PostgreSQL: DATABASE_URL is SQLite, which each node would keep to itself; "+
			"give every node the same DATABASE_URL=postgres://…")
	}
}

// validHostPort: a non-empty host and a port 1–65535; concrete refuses the
// unspecified addresses, which cannot be advertised.
func validHostPort(v string, concrete bool) bool {
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" || strings.ContainsAny(host, " /") {
		return false
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return false
	}
	if ip, err := netip.ParseAddr(host); concrete && err == nil && ip.IsUnspecified() {
		return false
	}
	return true
}
