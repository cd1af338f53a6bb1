package api

import (
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

func prefixes(t *testing.T, cidrs ...string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, c := range cidrs {
		out = append(out, netip.MustParsePrefix(c))
	}
	return out
}

// TestClientAddr: the one function that names a client. Without trusted
// proxies, or from a peer that is not one, X-Forwarded-For is ignored
// whatever it says; from a trusted peer it is read right to left, skipping
// trusted hops, and whatever the client wrote itself (left of the first
// untrusted hop) never matters.
func TestClientAddr(t *testing.T) {
	proxies := prefixes(t, "10.0.0.0/8", "2001:db8:ffff::/48")
	cases := []struct {
		name    string
		trusted []netip.Prefix
		peer    string
		xff     []string // header lines, in order
		want    string
	}{
		{"no proxies, no header", nil, "198.51.100.7:5000", nil, "198.51.100.7"},
		{"no proxies: header ignored", nil, "198.51.100.7:5000", []string{"203.0.113.9"}, "198.51.100.7"},
		{"no proxies: a spoofed trusted-looking hop ignored", nil, "198.51.100.7:5000", []string{"10.0.0.1"}, "198.51.100.7"},
		{"untrusted peer: header ignored", proxies, "198.51.100.7:5000", []string{"203.0.113.9"}, "198.51.100.7"},
		{"untrusted peer claiming a chain of proxies", proxies, "198.51.100.7:5000", []string{"203.0.113.9, 10.0.0.2, 10.0.0.1"}, "198.51.100.7"},
		{"untrusted IPv6 peer", proxies, "[2001:db8:1::5]:5000", []string{"203.0.113.9"}, "2001:db8:1::5"},
		{"trusted peer, one hop", proxies, "10.1.2.3:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"trusted peer, no header: the peer", proxies, "10.1.2.3:5000", nil, "10.1.2.3"},
		{"trusted peer, empty header: the peer", proxies, "10.1.2.3:5000", []string{""}, "10.1.2.3"},
		{"client-written hops left of the real one are ignored", proxies, "10.1.2.3:5000", []string{"1.1.1.1, 2.2.2.2, 203.0.113.9"}, "203.0.113.9"},
		{"a client spoofing a trusted address is still the rightmost untrusted", proxies, "10.1.2.3:5000", []string{"10.9.9.9, 203.0.113.9"}, "203.0.113.9"},
		{"two proxies", proxies, "10.1.2.3:5000", []string{"203.0.113.9, 10.0.0.7"}, "203.0.113.9"},
		{"two proxies, spoof on the left", proxies, "10.1.2.3:5000", []string{"6.6.6.6, 203.0.113.9, 10.0.0.7"}, "203.0.113.9"},
		{"several header lines are one list", proxies, "10.1.2.3:5000", []string{"6.6.6.6", "203.0.113.9, 10.0.0.7"}, "203.0.113.9"},
		{"several header lines, the last one untrusted", proxies, "10.1.2.3:5000", []string{"6.6.6.6, 10.0.0.8", "203.0.113.9"}, "203.0.113.9"},
		{"every hop trusted: the leftmost", proxies, "10.1.2.3:5000", []string{"10.0.0.9, 10.0.0.7"}, "10.0.0.9"},
		{"garbage ends the walk at the last good hop", proxies, "10.1.2.3:5000", []string{"203.0.113.9, not-an-ip, 10.0.0.7"}, "10.0.0.7"},
		{"garbage right after the peer: the peer", proxies, "10.1.2.3:5000", []string{"203.0.113.9, <script>"}, "10.1.2.3"},
		{"empty element: the peer", proxies, "10.1.2.3:5000", []string{"203.0.113.9,"}, "10.1.2.3"},
		{"blanks", proxies, "10.1.2.3:5000", []string{"  203.0.113.9  ,\t10.0.0.7 "}, "203.0.113.9"},
		{"hop with a port", proxies, "10.1.2.3:5000", []string{"203.0.113.9:4711"}, "203.0.113.9"},
		{"IPv6 hop", proxies, "10.1.2.3:5000", []string{"2001:db8:1::9"}, "2001:db8:1::9"},
		{"IPv6 hop in brackets with a port", proxies, "10.1.2.3:5000", []string{"[2001:db8:1::9]:4711"}, "2001:db8:1::9"},
		{"IPv6 hop in brackets", proxies, "10.1.2.3:5000", []string{"[2001:db8:1::9]"}, "2001:db8:1::9"},
		{"IPv6 hop with a zone", proxies, "10.1.2.3:5000", []string{"fe80::1%eth0"}, "fe80::1"},
		{"IPv4-mapped hop is IPv4", proxies, "10.1.2.3:5000", []string{"::ffff:203.0.113.9"}, "203.0.113.9"},
		{"IPv4-mapped trusted peer", proxies, "[::ffff:10.1.2.3]:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"IPv6 trusted peer", proxies, "[2001:db8:ffff::1]:5000", []string{"203.0.113.9, 2001:db8:ffff::2"}, "203.0.113.9"},
		{"trusted loopback proxy", prefixes(t, "127.0.0.1/32"), "127.0.0.1:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"another loopback address is not that proxy", prefixes(t, "127.0.0.1/32"), "127.0.0.2:5000", []string{"203.0.113.9"}, "127.0.0.2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got := clientAddr(r, tc.trusted)
			if got.String() != tc.want {
				t.Fatalf("clientAddr = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestClientAddrBadPeer: a peer address that does not parse is no address,
// and then no header is read either.
func TestClientAddrBadPeer(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "@"
	r.Header.Set("X-Forwarded-For", "203.0.113.9")
	if got := clientAddr(r, prefixes(t, "0.0.0.0/0", "::/0")); got.IsValid() {
		t.Fatalf("clientAddr = %s, want none", got)
	}
	if k := addrKey(netip.Addr{}); k != "addr:?" {
		t.Fatalf("addrKey of no address = %q", k)
	}
}

// TestAddrKey: an IPv4 address counts alone, an IPv6 address by its /64.
func TestAddrKey(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.9":             "ip:203.0.113.9",
		"2001:db8:1:2::1":         "ip:2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::ffff": "ip:2001:db8:1:2::/64",
		"2001:db8:1:3::1":         "ip:2001:db8:1:3::/64",
	} {
		if got := addrKey(netip.MustParseAddr(in)); got != want {
			t.Errorf("addrKey(%s) = %q, want %q", in, got, want)
		}
	}
}

// TestLoginDelay: nothing within the budget, then doubling from
// loginDelayBase up to loginDelayMax, and the most for an untracked email.
func TestLoginDelay(t *testing.T) {
	const limit = 10
	want := map[int]time.Duration{
		1: 0, 10: 0,
		11: 250 * time.Millisecond, 12: 500 * time.Millisecond, 13: time.Second,
		14: 2 * time.Second, 15: 4 * time.Second, 16: 4 * time.Second, 1000: 4 * time.Second,
		untracked: loginDelayMax,
	}
	for n, d := range want {
		if got := loginDelay(n, limit); got != d {
			t.Errorf("loginDelay(%d, %d) = %v, want %v", n, limit, got, d)
		}
	}
	if got := loginDelay(untracked, 0); got != 0 {
		t.Errorf("no budget configured: delay %v", got)
	}
}

// TestThrottleCount: count never refuses; past a full map a new key is
// untracked, and a failOpen throttle lets a new key through untracked.
func TestThrottleCount(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	restore := SetThrottleMaxKeysForTest(2)
	th := newThrottle(3, clock)
	open := newThrottle(1, clock)
	open.failOpen = true
	restore()

	for i := 1; i <= 5; i++ {
		if n := th.count("a"); n != i {
			t.Fatalf("count %d = %d", i, n)
		}
	}
	th.refund("a")
	if n := th.count("a"); n != 5 {
		t.Fatalf("after a refund: %d, want 5", n)
	}
	th.count("b")
	if n := th.count("c"); n != untracked {
		t.Fatalf("a new key in a full map: %d, want untracked", n)
	}
	now = now.Add(time.Minute)
	if n := th.count("c"); n != 1 {
		t.Fatalf("after the window: %d, want 1", n)
	}

	if ok, _ := open.take("x"); !ok {
		t.Fatal("first take refused")
	}
	if ok, _ := open.take("x"); ok {
		t.Fatal("second take of a budget of 1 allowed")
	}
	open.take("y")
	for range 3 {
		if ok, _ := open.take("z"); !ok {
			t.Fatal("failOpen refused a new key in a full map")
		}
	}
	if ok, _ := open.take("x"); ok {
		t.Fatal("a live counter was forgotten")
	}
}
