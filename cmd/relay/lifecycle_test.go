package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
	"github.com/relayhq/relay/transport"
)

// Lifecycle: every way a connection ends (transport/cause.go), the lifetime
// cap, the ping heartbeat against the idle timeout, the connection-plane
// routes and their auth header, and a clean stop of the real binary on
// SIGTERM and SIGINT.

// ---- helpers ----

// lcServer starts a relay on SQLite with the operator listener on, and
// creates a project.
func lcServer(t *testing.T, env map[string]string) (*testServer, *client, project) {
	t.Helper()
	ts := debugServer(t, env)
	owner := ts.Signup("alice@example.com")
	return ts, owner, owner.CreateProject("demo")
}

// lcClosedByMetrics reads relay_connections_closed_total{cause} for every
// cause from the operator listener's /metrics.
func lcClosedByMetrics(t *testing.T, ts *testServer) map[string]int64 {
	t.Helper()
	m := ts.Metrics(t)
	out := map[string]int64{}
	for _, c := range transport.Causes() {
		out[c.String()] = int64(m.Get(t, "relay_connections_closed_total", `cause="`+c.String()+`"`))
	}
	return out
}

// lcWantCauses is every cause at zero except those in want.
func lcWantCauses(want map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, c := range transport.Causes() {
		out[c.String()] = want[c.String()]
	}
	return out
}

// lcCloseLog matches the transport's debug line for one closed connection.
func lcCloseLog(cause string, code int) *regexp.Regexp {
	return regexp.MustCompile(`level=DEBUG msg="connection closed" component=transport conn=\d+ cause=` +
		regexp.QuoteMeta(cause) + ` code=` + strconv.Itoa(code) + ` `)
}

// lcWaitLogs waits until each pattern matches exactly its count of lines.
func lcWaitLogs(t *testing.T, logs fmt.Stringer, want map[*regexp.Regexp]int) {
	t.Helper()
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		text := logs.String()
		var bad []string
		for re, n := range want {
			if got := len(re.FindAllString(text, -1)); got != n {
				bad = append(bad, fmt.Sprintf("%d log lines match %s, want %d", got, re, n))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s; server log:\n%s", strings.Join(bad, "; "), text)
		}
		return nil
	})
}

// lcDialSmallBuffer connects with a 32 KiB receive buffer fixed before the
// handshake (no autotuning) and never reads: a peer whose socket fills after
// a few hundred KiB, so what the server sends it beyond that stays queued in
// the server.
func lcDialSmallBuffer(t *testing.T, ts *testServer, publicKey string) *wsClient {
	t.Helper()
	nd := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 32<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, NetDialContext: nd.DialContext}
	conn, _, err := d.Dial(ts.WSURL(publicKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	return relaytest.WSOn(t, conn)
}

// lcExpectSlowConsumerEnd reads what a peer that stopped reading was left
// once closed as a slow consumer: its queue was dropped, so it reads what its
// socket held and then the end, the 1013 frame when the socket had room for
// it, else the TCP close (1006 is the library's name for a close without a
// frame).
func lcExpectSlowConsumerEnd(t *testing.T, slow *wsClient) {
	t.Helper()
	slow.Read()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, ok := slow.Next(time.Until(deadline))
		if !ok {
			t.Fatal("slow consumer's connection did not end")
		}
		if f.Closed && (f.CloseCode != 1013 || f.Reason != "slow consumer") && f.CloseCode != websocket.CloseAbnormalClosure {
			t.Fatalf("slow consumer closed with %d %q, want 1013 \"slow consumer\" or no frame", f.CloseCode, f.Reason)
		}
		if f.Closed || f.Err != nil {
			return
		}
	}
}

// lcBigPayload is a JSON string that makes a message of about 120 KiB, under
// the 128 KiB cap.
var lcBigPayload = `"` + strings.Repeat("p", 120<<10) + `"`

// lcSubscribeUnread subscribes c (which does not read) to channel and waits
// until the channel counts it; it returns how many emits that took.
func lcSubscribeUnread(t *testing.T, c *wsClient, owner *client, secretKey, channel string) int {
	t.Helper()
	c.Send(`{"action":"subscribe","channel":"` + channel + `"}`)
	emits := 0
	relaytest.Eventually(t, 5*time.Second, func() bool {
		r := owner.Emit(secretKey, `{"channel":"`+channel+`","payload":0}`)
		emits++
		return r.Status == 200 && relaytest.Num(r.JSON, "subscriberCount") == 1
	}, "unread subscription counted")
	return emits
}

// lcPost sends method path with an optional raw Authorization header and
// decodes the answer; redirects are not followed.
func lcPost(t *testing.T, ts *testServer, method, path, auth string, setAuth bool, body string) response {
	t.Helper()
	var h map[string]string
	if setAuth {
		h = map[string]string{"Authorization": auth}
	}
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return (&client{T: t, Server: ts.Server, HTTP: hc}).Send(method, path, body, "application/json", h)
}

