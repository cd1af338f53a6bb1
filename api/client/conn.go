package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/relayhq/relay/proto"
)

// ErrDisconnected fails an operation whose connection dropped before its answer.
var ErrDisconnected = errors.New("relay client: connection lost")

// Client is a connection to a Relay that keeps itself connected.
type Client struct {
	url  string
	opts Options

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// writeMu: one writer on the socket at a time. An operation that waits
	// for an answer holds it from queueing its pending entry until its frame
	// is written, so the pending queues are in the order the frames went out
	// (answers are paired first in, first out per channel). Lock order:
	// writeMu, then mu.
	writeMu sync.Mutex

	mu        sync.Mutex
	conn      net.Conn // nil while disconnected
	state     State
	subs      map[string]*Subscription
	waitSub   map[string][]*pending
	waitUnsub map[string][]*pending
	waitEmit  map[string][]*pending
	pong      chan struct{}
	errs      chan error
	states    chan State
	tok       *tokenState // the current connection's token, with Options.Token; nil otherwise
}

// tokenState is one connection's channel-authorization token: its exp, and
// what dispatch hands the refresher (guarded by Client.mu but the channels).
type tokenState struct {
	exp      time.Time
	expiring chan int64  // a token_expiring's exp
	answer   chan string // the answer to the refresh sent: "ok", invalid_token or unknown_action
	waiting  bool        // a refresh was sent and not answered
	restart  atomic.Bool // a refused refresh: reconnect at once
}

func newTokenState(token string) *tokenState {
	return &tokenState{exp: tokenExp(token), expiring: make(chan int64, 1), answer: make(chan string, 1)}
}

// Dial connects to base (http://host:port, or the ws:// address) with a
// project's public key. The first connection must succeed; after that the
// client reconnects by itself unless Options.NoReconnect.
func Dial(ctx context.Context, base, publicKey string, opts Options) (*Client, error) {
	opts.defaults()
	u, err := wsURL(base, publicKey)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		url: u, opts: opts, ctx: cctx, cancel: cancel,
		subs: map[string]*Subscription{}, waitSub: map[string][]*pending{}, waitUnsub: map[string][]*pending{}, waitEmit: map[string][]*pending{},
		pong: make(chan struct{}, 1), errs: make(chan error, 64), states: make(chan State, 64),
	}
	c.wg.Add(1)
	go c.notifyStates()
	c.setState(Connecting)
	conn, tok, err := c.dial(ctx)
	if err != nil {
		c.setState(Closed)
		cancel()
		close(c.states)
		c.wg.Wait()
		return nil, err
	}
	c.wg.Add(1)
	go c.run(conn, tok)
	return c, nil
}

// Errors delivers error frames that answer no pending operation (dropped
// when nobody reads and 64 are waiting).
func (c *Client) Errors() <-chan error { return c.errs }

func (c *Client) notifyStates() {
	defer c.wg.Done()
	for s := range c.states {
		if c.opts.OnState != nil {
			c.opts.OnState(s)
		}
	}
}

func (c *Client) setState(s State) {
	c.mu.Lock()
	c.state = s
	c.mu.Unlock()
	select {
	case c.states <- s:
	default: // a listener this slow misses intermediate states
	}
}

// State is the current connection state.
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// HandshakeError is a refused connect (401 for a bad key or, with channel
// authorization, a bad or expired token; 503 while the server shuts down).
type HandshakeError struct {
	Status int
	Code   string // the answer's error code (invalid_public_key, invalid_token, token_expired, …), if it had one
}

func (e *HandshakeError) Error() string {
	if e.Code != "" {
		return "relay client: handshake refused: " + http.StatusText(e.Status) + " (" + e.Code + ")"
	}
	return "relay client: handshake refused: " + http.StatusText(e.Status)
}

