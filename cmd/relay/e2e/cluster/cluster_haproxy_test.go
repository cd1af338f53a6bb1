//go:build cluster

package cluster

// The documented front, run as is: Debian's haproxy with
// cmd/relay/deploy/haproxy.cfg in front of three nodes (README › Running
// several nodes; cmd/relay/deploy/README.md › HAProxy in front). Every
// client request of this test goes through HAProxy, but for one login sent
// straight to a node as a control; the nodes are otherwise reached only on
// their operator listeners (/metrics, /debug/actors) and logs. Run with `make test-cluster` (or -run '^TestClusterHAProxy'). Like
// the other cluster tests it starts its own etcd, PostgreSQL, relay processes
// and haproxy on loopback and ends only the processes it started, by their
// pids. haproxy must be installed (.ci/run installs it): without it the test
// fails rather than skips, so the documented file cannot go untested.

import (
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// haproxyConfig is the file operators use, relative to this package (go test's
// working directory).
const haproxyConfig = "../../deploy/haproxy.cfg"

// frontClientAddr is the local address the test's WebSocket clients connect
// to HAProxy from: not 127.0.0.1 (HAProxy's own address towards the nodes,
// which they trust), so that a node tells the client from its proxy.
const frontClientAddr = "127.0.0.3"

// haproxyFront is the haproxy process the test started.
type haproxyFront struct {
	cmd     *exec.Cmd
	base    string            // http://ADDR: RELAY_FRONT_ADDR, where clients connect
	stats   string            // http://ADDR: RELAY_HAPROXY_STATS_ADDR
	logs    *relaytest.Buffer // its stdout and stderr (request log, alerts)
	exited  chan struct{}
	servers map[string]string // node name -> HAProxy server name (A -> node1)
}

// upstream is one server HAProxy fronts: a relay node, or a stand-in.
type upstream struct {
	name string // A, B, ...
	addr string // HOST:PORT of its public listener
}

// upstreams lists the nodes' public listeners.
func upstreams(nodes ...*clusterNode) []upstream {
	var out []upstream
	for _, n := range nodes {
		out = append(out, upstream{n.name, strings.TrimPrefix(n.proc.Base, "http://")})
	}
	return out
}

// startHAProxy runs `haproxy -f deploy/haproxy.cfg -db` (foreground) with
// RELAY_NODE1.. pointing at nodes in order, on free loopback ports, and
// returns once every node is UP in its stats and the front answers. It is
// stopped, by its pid, when t ends.
func startHAProxy(t *testing.T, nodes []upstream) *haproxyFront {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/haproxy"); serr != nil { // sbin is not on every PATH
			t.Fatalf("haproxy is not installed: this test runs %s with it (Debian: apt-get install haproxy; .ci/run installs it): %v", haproxyConfig, err)
		}
		bin = "/usr/sbin/haproxy"
	}
	h := &haproxyFront{logs: &relaytest.Buffer{}, exited: make(chan struct{}), servers: map[string]string{}}
	front, stats := relaytest.FreeAddr(t), relaytest.FreeAddr(t)
	h.base, h.stats = "http://"+front, "http://"+stats
	env := []string{"RELAY_FRONT_ADDR=" + front, "RELAY_HAPROXY_STATS_ADDR=" + stats}
	for i, n := range nodes {
		env = append(env, fmt.Sprintf("RELAY_NODE%d=%s", i+1, n.addr))
		h.servers[n.name] = fmt.Sprintf("node%d", i+1)
	}
	h.cmd = exec.Command(bin, "-f", haproxyConfig, "-db")
	h.cmd.Env = append(os.Environ(), env...)
	h.cmd.Stdout, h.cmd.Stderr = h.logs, h.logs
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	go func() { h.cmd.Wait(); close(h.exited) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("haproxy's log:\n%s", h.logs)
		}
		select {
		case <-h.exited:
			return
		default:
		}
		syscall.Kill(h.cmd.Process.Pid, syscall.SIGTERM) // -db: SIGTERM stops it at once
		select {
		case <-h.exited:
		case <-time.After(5 * time.Second):
			syscall.Kill(h.cmd.Process.Pid, syscall.SIGKILL)
			<-h.exited
		}
	})
	began := time.Now()
	relaytest.EventuallyNil(t, 15*time.Second, func() error {
		select {
		case <-h.exited:
			t.Fatalf("haproxy exited at start (%v):\n%s", h.cmd.ProcessState, h.logs)
		default:
		}
		states, err := h.states()
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if s := states[h.servers[n.name]]; s != "UP" {
				return fmt.Errorf("%s (%s) is %q in haproxy's stats: %v", h.servers[n.name], n.name, s, states)
			}
		}
		r, err := relaytest.Do(nil, "GET", h.base+"/healthz", "", nil)
		if err != nil || r.Status != http.StatusOK {
			return fmt.Errorf("GET /healthz through haproxy: %d %s %v", r.Status, r.Raw, err)
		}
		return nil
	})
	t.Logf("haproxy (pid %d) up, every node UP, %v after its start", h.cmd.Process.Pid, time.Since(began).Round(time.Millisecond))
	return h
}

