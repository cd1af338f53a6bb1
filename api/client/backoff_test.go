package client

import (
	"testing"
	"time"
)

func TestBackoffBoundsAndCap(t *testing.T) {
	max := 30 * time.Second
	for attempt, base := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		lo, hi := Backoff(attempt, max, 0), Backoff(attempt, max, 0.999999)
		if lo != base/2 {
			t.Errorf("attempt %d: lowest %v, want %v", attempt, lo, base/2)
		}
		if want := time.Duration(float64(base) * 1.499999); hi < want-time.Millisecond || hi >= base*3/2 {
			t.Errorf("attempt %d: highest %v, want just under %v", attempt, hi, base*3/2)
		}
		if mid := Backoff(attempt, max, 0.5); mid != base {
			t.Errorf("attempt %d: middle %v, want %v", attempt, mid, base)
		}
	}
	if d := Backoff(100, 5*time.Second, 0.5); d != 5*time.Second {
		t.Errorf("a huge attempt number: %v, want the cap", d)
	}
}

func TestWSURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8080":     "ws://127.0.0.1:8080/ws?publicKey=pk",
		"https://relay.example/":    "wss://relay.example/ws?publicKey=pk",
		"ws://127.0.0.1:8080/ws":    "ws://127.0.0.1:8080/ws?publicKey=pk",
		"wss://relay.example/ws?x=": "wss://relay.example/ws?publicKey=pk&x=",
	} {
		if got, err := wsURL(in, "pk"); err != nil || got != want {
			t.Errorf("wsURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