// ---- 1. every close cause: code, counter, log line ----

// TestEveryCloseCauseIsCodedCountedAndLogged provokes each cause of
// transport/cause.go through the public interface, on a server of its own,
// and checks the close frame the client gets (where one is sent), the
// cause's counter on /metrics (every other cause staying at zero) and the
// transport's debug line "connection closed … cause=X code=N".
func TestEveryCloseCauseIsCodedCountedAndLogged(t *testing.T) {
	t.Parallel()
	type result struct {
		counts map[string]int64 // expected relay_connections_closed_total
		logs   map[*regexp.Regexp]int
	}
	cases := []struct {
		cause   string
		env     map[string]string
		provoke func(t *testing.T, ts *testServer, owner *client, p project) result
	}{
		{"peer_closed", nil, func(t *testing.T, ts *testServer, owner *client, p project) result {
			// A close frame with a code, one with none, and the library's own
			// close: each is echoed and ends the connection.
			a := ts.DialWS(p.PublicKey)
			a.SendRaw(relaytest.ClientFrame(0x8, true, []byte{0x0f, 0xa0, 'b', 'y', 'e'})) // 4000 "bye"
			a.ExpectClose(4000, 5*time.Second)
			b := ts.DialWS(p.PublicKey)
			b.SendRaw(relaytest.ClientFrame(0x8, true, nil))
			b.ExpectClose(websocket.CloseNoStatusReceived, 5*time.Second) // an empty close is echoed empty
			c := ts.DialWS(p.PublicKey)
			if err := c.Conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(1000, "done"), time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			c.ExpectClose(1000, 5*time.Second)
			return result{map[string]int64{"peer_closed": 3}, map[*regexp.Regexp]int{
				lcCloseLog("peer_closed", 4000): 1, lcCloseLog("peer_closed", 1005): 1, lcCloseLog("peer_closed", 1000): 1,
			}}
		}},
		{"peer_gone", nil, func(t *testing.T, ts *testServer, owner *client, p project) result {
			c := ts.Subscribed(t, p.PublicKey, "a")
			c.Conn.UnderlyingConn().Close() // TCP gone, no close frame either way
			return result{map[string]int64{"peer_gone": 1}, map[*regexp.Regexp]int{
				regexp.MustCompile(lcCloseLog("peer_gone", 1006).String() + `reason="" abrupt=true `): 1,
			}}
		}},
		{"idle", map[string]string{"IDLE_TIMEOUT_SECONDS": "1"}, func(t *testing.T, ts *testServer, owner *client, p project) result {
			c := ts.DialWS(p.PublicKey)
			if f := c.ExpectClose(1001, 5*time.Second); f.Reason != "idle timeout" {
				t.Fatalf("reason %q", f.Reason)
			}
			return result{map[string]int64{"idle": 1}, map[*regexp.Regexp]int{lcCloseLog("idle", 1001): 1}}
		}},
		{"lifetime", map[string]string{"CONNECTION_MAX_LIFETIME_SECONDS": "1"}, func(t *testing.T, ts *testServer, owner *client, p project) result {
			c := ts.DialWS(p.PublicKey)
			if f := c.ExpectClose(1001, 5*time.Second); f.Reason != "connection lifetime exceeded" {
				t.Fatalf("reason %q", f.Reason)
			}
			return result{map[string]int64{"lifetime": 1}, map[*regexp.Regexp]int{lcCloseLog("lifetime", 1001): 1}}
		}},
		{"slow_consumer", map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000"},
			func(t *testing.T, ts *testServer, owner *client, p project) result {
				slow := lcDialSmallBuffer(t, ts, p.PublicKey)
				lcSubscribeUnread(t, slow, owner, p.SecretKey, "firehose")
				// Its socket holds a few MiB at most; its queue
				// (MAX_QUEUED_BYTES_PER_CONNECTION, 2 MiB) overflows soon after.
				for i := 0; ts.app.transport.Stats().ClosedBy["slow_consumer"] == 0; i++ {
					if i == 1000 {
						t.Fatal("no slow consumer after 1000 messages of 120 KiB")
					}
					if r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":`+lcBigPayload+`}`); r.Status != 200 {
						t.Fatalf("emit %d: %d %s", i, r.Status, r.Raw)
					}
				}
				lcExpectSlowConsumerEnd(t, slow)
				if r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":1}`); relaytest.Num(r.JSON, "subscriberCount") != 0 {
					t.Fatalf("slow consumer still subscribed: %s", r.Raw)
				}
				return result{map[string]int64{"slow_consumer": 1}, map[*regexp.Regexp]int{lcCloseLog("slow_consumer", 1013): 1}}
			}},
		{"too_big", nil, func(t *testing.T, ts *testServer, owner *client, p project) result {
			c := ts.DialWS(p.PublicKey)
			c.SendRaw(relaytest.ClientFrame(0x1, true, make([]byte, 300<<10))) // over the 256 KiB frame cap
			c.ExpectClose(1009, 5*time.Second)
			return result{map[string]int64{"too_big": 1}, map[*regexp.Regexp]int{lcCloseLog("too_big", 1009): 1}}
		}},
		{"protocol", nil, func(t *testing.T, ts *testServer, owner *client, p project) result {
			a := ts.DialWS(p.PublicKey)
			a.SendRaw([]byte{0x81, 0x02, '{', '}'}) // unmasked client frame
			a.ExpectClose(1002, 5*time.Second)
			b := ts.DialWS(p.PublicKey)
			b.SendRaw(relaytest.ClientFrame(0x1, true, []byte{'"', 0xff, '"'})) // text that is not UTF-8
			b.ExpectClose(1007, 5*time.Second)
			return result{map[string]int64{"protocol": 2}, map[*regexp.Regexp]int{lcCloseLog("protocol", 1002): 1, lcCloseLog("protocol", 1007): 1}}
		}},
		{"application", nil, func(t *testing.T, ts *testServer, owner *client, p project) result {
			c := ts.Subscribed(t, p.PublicKey, "a")
			owner.Do("DELETE", "/api/projects/"+p.ID, "").Expect(t, 200, `{"ok":true}`)
			if f := c.ExpectClose(4004, 5*time.Second); f.Reason != "project deleted" {
				t.Fatalf("reason %q", f.Reason)
			}
			return result{map[string]int64{"application": 1}, map[*regexp.Regexp]int{lcCloseLog("application", 4004): 1}}
		}},
		{"shutdown", nil, func(t *testing.T, ts *testServer, owner *client, p project) result {
			c := ts.Subscribed(t, p.PublicKey, "a")
			a := ts.app
			ts.app = nil // this test shuts it down; its operator listener with it
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				done <- a.shutdown(ctx)
			}()
			if f := c.ExpectClose(1001, 5*time.Second); f.Reason != "server shutting down" {
				t.Fatalf("reason %q", f.Reason)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			return result{map[string]int64{"shutdown": 1}, map[*regexp.Regexp]int{lcCloseLog("shutdown", 1001): 1, regexp.MustCompile(`msg=stopped`): 1}}
		}},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		covered[tc.cause] = true
		t.Run(tc.cause, func(t *testing.T) {
			ts, owner, p := lcServer(t, tc.env)
			app := ts.app
			want := tc.provoke(t, ts, owner, p)
			exp := lcWantCauses(want.counts)
			if ts.app != nil {
				// The operator's /metrics, polled: the counter moves when the
				// socket is torn down, just after the client saw the close.
				relaytest.EventuallyNil(t, 5*time.Second, func() error {
					if got := lcClosedByMetrics(t, ts); relaytest.Canonical(got) != relaytest.Canonical(exp) {
						return fmt.Errorf("relay_connections_closed_total %v, want %v", got, exp)
					}
					return nil
				})
			}
			// The transport's own counters (all there is once shut down).
			if got := app.transport.Stats().ClosedBy; relaytest.Canonical(got) != relaytest.Canonical(exp) {
				t.Fatalf("transport Stats.ClosedBy %v, want %v", got, exp)
			}
			lcWaitLogs(t, ts.Logs, want.logs)
		})
	}
	for _, c := range transport.Causes() {
		if !covered[c.String()] {
			t.Errorf("cause %s has no case here", c)
		}
	}
}

