package api

import (
	"net/http/httptest"
	"strconv"
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
