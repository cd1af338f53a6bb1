package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gorilla/websocket"
	"github.com/relayhq/relay/store/tempdb"
)

// The scenarios run against the real relay binary (its in-process start lives
// in cmd/relay's package main, which cannot be imported): TestMain builds it,
// starts it on a free loopback port with a throwaway SQLite database, and
// stops it at the end.

var (
	relayBin  string
	relayBase string
	relayPID  int
)

func TestMain(m *testing.M) {
	// The suite starts the naive hub as `<this binary> naive`: in a test
	// run this binary is the test binary.
	if len(os.Args) > 1 && os.Args[1] == "naive" {
		if err := runNaive(context.Background(), os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == "transport-peer" { // relay-bench transport's two ends
		if err := runTransportPeer(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(runWithRelay(m))
}

func runWithRelay(m *testing.M) int {
	dir, err := os.MkdirTemp("", "relay-bench-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "relay")
	if out, err := exec.Command("go", "build", "-o", bin, "../relay").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the relay: %v\n%s", err, out)
		return 1
	}
	r, err := startRelay(bin, "EMIT_RATE_LIMIT_PER_MINUTE=100000000", "PROJECT_RATE_LIMIT_PER_MINUTE=100000000")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer r.stop()
	relayBin, relayBase, relayPID = bin, r.base, r.pid
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "relay log:\n%s", r.logText())
	}
	return code
}

// captured runs a scenario (or the suite) with stdout captured, logs what
// it printed and fails the test on its error.
func captured(t *testing.T, run func(context.Context, []string) error, args []string) *bytes.Buffer {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&out, r); close(copied) }()
	err = run(context.Background(), args)
	os.Stdout = stdout
	w.Close()
	<-copied
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	return &out
}

// runScenario runs a scenario function with stdout captured and returns its
// JSON lines, decoded.
func runScenario(t *testing.T, run func(context.Context, []string) error, args ...string) []map[string]any {
	t.Helper()
	args = append([]string{"-base", relayBase, "-server-pid", fmt.Sprint(relayPID), "-timeout", "30s"}, args...)
	out := captured(t, run, args)
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue // the human line
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("JSON line does not parse: %v\n%s", err, line)
		}
		lines = append(lines, v)
	}
	if len(lines) == 0 {
		t.Fatal("no JSON line")
	}
	return lines
}

// field reads a number at a dotted path of a decoded JSON object.
func field(t *testing.T, v map[string]any, path string) float64 {
	t.Helper()
	var cur any = v
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("%s: %v is not an object", path, cur)
		}
		if cur, ok = m[k]; !ok {
			t.Fatalf("%s: no %q in %v", path, k, m)
		}
	}
	f, ok := cur.(float64)
	if !ok {
		t.Fatalf("%s: %v is not a number", path, cur)
	}
	return f
}

func wantEq(t *testing.T, v map[string]any, path string, want float64) {
	t.Helper()
	if got := field(t, v, path); got != want {
		t.Errorf("%s = %v, want %v", path, got, want)
	}
}

func TestFanout(t *testing.T) {
	out := runScenario(t, runFanout, "-subs", "20", "-channels", "2", "-rate", "200", "-duration", "2s",
		"-workers", "4", "-sources", "2", "-drain", "5s")[0]
	wantEq(t, out, "subscribers", 20)
	wantEq(t, out, "emits.ok", 400)
	wantEq(t, out, "emits.failed", 0)
	wantEq(t, out, "emits.refused_429", 0)
	wantEq(t, out, "emits.subscriber_count_min", 10)
	wantEq(t, out, "subs.deliveries", 20*400/2) // each message reaches the 10 subscribers of its channel
	wantEq(t, out, "subs.expected_deliveries", 20*400/2)
	wantEq(t, out, "subs.lost", 0)
	wantEq(t, out, "subs.out_of_order", 0)
	wantEq(t, out, "subs.duplicates", 0)
	wantEq(t, out, "subs.unexpected", 0)
	wantEq(t, out, "subs.server_closed", 0)
	if n := field(t, out, "subs.latency.count"); n != 20*400/2 {
		t.Errorf("latency samples = %v, want one per delivery", n)
	}
	if field(t, out, "subs.latency.p50_ms") <= 0 || field(t, out, "server.rss_peak_kib") <= 0 || field(t, out, "client.cpu_seconds") <= 0 {
		t.Errorf("latency, server RSS or client CPU missing")
	}
}