// ---- 2. lifetime cap ----

// TestConnectionLifetimeCap: with CONNECTION_MAX_LIFETIME_SECONDS=1 a busy
// connection (a ping every 250 ms, each answered) is still closed with 1001
// "connection lifetime exceeded", no sooner than a second after it opened;
// the client can connect again at once.
func TestConnectionLifetimeCap(t *testing.T) {
	t.Parallel()
	ts, _, p := lcServer(t, map[string]string{"CONNECTION_MAX_LIFETIME_SECONDS": "1"})
	start := time.Now()
	c := ts.DialWS(p.PublicKey)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	pongs := 0
	var closed frame
wait:
	for {
		select {
		case f, ok := <-c.Frames:
			switch {
			case !ok:
				t.Fatal("connection over without a close frame")
			case f.Closed:
				closed = f
				break wait
			case f.Err != nil:
				t.Fatal(f.Err)
			case f.Text != `{"action":"pong","ok":true}`:
				t.Fatalf("unexpected %s", f.Text)
			}
			pongs++
		case <-tick.C:
			c.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
			c.Conn.WriteMessage(websocket.TextMessage, []byte(`{"action":"ping"}`)) // after the close this may fail
		case <-deadline:
			t.Fatalf("no lifetime close within 10s (%d pongs)", pongs)
		}
	}
	age := time.Since(start)
	if closed.CloseCode != 1001 || closed.Reason != "connection lifetime exceeded" {
		t.Fatalf("closed with %d %q, want 1001 \"connection lifetime exceeded\"", closed.CloseCode, closed.Reason)
	}
	if age < time.Second {
		t.Fatalf("closed after %v, before the 1 s lifetime", age)
	}
	if pongs == 0 {
		t.Fatal("no ping was answered while the connection was open")
	}
	// Reconnecting is what the client is meant to do.
	again := ts.DialWS(p.PublicKey)
	again.Send(`{"action":"ping"}`)
	again.Expect(`{"action":"pong","ok":true}`)
	want := lcWantCauses(map[string]int64{"lifetime": 1})
	relaytest.Eventually(t, 5*time.Second, func() bool {
		return relaytest.Canonical(lcClosedByMetrics(t, ts)) == relaytest.Canonical(want)
	}, "lifetime counted once")
}

