package webhook

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
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
	return waitUntil(t, "stats", d.Stats, ok)
}

// waitUntil polls get until ok holds (10 s at most) and returns what it
// last saw: the dispatcher's workers change it with no event to wait on.
func waitUntil[T any](t *testing.T, what string, get func() T, ok func(T) bool) T {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := get()
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached the expected state: %+v", what, v)
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
	d := New(Config{AllowPrivate: true, Timeout: 200 * time.Millisecond, MaxAttempts: 1}) // no retry
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

// TestHangingProjectDelaysNobody: project A's receiver never answers and A
// queues far more than it may; B's events still go out at once, A holds no
// more than its in-flight bound, and A's overflow is dropped and counted as
// A's, never B's.
func TestHangingProjectDelaysNobody(t *testing.T) {
	hang := make(chan struct{})
	a := newReceiver(t, "a", http.StatusOK, hang)
	b := newReceiver(t, "b", http.StatusOK, nil)
	d := New(Config{AllowPrivate: true, Workers: 4, ProjectQueue: 50, ProjectInFlight: 2, Timeout: 30 * time.Second})
	defer d.Close(context.Background())
	defer close(hang) // first: A's receiver answers, so Close can drain
	deliverA := func(i int) {
		d.Deliver(Delivery{URL: a.URL + "?token=abc", Secret: "a", Event: Event{Event: "connect", ProjectID: "A", ConnectionID: fmt.Sprint(i)}})
	}
	deliverA(0)
	deliverA(1)
	<-a.events
	<-a.events // both of A's deliveries are now held
	for i := 2; i < 500; i++ {
		deliverA(i) // 50 queue, 448 are dropped
	}
	for i := range 20 {
		start := time.Now()
		d.Deliver(Delivery{URL: b.URL, Secret: "b", Event: Event{Event: "connect", ProjectID: "B", ConnectionID: fmt.Sprint(i)}})
		select {
		case <-b.events:
		case <-time.After(time.Second):
			t.Fatalf("B's event %d not delivered within 1s behind A's hanging receiver", i)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("B's event %d took %v", i, took)
		}
	}
	st := waitStats(t, d, func(s Stats) bool { return s.Sent == 20 })
	if st.InFlight != 2 || st.Queued != 50 || st.ProjectsQueued != 1 || st.ProjectsFull != 1 ||
		st.DroppedBy[DropProjectQueueFull] != 448 || st.DroppedBy[DropQueueFull] != 0 || st.Dropped != 448 || st.ProjectOverflows != 1 {
		t.Fatalf("stats %+v", st)
	}
	select {
	case ev := <-a.events:
		t.Fatalf("A got a third delivery at once: %+v", ev)
	default:
	}
}

// TestRoundRobinBetweenProjects: with one worker, projects with events
// waiting are served one event each in turn, whatever order they queued in.
func TestRoundRobinBetweenProjects(t *testing.T) {
	hold := make(chan struct{})
	r := newReceiver(t, "s", http.StatusOK, hold)
	d := New(Config{AllowPrivate: true, Workers: 1, Timeout: 5 * time.Second})
	defer d.Close(context.Background())
	send := func(project string, i int) {
		d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: project, ConnectionID: fmt.Sprint(i)}})
	}
	send("first", 0)
	<-r.events // the worker is held: the rest queue up
	for i := range 3 {
		send("A", i)
	}
	for i := range 3 {
		send("B", i)
	}
	send("C", 0)
	close(hold)
	var got []string
	for range 7 {
		ev := <-r.events
		got = append(got, ev.ProjectID+ev.ConnectionID)
	}
	if want := "[A0 B0 C0 A1 B1 A2 B2]"; fmt.Sprint(got) != want {
		t.Fatalf("order %v, want %s", got, want)
	}
}

// TestSharedBoundAndCloseDrops: the bound over all projects holds, and Close
// drops (counted) what its context leaves no time for.
func TestSharedBoundAndCloseDrops(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	r := newReceiver(t, "s", http.StatusOK, hang)
	d := New(Config{AllowPrivate: true, Workers: 2, QueueSize: 10, ProjectQueue: 4, ProjectInFlight: 1, Timeout: 30 * time.Second})
	// p0's sixth event is over its own bound whether or not a worker has
	// taken its first yet (at most 1 in flight and 4 queued); the others
	// then fill the shared queue.
	for p := range 5 {
		n := 5
		if p == 0 {
			n = 6
		}
		for i := range n {
			d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: fmt.Sprint("p", p), ConnectionID: fmt.Sprint(i)}})
		}
	}
	<-r.events
	<-r.events
	st := d.Stats()
	if st.Queued+st.InFlight > 10+2 || st.DroppedBy[DropQueueFull] == 0 || st.DroppedBy[DropProjectQueueFull] == 0 {
		t.Fatalf("stats %+v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := d.Close(ctx); err == nil {
		t.Fatal("Close returned nil with deliveries hanging")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v", took)
	}
	st = waitStats(t, d, func(s Stats) bool { return s.InFlight == 0 && s.ProjectsQueued == 0 })
	if st.Queued != 0 || st.DroppedBy[DropShutdown] == 0 || st.Failed != 2 {
		t.Fatalf("after Close: %+v", st)
	}
}

func TestRedactURL(t *testing.T) {
	for raw, want := range map[string]string{
		"https://hooks.example.com/relay?token=s3cret&x=1": "https://hooks.example.com/relay?redacted",
		"https://hooks.example.com/relay#s3cret":           "https://hooks.example.com/relay#redacted",
		"http://u:s3cret@example.com/x?":                   "http://u:xxxxx@example.com/x?",
		"https://example.com/hook":                         "https://example.com/hook",
	} {
		if got := RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestLogsRedactQueryStrings: the log lines about a delivery never show the
// URL's query string.
func TestLogsRedactQueryStrings(t *testing.T) {
	var logs syncBuffer
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	down := "http://" + ln.Addr().String() + "/hook?token=s3cret"
	ln.Close()
	d := New(Config{AllowPrivate: true, Timeout: time.Second, ProjectQueue: 1, Workers: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for range 5 {
		d.Deliver(Delivery{URL: down, Secret: "s", Event: Event{Event: "connect", ProjectID: "p"}})
	}
	d.Close(context.Background())
	out := logs.String()
	if strings.Contains(out, "s3cret") || !strings.Contains(out, "/hook?redacted") ||
		!strings.Contains(out, "webhook not delivered") || !strings.Contains(out, "webhook queue of a project is full") {
		t.Fatalf("logs:\n%s", out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