func TestEmit(t *testing.T) {
	lines := runScenario(t, runEmit, "-subs", "0,5", "-workers", "4", "-duration", "1s")
	if len(lines) != 2 {
		t.Fatalf("%d JSON lines, want one per subscriber count", len(lines))
	}
	for i, subs := range []float64{0, 5} {
		out := lines[i]
		wantEq(t, out, "subscribers", subs)
		ok := field(t, out, "emits.ok")
		if ok < 10 {
			t.Errorf("only %v emits in a second", ok)
		}
		wantEq(t, out, "emits.sent", ok)
		wantEq(t, out, "emits.failed", 0)
		wantEq(t, out, "emits.subscriber_count_max", subs)
		if subs > 0 {
			wantEq(t, out, "subs.deliveries", subs*ok)
			wantEq(t, out, "subs.lost", 0)
			wantEq(t, out, "subs.out_of_order", 0)
		}
	}
}

func TestChurn(t *testing.T) {
	out := runScenario(t, runChurn, "-rate", "50", "-duration", "2s", "-emit-rate", "100", "-min-life", "200ms",
		"-max-life", "800ms", "-resident", "3", "-abrupt", "0.3", "-settle", "500ms", "-sources", "2")[0]
	wantEq(t, out, "joined", 100)
	wantEq(t, out, "join_failed", 0)
	wantEq(t, out, "churners.lost", 0)
	wantEq(t, out, "churners.out_of_order", 0)
	wantEq(t, out, "churners.server_closed", 0)
	wantEq(t, out, "residents.lost", 0)
	wantEq(t, out, "residents.server_closed", 0)
	wantEq(t, out, "open_quiesced.tool", 3)
	wantEq(t, out, "open_quiesced.server", 3)
	wantEq(t, out, "quiesced_mismatch", 0)
	wantEq(t, out, "leaked_after_all_closed", 0)
	// The residents got all 200 streamed messages and the probe that followed.
	wantEq(t, out, "residents.deliveries", 3*(200+2))
	if field(t, out, "churners.deliveries") == 0 {
		t.Error("the churning connections received nothing")
	}
	if before, after := field(t, out, "server_sockets.before"), field(t, out, "server_sockets.after"); after > before {
		t.Errorf("server sockets %v before, %v after: leaked", before, after)
	}
}

func TestHistogram(t *testing.T) {
	prev := -1
	for us := uint64(0); us < 1<<31; us = us*5/4 + 1 {
		i := histIndex(us)
		if i < prev || i >= histBuckets {
			t.Fatalf("histIndex(%d) = %d after %d", us, i, prev)
		}
		prev = i
		if i < histBuckets-1 {
			if up := histUpper(i); up < us || (i > 0 && histUpper(i-1) >= us) {
				t.Fatalf("%d µs in bucket %d whose range ends at %d (previous %d)", us, i, up, histUpper(i-1))
			}
			if us >= histLinear && float64(histUpper(i)-us) > float64(us)/30 {
				t.Fatalf("bucket of %d µs too wide: ends at %d", us, histUpper(i))
			}
		}
	}
	var h latHist
	for us := uint64(1); us <= 10000; us++ {
		h.record(us)
	}
	var m mergedHist
	m.add(&h)
	m.add(&h)
	for _, q := range []struct {
		q    float64
		want uint64
	}{{.5, 5000}, {.99, 9900}, {.999, 9990}, {1, 10000}} {
		got := m.quantile(q.q)
		if got < q.want || float64(got-q.want) > float64(q.want)*0.035 {
			t.Errorf("quantile %v = %d, want %d (+3.5%%)", q.q, got, q.want)
		}
	}
	if m.n != 20000 || m.max != 10000 {
		t.Errorf("n %d max %d", m.n, m.max)
	}
}