// ---- 3. ping resets the idle clock ----

// TestPingResetsIdleClock: with IDLE_TIMEOUT_SECONDS=2, a ping every 700 ms
// for 4 s (twice the timeout) keeps the connection open and each gets its
// pong; once the pings stop, the idle close (1001 "idle timeout") follows,
// not before the timeout has run from the last pong.
func TestPingResetsIdleClock(t *testing.T) {
	// Not parallel: a ping every 700 ms against a 2 s idle timeout.
	ts, _, p := lcServer(t, map[string]string{"IDLE_TIMEOUT_SECONDS": "2"})
	c := ts.DialWS(p.PublicKey)
	opened := time.Now()
	tick := time.NewTicker(700 * time.Millisecond)
	defer tick.Stop()
	var lastPong time.Time
	pings := 0
	for time.Since(opened) < 4*time.Second {
		c.Send(`{"action":"ping"}`)
		c.Expect(`{"action":"pong","ok":true}`) // fails on a close frame instead
		lastPong = time.Now()
		pings++
		<-tick.C
	}
	if pings < 4 {
		t.Fatalf("only %d pings in 4 s", pings)
	}
	f := c.ExpectClose(1001, 5*time.Second)
	if f.Reason != "idle timeout" {
		t.Fatalf("reason %q", f.Reason)
	}
	if quiet := time.Since(lastPong); quiet < 1500*time.Millisecond {
		t.Fatalf("idle close %v after the last pong; the timeout is 2 s", quiet)
	}
	want := lcWantCauses(map[string]int64{"idle": 1})
	relaytest.Eventually(t, 5*time.Second, func() bool {
		return relaytest.Canonical(lcClosedByMetrics(t, ts)) == relaytest.Canonical(want)
	}, "idle counted once")
}

// ---- 4. connection-plane routes, auth header, the exact 200 ----