// dial connects, with a fresh connection token when Options.Token is set
// (returned, for its exp).
func (c *Client) dial(ctx context.Context) (net.Conn, string, error) {
	u, token := c.url, ""
	if c.opts.Token != nil {
		var err error
		if token, err = c.opts.Token(ctx); err != nil {
			return nil, "", fmt.Errorf("relay client: connection token: %w", err)
		}
		u += "&token=" + url.QueryEscape(token)
	}
	var code string
	d := ws.Dialer{Timeout: 10 * time.Second, OnStatusError: func(_ int, _ []byte, resp io.Reader) {
		var b struct {
			Error string `json:"error"`
		}
		if res, err := http.ReadResponse(bufio.NewReader(io.LimitReader(resp, 64<<10)), nil); err == nil {
			json.NewDecoder(io.LimitReader(res.Body, 4<<10)).Decode(&b)
			res.Body.Close()
		}
		code = b.Error
	}}
	conn, br, _, err := d.Dial(ctx, u)
	var se ws.StatusError
	if errors.As(err, &se) {
		return nil, "", &HandshakeError{Status: int(se), Code: code}
	}
	if err != nil {
		return nil, "", err
	}
	if br != nil && br.Buffered() > 0 {
		conn = &bufferedConn{Conn: conn, r: br}
	}
	return conn, token, nil
}

// retryable: a handshake refused for its token, which a fresh one may pass.
func (c *Client) retryable(he *HandshakeError) bool {
	return c.opts.Token != nil && (he.Code == CodeInvalidToken || he.Code == CodeTokenExpired)
}