func TestSeqSet(t *testing.T) {
	var s seqSet
	base := uint64(1_700_000_000_000_000)
	for _, d := range []uint64{5, 6, 8, 7, 8, 200, 3} {
		s.add(base + d)
	}
	if s.unique != 6 || s.dups != 1 || s.outOfOrd != 2 || s.lo != base+3 || s.last != base+200 {
		t.Fatalf("%+v", s)
	}
	expected := []uint64{}
	for d := uint64(3); d <= 200; d++ {
		expected = append(expected, base+d)
	}
	lost, matched := s.missing(expected, 0, ^uint64(0))
	if matched != 6 || lost != int64(len(expected))-6 {
		t.Fatalf("lost %d matched %d", lost, matched)
	}
	if lost, matched := s.missing(expected, base+5, base+8); lost != 0 || matched != 4 {
		t.Fatalf("between 5 and 8: lost %d matched %d", lost, matched)
	}
}

func TestScan(t *testing.T) {
	msg := []byte(`{"channel":"bench-0","payload":{"t":1700000000123456789,"pad":"xxxx"},"seq":1763843000000001}`)
	if seq, ok := seqOf(msg); !ok || seq != 1763843000000001 {
		t.Errorf("seqOf = %d %v", seq, ok)
	}
	if ts, ok := sentAt(msg); !ok || ts != 1700000000123456789 {
		t.Errorf("sentAt = %d %v", ts, ok)
	}
	spaced := []byte(`{"channel": "a", "payload": {"t": 12}, "seq": 34 }`)
	if seq, ok := seqOf(spaced); !ok || seq != 34 {
		t.Errorf("seqOf spaced = %d %v", seq, ok)
	}
	if _, ok := seqOf([]byte(`{"action":"subscribe","ok":true}`)); ok {
		t.Error("seq found in an ack")
	}
	var s wsSub
	if testing.AllocsPerRun(100, func() { s.onMessage(msg, time.Now().UnixNano()) }) != 0 {
		t.Error("onMessage allocates")
	}
	// A whole read's worth of frames: parsing allocates nothing either.
	var stream []byte
	for range 20 {
		stream = append(stream, serverFrame(ws.OpText, true, msg)...)
	}
	s = wsSub{buf: make([]byte, readBufSize)}
	if testing.AllocsPerRun(100, func() { s.n = copy(s.buf, stream); s.consume(1) }) != 0 {
		t.Error("consume allocates")
	}
	if s.recv.Load() != 20*101 || s.n != 0 {
		t.Errorf("%d messages, %d bytes left", s.recv.Load(), s.n)
	}
}

// serverFrame builds an unmasked server frame.
func serverFrame(op ws.OpCode, fin bool, p []byte) []byte {
	var b bytes.Buffer
	ws.WriteHeader(&b, ws.Header{Fin: fin, OpCode: op, Length: int64(len(p))})
	b.Write(p)
	return b.Bytes()
}

func message(seq int, pad int) []byte {
	return fmt.Appendf(nil, `{"channel":"c","payload":{"t":%d,"pad":"%s"},"seq":%d}`,
		time.Now().UnixNano(), strings.Repeat("y", pad), 1_000_000+seq)
}