// TestConnectionPlaneRoutesAndAuth: wrong methods on /emit,
// /emit-tokens/revoke and /ws answer 405 method_not_allowed with Allow, and
// their unknown sub-paths 404 not_found, all in JSON; an Authorization header
// that is not "Bearer <key>" gets 401 invalid_secret_key and a missing one
// missing_secret_key, exact bodies; none of it emits anything, which the
// exactly compared 200 bodies show (the first seq of a fresh channel, full
// budgets).
func TestConnectionPlaneRoutesAndAuth(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		// The clock stands still but where the test moves it: exact seqs
		// and one budget window.
		clock := newClock()
		ts := startServerAt(t, url, nil, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		opened := clock.Now()
		sub := ts.Subscribed(t, p.PublicKey, "room.1") // the channel actor starts here
		// Fixed one-minute windows: both budgets reset at the end of the
		// clock's minute, in the millisecond UTC form of every timestamp.
		resetAt := opened.Truncate(time.Minute).Add(time.Minute).UTC().Format("2006-01-02T15:04:05.000Z")
		bearer := "Bearer " + p.SecretKey
		emitBody := `{"channel":"room.1","payload":{"x":[1,"two",null]}}`

		wrongMethod := []struct{ method, path, allow string }{
			{"GET", "/emit", "POST"}, {"PUT", "/emit", "POST"}, {"PATCH", "/emit", "POST"},
			{"DELETE", "/emit", "POST"}, {"OPTIONS", "/emit", "POST"},
			{"GET", "/emit-tokens/revoke", "POST"}, {"PUT", "/emit-tokens/revoke", "POST"},
			{"PATCH", "/emit-tokens/revoke", "POST"}, {"DELETE", "/emit-tokens/revoke", "POST"},
			{"POST", "/ws", "GET"}, {"PUT", "/ws", "GET"}, {"PATCH", "/ws", "GET"},
			{"DELETE", "/ws", "GET"}, {"OPTIONS", "/ws", "GET"},
		}
		for _, rt := range wrongMethod {
			for _, auth := range []string{"", bearer} {
				r := lcPost(t, ts, rt.method, rt.path+"?publicKey="+p.PublicKey, auth, auth != "", emitBody)
				if r.Status != http.StatusMethodNotAllowed {
					t.Errorf("%s %s: %d %s", rt.method, rt.path, r.Status, r.Raw)
					continue
				}
				r.Expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)
				if got := r.Header.Get("Allow"); got != rt.allow {
					t.Errorf("%s %s: Allow %q, want %q", rt.method, rt.path, got, rt.allow)
				}
			}
		}
		unknown := []string{
			"/emit/", "/emit/x", "/emit/revoke", "/emitx", "/EMIT", "/emit.json",
			"/emit-tokens", "/emit-tokens/", "/emit-tokens/revoke/", "/emit-tokens/revoke/x", "/emit-tokens/other", "/emit-tokens/REVOKE",
			"/ws/", "/ws/x", "/wss", "/WS", "/ws/emit",
		}
		for _, path := range unknown {
			for _, method := range []string{"GET", "POST", "PUT"} {
				r := lcPost(t, ts, method, path+"?publicKey="+p.PublicKey, bearer, true, emitBody)
				if r.Status != http.StatusNotFound {
					t.Errorf("%s %s: %d %s", method, path, r.Status, r.Raw)
					continue
				}
				r.Expect(t, http.StatusNotFound, `{"error":"not_found"}`)
			}
		}
		// A real WebSocket handshake on an unknown path or with a wrong key
		// is refused in JSON too, never upgraded.
		for _, path := range []string{"/ws/", "/ws/x", "/wss"} {
			ts.Handshake(path+"?publicKey="+p.PublicKey).Expect(t, http.StatusNotFound, `{"error":"not_found"}`)
		}
		ts.Handshake("/emit?publicKey="+p.PublicKey).Expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)
		ts.Handshake("/ws?publicKey="+p.SecretKey).Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)

		// The Authorization header.
		auths := []struct {
			name, value string
			set         bool
			want        string
		}{
			{"absent", "", false, "missing_secret_key"},
			{"blank", "", true, "missing_secret_key"},
			{"spaces only", "   ", true, "missing_secret_key"},
			{"Basic", "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+p.SecretKey)), true, "invalid_secret_key"},
			{"Bearer alone", "Bearer", true, "invalid_secret_key"},
			{"Bearer and spaces", "Bearer    ", true, "invalid_secret_key"},
			{"Bearer and a tab", "Bearer \t", true, "invalid_secret_key"},
			{"key without scheme", p.SecretKey, true, "invalid_secret_key"},
			{"Token scheme", "Token " + p.SecretKey, true, "invalid_secret_key"},
			{"Bearer glued to the key", "Bearer" + p.SecretKey, true, "invalid_secret_key"},
			{"Bearer with a colon", "Bearer: " + p.SecretKey, true, "invalid_secret_key"},
			{"key and trailing junk", bearer + " junk", true, "invalid_secret_key"},
			{"two keys", bearer + "," + bearer, true, "invalid_secret_key"},
			{"public key", "Bearer " + p.PublicKey, true, "invalid_secret_key"},
			{"unknown key", "Bearer sk_live_doesnotexist", true, "invalid_secret_key"},
		}
		for _, path := range []string{"/emit", "/emit-tokens/revoke"} {
			body := emitBody
			if path != "/emit" {
				body = `{"clientId":"mallory"}`
			}
			for _, a := range auths {
				r := lcPost(t, ts, "POST", path, a.value, a.set, body)
				if r.Status != http.StatusUnauthorized {
					t.Errorf("%s, %s: %d %s", path, a.name, r.Status, r.Raw)
					continue
				}
				r.Expect(t, http.StatusUnauthorized, `{"error":"`+a.want+`"}`)
			}
		}
		sub.ExpectSilence(100 * time.Millisecond) // nothing above was delivered

		// The 200 body, every key compared. Nothing before this emitted: seq
		// is the first of the channel (a channel's counter starts from the
		// clock in µs when it starts, PROTOCOL.md only promises it increases) and
		// both budgets have spent exactly one.
		r := lcPost(t, ts, "POST", "/emit", bearer, true, emitBody)
		seq1 := uint64(opened.UnixMicro()) + 1
		r.Expect(t, http.StatusOK, fmt.Sprintf(`{"ok":true,"channel":"room.1","seq":%d,"delivered":1,"subscriberCount":1,`+
			`"rate_limit":{"limit":600,"remaining":599,"resetAt":%q},"project_rate_limit":{"limit":6000,"remaining":5999,"resetAt":%q}}`, seq1, resetAt, resetAt))
		sub.Expect(fmt.Sprintf(`{"channel":"room.1","payload":{"x":[1,"two",null]},"seq":%d}`, seq1))

		// The scheme is case-insensitive (RFC 7235); a channel nobody
		// listens on: delivered and subscriberCount 0, its own seq (from the
		// clock when it starts, here) and budget, the project's budget shared.
		started := clock.Advance(time.Millisecond)
		r = lcPost(t, ts, "POST", "/emit", "bearer "+p.SecretKey, true, `{"channel":"empty","payload":null}`)
		r.Expect(t, http.StatusOK, fmt.Sprintf(`{"ok":true,"channel":"empty","seq":%d,"delivered":0,"subscriberCount":0,`+
			`"rate_limit":{"limit":600,"remaining":599,"resetAt":%q},"project_rate_limit":{"limit":6000,"remaining":5998,"resetAt":%q}}`, started.UnixMicro()+1, resetAt, resetAt))

		// The first channel again: the next seq.
		clock.Advance(time.Millisecond)
		r = lcPost(t, ts, "POST", "/emit", bearer, true, `{"channel":"room.1","payload":"again"}`)
		r.Expect(t, http.StatusOK, fmt.Sprintf(`{"ok":true,"channel":"room.1","seq":%d,"delivered":1,"subscriberCount":1,`+
			`"rate_limit":{"limit":600,"remaining":598,"resetAt":%q},"project_rate_limit":{"limit":6000,"remaining":5997,"resetAt":%q}}`, seq1+1, resetAt, resetAt))
		sub.Expect(fmt.Sprintf(`{"channel":"room.1","payload":"again","seq":%d}`, seq1+1))

		lcPost(t, ts, "POST", "/emit-tokens/revoke", "bearer "+p.SecretKey, true, `{"jti":"x"}`).Expect(t, http.StatusOK, `{"ok":true}`)
	})
}