type bufferedConn struct {
	net.Conn
	r interface{ Read([]byte) (int, error) }
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// run owns the connection cycle: serve a connection, then reconnect with
// backoff, resubscribing, until Close or a reason not to.
func (c *Client) run(conn net.Conn, token string) {
	defer c.wg.Done()
	defer c.shutdown()
	attempt := 0
	for {
		healthy := c.opts.Clock(HealthyConnection) // on the injected clock, like the backoff
		var tok *tokenState
		if c.opts.Token != nil {
			tok = newTokenState(token)
		}
		c.attach(conn, tok)
		code := c.serve(conn, tok)
		c.detach()
		if c.ctx.Err() != nil {
			return
		}
		if c.opts.NoReconnect || code == 4004 || code == CloseTokenRevoked { // the project is gone; the user's tokens were revoked
			return
		}
		select {
		case <-healthy:
			attempt = 0 // it was a healthy connection
		default:
		}
		c.setState(Reconnecting)
		// 4011: the token expired (or a refresh was refused): a fresh token, at once.
		now := code == CloseTokenExpired || tok != nil && tok.restart.Load()
		for {
			if !now {
				select {
				case <-c.opts.Clock(Backoff(attempt, c.opts.MaxReconnectDelay, c.opts.Jitter())):
				case <-c.ctx.Done():
					return
				}
				attempt++
			}
			now = false
			var err error
			conn, token, err = c.dial(c.ctx)
			var he *HandshakeError
			if errors.As(err, &he) && he.Status == http.StatusUnauthorized && !c.retryable(he) {
				c.report(err)
				return // the key was revoked: retrying cannot help
			}
			if err == nil {
				break
			}
			if c.opts.Token != nil && c.ctx.Err() == nil {
				c.report(err) // the token callback's error, or a token refused: the application may want to know
			}
		}
	}
}

// attach makes conn current and resubscribes every subscription, asking for
// replay from the last seq seen (with a fresh subscribe token for those that
// have a Token: one whose Token fails ends, its error on Errors).
func (c *Client) attach(conn net.Conn, tok *tokenState) {
	c.writeMu.Lock() // held while the tokens are fetched: no Subscribe changes opts meanwhile
	defer c.writeMu.Unlock()
	tokens := c.subscribeTokens(c.ctx)
	c.mu.Lock()
	c.conn, c.tok = conn, tok
	var frames [][]byte
	for ch, s := range c.subs {
		s.acked = false // a new connection holds none of them yet
		if err, failed := tokens[s].(error); failed {
			for p := pop(c.waitSub, ch); p != nil; p = pop(c.waitSub, ch) {
				p.done <- err
			}
			delete(c.subs, ch)
			s.end()
			c.report(err)
			continue
		}
		token, _ := tokens[s].(string)
		n := max(1, len(c.waitSub[ch]))
		if len(c.waitSub[ch]) == 0 {
			c.waitSub[ch] = append(c.waitSub[ch], newPending())
		}
		f := subscribeFrame(ch, s.opts, s.lastSeq, s.hasSeq, token)
		for range n {
			frames = append(frames, f)
		}
	}
	c.mu.Unlock()
	c.setState(Open)
	for _, f := range frames {
		c.writeLocked(conn, f)
	}
}

// subscribeTokens calls the Token of every subscription that has one: a
// string, or an error, for each. Caller holds writeMu, not mu.
func (c *Client) subscribeTokens(ctx context.Context) map[*Subscription]any {
	c.mu.Lock()
	var with []*Subscription
	for _, s := range c.subs {
		if s.opts.Token != nil {
			with = append(with, s)
		}
	}
	c.mu.Unlock()
	tokens := map[*Subscription]any{}
	for _, s := range with {
		if t, err := s.opts.Token(ctx); err != nil {
			tokens[s] = &TokenError{Channel: s.channel, Err: err}
		} else {
			tokens[s] = t
		}
	}
	return tokens
}

// TokenError is a subscribe Token that failed: it fails Subscribe, and on a
// reconnect ends the subscription.
type TokenError struct {
	Channel string
	Err     error
}

func (e *TokenError) Error() string {
	return "relay client: subscribe token for " + e.Channel + ": " + e.Err.Error()
}

func (e *TokenError) Unwrap() error { return e.Err }

// detach fails what cannot survive the connection: unsubscribes count as done
// (the new connection will not have the subscription), emits fail.
func (c *Client) detach() {
	c.mu.Lock()
	c.conn, c.tok = nil, nil
	for ch, ps := range c.waitUnsub {
		for _, p := range ps {
			p.done <- nil
		}
		delete(c.waitUnsub, ch)
	}
	for ch, ps := range c.waitEmit {
		for _, p := range ps {
			p.done <- ErrDisconnected
		}
		delete(c.waitEmit, ch)
	}
	c.mu.Unlock()
}

// shutdown ends every subscription and waiter once the client stops.
func (c *Client) shutdown() {
	c.cancel() // first: an operation that takes mu after the maps are cleared sees it (ErrClosed)
	c.mu.Lock()
	for ch, s := range c.subs {
		s.end()
		delete(c.subs, ch)
	}
	for _, m := range []map[string][]*pending{c.waitSub, c.waitUnsub, c.waitEmit} {
		for ch, ps := range m {
			for _, p := range ps {
				p.done <- ErrClosed
			}
			delete(m, ch)
		}
	}
	c.mu.Unlock()
	c.setState(Closed)
	close(c.states)
}

// serve reads until the connection ends and returns the close code (0 when
// the connection just dropped).
func (c *Client) serve(conn net.Conn, tok *tokenState) int {
	stop := make(chan struct{})
	var hb sync.WaitGroup // every goroutine of this connection
	if c.opts.HeartbeatInterval > 0 {
		hb.Add(1)
		go func() { defer hb.Done(); c.heartbeat(conn, stop) }()
	}
	if tok != nil {
		hb.Add(1)
		go func() { defer hb.Done(); c.refresher(conn, tok, stop) }()
	}
	defer func() { close(stop); conn.Close(); hb.Wait() }()
	hb.Add(1)
	go func() { // Close unblocks the read
		defer hb.Done()
		select {
		case <-c.ctx.Done():
			conn.Close()
		case <-stop:
		}
	}()
	for {
		data, err := wsutil.ReadServerText(conn)
		if err != nil {
			var ce wsutil.ClosedError
			if errors.As(err, &ce) {
				return int(ce.Code)
			}
			return 0
		}
		c.dispatch(data)
	}
}

// heartbeat pings every interval and closes the socket when no pong comes
// within the ack timeout, which makes serve return and the client reconnect.
func (c *Client) heartbeat(conn net.Conn, stop chan struct{}) {
	for {
		select {
		case <-c.opts.Clock(c.opts.HeartbeatInterval):
		case <-stop:
			return
		}
		select { // forget a stale pong
		case <-c.pong:
		default:
		}
		c.write(conn, []byte(`{"action":"ping"}`))
		select {
		case <-c.pong:
		case <-c.opts.Clock(c.opts.HeartbeatAckTimeout):
			conn.Close()
			return
		case <-stop:
			return
		}
	}
}

// refreshLead: the connection token is refreshed this long before its exp.
const refreshLead = 30 * time.Second

// refresher refreshes the connection token on the socket: refreshLead
// before its exp, or when the server sends token_expiring. A refused refresh
// closes the socket (run reconnects at once); a project without channel
// authorization answers unknown_action, and it stops. A short token (under
// twice refreshLead when got) is refreshed halfway to its exp, at least a
// second later, and token_expiring about it is left to that timer: a
// backend minting short tokens is not asked in a loop.
func (c *Client) refresher(conn net.Conn, tok *tokenState, stop chan struct{}) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	exp := tok.exp
	isShort := func() bool { return !exp.IsZero() && time.Until(exp) < 2*refreshLead }
	short := isShort() // as the token was got
	for {
		var timer <-chan time.Time
		if !exp.IsZero() {
			left := time.Until(exp)
			timer = c.opts.Clock(max(left-refreshLead, left/2, time.Second))
		}
		select {
		case <-stop:
			return
		case <-timer:
		case e := <-tok.expiring:
			if !exp.IsZero() && (e < exp.Unix() || e == exp.Unix() && short) {
				continue // about a token replaced, or a short one the timer takes care of
			}
		}
		token, err := c.opts.Token(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.report(fmt.Errorf("relay client: connection token: %w", err))
			exp = time.Time{} // no retry but on token_expiring; else a 4011 reconnects
			continue
		}
		b, _ := json.Marshal(map[string]string{"action": "refresh", "token": token})
		c.writeMu.Lock()
		c.mu.Lock()
		tok.waiting = true
		c.mu.Unlock()
		c.writeLocked(conn, b)
		c.writeMu.Unlock()
		var answer string
		select {
		case answer = <-tok.answer:
		case <-stop:
			return
		}
		switch answer {
		case "ok":
			exp = tokenExp(token)
			short = isShort()
		case CodeInvalidToken:
			c.report(&Error{Code: CodeInvalidToken})
			tok.restart.Store(true)
			conn.Close()
			return
		default: // unknown_action: no channel authorization here, the token is ignored
			return
		}
	}
}