// TestParse feeds a stream in random pieces, as reads would bring it.
func TestParse(t *testing.T) {
	var stream bytes.Buffer
	stream.Write(serverFrame(ws.OpText, true, []byte(`{"action":"subscribe","channel":"c","ok":true}`)))
	stream.Write(serverFrame(ws.OpText, true, message(1, 10)))
	m2 := message(2, 300) // 16-bit length, split in three fragments around a ping
	stream.Write(serverFrame(ws.OpText, false, m2[:100]))
	stream.Write(serverFrame(ws.OpPing, true, []byte("p")))
	stream.Write(serverFrame(ws.OpContinuation, false, m2[100:200]))
	stream.Write(serverFrame(ws.OpContinuation, true, m2[200:]))
	stream.Write(serverFrame(ws.OpText, true, message(3, 70000))) // larger than the buffer, 64-bit length
	ws.WriteFrame(&stream, ws.MaskFrameInPlace(ws.NewTextFrame(message(4, 5))))
	stream.Write(serverFrame(ws.OpText, true, []byte(`{"type":"presence"}`)))
	stream.Write(serverFrame(ws.OpText, true, message(5, 10)))
	stream.Write(serverFrame(ws.OpClose, true, ws.NewCloseFrameBody(1013, "slow")))
	stream.Write(serverFrame(ws.OpText, true, message(6, 10))) // after the close: ignored

	client, server := net.Pipe()
	defer client.Close()
	var written bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&written, server); close(copied) }()
	s := &wsSub{conn: client, buf: make([]byte, readBufSize)}
	b := stream.Bytes()
	for len(b) > 0 && !s.ended {
		k := min(len(b), len(s.buf)-s.n, 1+rand.IntN(300))
		s.n += copy(s.buf[s.n:], b[:k])
		b = b[k:]
		s.consume(time.Now().UnixNano())
	}
	client.Close()
	<-copied
	if !s.acked || s.recv.Load() != 5 || s.seqs.unique != 5 || s.seqs.outOfOrd != 0 || s.other != 1 {
		t.Errorf("acked %v, %d messages, %d seqs, %d out of order, %d other frames",
			s.acked, s.recv.Load(), s.seqs.unique, s.seqs.outOfOrd, s.other)
	}
	if s.hist.n != 5 {
		t.Errorf("%d latencies", s.hist.n)
	}
	if !s.ended || !s.serverClosed || !s.closeFrame || s.closeCode != 1013 {
		t.Errorf("ended %v, server closed %v, close frame %v, code %d", s.ended, s.serverClosed, s.closeFrame, s.closeCode)
	}
	// The pong and the close answer went out, masked.
	r := bytes.NewReader(written.Bytes())
	for _, want := range []ws.OpCode{ws.OpPong, ws.OpClose} {
		f, err := ws.ReadFrame(r)
		if err != nil || f.Header.OpCode != want || !f.Header.Masked {
			t.Fatalf("written %v masked %v %v, want %v", f.Header.OpCode, f.Header.Masked, err, want)
		}
	}

	var hdr [10]byte
	hdr[0], hdr[1] = 0x81, 127
	binary.BigEndian.PutUint64(hdr[2:], 1<<40)
	s = &wsSub{buf: make([]byte, readBufSize)}
	s.n = copy(s.buf, hdr[:])
	s.consume(0)
	if !s.ended || s.err != errBadFrame || !s.serverClosed {
		t.Fatalf("oversized frame: ended %v err %v", s.ended, s.err)
	}
}

// BenchmarkConsume is the tool's user-space cost per delivered message (a
// read's worth of 150-byte messages parsed, scanned and recorded); the
// socket read itself comes on top.
func BenchmarkConsume(b *testing.B) {
	msg := message(1, 60)
	frame := serverFrame(ws.OpText, true, msg)
	var stream []byte
	for len(stream)+len(frame) <= readBufSize {
		stream = append(stream, frame...)
	}
	perRead := len(stream) / len(frame)
	s := wsSub{buf: make([]byte, readBufSize)}
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for i := 0; i < b.N; i += perRead {
		s.n = copy(s.buf, stream)
		s.consume(int64(i))
	}
}

