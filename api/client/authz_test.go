package client

// Channel authorization in the Go client against a scripted server (the
// real one is in cmd/relay's tests): the connection token on every connect,
// its refresh on token_expiring and before exp, a reconnect at once on 4011
// or a refused refresh, subscribe tokens, and the handshake's error code.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// fakeRelay accepts WebSocket connections and hands them to the test; with
// refuse set, it answers the handshake with that status and body instead.
type fakeRelay struct {
	t      *testing.T
	srv    *httptest.Server
	conns  chan *fakeConn
	refuse atomic.Pointer[[2]string] // status, body
}

type fakeConn struct {
	t     *testing.T
	conn  net.Conn
	query url.Values
}

func newFakeRelay(t *testing.T) *fakeRelay {
	f := &fakeRelay{t: t, conns: make(chan *fakeConn, 16)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ref := f.refuse.Load(); ref != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(map[string]int{"401": 401}[ref[0]])
			w.Write([]byte(ref[1]))
			return
		}
		conn, _, _, err := ws.UpgradeHTTP(r, w)
		if err != nil {
			return
		}
		f.conns <- &fakeConn{t: t, conn: conn, query: r.URL.Query()}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRelay) next() *fakeConn {
	f.t.Helper()
	select {
	case c := <-f.conns:
		f.t.Cleanup(func() { c.conn.Close() })
		return c
	case <-time.After(5 * time.Second):
		f.t.Fatal("no connection in 5 s")
	}
	return nil
}

// read returns the next client frame.
func (c *fakeConn) read() map[string]any {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		b, op, err := wsutil.ReadClientData(c.conn)
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		if op != ws.OpText {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			c.t.Fatalf("frame %s: %v", b, err)
		}
		return m
	}
}

func (c *fakeConn) send(frame string) {
	c.t.Helper()
	if err := wsutil.WriteServerText(c.conn, []byte(frame)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *fakeConn) close(code ws.StatusCode, reason string) {
	c.conn.Write(ws.MustCompileFrame(ws.NewCloseFrame(ws.NewCloseFrameBody(code, reason))))
	c.conn.Close()
}

// jwtWithExp is an unsigned-looking JWT whose payload has exp (the client
// reads it without verifying).
func jwtWithExp(name string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc([]byte(fmt.Sprintf(`{"sub":%q,"exp":%d}`, name, exp.Unix()))) + ".sig"
}

// tokens is a Token callback giving name-1, name-2, … (as JWTs expiring in
// ttl), counting its calls.
type tokens struct {
	name  string
	ttl   time.Duration
	calls atomic.Int32
	fail  atomic.Bool
}

func (tk *tokens) token(context.Context) (string, error) {
	n := tk.calls.Add(1)
	if tk.fail.Load() {
		return "", errors.New("backend down")
	}
	return jwtWithExp(fmt.Sprintf("%s-%d", tk.name, n), time.Now().Add(tk.ttl)), nil
}

func sub(t *testing.T, token string) string {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[1])
	if err != nil {
		t.Fatalf("token %q: %v", token, err)
	}
	var c struct{ Sub string }
	json.Unmarshal(raw, &c)
	return c.Sub
}

// neverBackoff is a Clock whose waits never end: a reconnect that happens
// did not wait for its backoff.
func neverBackoff(time.Duration) <-chan time.Time { return nil }

func nextErr(t *testing.T, c *Client) error {
	t.Helper()
	select {
	case err := <-c.Errors():
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("no error in 5 s")
	}
	return nil
}