func (c *Client) write(conn net.Conn, frame []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.writeLocked(conn, frame)
}

// writeLocked writes with writeMu held by the caller.
func (c *Client) writeLocked(conn net.Conn, frame []byte) error {
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return wsutil.WriteClientText(conn, frame)
}

func (c *Client) report(err error) {
	select {
	case c.errs <- err:
	default:
	}
}

func subscribeFrame(channel string, o SubscribeOptions, since uint64, hasSince bool, token string) []byte {
	m := map[string]any{"action": "subscribe", "channel": channel}
	if o.Presence {
		m["presence"], m["clientId"] = true, o.ClientID
	}
	if hasSince {
		m["since"] = since
	}
	if token != "" {
		m["token"] = token
	}
	b, _ := json.Marshal(m)
	return b
}

// parseSeq reads a seq from its JSON number text exactly (a float64 would be
// exact only below 2^53). The since of a replay_gap is the one this client
// sent, a whole number; anything else (a fraction, an exponent) is read as a
// float and truncated, a negative or non-number as 0.
func parseSeq(raw json.RawMessage) uint64 {
	s := string(raw)
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return n
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), f != f, f <= 0:
		return 0
	case f >= 1<<64:
		return math.MaxUint64
	}
	return uint64(f)
}

// frame is any server message; which fields are set tells its kind.
type frame struct {
	Action   string          `json:"action"`
	Channel  string          `json:"channel"`
	Error    string          `json:"error"`
	Type     string          `json:"type"`
	Event    string          `json:"event"`
	ClientID string          `json:"clientId"`
	Members  []string        `json:"members"`
	Since    json.RawMessage `json:"since"` // a seq as the client sent it: parseSeq
	Seq      *uint64         `json:"seq"`
	Payload  json.RawMessage `json:"payload"`
	Replay   bool            `json:"replay"`
	Exp      int64           `json:"exp"` // token_expiring
	OK       bool            `json:"ok"`  // a refresh's answer
}