// TestEmitConn checks the hand-rolled HTTP/1.1 client against net/http's
// server: lengths, chunks, refusals, closes and keep-alive reuse.
func TestEmitConn(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Channel string `json:"channel"`
			Payload struct {
				T   int64  `json:"t"`
				Pad string `json:"pad"`
			} `json:"payload"`
		}
		if r.URL.Path != "/emit" || r.Header.Get("Authorization") != "Bearer sk" || json.NewDecoder(r.Body).Decode(&body) != nil ||
			body.Payload.T == 0 || len(body.Payload.Pad) != 100-34 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch body.Channel {
		case "chunked":
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(`{"ok":true,"seq":`))
			w.(http.Flusher).Flush()
			w.Write([]byte(`42,"subscriberCount":7}`))
		case "limited":
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":"project_rate_limited","rate_limit":{"limit":1}}`))
		case "close":
			w.Header().Set("Connection", "close")
			w.Write([]byte(`{"ok":true,"seq":9,"subscriberCount":0}`))
		default:
			w.Write([]byte(`{"ok":true,"channel":"c","seq":1763843000000001,"delivered":3,"subscriberCount":3}`))
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	em := newEmitClient(srv.URL, "sk", 1, 100)
	w := em.newConn()
	defer w.close()
	ctx := context.Background()
	for _, c := range []struct {
		channel string
		want    emitReply
	}{
		{"c", emitReply{status: 200, seq: 1763843000000001, hasSeq: true, subs: 3}},
		{"chunked", emitReply{status: 200, seq: 42, hasSeq: true, subs: 7}},
		{"limited", emitReply{status: 429, code: "project_rate_limited"}},
		{"c", emitReply{status: 200, seq: 1763843000000001, hasSeq: true, subs: 3}},
		{"close", emitReply{status: 200, seq: 9, hasSeq: true}},
		{"c", emitReply{status: 200, seq: 1763843000000001, hasSeq: true, subs: 3}},
	} {
		r, err := w.emit(ctx, c.channel, time.Now().UnixNano())
		if err != nil || r != c.want {
			t.Fatalf("%s: %+v %v, want %+v", c.channel, r, err, c.want)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (one kept alive until the server's close)", n)
	}
}

// TestSuite runs the standard load run at toy sizes: it starts its own
// relays from the built binary, and its table names every target.
func TestSuite(t *testing.T) {
	out := captured(t, runSuite, []string{"-relay", relayBin, "-conns", "200", "-fanout-subs", "20",
		"-deliveries", "2000,4000", "-growth", "10,20", "-duration", "1s", "-churn-duration", "1s",
		"-ladder", "5,10", "-spread-channels", "5", "-spread-rate", "10", "-naive-rounds", "1"})
	table := out.String()[strings.Index(out.String(), "relay-bench suite,"):]
	for _, want := range []string{"memory, 180 idle subscribed connections", "handshakes", "HTTP emit, no subscribers, 16 workers",
		"HTTP emit, 100 subscribers", "fan-out, 1 channel, 20 subscribers, 100 B", "fan-out, 1 channel, 10 subscribers",
		"growth, 20 vs 10 subscribers", "server CPU per delivery", "churn, 200 joins/s",
		"latency, 5 emits/s to 20 subscribers", "HTTP emit against the naive hub", "latency, 10 emits/s to 20 subscribers", "latency, 10 emits/s over 5 channels × 2 subscribers"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table has no row %q", want)
		}
	}
	// Toy rates are far below any limit: the growth baselines and churn pass
	// (the fan-out target row wants 600 000/s, which toy sizes never offer).
	for _, line := range strings.Split(table, "\n") {
		if (strings.Contains(line, "(growth baseline") || strings.HasPrefix(line, "churn") || strings.HasPrefix(line, "latency")) && !strings.Contains(line, " yes ") {
			t.Errorf("row did not pass: %s", line)
		}
	}
}

// TestCluster runs `relay-bench cluster` at toy sizes: its own etcd and
// PostgreSQL, one node then two, every measurement once. It checks that the
// table names every target and that nothing was lost; the figures at these
// sizes mean nothing.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("about 30 s: etcd, PostgreSQL and three relays")
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd (apt-get install etcd-server)")
	}
	if _, err := tempdb.BinDir(); err != nil {
		t.Skip(err)
	}
	out := captured(t, runCluster, []string{"-relay", relayBin, "-nodes", "2", "-rounds", "1", "-conns-per-node", "200",
		"-fanout-subs", "20", "-fanout-rates", "20", "-conns-settle", "0s", "-latency-channels", "4", "-latency-rate", "20", "-latency-duration", "1s",
		"-emit-rate", "50", "-emit-channels", "5", "-duration", "1s", "-timeout", "2m"}).String()
	var summary map[string]any
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, `{`) && strings.Contains(line, `"scenario":"cluster"`) {
			if err := json.Unmarshal([]byte(line), &summary); err != nil {
				t.Fatal(err)
			}
		}
	}
	if summary == nil {
		t.Fatal("no summary line")
	}
	wantEq(t, summary, "lost", 0)
	wantEq(t, summary, "emits_failed_or_refused", 0)
	table := out[strings.Index(out, "relay-bench cluster,"):]
	for _, want := range []string{"server CPU per delivery, 20 subscribers", "added latency per cross-node hop",
		"HTTP emit, 50 emits/s", "idle memory per connection on a node, 200"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table has no row %q", want)
		}
	}
	// Each subscriber of the hop run is on its channel's emitting node or
	// not, so the two-node run reports latency for at least two hop counts.
	runs, _ := summary["runs"].([]any)
	if len(runs) != 2 {
		t.Fatalf("%d runs, want 2", len(runs))
	}
	if hops, _ := runs[1].(map[string]any)["latency_by_hops_p50_p99_ms"].(map[string]any); len(hops) < 2 {
		t.Errorf("latency by hops: %v, want at least two hop counts", hops)
	}
}

