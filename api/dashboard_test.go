package api

import (
	"go/parser"
	"go/token"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/store"
)

func TestDashboardPagesParsed(t *testing.T) {
	for _, name := range []string{"login", "signup", "home", "project", "confirm", "usage", "error"} {
		if pages[name] == nil {
			t.Errorf("page %q not parsed", name)
		}
	}
}

func TestGroupDigits(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45678: "-45,678"} {
		if got := groupDigits(n); got != want {
			t.Errorf("groupDigits(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for n, want := range map[int64]int64{-1: 1, 0: 1, 1: 1, 7: 7, 10: 10, 11: 12, 13: 15, 61: 80, 81: 100, 2048: 2500, 1234567: 1500000} {
		if got := niceCeil(n); got != want {
			t.Errorf("niceCeil(%d) = %d, want %d", n, got, want)
		}
	}
	for n := int64(1); n < 100000; n += 7 {
		if c := niceCeil(n); c < n || float64(n)/float64(c) < 0.75 && n > 10 {
			t.Fatalf("niceCeil(%d) = %d", n, c)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	for _, tc := range []struct {
		origin, referer, forwarded string
		ok                         bool
	}{
		{"https://relay.example.com", "", "relay.example.com", true},
		{"https://relay.example.com", "", "relay.example.com, 10.0.0.1", true},
		{"https://evil.example.com", "", "relay.example.com", false},
		{"", "", "", true},
		{"http://relay.test:8080", "", "", true},
		{"HTTP://RELAY.TEST:8080", "", "", true},
		{"http://relay.test", "", "", false}, // another port is another origin
		{"https://evil.test", "http://relay.test:8080/", "", false},
		{"null", "", "", false},
		{"", "http://relay.test:8080/projects/x", "", true},
		{"", "http://evil.test/relay.test:8080", "", false},
		{"", "not a url", "", false},
	} {
		r := httptest.NewRequest("POST", "http://relay.test:8080/logout", nil)
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.referer != "" {
			r.Header.Set("Referer", tc.referer)
		}
		if tc.forwarded != "" {
			r.Header.Set("X-Forwarded-Host", tc.forwarded)
		}
		if got := sameOrigin(r); got != tc.ok {
			t.Errorf("Origin %q Referer %q: %v, want %v", tc.origin, tc.referer, got, tc.ok)
		}
	}
}

func TestUsageChartGeometry(t *testing.T) {
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newUsageChart(from, []store.Usage{
		{Day: "2026-01-01", MessageCount: 100, ConnectionCount: 0},
		{Day: "2026-01-30", MessageCount: 40, ConnectionCount: 3},
		{Day: "2026-01-31", MessageCount: 1}, // outside the 30 days: skipped
	})
	if len(c.Panels) != 2 {
		t.Fatalf("%d panels", len(c.Panels))
	}
	x := func(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f }
	msgs := c.Panels[0]
	if len(msgs.Bars) != 2 || msgs.Bars[0].H != "120.0" || msgs.Bars[1].H != "48.0" || x(msgs.Bars[0].X) >= x(msgs.Bars[1].X) {
		t.Fatalf("message bars %+v", msgs.Bars)
	}
	if conns := c.Panels[1]; conns.Bars[0].H != "0.0" || conns.Bars[1].H != "120.0" || conns.Top <= msgs.Bottom {
		t.Fatalf("connection panel %+v", conns)
	}
}

func TestRequestOrigin(t *testing.T) {
	for _, tc := range []struct {
		url, proto, host, want string
	}{
		{"http://relay.test:8080/projects/x", "", "", "http://relay.test:8080"},
		{"https://relay.test/projects/x", "", "", "https://relay.test"}, // TLS
		{"http://10.0.0.5:8080/projects/x", "https", "relay.example.com", "https://relay.example.com"},
		{"http://10.0.0.5:8080/projects/x", "HTTPS, http", "relay.example.com, 10.0.0.5", "https://relay.example.com"},
		{"http://10.0.0.5:8080/projects/x", "http", "", "http://10.0.0.5:8080"},
		{"http://relay.test/projects/x", "", "evil.test/path", "http://relay.test"},
		{"http://relay.test/projects/x", "", "a'b", "http://relay.test"},
		{"http://[::1]:8080/projects/x", "", "", "http://[::1]:8080"},
	} {
		r := httptest.NewRequest("GET", tc.url, nil)
		if tc.proto != "" {
			r.Header.Set("X-Forwarded-Proto", tc.proto)
		}
		if tc.host != "" {
			r.Header.Set("X-Forwarded-Host", tc.host)
		}
		if got := requestOrigin(r); got != tc.want {
			t.Errorf("%s (proto %q, host %q): %q, want %q", tc.url, tc.proto, tc.host, got, tc.want)
		}
	}
}

// TestSnippets: the project page's code with raw keys and with placeholders;
// the Go one is a Go file.
func TestSnippets(t *testing.T) {
	active := store.APIKey{KeyType: "secret", KeyPrefix: "sk_live_abcd************"}
	for _, tc := range []struct {
		name    string
		newKeys []newKey
		public  string
		secret  string
		hint    []string
	}{
		{"both raw", []newKey{{"public", "pk_live_PUB"}, {"secret", "sk_live_SEC"}}, "pk_live_PUB", "sk_live_SEC", nil},
		{"none raw", nil, "<your public key>", "<your secret key>", []string{"<your public key>: your public key;", "<your secret key>: your secret key (sk_live_abcd…)"}},
		{"public raw", []newKey{{"public", "pk_live_PUB"}}, "pk_live_PUB", "<your secret key>", []string{"placeholders: <your secret key>: your secret key (sk_live_abcd…)."}},
	} {
		pv := &projectView{NewKeys: tc.newKeys}
		pv.fillSnippets("https://relay.example.com", []store.APIKey{active}, time.Now())
		text := map[string]string{}
		for _, s := range pv.Snippets {
			text[s.ID] = s.Text
		}
		for id, want := range map[string]string{
			"snippet-browser": `new Relay({ url: "https://relay.example.com", publicKey: "` + tc.public + `" })`,
			"snippet-curl":    `-H 'Authorization: Bearer ` + tc.secret + `'`,
			"snippet-go":      `"` + tc.secret + `", "demo", map[string]any{"text": "hello"})`,
		} {
			if !strings.Contains(text[id], want) {
				t.Errorf("%s: %s lacks %q:\n%s", tc.name, id, want, text[id])
			}
		}
		if _, err := parser.ParseFile(token.NewFileSet(), "snippet.go", text["snippet-go"], 0); err != nil {
			t.Errorf("%s: the Go snippet does not parse: %v", tc.name, err)
		}
		if (pv.KeyHint == "") != (tc.hint == nil) {
			t.Errorf("%s: key hint %q", tc.name, pv.KeyHint)
		}
		for _, h := range tc.hint {
			if !strings.Contains(pv.KeyHint, h) {
				t.Errorf("%s: key hint %q lacks %q", tc.name, pv.KeyHint, h)
			}
		}
	}
}

// TestViaHTTPS: the first hop of X-Forwarded-Proto decides (a chain of
// proxies appends), as a TLS connection does; the cookie's Secure flag and
// the snippets' scheme both ask it.
func TestViaHTTPS(t *testing.T) {
	for proto, want := range map[string]bool{
		"": false, "http": false, "https": true, "HTTPS": true, " https ": true, "https, http": true, "http, https": false,
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if proto != "" {
			r.Header.Set("X-Forwarded-Proto", proto)
		}
		if got := viaHTTPS(r); got != want {
			t.Errorf("X-Forwarded-Proto %q: viaHTTPS %v, want %v", proto, got, want)
		}
	}
	r := httptest.NewRequest("GET", "https://example.com/", nil) // TLS
	if !viaHTTPS(r) {
		t.Error("a TLS request is not HTTPS")
	}
}