// subscribeErrors are the codes that answer a subscribe; the rest of the
// channel-bound codes answer an emit, but too_many_channels, which answers
// whichever of the two came first (a new channel).
var subscribeErrors = map[string]bool{
	string(proto.CodeClientIDRequired): true, string(proto.CodeInvalidSince): true, string(proto.CodeInvalidChannel): true,
	string(proto.CodeTooManySubscriptions): true, string(proto.CodeClientIDTooLong): true,
	string(proto.CodeTooManyPresenceMembers): true,

	// channel authorization
	CodeTokenRequired: true, CodeClientIDMismatch: true, CodeChannelForbidden: true, CodeInvalidSubscribeToken: true,
}

// answersSubscribe: an error frame answers the subscribe waiting on its
// channel rather than an emit. too_many_channels refuses a new channel to
// whichever came first, and a subscribe to it is sent before any emit that
// can get that answer (rule 4 wants the emitter subscribed): while one
// waits, it is the subscribe's. Caller holds mu.
func (c *Client) answersSubscribe(f *frame) bool {
	if f.Error == string(proto.CodeTooManyChannels) {
		return len(c.waitSub[f.Channel]) > 0
	}
	return subscribeErrors[f.Error]
}

func pop(m map[string][]*pending, ch string) *pending {
	ps := m[ch]
	if len(ps) == 0 {
		return nil
	}
	m[ch] = ps[1:]
	if len(m[ch]) == 0 {
		delete(m, ch)
	}
	return ps[0]
}