// TestNaiveHub checks the comparison server does the work it is compared
// on: a key check, a subscriber receiving the relay's message shape, and the
// emit scenario driving it with -secret-key.
func TestNaiveHub(t *testing.T) {
	srv := httptest.NewServer(newNaiveHub())
	defer srv.Close()
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws?channel=room"
	c, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	post := func(key, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/emit", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := post("wrong", `{"channel":"room","payload":1}`); code != http.StatusUnauthorized || body != `{"error":"invalid_secret_key"}` {
		t.Errorf("wrong key: %d %s", code, body)
	}
	// The hub registers the subscriber after it answers the handshake, and
	// only then starts the reader that answers pings: a pong says the
	// subscriber is registered, so a single emit must reach it.
	ponged := make(chan struct{})
	c.SetPongHandler(func(string) error { close(ponged); return nil })
	type read struct {
		msg []byte
		err error
	}
	reads := make(chan read, 1)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	go func() { _, msg, err := c.ReadMessage(); reads <- read{msg, err} }() // handles the pong, then reads the message
	if err := c.WriteControl(websocket.PingMessage, nil, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ponged:
	case r := <-reads:
		t.Fatalf("no pong before %q, %v", r.msg, r.err)
	}
	code, body := post(naiveSecretKey, `{"channel":"room","payload":{"n":1}}`)
	if code != http.StatusOK || !strings.Contains(body, `"delivered":1`) || !strings.Contains(body, `"channel":"room"`) || !strings.Contains(body, `"subscriberCount":1`) {
		t.Fatalf("emit answer %d %s", code, body)
	}
	r := <-reads // within the read deadline
	msg, err := r.msg, r.err
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Channel string          `json:"channel"`
		Payload json.RawMessage `json:"payload"`
		Seq     uint64          `json:"seq"`
	}
	if err := json.Unmarshal(msg, &got); err != nil || got.Channel != "room" || string(got.Payload) != `{"n":1}` || got.Seq == 0 {
		t.Errorf("message %s (%v)", msg, err)
	}

	out := captured(t, runEmit, []string{"-base", srv.URL, "-secret-key", naiveSecretKey, "-subs", "0", "-workers", "2", "-duration", "500ms"})
	line, _, _ := strings.Cut(out.String(), "\n")
	var run map[string]any
	if err := json.Unmarshal([]byte(line), &run); err != nil {
		t.Fatalf("JSON line %q: %v", line, err)
	}
	if ok := field(t, run, "emits.ok"); ok < 10 {
		t.Errorf("only %v emits to the hub", ok)
	}
	wantEq(t, run, "emits.failed", 0)
	if err := runEmit(context.Background(), []string{"-base", srv.URL, "-secret-key", naiveSecretKey, "-subs", "1"}); err == nil {
		t.Error("-secret-key with subscribers was accepted")
	}
}

// The transport scenario at toy size: each transport's two processes
// answer every request, and the figures are there.
func TestTransport(t *testing.T) {
	out := captured(t, runTransport, []string{"-rounds", "1", "-rate", "200", "-warmup", "100ms", "-duration", "500ms"})
	var v struct {
		Runs map[string][]transportRun `json:"runs"`
	}
	if err := json.Unmarshal([]byte(strings.SplitN(out.String(), "\n", 2)[0]), &v); err != nil {
		t.Fatal(err)
	}
	for _, tr := range transports {
		runs := v.Runs[tr]
		if len(runs) != 1 || runs[0].RoundTrips < 50 || runs[0].CPUSeconds < 0 || (tr != "none" && runs[0].P50us <= 0) {
			t.Errorf("%s: %+v, want one run of about 100 round trips with its CPU and latency", tr, runs)
		}
	}
}
