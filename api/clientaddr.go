package api

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientAddr is the address of the client behind r: the one function that
// decides it, for every per-address limit and every log line that names a
// client (TRUSTED_PROXIES in cmd/relay/README.md › Configuration).
//
// The TCP peer is the client unless it is in trusted. From a trusted peer,
// X-Forwarded-For is read right to left (each proxy appends the address it
// received the request from), skipping trusted hops: the first untrusted
// address is the client. Everything left of it was written by the client
// itself and is ignored, so a client cannot choose its address by sending the
// header. When every hop is trusted, the leftmost is the client. An entry
// that is not an address ends the walk, as if the list began after it.
//
// Without trusted proxies X-Forwarded-For is never read: anyone can send it.
// The zero Addr means the peer address itself did not parse (not a TCP peer).
func clientAddr(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseHop(r.RemoteAddr)
	if !peer.IsValid() || !isTrusted(peer, trusted) {
		return peer
	}
	client := peer
	values := r.Header.Values("X-Forwarded-For") // several header lines are one list, in order
	for i := len(values) - 1; i >= 0; i-- {
		hops := strings.Split(values[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			hop := parseHop(hops[j])
			if !hop.IsValid() {
				return client
			}
			client = hop
			if !isTrusted(hop, trusted) {
				return client
			}
		}
	}
	return client // every hop trusted: the leftmost
}

// parseHop reads one address as proxies write it: 192.0.2.1, 2001:db8::1, or
// either with a port (192.0.2.1:80, [2001:db8::1]:80), in blanks. IPv4-mapped
// IPv6 addresses become IPv4, and zones are dropped, so one client has one
// spelling.
func parseHop(s string) netip.Addr {
	s = strings.TrimSpace(s)
	a, err := netip.ParseAddr(s)
	if err != nil {
		host, _, serr := net.SplitHostPort(s)
		if serr != nil {
			host = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		}
		if a, err = netip.ParseAddr(host); err != nil {
			return netip.Addr{}
		}
	}
	return a.WithZone("").Unmap()
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientAddr is the client address of r under this server's TRUSTED_PROXIES.
func (s *Server) clientAddr(r *http.Request) netip.Addr {
	return clientAddr(r, s.trustedProxies)
}

// addrForLog is a client address for a log line: the address, or r's raw
// peer when it did not parse.
func addrForLog(ip netip.Addr, r *http.Request) string {
	if ip.IsValid() {
		return ip.String()
	}
	return r.RemoteAddr
}