func (c *Client) dispatch(data []byte) {
	var f frame
	if json.Unmarshal(data, &f) != nil {
		return
	}
	c.mu.Lock()
	sub := c.subs[f.Channel]
	var ev *Event
	var saveSeq *uint64 // for Options.Seqs, once unlocked
	switch {
	case c.tok != nil && c.tok.waiting && f.Channel == "" && (f.Error == CodeInvalidToken || f.Error == string(proto.CodeUnknownAction) || f.Action == "refresh"):
		c.tok.waiting = false
		answer := f.Error
		if answer == "" {
			answer = "ok"
		}
		c.tok.answer <- answer // room for one: one refresh at a time
	case c.tok != nil && f.Type == "token_expiring":
		select {
		case c.tok.expiring <- f.Exp:
		case old := <-c.tok.expiring: // one is waiting: keep the later exp (this is the only sender)
			c.tok.expiring <- max(old, f.Exp)
		}
	case f.Error != "":
		e := &Error{Code: f.Error, Channel: f.Channel}
		var p *pending
		if f.Channel != "" && c.answersSubscribe(&f) {
			p = pop(c.waitSub, f.Channel)
			switch {
			case p == nil || sub == nil || len(c.waitSub[f.Channel]) > 0:
			case p.prev != nil:
				sub.opts = *p.prev // refused: the server keeps the subscription as it was
			default:
				delete(c.subs, f.Channel) // the subscription was refused
				sub.end()
			}
		} else if f.Channel != "" {
			p = pop(c.waitEmit, f.Channel)
		}
		if p != nil {
			p.done <- e
		} else {
			c.report(e)
		}
	case f.Action == "pong":
		select {
		case c.pong <- struct{}{}:
		default:
		}
	case f.Action == proto.ActionSubscribe:
		if sub != nil {
			sub.acked = true
		}
		if p := pop(c.waitSub, f.Channel); p != nil {
			p.done <- nil
		}
	case f.Action == proto.ActionUnsubscribe:
		if p := pop(c.waitUnsub, f.Channel); p != nil {
			p.done <- nil
		}
	case f.Action == proto.ActionEmit:
		if p := pop(c.waitEmit, f.Channel); p != nil && f.Seq != nil {
			p.seq = *f.Seq
			p.done <- nil
		}
		if sub != nil && f.Seq != nil && (!sub.hasSeq || *f.Seq > sub.lastSeq) {
			sub.lastSeq, sub.hasSeq = *f.Seq, true // our own message is not sent back to us
			saveSeq = f.Seq
		}
	case sub == nil:
	case f.Seq != nil: // a message (checked before type, which a client emit chooses)
		if sub.hasSeq && *f.Seq <= sub.lastSeq {
			break // already delivered before a reconnect
		}
		sub.lastSeq, sub.hasSeq = *f.Seq, true
		saveSeq = f.Seq
		ev = &Event{Message: &Message{Channel: f.Channel, Payload: f.Payload, Seq: *f.Seq, Type: f.Type, ClientID: f.ClientID, Replay: f.Replay}}
	case f.Type == "presence":
		switch f.Event {
		case proto.PresenceSync:
			sub.members = append([]string{}, f.Members...)
		case proto.PresenceJoin:
			sub.members = append(sub.members, f.ClientID)
		case proto.PresenceLeave:
			for i, m := range sub.members {
				if m == f.ClientID {
					sub.members = append(sub.members[:i:i], sub.members[i+1:]...)
					break
				}
			}
		}
		ev = &Event{Presence: &PresenceEvent{Event: f.Event, ClientID: f.ClientID, Members: append([]string(nil), sub.members...)}}
	case f.Type == "replay_gap":
		ev = &Event{Gap: &Gap{Since: parseSeq(f.Since)}}
	}
	c.mu.Unlock()
	if ev != nil {
		select {
		case sub.events <- *ev:
		case <-sub.done:
			return
		case <-c.ctx.Done():
			return
		}
	}
	if saveSeq != nil && c.opts.Seqs != nil {
		c.opts.Seqs.SaveSeq(f.Channel, *saveSeq)
	}
}

// subscribed: channel has a subscription (acked or not).
func (c *Client) subscribed(channel string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.subs[channel]
	return ok
}

// current returns the live connection, or nil.
func (c *Client) current() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