// states reads the status of each server of the relay_nodes backend from
// HAProxy's CSV stats ("UP", "DOWN", "UP 1/2" while going down, ...). It
// does not touch t: goroutines use it.
func (h *haproxyFront) states() (map[string]string, error) {
	r, err := relaytest.Do(&http.Client{Timeout: 2 * time.Second}, "GET", h.stats+"/stats;csv", "", nil)
	if err != nil {
		return nil, err
	}
	rows, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(r.Raw, "# "))).ReadAll()
	if err != nil || len(rows) < 2 {
		return nil, fmt.Errorf("stats: %d %q: %v", r.Status, r.Raw, err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	out := map[string]string{}
	for _, row := range rows[1:] {
		if len(row) > col["status"] && row[col["pxname"]] == "relay_nodes" && strings.HasPrefix(row[col["svname"]], "node") {
			out[row[col["svname"]]] = row[col["status"]]
		}
	}
	return out, nil
}

// frontSessions is how many sessions (requests, sockets) the relay frontend
// holds now: a session is logged when it ends.
func (h *haproxyFront) frontSessions() (int, error) {
	r, err := relaytest.Do(&http.Client{Timeout: 2 * time.Second}, "GET", h.stats+"/stats;csv", "", nil)
	if err != nil {
		return 0, err
	}
	rows, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(r.Raw, "# "))).ReadAll()
	if err != nil || len(rows) < 2 {
		return 0, fmt.Errorf("stats: %d %q: %v", r.Status, r.Raw, err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	for _, row := range rows[1:] {
		if len(row) > col["scur"] && row[col["pxname"]] == "relay" && row[col["svname"]] == "FRONTEND" {
			return strconv.Atoi(row[col["scur"]])
		}
	}
	return 0, fmt.Errorf("no relay FRONTEND row in %q", r.Raw)
}

// dial opens a WebSocket through the front from frontClientAddr, with extra
// request headers; the socket is read into frames from the start. It returns
// errors instead of failing.
func (h *haproxyFront) dial(t *testing.T, publicKey string, header http.Header) (*relaytest.WS, error) {
	local := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(frontClientAddr)}, Timeout: 5 * time.Second}
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, NetDialContext: local.DialContext}
	u := "ws://" + strings.TrimPrefix(h.base, "http://") + "/ws?publicKey=" + url.QueryEscape(publicKey)
	conn, res, err := d.DialContext(context.Background(), u, header)
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		return nil, fmt.Errorf("dial through haproxy: status %d: %w", status, err)
	}
	c := relaytest.WSOn(t, conn)
	c.Read()
	return c, nil
}

// haproxyLogRe picks the server, the retries field (%rc: "+N" when
// redispatched), the status and the request line out of an httplog line.
var haproxyLogRe = regexp.MustCompile(`relay_nodes/(\S+) \S+ (\d+) .* \d+/\d+/\d+/\d+/(\+?\d+) \d+/\d+ "(\S+) (\S+)`)

// openedAddrRe is a node's debug line for a WebSocket it opened, with the
// client address it decided on (api/ws.go).
var openedAddrRe = regexp.MustCompile(`msg="connection opened" .*addr=(\S+)`)

// frontSub is one client of the stop scenario: every frame it got, across
// the sockets it had (it reconnects through the front after a 1001).
type frontSub struct {
	name string
	mu   sync.Mutex
	log  []relaytest.Frame
	at   []time.Time
	// resumes[i] is the index in log where the i-th resumed socket begins.
	resumes []int
	// mustReplay: messages were acknowledged between its close and its
	// resume, so the resume replays at least one.
	mustReplay bool
}

func (s *frontSub) add(f relaytest.Frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log, s.at = append(s.log, f), append(s.at, time.Now())
}

// lastSeq is the highest seq of a message the client has seen.
func (s *frontSub) lastSeq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last int64
	for _, f := range s.log {
		if m, err := parseMessage(f); err == nil {
			last = max(last, m.seq)
		}
	}
	return last
}

// copies counts the client's messages whose seq is in want, a seq seen
// twice counted twice.
func (s *frontSub) copies(want map[int64]int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.log {
		if m, err := parseMessage(f); err == nil && want[m.seq] != 0 {
			n++
		}
	}
	return n
}