// TestRefusedUpgradeClosesItsConnection: a GET /ws with a good key that is
// not a valid WebSocket handshake is answered (400, or 426 for an unknown
// version) and its connection closed, not left open behind the answer: a
// client that keeps connections alive would wait on it forever. (The
// upgrader hijacks the socket before checking; the transport used to drop it
// without closing it.)
func TestRefusedUpgradeClosesItsConnection(t *testing.T) {
	t.Parallel()
	ts, _, p := lcServer(t, nil)
	addr := ts.Addr()
	head := "GET /ws?publicKey=" + p.PublicKey + " HTTP/1.1\r\nHost: " + addr + "\r\n"
	upgrade := "Upgrade: websocket\r\nConnection: Upgrade\r\n"
	cases := []struct {
		name, request string
		status        int
	}{
		{"no upgrade headers", head + "\r\n", http.StatusBadRequest},
		{"no key", head + upgrade + "Sec-WebSocket-Version: 13\r\n\r\n", http.StatusBadRequest},
		{"short key", head + upgrade + "Sec-WebSocket-Key: c2hvcnQ=\r\nSec-WebSocket-Version: 13\r\n\r\n", http.StatusBadRequest},
		{"unknown version", head + upgrade + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n", http.StatusUpgradeRequired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := conn.Write([]byte(tc.request)); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.status)
			}
			if n, err := br.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("after the refusal: read %d, %v; want the connection closed (EOF)", n, err)
			}
		})
	}
	// A kept-alive Go client goes on after a refusal.
	hc := &http.Client{Timeout: 5 * time.Second}
	for range 3 {
		res, err := hc.Get(ts.Base + "/ws?publicKey=" + p.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain GET /ws: %d", res.StatusCode)
		}
		res, err = hc.Get(ts.Base + "/healthz")
		if err != nil {
			t.Fatalf("next request on the same client: %v", err)
		}
		res.Body.Close()
	}
	if n := ts.app.transport.Len(); n != 0 {
		t.Fatalf("%d connections registered by refused handshakes", n)
	}
}

// ---- 5. the real binary on SIGTERM and SIGINT ----

// lcFillCount is how many 120 KiB messages fill the 32 KiB receive buffer of
// an lcDialSmallBuffer peer and the server's send buffer (at most tcp_wmem's
// maximum) and leave about 1 MiB queued in the server, well under the
// queue's cap (lcQueueBytes, which these tests set): then the server's close
// frame for that peer waits behind its queue for as long as the peer stays.
// ok is false when this host's buffers are too big for that.
func lcFillCount() (n int, ok bool) {
	const frameBytes = 120 << 10
	const queueBytes = lcQueueBytes
	absorbed, ok := lcSocketBuffers()
	n = (absorbed+(1<<20))/frameBytes + 1
	return n, ok && n*frameBytes < queueBytes-(1<<20)
}