func wait(ctx context.Context, p *pending) error {
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Subscribe subscribes to channel and waits for the ack; with opts.Since (or
// a seq from Options.Seqs), the replayed messages (and a Gap, if some are
// lost) are on Events before it returns. The subscription is renewed on every
// reconnect, with replay from its LastSeq.
func (c *Client) Subscribe(ctx context.Context, channel string, opts SubscribeOptions) (*Subscription, error) {
	if err := validate(channel, opts); err != nil {
		return nil, err
	}
	if c.ctx.Err() != nil {
		return nil, ErrClosed
	}
	var token string
	if opts.Token != nil {
		t, err := opts.Token(ctx)
		if err != nil {
			return nil, &TokenError{Channel: channel, Err: err}
		}
		token = t
	}
	p := newPending()
	c.writeMu.Lock()
	// Under writeMu, so that two Subscribes to a channel cannot both start
	// from the stored seq; not under mu, which the reader needs.
	if opts.Since == nil && c.opts.Seqs != nil && !c.subscribed(channel) {
		if seq, ok := c.opts.Seqs.LoadSeq(channel); ok {
			opts.Since = &seq
		}
	}
	c.mu.Lock()
	if c.ctx.Err() != nil { // shut down meanwhile: nothing would answer
		c.mu.Unlock()
		c.writeMu.Unlock()
		return nil, ErrClosed
	}
	s, ok := c.subs[channel]
	if !ok {
		s = &Subscription{c: c, channel: channel, opts: opts, events: make(chan Event, 1024), done: make(chan struct{})}
		c.subs[channel] = s
	} else if s.acked {
		prev := s.opts
		p.prev = &prev
	}
	s.opts = opts
	if opts.Since != nil {
		s.lastSeq, s.hasSeq = *opts.Since, true
	}
	c.waitSub[channel] = append(c.waitSub[channel], p)
	conn, since, has := c.conn, s.lastSeq, s.hasSeq
	c.mu.Unlock()
	if conn != nil {
		c.writeLocked(conn, subscribeFrame(channel, opts, since, has, token)) // a failed write is a drop: attach resends
	}
	c.writeMu.Unlock()
	if err := wait(ctx, p); err != nil {
		return nil, err
	}
	return s, nil
}

// Unsubscribe ends the subscription and waits for the ack.
func (c *Client) Unsubscribe(ctx context.Context, s *Subscription) error {
	p := newPending()
	b, _ := json.Marshal(map[string]string{"action": "unsubscribe", "channel": s.channel})
	c.writeMu.Lock()
	c.mu.Lock()
	if c.subs[s.channel] == s {
		delete(c.subs, s.channel)
	}
	s.end()
	conn := c.conn
	if conn != nil {
		c.waitUnsub[s.channel] = append(c.waitUnsub[s.channel], p)
	}
	c.mu.Unlock()
	if conn == nil {
		c.writeMu.Unlock()
		return nil // nothing to tell: the next connection will not subscribe it
	}
	c.writeLocked(conn, b)
	c.writeMu.Unlock()
	return wait(ctx, p)
}

// Emit client-emits payload on channel with a token minted by the backend;
// the connection must be subscribed there with presence under the token's
// clientId. It returns the message's seq.
func (c *Client) Emit(ctx context.Context, channel, msgType string, payload any, token string) (uint64, error) {
	if !proto.ValidChannel(channel) {
		// The server's invalid_channel would not say which operation it answers.
		return 0, &Error{Code: string(proto.CodeInvalidChannel), Channel: channel}
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return 0, err
	}
	b, _ := json.Marshal(map[string]any{"action": "emit", "channel": channel, "type": msgType, "payload": json.RawMessage(raw), "token": token})
	p := newPending()
	c.writeMu.Lock()
	c.mu.Lock()
	if c.ctx.Err() != nil { // shut down meanwhile: nothing would answer
		c.mu.Unlock()
		c.writeMu.Unlock()
		return 0, ErrClosed
	}
	conn := c.conn
	if conn != nil {
		c.waitEmit[channel] = append(c.waitEmit[channel], p)
	}
	c.mu.Unlock()
	if conn == nil {
		c.writeMu.Unlock()
		return 0, ErrDisconnected
	}
	c.writeLocked(conn, b)
	c.writeMu.Unlock()
	if err := wait(ctx, p); err != nil {
		return 0, err
	}
	return p.seq, nil
}

// Close closes the connection and stops every goroutine of the client.
func (c *Client) Close() error {
	if conn := c.current(); conn != nil { // a polite close first
		c.writeMu.Lock()
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		conn.Write(ws.MustCompileFrame(ws.MaskFrame(ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusNormalClosure, "")))))
		c.writeMu.Unlock()
	}
	c.cancel()
	c.wg.Wait()
	return nil
}
