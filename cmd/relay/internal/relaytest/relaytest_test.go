package relaytest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const exposition = `# HELP relay_connections_closed_total Connections closed, by cause.
# TYPE relay_connections_closed_total counter
relay_connections_closed_total{cause="idle"} 2
relay_connections_closed_total{cause="peer_gone"} 0
# HELP relay_connections_open Open connections.
# TYPE relay_connections_open gauge
relay_connections_open 4
# HELP relay_emit_duration_seconds Emit latency.
# TYPE relay_emit_duration_seconds histogram
relay_emit_duration_seconds_bucket{le="0.1"} 3
relay_emit_duration_seconds_bucket{le="+Inf"} 3
relay_emit_duration_seconds_sum 0.02
relay_emit_duration_seconds_count 3
# HELP relay_x_total Two labels.
# TYPE relay_x_total counter
relay_x_total{a="1",b="2"} 7
`

func TestMetricsValue(t *testing.T) {
	m, err := ParseMetrics(exposition)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, labels string
		want         float64
		ok           bool
	}{
		{"relay_connections_closed_total", `cause="idle"`, 2, true},
		{"relay_connections_closed_total", `cause="peer_gone"`, 0, true},
		{"relay_connections_closed_total", `cause="lifetime"`, 0, false},
		{"relay_connections_closed_total", "", 0, false}, // labels must match exactly
		{"relay_connections_open", "", 4, true},
		{"relay_emit_duration_seconds_count", "", 3, true},
		{"relay_emit_duration_seconds_sum", "", 0.02, true},
		{"relay_x_total", `b="2",a="1"`, 7, true}, // in any order
		{"relay_x_total", `a="1"`, 0, false},
		{"relay_missing_total", "", 0, false},
		{"relay_x_total", `a=`, 0, false}, // labels that do not parse
	}
	for _, c := range cases {
		if got, ok := m.Value(c.name, c.labels); got != c.want || ok != c.ok {
			t.Errorf("Value(%s, %s) = %v, %v; want %v, %v", c.name, c.labels, got, ok, c.want, c.ok)
		}
	}
}

func TestScrapeMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(exposition)) }))
	defer srv.Close()
	if got := ScrapeMetrics(t, srv.URL).Get(t, "relay_connections_open", ""); got != 4 {
		t.Fatalf("relay_connections_open = %v", got)
	}
}

func TestDo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got", r.Method+" "+r.Header.Get("Authorization")+" "+r.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	r, err := Do(nil, "POST", srv.URL, "{}", http.Header{"authorization": {"Bearer k"}, "Content-Type": {"application/json"}})
	if err != nil || r.Status != http.StatusTeapot || r.Raw != `{"ok":true}` || r.JSON["ok"] != true ||
		r.Header.Get("X-Got") != "POST Bearer k application/json" {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := Do(nil, "GET", "http://127.0.0.1:1/", "", nil); err == nil {
		t.Fatal("no error from a refused connection")
	}
}

func TestClock(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 30, 0, time.UTC)
	c := NewClock(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now %v", c.Now())
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); c.Advance(time.Second); c.Now() }()
	}
	wg.Wait()
	if want := start.Add(10 * time.Second); !c.Now().Equal(want) {
		t.Fatalf("after ten 1 s steps: %v, want %v", c.Now(), want)
	}
	c.Set(start)
	if got := c.Advance(time.Minute); !got.Equal(start.Add(time.Minute)) || !c.Now().Equal(got) {
		t.Fatalf("Set then Advance: %v", got)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, 5*time.Second, func() bool { n++; return n == 3 }, "three polls")
	if n != 3 {
		t.Fatalf("polled %d times", n)
	}
	m := 0
	EventuallyNil(t, 5*time.Second, func() error {
		if m++; m < 2 {
			return errNotYet
		}
		return nil
	})
	if err := poll(30*time.Millisecond, func() error { return errNotYet }); err != errNotYet {
		t.Fatalf("poll past its deadline: %v", err)
	}
}

func TestStartBinary(t *testing.T) {
	p := StartBinary(t, "RELAY_DEBUG_ADDR=")
	if p.Debug != "" {
		t.Fatalf("Debug %q with the operator listener off", p.Debug)
	}
	if r, err := Do(nil, "GET", p.Base+"/healthz", "", nil); err != nil || r.Status != http.StatusOK {
		t.Fatalf("/healthz: %+v %v", r, err)
	}
	q := StartBinary(t)
	if got := ScrapeMetrics(t, q.Debug+"/metrics").Get(t, "relay_connections_open", ""); got != 0 {
		t.Fatalf("relay_connections_open = %v", got)
	}
	if err := p.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.Exited
}

// reports is a testing.TB that keeps what the harness reports with Error
// and Errorf instead of failing the test, so that a test can provoke the
// harness's own checks. Everything else goes to the test it wraps.
type reports struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *reports) Error(args ...any) { r.add(fmt.Sprint(args...)) }

func (r *reports) Errorf(format string, args ...any) { r.add(fmt.Sprintf(format, args...)) }

func (r *reports) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, s)
}

// A relay that Start started and that exits on its own during the test
// fails the test, however it exited; one the test stopped with Stop does not.
func TestStartReportsARelayThatExited(t *testing.T) {
	var killed, stopped reports
	t.Run("killed", func(t *testing.T) {
		killed.TB = t
		s := Start(&killed, "sqlite:"+filepath.Join(t.TempDir(), "relay.db"), nil)
		if err := s.proc.Cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-s.proc.Exited
	})
	if len(killed.errs) != 1 || !strings.Contains(killed.errs[0], "the relay exited during the test (signal: killed)") {
		t.Errorf("a relay killed during the test: reported %q", killed.errs)
	}
	t.Run("stopped", func(t *testing.T) {
		stopped.TB = t
		Start(&stopped, "sqlite:"+filepath.Join(t.TempDir(), "relay.db"), nil).Stop()
	})
	if len(stopped.errs) != 0 {
		t.Errorf("a relay the test stopped: reported %q", stopped.errs)
	}
}

func TestRunBinary(t *testing.T) {
	code, out := RunBinary(t, 30*time.Second, "IDLE_TIMEOUT_SECONDS=ten minutes")
	if code != 1 || !strings.Contains(out, "IDLE_TIMEOUT_SECONDS") {
		t.Fatalf("a start with a bad variable: exit %d, output:\n%s", code, out)
	}
}

func TestUnread(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, ok := Unread(s.LocalAddr(), s.RemoteAddr()); !ok || n != 0 {
		t.Fatalf("nothing sent: Unread %d, %v; want 0, true", n, ok)
	}
	c.Write([]byte("hello"))
	Eventually(t, 5*time.Second, func() bool { n, _ := Unread(s.LocalAddr(), s.RemoteAddr()); return n == 5 }, "5 bytes unread")
	buf := make([]byte, 5)
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatal(err)
	}
	if n, ok := Unread(s.LocalAddr(), s.RemoteAddr()); !ok || n != 0 {
		t.Fatalf("all read: Unread %d, %v; want 0, true", n, ok)
	}
	if _, ok := Unread(c.LocalAddr(), ln.Addr()); !ok {
		t.Fatal("the client's end not found")
	}
	if _, ok := Unread(ln.Addr(), ln.Addr()); ok {
		t.Fatal("a socket that does not exist found")
	}
}