func TestTokenOnEveryConnectAnd4011(t *testing.T) {
	f := newFakeRelay(t)
	tk := &tokens{name: "ann", ttl: 10 * time.Minute}
	c, err := Dial(context.Background(), f.srv.URL, "pk", Options{Token: tk.token, Clock: neverBackoff, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c1 := f.next()
	if got := c1.query.Get("publicKey"); got != "pk" || sub(t, c1.query.Get("token")) != "ann-1" {
		t.Fatalf("first connect: %v", c1.query)
	}
	done := make(chan *Subscription)
	go func() {
		s, _ := c.Subscribe(context.Background(), "private-user-42", SubscribeOptions{})
		done <- s
	}()
	if m := c1.read(); m["action"] != "subscribe" || m["channel"] != "private-user-42" || m["token"] != nil || m["since"] != nil {
		t.Fatalf("subscribe %v", m)
	}
	c1.send(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
	s := <-done
	c1.send(`{"channel":"private-user-42","payload":1,"seq":7}`)
	if ev := <-s.Events(); ev.Message == nil || ev.Message.Seq != 7 {
		t.Fatalf("event %+v", ev)
	}

	// 4011: at once (the backoff's wait never ends), a fresh token, since.
	c1.close(CloseTokenExpired, "token expired")
	c2 := f.next()
	if sub(t, c2.query.Get("token")) != "ann-2" {
		t.Fatalf("reconnect: %v", c2.query)
	}
	if m := c2.read(); m["action"] != "subscribe" || m["since"] != float64(7) {
		t.Fatalf("resubscribe %v", m)
	}

	// Another close waits for the backoff: no reconnect.
	c2.close(ws.StatusGoingAway, "")
	select {
	case c3 := <-f.conns:
		t.Fatalf("reconnected without the backoff: %v", c3.query)
	case <-time.After(300 * time.Millisecond):
	}
	if tk.calls.Load() != 2 {
		t.Fatalf("token called %d times, want 2", tk.calls.Load())
	}
}

func TestNoTokenOptionSendsNone(t *testing.T) {
	f := newFakeRelay(t)
	c, err := Dial(context.Background(), f.srv.URL, "pk", Options{HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if q := f.next().query; len(q) != 1 || q.Get("publicKey") != "pk" {
		t.Fatalf("query %v", q)
	}
}

func TestRefreshOnTokenExpiring(t *testing.T) {
	f := newFakeRelay(t)
	tk := &tokens{name: "ann", ttl: 10 * time.Minute}
	c, err := Dial(context.Background(), f.srv.URL, "pk", Options{Token: tk.token, Clock: neverBackoff, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c1 := f.next()
	exp := tokenExp(c1.query.Get("token")).Unix()

	c1.send(fmt.Sprintf(`{"type":"token_expiring","exp":%d}`, exp))
	if m := c1.read(); m["action"] != "refresh" || sub(t, m["token"].(string)) != "ann-2" || len(m) != 2 {
		t.Fatalf("refresh %v", m)
	}
	c1.send(`{"action":"refresh","ok":true}`)
	// One about the token replaced is stale: no refresh.
	c1.send(fmt.Sprintf(`{"type":"token_expiring","exp":%d}`, exp-1))
	c1.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if b, err := wsutil.ReadClientText(c1.conn); err == nil {
		t.Fatalf("refreshed on a token_expiring about the token replaced: %s", b)
	}
	if n := tk.calls.Load(); n != 2 {
		t.Fatalf("token called %d times after a stale token_expiring, want 2", n)
	}
	c1.send(`{"action":"pong","ok":true}`)
	c1.send(`{"type":"token_expiring","exp":99999999999}`)
	if m := c1.read(); m["action"] != "refresh" || sub(t, m["token"].(string)) != "ann-3" {
		t.Fatalf("second refresh %v", m)
	}
	// Refused: invalid_token on Errors, a reconnect at once with a fresh token.
	c1.send(`{"error":"invalid_token"}`)
	if e, ok := nextErr(t, c).(*Error); !ok || e.Code != CodeInvalidToken || e.Channel != "" {
		t.Fatalf("error %v", e)
	}
	c2 := f.next()
	if sub(t, c2.query.Get("token")) != "ann-4" {
		t.Fatalf("reconnect: %v", c2.query)
	}
}

// stepTimer is a Clock handing each wait to the test, which fires it.
type stepTimer struct{ waits chan stepWait }

type stepWait struct {
	d    time.Duration
	fire chan time.Time
}

func (s *stepTimer) clock(d time.Duration) <-chan time.Time {
	w := stepWait{d, make(chan time.Time, 1)}
	s.waits <- w
	return w.fire
}

// refreshWait returns the refresher's next wait, passing over the
// healthy-connection timers.
func (s *stepTimer) refreshWait(t *testing.T) stepWait {
	t.Helper()
	for {
		select {
		case w := <-s.waits:
			if w.d != HealthyConnection {
				return w
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no wait in 5 s")
		}
	}
}

func near(d, want time.Duration) bool { return d > want-2*time.Second && d <= want }

// TestRefreshTimer: the refresh is planned 30 s before the token's exp; a
// short token (under 60 s when got) is refreshed halfway, and a
// token_expiring about it does not refresh at once.
func TestRefreshTimer(t *testing.T) {
	f := newFakeRelay(t)
	tk := &tokens{name: "ann", ttl: 10 * time.Minute}
	st := &stepTimer{waits: make(chan stepWait, 64)}
	c, err := Dial(context.Background(), f.srv.URL, "pk", Options{Token: tk.token, Clock: st.clock, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c1 := f.next()
	w := st.refreshWait(t)
	if !near(w.d, 10*time.Minute-30*time.Second) {
		t.Fatalf("refresh planned in %v, want 9m30s", w.d)
	}
	tk.ttl = 40 * time.Second
	w.fire <- time.Now()
	m := c1.read()
	if m["action"] != "refresh" || sub(t, m["token"].(string)) != "ann-2" {
		t.Fatalf("refresh %v", m)
	}
	c1.send(`{"action":"refresh","ok":true}`)
	if w := st.refreshWait(t); !near(w.d, 20*time.Second) {
		t.Fatalf("short token's refresh planned in %v, want 20s", w.d)
	}
	c1.send(fmt.Sprintf(`{"type":"token_expiring","exp":%d}`, tokenExp(m["token"].(string)).Unix()))
	if w := st.refreshWait(t); !near(w.d, 20*time.Second) { // planned again, not refreshed
		t.Fatalf("after token_expiring: a wait of %v", w.d)
	}
	c1.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if b, err := wsutil.ReadClientText(c1.conn); err == nil {
		t.Fatalf("refreshed on token_expiring about a short token: %s", b)
	}
}

func TestUnknownActionStopsRefreshing(t *testing.T) {
	f := newFakeRelay(t)
	tk := &tokens{name: "ann", ttl: 10 * time.Minute}
	c, err := Dial(context.Background(), f.srv.URL, "pk", Options{Token: tk.token, Clock: neverBackoff, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c1 := f.next()
	c1.send(`{"type":"token_expiring","exp":99999999999}`)
	c1.read()
	c1.send(`{"error":"unknown_action"}`) // a project without channel authorization
	c1.send(`{"type":"token_expiring","exp":99999999999}`)
	c1.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if b, err := wsutil.ReadClientText(c1.conn); err == nil {
		t.Fatalf("refreshed after unknown_action: %s", b)
	}
	select {
	case err := <-c.Errors():
		t.Fatalf("error %v", err)
	default:
	}
}

func TestSubscribeToken(t *testing.T) {
	f := newFakeRelay(t)
	open := make(chan struct{}, 1)
	c, err := Dial(context.Background(), f.srv.URL, "pk", Options{Clock: neverBackoff, HeartbeatInterval: -1, OnState: func(s State) {
		if s == Open {
			select {
			case open <- struct{}{}:
			default:
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c1 := f.next()
	select {
	case <-open:
	case <-time.After(5 * time.Second):
		t.Fatal("not open within 5 s")
	}
	var calls atomic.Int32
	opts := SubscribeOptions{Token: func(context.Context) (string, error) {
		return fmt.Sprintf("st-%d", calls.Add(1)), nil
	}}
	type result struct {
		s   *Subscription
		err error
	}
	res := make(chan result, 1)
	subscribe := func(ch string, o SubscribeOptions) {
		go func() {
			s, err := c.Subscribe(context.Background(), ch, o)
			res <- result{s, err}
		}()
	}
	subscribe("private-doc-9", opts)
	if m := c1.read(); m["channel"] != "private-doc-9" || m["token"] != "st-1" {
		t.Fatalf("subscribe %v", m)
	}
	c1.send(`{"action":"subscribe","channel":"private-doc-9","ok":true}`)
	doc := <-res
	if doc.err != nil {
		t.Fatal(doc.err)
	}

	// Refused: the code, as other subscribe errors.
	for _, code := range []string{CodeChannelForbidden, CodeInvalidSubscribeToken, CodeTokenRequired, CodeClientIDMismatch} {
		subscribe("private-x", SubscribeOptions{})
		c1.read()
		c1.send(`{"error":"` + code + `","channel":"private-x"}`)
		if r := <-res; r.s != nil || r.err.(*Error).Code != code || r.err.(*Error).Channel != "private-x" {
			t.Fatalf("%s: %v %v", code, r.s, r.err)
		}
	}
	// A Token that fails fails Subscribe, nothing sent.
	boom := errors.New("no grant")
	_, err = c.Subscribe(context.Background(), "private-y", SubscribeOptions{Token: func(context.Context) (string, error) { return "", boom }})
	var te *TokenError
	if !errors.As(err, &te) || te.Channel != "private-y" || !errors.Is(err, boom) {
		t.Fatalf("failing token: %v", err)
	}

	// A reconnect asks the Token again.
	c1.close(CloseTokenExpired, "")
	c2 := f.next()
	if m := c2.read(); m["channel"] != "private-doc-9" || m["token"] != "st-2" {
		t.Fatalf("resubscribe %v", m)
	}
	// A reconnect whose Token fails ends the subscription, the error on Errors.
	calls.Store(100)
	opts2 := SubscribeOptions{Token: func(context.Context) (string, error) {
		if calls.Add(1) > 101 {
			return "", boom
		}
		return "st", nil
	}}
	subscribe("private-z", opts2)
	c2.read()
	c2.send(`{"action":"subscribe","channel":"private-z","ok":true}`)
	z := <-res
	c2.close(CloseTokenExpired, "")
	c3 := f.next()
	if m := c3.read(); m["channel"] != "private-doc-9" {
		t.Fatalf("resubscribe %v", m)
	}
	if err := nextErr(t, c); !errors.As(err, &te) || te.Channel != "private-z" {
		t.Fatalf("error %v", err)
	}
	select {
	case <-z.s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("private-z not ended")
	}
}

func TestHandshakeErrorCode(t *testing.T) {
	f := newFakeRelay(t)
	f.refuse.Store(&[2]string{"401", `{"error":"token_expired"}`})
	tk := &tokens{name: "ann", ttl: time.Minute}
	_, err := Dial(context.Background(), f.srv.URL, "pk", Options{Token: tk.token})
	var he *HandshakeError
	if !errors.As(err, &he) || he.Status != 401 || he.Code != CodeTokenExpired {
		t.Fatalf("%v", err)
	}
	tk.fail.Store(true)
	if _, err := Dial(context.Background(), f.srv.URL, "pk", Options{Token: tk.token}); err == nil || !strings.Contains(err.Error(), "backend down") {
		t.Fatalf("failing token: %v", err)
	}
}

func TestTokenExp(t *testing.T) {
	at := time.Unix(1763925400, 0)
	if got := tokenExp(jwtWithExp("a", at)); !got.Equal(at) {
		t.Fatalf("%v", got)
	}
	for _, bad := range []string{"", "a.b", "a.!!.c", "a." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x"}`)) + ".c"} {
		if got := tokenExp(bad); !got.IsZero() {
			t.Fatalf("%q: %v", bad, got)
		}
	}
}

// 4012 (the backend revoked this user's tokens): the client does not
// reconnect, even when its backoff would let it at once.
func TestNoReconnectAfter4012(t *testing.T) {
	f := newFakeRelay(t)
	tk := &tokens{name: "ann", ttl: 10 * time.Minute}
	// Every wait but the token's refresh (minutes away) ends at once: a
	// refresh at once, unanswered by the fake relay, would close the socket
	// and reconnect before the 4012 arrives.
	now := func(d time.Duration) <-chan time.Time {
		if d > HealthyConnection {
			return nil
		}
		ch := make(chan time.Time, 1)
		ch <- time.Now()
		return ch
	}
	c, err := Dial(context.Background(), f.srv.URL, "pk", Options{Token: tk.token, Clock: now, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f.next().close(CloseTokenRevoked, "token revoked")
	select {
	case again := <-f.conns:
		t.Fatalf("reconnected after 4012: %v", again.query)
	case <-time.After(300 * time.Millisecond):
	}
}
