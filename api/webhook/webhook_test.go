package webhook

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// receiver is a real HTTP endpoint that checks each request's signature in
// constant time and hands the decoded event to the test.
type receiver struct {
	*httptest.Server
	secret string
	events chan Event
	bad    atomic.Int64 // requests whose signature did not verify
	hold   chan struct{}
}

func newReceiver(t *testing.T, secret string, status int, hold chan struct{}) *receiver {
	t.Helper()
	r := &receiver{secret: secret, events: make(chan Event, 100), hold: hold}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if !hmac.Equal([]byte(req.Header.Get("X-Service-Signature")), []byte(Sign(r.secret, body))) ||
			req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			r.bad.Add(1)
		}
		var ev Event
		json.Unmarshal(body, &ev)
		r.events <- ev
		if r.hold != nil {
			<-r.hold
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

func waitStats(t *testing.T, d *Dispatcher, ok func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := d.Stats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never reached the expected state: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDeliverSignsAndSends(t *testing.T) {
	r := newReceiver(t, "whsec", http.StatusNoContent, nil)
	d := New(Config{AllowPrivate: true, Timeout: 2 * time.Second})
	defer d.Close(context.Background())
	code, reason := 4001, "bye"
	d.Deliver(Delivery{URL: r.URL, Secret: "whsec", Event: Event{Event: "disconnect", ProjectID: "p1", ConnectionID: "c1",
		Timestamp: "2026-11-23T10:00:00.000Z", DisconnectStatusCode: &code, DisconnectReason: &reason}})
	ev := <-r.events
	if ev.Event != "disconnect" || ev.ProjectID != "p1" || ev.ConnectionID != "c1" || *ev.DisconnectStatusCode != 4001 || *ev.DisconnectReason != "bye" {
		t.Fatalf("event %+v", ev)
	}
	waitStats(t, d, func(s Stats) bool { return s.Sent == 1 })
	if r.bad.Load() != 0 {
		t.Fatal("signature, method or content type wrong")
	}
}

func TestFullQueueDropsAndCounts(t *testing.T) {
	hold := make(chan struct{})
	r := newReceiver(t, "s", http.StatusOK, hold)
	d := New(Config{AllowPrivate: true, Workers: 1, QueueSize: 2, Timeout: 5 * time.Second})
	del := Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "p", ConnectionID: "c"}}
	d.Deliver(del)
	<-r.events // the only worker is now held inside the receiver
	start := time.Now()
	for range 10 {
		d.Deliver(del) // two fit in the queue, eight are dropped
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Deliver waited %v on a full queue", took)
	}
	if st := d.Stats(); st.Dropped != 8 {
		t.Fatalf("dropped %d, want 8", st.Dropped)
	}
	close(hold)
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats(); st.Sent != 3 || st.Dropped != 8 || st.Failed != 0 {
		t.Fatalf("stats %+v, want 3 sent and 8 dropped", st)
	}
	d.Deliver(del) // after Close: dropped, not a panic
	if st := d.Stats(); st.Dropped != 9 {
		t.Fatalf("a delivery after Close: %+v", st)
	}
}

func TestSlowReceiverTimesOutAndFailedStatusCounts(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	slow := newReceiver(t, "s", http.StatusOK, hold)
	d := New(Config{AllowPrivate: true, Timeout: 200 * time.Millisecond})
	defer d.Close(context.Background())
	start := time.Now()
	d.Deliver(Delivery{URL: slow.URL, Secret: "s", Event: Event{Event: "connect"}})
	waitStats(t, d, func(s Stats) bool { return s.Failed == 1 })
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the timeout took %v", took)
	}

	refusing := newReceiver(t, "s", http.StatusInternalServerError, nil)
	d.Deliver(Delivery{URL: refusing.URL, Secret: "s", Event: Event{Event: "connect"}})
	waitStats(t, d, func(s Stats) bool { return s.Failed == 2 && s.Sent == 0 })
}

func TestPrivateTargetsRefused(t *testing.T) {
	r := newReceiver(t, "s", http.StatusOK, nil)
	d := New(Config{Timeout: time.Second}) // AllowPrivate false: loopback is refused at dial time
	defer d.Close(context.Background())
	d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect"}})
	waitStats(t, d, func(s Stats) bool { return s.Refused == 1 })
	select {
	case ev := <-r.events:
		t.Fatalf("a private target received %+v", ev)
	default:
	}

	for _, c := range []struct {
		addr   string
		public bool
	}{
		{"127.0.0.1", false}, {"10.1.2.3", false}, {"172.16.0.1", false}, {"192.168.1.1", false},
		{"169.254.169.254", false}, {"0.0.0.0", false}, {"0.1.2.3", false}, {"100.64.0.1", false},
		{"100.127.255.255", false}, {"192.0.0.8", false}, {"198.18.0.1", false}, {"240.0.0.1", false},
		{"255.255.255.255", false}, {"224.0.0.1", false}, {"::1", false}, {"::", false}, {"fc00::1", false},
		{"fe80::1", false}, {"::ffff:10.0.0.1", false}, {"::ffff:127.0.0.1", false}, {"64:ff9b::a00:1", false},
		{"64:ff9b:1::1", false},
		{"93.184.216.34", true}, {"1.1.1.1", true}, {"100.63.255.255", true}, {"100.128.0.0", true},
		{"2606:4700:4700::1111", true}, {"::ffff:93.184.216.34", true},
	} {
		if got := publicAddr(netip.MustParseAddr(c.addr)); got != c.public {
			t.Errorf("publicAddr(%s) = %v, want %v", c.addr, got, c.public)
		}
		err := refusePrivate("tcp", netip.AddrPortFrom(netip.MustParseAddr(c.addr), 443).String(), nil)
		if (err == nil) != c.public {
			t.Errorf("refusePrivate(%s) = %v", c.addr, err)
		}
	}
}

func TestValidURL(t *testing.T) {
	for raw, want := range map[string]bool{
		"https://example.com/hook": true, "http://example.com:8080/x?y=1": true,
		"ftp://example.com": false, "javascript:alert(1)": false, "/relative": false, "https://": false,
		"https://user:pass@example.com/": false, "": false,
	} {
		if got := ValidURL(raw); got != want {
			t.Errorf("ValidURL(%q) = %v, want %v", raw, got, want)
		}
	}
}