// lcSocketBuffers bounds what the kernel holds of the frames sent to an
// lcDialSmallBuffer peer that does not read: the server's send buffer (at
// most tcp_wmem's maximum, which it autotunes to) and the peer's 32 KiB
// receive buffer (doubled by the kernel), with room to spare. ok is false
// when tcp_wmem cannot be read.
func lcSocketBuffers() (bytes int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, false
	}
	sendMax, err := strconv.Atoi(f[2])
	return sendMax + 256<<10, err == nil && sendMax > 0
}

// lcQueueBytes is the write-queue cap of the binaries that lcFillCount
// fills (MAX_QUEUED_BYTES_PER_CONNECTION; the default, 2 MiB, is less than
// a full loopback send buffer holds, so the stuck peer would be dropped as a
// slow consumer instead of holding the drain open).
const lcQueueBytes = 8 << 20

var lcQueueEnv = "MAX_QUEUED_BYTES_PER_CONNECTION=" + strconv.Itoa(lcQueueBytes)

// TestSignalStopsTheBinaryCleanly: SIGTERM and SIGINT each make the real
// binary close every connection with 1001 "server shutting down", refuse
// new handshakes, emits and revokes with 503 service_unavailable while it
// drains, exit 0 within SHUTDOWN_TIMEOUT_SECONDS, and log the shutdown and
// the stop. The drain is held open deterministically by one subscriber that
// reads nothing: its socket is full and its close frame waits behind queued
// messages until it goes away.
func TestSignalStopsTheBinaryCleanly(t *testing.T) {
	t.Parallel()
	const shutdownTimeout = 5 * time.Second
	fill, holdDrain := lcFillCount()
	if !holdDrain {
		t.Fatal("this host's TCP send buffers (tcp_wmem max over about 5.5 MiB) are too big to hold the drain open with a full socket")
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			proc := relaytest.StartBinary(t, "LOG_LEVEL=debug", "SHUTDOWN_TIMEOUT_SECONDS="+strconv.Itoa(int(shutdownTimeout/time.Second)),
				"EMIT_RATE_LIMIT_PER_MINUTE=100000", "PROJECT_RATE_LIMIT_PER_MINUTE=100000", lcQueueEnv)
			ts := binaryServer(t, proc)
			owner := ts.Signup("alice@example.com")
			p := owner.CreateProject("demo")
			readers := []*wsClient{
				ts.Subscribed(t, p.PublicKey, "live"), ts.Subscribed(t, p.PublicKey, "live"), ts.Subscribed(t, p.PublicKey, "live"),
			}
			r := owner.Emit(p.SecretKey, `{"channel":"live","payload":"before"}`)
			if r.Status != 200 || relaytest.Num(r.JSON, "delivered") != 3 {
				t.Fatalf("emit: %d %s", r.Status, r.Raw)
			}
			var stuck *wsClient
			if holdDrain {
				stuck = lcDialSmallBuffer(t, ts, p.PublicKey)
				lcSubscribeUnread(t, stuck, owner, p.SecretKey, "firehose")
				for i := range fill {
					r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":`+lcBigPayload+`}`)
					if r.Status != 200 || relaytest.Num(r.JSON, "delivered") != 1 {
						t.Fatalf("filling emit %d: %d %s", i, r.Status, r.Raw)
					}
				}
			}
			conns := len(readers)
			if stuck != nil {
				conns++
			}

			signalled := time.Now()
			if err := proc.Cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			for i, c := range readers {
				c.ExpectExcept(`{"channel":"live","payload":"before"}`, "seq")
				if f := c.ExpectClose(1001, shutdownTimeout); f.Reason != "server shutting down" {
					t.Fatalf("reader %d: reason %q", i, f.Reason)
				}
			}
			if stuck != nil {
				// Still draining: the new work is refused, in JSON.
				select {
				case <-proc.Exited:
					t.Fatalf("exited while a connection was still draining:\n%s", proc.Logs.String())
				default:
				}
				ts.Handshake("/ws?publicKey="+p.PublicKey).Expect(t, http.StatusServiceUnavailable, `{"error":"service_unavailable"}`)
				owner.Emit(p.SecretKey, `{"channel":"live","payload":"late"}`).Expect(t, 503, `{"error":"service_unavailable"}`)
				owner.Revoke(p.SecretKey, `{"clientId":"x"}`).Expect(t, 503, `{"error":"service_unavailable"}`)
				if n := ts.Metrics(t).Get(t, "relay_handshakes_refused_total", `reason="shutting_down"`); n != 1 {
					t.Fatalf("relay_handshakes_refused_total{shutting_down} = %v, want 1", n)
				}
				stuck.Conn.Close() // the last connection goes; the drain ends
			}
			select {
			case <-proc.Exited:
			case <-time.After(time.Until(signalled.Add(shutdownTimeout))):
				t.Fatalf("still running %v after %v:\n%s", time.Since(signalled), sig, proc.Logs.String())
			}
			took := time.Since(signalled)
			logs := proc.Logs.String()
			if code := proc.Cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("exit status %d after %v, want 0:\n%s", code, sig, logs)
			}
			t.Logf("%v: stopped in %v", sig, took)
			shutting := regexp.MustCompile(`level=INFO msg="shutting down" connections=` + strconv.Itoa(conns) + `\n`)
			stopped := regexp.MustCompile(`level=INFO msg=stopped\n`)
			ls, le := shutting.FindStringIndex(logs), stopped.FindStringIndex(logs)
			if ls == nil || le == nil || le[0] < ls[0] {
				t.Fatalf("want a shutting down line (connections=%d) then a stopped line:\n%s", conns, logs)
			}
			if n := len(lcCloseLog("shutdown", 1001).FindAllString(logs, -1)); n != len(readers) {
				t.Fatalf("%d connections closed with cause=shutdown, want %d:\n%s", n, len(readers), logs)
			}
			if strings.Contains(logs, "level=ERROR") || strings.Contains(logs, "level=WARN") || strings.Contains(logs, "panic") {
				t.Fatalf("errors or warnings logged:\n%s", logs)
			}
		})
	}
}