// seen counts the distinct seqs of want among the client's messages.
func (s *frontSub) seen(want map[int64]int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := map[int64]bool{}
	for _, f := range s.log {
		if m, err := parseMessage(f); err == nil && want[m.seq] != 0 {
			got[m.seq] = true
		}
	}
	return len(got)
}

// read files c's frames under s until c closes (then it reports s on
// closed) or stop is closed.
func (s *frontSub) read(c *relaytest.WS, stop <-chan struct{}, closed chan<- *frontSub, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		default:
		}
		f, ok := c.Next(50 * time.Millisecond)
		if !ok {
			continue
		}
		s.add(f)
		if f.Closed || f.Err != nil {
			closed <- s
			return
		}
	}
}

// TestClusterHAProxy: three nodes behind haproxy.cfg. Through HAProxy: signup,
// projects and the dashboard on whichever node; X-Forwarded-Proto set by
// HAProxy; with a stand-in draining node in the pool, a handshake it refuses
// with 503 is retried elsewhere and an emit it refuses is not; six sockets
// spread by leastconn over at least two nodes, each node naming the client's
// address (X-Forwarded-For, a spoofed one ignored); emits delivered once to
// every socket with the seq of the 200. Then one node stopped with SIGTERM
// while emits flow: its sockets close with 1001, their clients reconnect
// through HAProxy and resume with since, every acknowledged message reaches
// every client once and in order, HAProxy takes the node out (timed), and
// with no node up HAProxy answers the relay's 503.
func TestClusterHAProxy(t *testing.T) {
	began := time.Now()
	// HAProxy reaches the nodes from 127.0.0.1: its X-Forwarded-For is
	// trusted from there, as the config's comment tells operators. Debug
	// logs name each WebSocket's client address.
	nodes := startCluster(t, 10*time.Second, []string{"A", "B", "C"}, "TRUSTED_PROXIES=127.0.0.1/32", "LOG_LEVEL=debug").nodes
	h := startHAProxy(t, upstreams(nodes...))
	front := &relaytest.Server{T: t, Base: h.base, Now: time.Now} // the helpers, pointed at HAProxy
	viaFront := front.Client()

	owner := front.Signup("alice@example.com")
	p := owner.CreateProject("behind-haproxy")

	t.Run("X-Forwarded-Proto comes from HAProxy, not the client", func(t *testing.T) {
		login := `{"email":"alice@example.com","password":"correct horse"}`
		spoof := map[string]string{"X-Forwarded-Proto": "https"}
		// Directly, the relay marks the cookie Secure on the client's word
		// (COOKIE_SECURE=auto)...
		direct := nodes[0].on(t).Client().Send("POST", "/api/auth/login", login, "application/json", spoof)
		if direct.Status != http.StatusOK || !strings.Contains(direct.Header.Get("Set-Cookie"), "Secure") {
			t.Fatalf("direct login with X-Forwarded-Proto: https: %d, Set-Cookie %q", direct.Status, direct.Header.Get("Set-Cookie"))
		}
		// ...through plain-HTTP HAProxy the header is replaced by "http".
		r := front.Client().Send("POST", "/api/auth/login", login, "application/json", spoof)
		if r.Status != http.StatusOK || r.Header.Get("Set-Cookie") == "" || strings.Contains(r.Header.Get("Set-Cookie"), "Secure") {
			t.Fatalf("login through haproxy with X-Forwarded-Proto: https: %d, Set-Cookie %q", r.Status, r.Header.Get("Set-Cookie"))
		}
	})

	t.Run("dashboard through HAProxy: page and form on whichever node", func(t *testing.T) {
		q := owner.CreateProject("dash-through-haproxy")
		page := "/projects/" + q.ID
		dc := front.Dash(t)
		dc.HTTP.Jar = owner.HTTP.Jar
		for range 3 {
			if pg := dc.Get(page); pg.Status != http.StatusOK || !strings.Contains(pg.Body, "dash-through-haproxy") {
				t.Fatalf("GET %s through haproxy: %d", page, pg.Status)
			}
		}
		// The CSRF token of a page served by one node is accepted by
		// whichever node gets the form.
		dc.Submit(page, page+"/budget", url.Values{"limit": {"100"}}).ExpectRedirect(t, page+"?done=budget-saved")
	})

	t.Run("retries: a handshake refused with 503 goes to another node, an emit refused with 503 is not sent again", func(t *testing.T) {
		// A stand-in for a node draining after SIGTERM that HAProxy's
		// checks have not taken out yet: it passes /readyz/traffic and answers
		// everything else 503 service_unavailable, as the relay does from
		// api.Server.Drain (its /readyz/traffic fails from then on too, but
		// HAProxy needs two failed checks to notice). It holds no connections,
		// so leastconn sends it every new request first.
		var mu sync.Mutex
		asked := map[string]int{}
		draining := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.URL.Path == "/readyz/traffic" {
				w.Write([]byte(`{"status":"ok"}`))
				return
			}
			mu.Lock()
			asked[r.Method+" "+r.URL.Path]++
			mu.Unlock()
			w.Header().Set("X-Test-Node", "draining")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"service_unavailable"}`))
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go draining.Serve(ln)
		t.Cleanup(func() { draining.Close() })
		h2 := startHAProxy(t, append(upstreams(nodes[0], nodes[1]), upstream{"draining", ln.Addr().String()}))

		for i := 1; i <= 3; i++ {
			t0 := time.Now()
			c, err := h2.dial(t, p.PublicKey, nil)
			if err != nil {
				t.Fatalf("handshake %d through haproxy, with a draining node in the pool: %v", i, err)
			}
			c.Send(`{"action":"subscribe","channel":"retried"}`)
			c.Expect(`{"action":"subscribe","channel":"retried","ok":true}`)
			t.Logf("handshake %d: 101 in %v", i, time.Since(t0).Round(time.Microsecond))
		}
		r, err := emitAt(&http.Client{Timeout: 10 * time.Second}, h2.base, p.SecretKey, "retried", "1")
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		t.Logf("the draining stand-in was asked: %v", asked)
		// leastconn sends a handshake to the stand-in whenever it ties for
		// the fewest connections, at least the first time.
		if asked["GET /ws"] == 0 {
			t.Errorf("the draining stand-in was never asked for a handshake, so no retry was tested: %v", asked)
		}
		if r.Status != http.StatusServiceUnavailable || r.Header.Get("X-Test-Node") != "draining" || asked["POST /emit"] != 1 {
			t.Errorf("emit with a draining node in the pool: %d %s (X-Test-Node %q), the stand-in asked %d times; want its own 503, passed on once and not sent elsewhere",
				r.Status, r.Raw, r.Header.Get("X-Test-Node"), asked["POST /emit"])
		}
	})

	// Six WebSockets through HAProxy, from frontClientAddr; half of them
	// also send an X-Forwarded-For of their own, which must not count.
	const spoofed = "203.0.113.66"
	logFromNode := map[string]int{}
	for _, n := range nodes {
		logFromNode[n.name] = len(n.proc.Logs.String())
	}
	subs := make([]*frontSub, 6)
	socks := make([]*relaytest.WS, 6)
	for i := range socks {
		var hdr http.Header
		if i%2 == 1 {
			hdr = http.Header{"X-Forwarded-For": {spoofed}}
		}
		t0 := time.Now()
		c, err := h.dial(t, p.PublicKey, hdr)
		if err != nil {
			t.Fatalf("socket %d: %v", i+1, err)
		}
		socks[i], subs[i] = c, &frontSub{name: fmt.Sprintf("s%d", i+1)}
		t.Logf("socket s%d open through haproxy in %v", i+1, time.Since(t0).Round(time.Microsecond))
	}
	perNode := map[string]float64{}
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		sum := 0.0
		for _, n := range nodes {
			perNode[n.name] = n.metric(t, "relay_connections_open")
			sum += perNode[n.name]
		}
		if sum != 6 {
			return fmt.Errorf("relay_connections_open by node %v, want 6 in all", perNode)
		}
		return nil
	})
	holding := 0
	for _, n := range nodes {
		if perNode[n.name] > 0 {
			holding++
		}
	}
	t.Logf("leastconn spread the 6 sockets: %v", perNode)
	if holding < 2 {
		t.Fatalf("the 6 sockets are on %d node(s), want at least 2 (balance leastconn): %v", holding, perNode)
	}

	t.Run("X-Forwarded-For: each node sees the client, not HAProxy and not what the client wrote", func(t *testing.T) {
		var addrs []string
		for _, n := range nodes {
			for _, m := range openedAddrRe.FindAllStringSubmatch(n.proc.Logs.String()[logFromNode[n.name]:], -1) {
				addrs = append(addrs, n.name+":"+m[1])
			}
		}
		sort.Strings(addrs)
		if len(addrs) != 6 {
			t.Fatalf("%d connection-opened lines, want 6: %v", len(addrs), addrs)
		}
		for _, a := range addrs {
			if !strings.HasSuffix(a, ":"+frontClientAddr) {
				t.Fatalf("a node logged a socket from %s, want %s for all: %v", a, frontClientAddr, addrs)
			}
		}
		t.Logf("client addresses the nodes decided on: %v", addrs)
	})

	// The node to stop: the one holding most sockets (ties: the later node).
	var victim *clusterNode
	for i := len(nodes) - 1; i >= 0; i-- {
		if victim == nil || perNode[nodes[i].name] > perNode[victim.name] {
			victim = nodes[i]
		}
	}
	// A channel whose grain lives on the victim, so that its stop also
	// hands the channel's ring over.
	ch := channelHostedBy(t, victim, viaFront, p, "front")
	for _, s := range socks {
		s.Send(`{"action":"subscribe","channel":"` + ch + `"}`)
		s.Expect(`{"action":"subscribe","channel":"` + ch + `","ok":true}`)
	}

	t.Run("emit through HAProxy: every socket gets it once, with the seq of the 200", func(t *testing.T) {
		for i := 1; i <= 3; i++ {
			t0 := time.Now()
			e := expectEmitted(t, viaFront.Emit(p.SecretKey, fmt.Sprintf(`{"channel":%q,"payload":{"k":%d}}`, ch, i)), ch)
			answered := time.Since(t0)
			if e.delivered != 6 || e.subscriberCount != 6 {
				t.Errorf("delivered %d, subscriberCount %d; want 6 and 6", e.delivered, e.subscriberCount)
			}
			want := fmt.Sprintf(`{"channel":%q,"payload":{"k":%d},"seq":%d}`, ch, i, e.seq)
			got := collectEach(socks, 1, time.Now().Add(5*time.Second), 200*time.Millisecond)
			for j, frames := range got {
				if len(frames) != 1 || !sameJSON(frames[0].Text, want) {
					t.Errorf("s%d: got %d frames %+v, want exactly %s", j+1, len(frames), frames, want)
				}
			}
			t.Logf("emit %d through haproxy answered in %v (seq %d), on all 6 sockets", i, answered.Round(time.Microsecond), e.seq)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("database outage: every node stays in rotation and emits go on", func(t *testing.T) {
		// Each node learns the secret key first: with the database down, a
		// node serves only keys it has already seen (README › The database
		// goes away).
		for _, n := range nodes {
			if r, err := emitAt(nil, n.proc.Base, p.SecretKey, "outage", "0"); err != nil || r.Status != http.StatusOK {
				t.Fatalf("emit on %s before the outage: %d %s %v", n.name, r.Status, r.Raw, err)
			}
		}
		storetest.StopPostgres(t)
		stopped := time.Now()
		down := true
		defer func() {
			if down {
				storetest.StartPostgres(t)
			}
		}()
		// /readyz (the store) fails on every node: the page-worthy signal.
		for _, n := range nodes {
			relaytest.EventuallyNil(t, 10*time.Second, func() error {
				if s, body := relaytest.GetText(t, n.proc.Base+"/readyz"); s != http.StatusServiceUnavailable {
					return fmt.Errorf("%s: /readyz %d %s with PostgreSQL stopped", n.name, s, body)
				}
				return nil
			})
		}
		t.Logf("/readyz 503 on every node %v after PostgreSQL stopped", time.Since(stopped).Round(time.Millisecond))
		// HAProxy checks /readyz/traffic every second and takes a node out
		// after two failures: over four seconds, every node stays UP.
		var notUp string
		if relaytest.Within(4*time.Second, func() bool {
			states, err := h.states()
			if err != nil {
				notUp = err.Error()
				return true
			}
			for _, n := range nodes {
				if sv := h.servers[n.name]; states[sv] != "UP" {
					notUp = fmt.Sprintf("%s (%s) is %q in haproxy's stats: %v", sv, n.name, states[sv], states)
					return true
				}
			}
			return false
		}) {
			t.Fatalf("with PostgreSQL stopped, want every node UP for 4 s: %s", notUp)
		}
		viaFront.Do("GET", "/readyz/traffic", "").Expect(t, http.StatusOK, `{"status":"ok"}`)
		for i := 1; i <= 6; i++ {
			expectEmitted(t, viaFront.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"outage","payload":%d}`, i)), "outage")
		}
		owner.Do("GET", "/api/projects", "").Expect(t, http.StatusServiceUnavailable, `{"error":"service_unavailable"}`)
		storetest.StartPostgres(t)
		down = false
		for _, n := range nodes {
			relaytest.EventuallyNil(t, 15*time.Second, func() error {
				if s, body := relaytest.GetText(t, n.proc.Base+"/readyz"); s != http.StatusOK {
					return fmt.Errorf("%s: /readyz %d %s with PostgreSQL back", n.name, s, body)
				}
				return nil
			})
		}
		t.Logf("PostgreSQL down %v: every node stayed UP behind haproxy, emits through it answered 200", time.Since(stopped).Round(100*time.Millisecond))
	})
	if t.Failed() {
		t.FailNow()
	}

	// Graceful stop of the victim while emits flow through HAProxy: its
	// sockets close with 1001, their clients reconnect through HAProxy and
	// resume with since; HAProxy's check takes the node out.
	type ack struct {
		n       int
		res     relaytest.Response // the last answer
		err     error
		at      time.Time
		refused []string // earlier 503 service_unavailable answers, retried
	}
	var (
		acksMu sync.Mutex
		acks   []ack
	)
	var termMu sync.Mutex
	var term time.Time // when SIGTERM was sent
	termAt := func() time.Time { termMu.Lock(); defer termMu.Unlock(); return term }
	stopEmits := make(chan struct{})
	emitsDone := make(chan struct{})
	go func() {
		defer close(emitsDone)
		hc := &http.Client{Timeout: 10 * time.Second}
		// The client's pace: an emit or a resend at most every 50 ms, well
		// under the channel budget (600 a minute) over the scenario's seconds.
		pace := time.NewTicker(50 * time.Millisecond)
		defer pace.Stop()
		for i := 1; ; i++ {
			select {
			case <-stopEmits:
				return
			default:
			}
			// A node draining after SIGTERM refuses an emit with 503
			// service_unavailable before taking it (api.Server.Drain)
			// until HAProxy's checks take it out; a client sends it
			// again, as here (up to 3 times). An emit that was delivered though
			// answered 503 would show as an unacknowledged seq below.
			a := ack{n: i}
			for try := 0; ; try++ {
				a.res, a.err = emitAt(hc, h.base, p.SecretKey, ch, fmt.Sprintf(`{"n":%d}`, i))
				a.at = time.Now()
				if try == 3 || a.err != nil || a.res.Status != http.StatusServiceUnavailable || a.res.JSON["error"] != "service_unavailable" {
					break
				}
				when := "before the SIGTERM"
				if at := termAt(); !at.IsZero() {
					when = fmt.Sprintf("+%v", a.at.Sub(at).Round(time.Millisecond))
				}
				a.refused = append(a.refused, when)
				<-pace.C
			}
			acksMu.Lock()
			acks = append(acks, a)
			acksMu.Unlock()
			select {
			case <-stopEmits:
				return
			case <-pace.C:
			}
		}
	}()
	relaytest.Eventually(t, 5*time.Second, func() bool { acksMu.Lock(); defer acksMu.Unlock(); return len(acks) >= 5 },
		"5 emits through haproxy before the stop")

	onVictim := int(perNode[victim.name])
	server := h.servers[victim.name]
	logFrom := len(h.logs.String())
	termMu.Lock()
	if err := syscall.Kill(victim.pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	term = time.Now()
	termMu.Unlock()
	t.Logf("SIGTERM to %s (haproxy's %s), which holds %d of the sockets and channel %s's grain", victim.name, server, onVictim, ch)

	// HAProxy's view of the victim, polled off the test's goroutine.
	var stateLog []string
	takenOut := make(chan time.Duration, 1)
	stopPolling := make(chan struct{})
	defer close(stopPolling)
	go func() {
		last := ""
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for time.Since(term) < 30*time.Second {
			select {
			case <-stopPolling:
				return
			default:
			}
			states, err := h.states()
			if err == nil && states[server] != last {
				last = states[server]
				stateLog = append(stateLog, fmt.Sprintf("+%v %q", time.Since(term).Round(time.Millisecond), last))
				if strings.HasPrefix(last, "DOWN") {
					takenOut <- time.Since(term)
					return
				}
			}
			select {
			case <-stopPolling:
				return
			case <-tick.C:
			}
		}
		close(takenOut)
	}()

	stopReads := make(chan struct{})
	closed := make(chan *frontSub, 32)
	var readers sync.WaitGroup
	for i, s := range subs {
		readers.Add(1)
		go s.read(socks[i], stopReads, closed, &readers)
	}
	defer func() { // on any failure below, no reader is left behind
		select {
		case <-stopReads:
		default:
			close(stopReads)
		}
		readers.Wait()
	}()

	// Each client closed with 1001 reconnects through HAProxy and resumes
	// after the last seq it saw.
	var reconnects []string
	for closes := 0; closes < onVictim; closes++ {
		var s *frontSub
		select {
		case s = <-closed:
		case <-time.After(time.Until(term.Add(15 * time.Second))):
			t.Fatalf("%d of %d sockets on %s closed within 15 s of SIGTERM", closes, onVictim, victim.name)
		}
		s.mu.Lock()
		last, at := s.log[len(s.log)-1], s.at[len(s.at)-1]
		s.mu.Unlock()
		if !last.Closed || last.CloseCode != 1001 {
			t.Fatalf("%s: socket over with close %d %q (err %v), want 1001", s.name, last.CloseCode, last.Reason, last.Err)
		}
		// The first client back reconnects at once (HAProxy may still
		// count the stopping node as up); the others wait for an emit
		// acknowledged after their close, which their resume must replay.
		waited := time.Duration(0)
		if closes > 0 {
			w0 := time.Now()
			relaytest.Eventually(t, 3*time.Second, func() bool {
				acksMu.Lock()
				defer acksMu.Unlock()
				last := acks[len(acks)-1]
				return last.at.After(at) && last.err == nil && last.res.Status == http.StatusOK
			}, "%s: an emit acknowledged after its close", s.name)
			waited = time.Since(w0)
			s.mustReplay = true
		}
		since := s.lastSeq()
		t0 := time.Now()
		c, err := h.dial(t, p.PublicKey, nil)
		if err != nil {
			t.Fatalf("%s: reconnect through haproxy %v after SIGTERM: %v", s.name, time.Since(term).Round(time.Millisecond), err)
		}
		s.mu.Lock()
		s.resumes = append(s.resumes, len(s.log))
		s.mu.Unlock()
		c.Send(fmt.Sprintf(`{"action":"subscribe","channel":%q,"since":%d}`, ch, since))
		readers.Add(1)
		go s.read(c, stopReads, closed, &readers)
		reconnects = append(reconnects, fmt.Sprintf("%s closed 1001 at +%v, waited %v for an emit, reconnected through haproxy in %v, since %d",
			s.name, at.Sub(term).Round(time.Millisecond), waited.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), since))
	}
	for _, r := range reconnects {
		t.Log(r)
	}
	if code := victim.waitExit(t, 15*time.Second); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM:\n%s", victim.name, code, victim.proc.Logs)
	}
	exited := time.Since(term)
	out, ok := <-takenOut
	if !ok {
		t.Fatalf("haproxy did not take %s out within 30 s of SIGTERM: %v", server, stateLog)
	}
	t.Logf("%s exited 0 %v after SIGTERM; haproxy marked %s DOWN %v after SIGTERM (%v after the exit); its states: %v",
		victim.name, exited.Round(time.Millisecond), server, out.Round(time.Millisecond), (out - exited).Round(time.Millisecond), stateLog)

	// Emits go on with the node down (20 more answered), then stop.
	acksMu.Lock()
	out0 := len(acks)
	acksMu.Unlock()
	relaytest.Eventually(t, 10*time.Second, func() bool { acksMu.Lock(); defer acksMu.Unlock(); return len(acks) >= out0+20 },
		"20 emits through haproxy answered with %s out", server)
	close(stopEmits)
	<-emitsDone

	acksMu.Lock()
	stream := slices.Clone(acks)
	acksMu.Unlock()
	seqN := map[int64]int{} // acknowledged seq -> payload n
	var refused, retried503 []string
	var lastAnswer time.Duration
	for _, a := range stream {
		if len(a.refused) > 0 {
			retried503 = append(retried503, fmt.Sprintf("n=%d refused at %v, then %d", a.n, a.refused, a.res.Status))
		}
		if a.err != nil || a.res.Status != http.StatusOK || relaytest.Num(a.res.JSON, "seq") <= 0 {
			refused = append(refused, fmt.Sprintf("n=%d at +%v: %d %s %v", a.n, a.at.Sub(term).Round(time.Millisecond), a.res.Status, a.res.Raw, a.err))
			continue
		}
		seqN[int64(relaytest.Num(a.res.JSON, "seq"))] = a.n
		lastAnswer = max(lastAnswer, a.at.Sub(term))
	}
	t.Logf("%d emits through haproxy from 5 before the SIGTERM to 20 after %s was out; %d answered 200, the last at +%v",
		len(stream), server, len(seqN), lastAnswer.Round(time.Millisecond))
	if len(retried503) > 0 {
		t.Logf("emits answered 503 by the draining %s (before haproxy's checks took it out) and sent again: %v", victim.name, retried503)
	}
	if len(refused) > 0 {
		t.Errorf("%d emits through haproxy not answered 200 around the stop: %v", len(refused), refused)
	}

	// Which node answered what, and what HAProxy retried, while the victim stopped.
	served := map[string]int{}
	for _, line := range strings.Split(h.logs.String()[logFrom:], "\n") {
		if m := haproxyLogRe.FindStringSubmatch(line); m != nil {
			served[m[4]+" "+strings.Split(m[5], "?")[0]+" -> "+m[1]+" "+m[2]+" retries "+m[3]]++
		}
	}
	t.Logf("requests logged by haproxy since the SIGTERM (method path -> server status retries: count; a WebSocket is logged when it ends): %v", served)

	// Every client has every acknowledged message once, in seq order: live,
	// or replayed after its resume; no replay_gap.
	// (Judged below, with what is missing, either way.)
	relaytest.Within(10*time.Second, func() bool {
		for _, s := range subs {
			if s.seen(seqN) < len(seqN) {
				return false
			}
		}
		return true
	})
	// Time by nature: a late duplicate would come within 300 ms (polled:
	// one ends the wait, and is reported below).
	relaytest.Within(300*time.Millisecond, func() bool {
		for _, s := range subs {
			if s.copies(seqN) > s.seen(seqN) {
				return true
			}
		}
		return false
	})
	close(stopReads)
	readers.Wait()
	ackFrame := `{"action":"subscribe","channel":"` + ch + `","ok":true}`
	for _, s := range subs {
		got := map[int64]int{}
		var last int64
		var problems []string
		resume, replays, acked := -1, 0, 0
		for i, f := range s.log {
			if slices.Contains(s.resumes, i) {
				resume++
			}
			if f.Closed || f.Err != nil {
				if resume == len(s.resumes)-1 || f.CloseCode != 1001 {
					problems = append(problems, fmt.Sprintf("socket over: close %d %q, err %v", f.CloseCode, f.Reason, f.Err))
				}
				continue
			}
			if sameJSON(f.Text, ackFrame) {
				acked++
				continue
			}
			m, err := parseMessage(f)
			if err != nil || m.channel != ch {
				problems = append(problems, fmt.Sprintf("unexpected frame %s (%v)", f.Text, err))
				continue
			}
			if m.replay {
				replays++
				if resume < 0 {
					problems = append(problems, fmt.Sprintf("replayed seq %d without a resume", m.seq))
				}
			}
			n, ok := seqN[m.seq]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("seq %d was not acknowledged", m.seq))
			case m.payload != fmt.Sprintf(`{"n":%d}`, n):
				problems = append(problems, fmt.Sprintf("seq %d with payload %s, acknowledged for n=%d", m.seq, m.payload, n))
			}
			if got[m.seq]++; got[m.seq] > 1 {
				problems = append(problems, fmt.Sprintf("seq %d twice", m.seq))
			}
			if m.seq <= last {
				problems = append(problems, fmt.Sprintf("seq %d after %d", m.seq, last))
			}
			last = max(last, m.seq)
		}
		missing := 0
		for seq := range seqN {
			if got[seq] == 0 {
				missing++
			}
		}
		if missing > 0 {
			problems = append(problems, fmt.Sprintf("%d of %d acknowledged messages missing", missing, len(seqN)))
		}
		if s.mustReplay && replays == 0 {
			problems = append(problems, "nothing replayed after its resume, though emits were acknowledged while it was away")
		}
		if acked != len(s.resumes) {
			problems = append(problems, fmt.Sprintf("%d subscribe acks for %d resumes", acked, len(s.resumes)))
		}
		if len(problems) > 0 {
			t.Errorf("%s (%d resumes): %v", s.name, len(s.resumes), problems)
		} else {
			t.Logf("%s: all %d acknowledged messages once, in order (%d resumes, %d replayed)", s.name, len(seqN), len(s.resumes), replays)
		}
	}
	resumed := 0
	for _, s := range subs {
		if len(s.resumes) > 0 {
			resumed++
		}
	}
	if resumed != onVictim {
		t.Errorf("%d clients resumed, want the %d that were on %s", resumed, onVictim, victim.name)
	}

	t.Run("no node up: HAProxy answers 503 in the relay's shape", func(t *testing.T) {
		var rest []string
		for _, n := range nodes {
			if n == victim {
				continue
			}
			rest = append(rest, h.servers[n.name])
			if err := syscall.Kill(n.pid(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		killed := time.Now()
		relaytest.EventuallyNil(t, 15*time.Second, func() error {
			states, err := h.states()
			if err != nil {
				return err
			}
			for _, sv := range rest {
				if !strings.HasPrefix(states[sv], "DOWN") {
					return fmt.Errorf("%s is %q", sv, states[sv])
				}
			}
			return nil
		})
		t.Logf("haproxy marked %v DOWN %v after kill -9", rest, time.Since(killed).Round(time.Millisecond))
		r := viaFront.Emit(p.SecretKey, `{"channel":"x","payload":1}`)
		r.Expect(t, http.StatusServiceUnavailable, `{"error":"service_unavailable"}`)
	})
	// Sockets are logged when they end, so once none is left: the
	// reconnects HAProxy first sent to the stopping node and then elsewhere.
	// (For the log only: it goes on either way.)
	relaytest.Within(5*time.Second, func() bool { n, err := h.frontSessions(); return err == nil && n == 0 })
	for _, line := range strings.Split(h.logs.String()[logFrom:], "\n") {
		if m := haproxyLogRe.FindStringSubmatch(line); m != nil && m[4] == "GET" && m[3] != "0" {
			t.Logf("a WebSocket handshake haproxy retried on another node: %s", line)
		}
	}
	t.Logf("haproxy tests took %v", time.Since(began).Round(100*time.Millisecond))
}