// TestShutdownTimeoutDropsStuckPeerKeepsUsage: a peer that never reads holds
// the drain until SHUTDOWN_TIMEOUT_SECONDS; then it is dropped, the process
// logs that the bound was reached and exits 0 at once after logging the stop, and the usage counted since the last rollup is still written
// (the final rollup used to run on the expired context and lose it).
func TestShutdownTimeoutDropsStuckPeerKeepsUsage(t *testing.T) {
	// Not parallel: the exit within 3 s of SIGTERM.
	fill, ok := lcFillCount()
	if !ok {
		t.Fatal("this host's TCP send buffers (tcp_wmem max over about 5.5 MiB) are too big to hold the drain open with a full socket")
	}
	const shutdownTimeout = 2 * time.Second
	url := storetest.SQLiteURL(t)
	day := time.Now().UTC().Format(time.DateOnly)
	proc := relaytest.StartBinary(t, "LOG_LEVEL=debug", "DATABASE_URL="+url, "SHUTDOWN_TIMEOUT_SECONDS=2", "USAGE_ROLLUP_SECONDS=3600",
		"EMIT_RATE_LIMIT_PER_MINUTE=100000", "PROJECT_RATE_LIMIT_PER_MINUTE=100000", lcQueueEnv)
	ts := binaryServer(t, proc)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	reader := ts.Subscribed(t, p.PublicKey, "live")
	stuck := lcDialSmallBuffer(t, ts, p.PublicKey)
	emits := lcSubscribeUnread(t, stuck, owner, p.SecretKey, "firehose")
	for i := range fill {
		if r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":`+lcBigPayload+`}`); r.Status != 200 || relaytest.Num(r.JSON, "delivered") != 1 {
			t.Fatalf("filling emit %d: %d %s", i, r.Status, r.Raw)
		}
		emits++
	}

	signalled := time.Now()
	proc.Cmd.Process.Signal(syscall.SIGTERM)
	reader.ExpectClose(1001, shutdownTimeout)
	select {
	case <-proc.Exited:
	case <-time.After(time.Until(signalled.Add(shutdownTimeout + time.Second))):
		t.Fatalf("still running %v after SIGTERM with SHUTDOWN_TIMEOUT_SECONDS=2:\n%s", time.Since(signalled), proc.Logs.String())
	}
	took := time.Since(signalled)
	logs := proc.Logs.String()
	if took < shutdownTimeout-100*time.Millisecond {
		t.Fatalf("exited after %v: the stuck peer should have held the drain for the timeout", took)
	}
	if code := proc.Cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(logs, `level=WARN msg="shutdown bound reached; the rest was dropped" step="closing connections"`) {
		t.Fatalf("exit status %d, want 0 with a warning that the bound was reached:\n%s", code, logs)
	}
	dropped := regexp.MustCompile(lcCloseLog("shutdown", 1001).String() + `reason="server shutting down" abrupt=true `)
	if !dropped.MatchString(logs) || !strings.Contains(logs, "level=INFO msg=stopped\n") {
		t.Fatalf("want the stuck peer dropped (abrupt) and a stopped line:\n%s", logs)
	}
	st, err := store.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	us, err := st.Usage(context.Background(), p.ID, day)
	if err != nil {
		t.Fatal(err)
	}
	var connects, messages int64
	for _, u := range us {
		connects += u.ConnectionCount
		messages += u.MessageCount
	}
	if connects != 2 || messages != int64(emits) {
		t.Fatalf("usage after a timed-out shutdown: %d connects, %d messages (%+v); want 2 and %d", connects, messages, us, emits)
	}
}
