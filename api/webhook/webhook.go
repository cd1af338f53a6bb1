// Package webhook delivers webhook events (api/README.md › Webhooks and usage:
// connect and disconnect, the channel and presence events a project opted
// in to, and test events) off the hot path: a bounded queue per project,
// workers shared fairly between projects, a timeout per attempt, retries
// with backoff for a bounded time (retry.go), the last deliveries of each
// project (history.go), and counters for what was sent, failed or dropped.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Event is one webhook body, in api/README.md › Webhooks and usage's field
// order: id, event, projectId, then connectionId (connect and disconnect) or
// channel (and clientId for member_added and member_removed), timestamp,
// then the disconnect status and reason.
type Event struct {
	// ID is unique per event and the same on every attempt (receivers
	// dedupe by it): 16 random bytes, base64url without padding. Deliver
	// sets it when empty.
	ID                   string  `json:"id"`
	Event                string  `json:"event"` // "connect", "disconnect", "channel_occupied", …
	ProjectID            string  `json:"projectId"`
	ConnectionID         string  `json:"connectionId,omitempty"` // connect and disconnect (never empty there)
	Channel              string  `json:"channel,omitempty"`      // channel and presence events
	ClientID             string  `json:"clientId,omitempty"`     // member_added and member_removed
	Timestamp            string  `json:"timestamp"`
	DisconnectStatusCode *int    `json:"disconnectStatusCode,omitempty"`
	DisconnectReason     *string `json:"disconnectReason,omitempty"`
}

// Delivery is an event and where it goes.
type Delivery struct {
	URL    string
	Secret string
	Event  Event
}

// Sign is the X-Service-Signature value for body: sha256=<hex HMAC-SHA256>.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Config of a Dispatcher. Zero values take the defaults (api/README.md › Webhooks
// and usage).
type Config struct {
	Timeout         time.Duration // per attempt (WEBHOOK_TIMEOUT_MS)
	Workers         int           // deliveries at once over all projects (WEBHOOK_WORKERS, 32)
	QueueSize       int           // events waiting over all projects, retries included (WEBHOOK_QUEUE_TOTAL, 10 000)
	ProjectQueue    int           // events waiting for one project, retries included (WEBHOOK_QUEUE_PER_PROJECT, 1 000)
	ProjectInFlight int           // deliveries of one project at once (WEBHOOK_IN_FLIGHT_PER_PROJECT, 2)
	AllowPrivate    bool          // allow loopback, private and link-local targets
	Logger          *slog.Logger

	// Retries (retry.go). MaxAttempts counts the first (WEBHOOK_RETRY_MAX_ATTEMPTS,
	// 10; 1 turns retries off); no attempt starts later than RetryFor after
	// the first (WEBHOOK_RETRY_MAX_SECONDS, 5 minutes). The delay before
	// retry n is RetryBase·2^(n-1) (1 s), at most RetryMaxDelay (60 s),
	// of which a random half is taken off (jitter).
	MaxAttempts   int
	RetryFor      time.Duration
	RetryBase     time.Duration
	RetryMaxDelay time.Duration

	// History is how many deliveries of each project are kept for the
	// dashboard and the API (50), over at most HistoryProjects projects
	// (1 000; the least recently active are forgotten first).
	History         int
	HistoryProjects int

	Now func() time.Time // records' times and the retry bound; time.Now if nil
}

// Drop reasons: why an event was never sent (the reason label of
// relay_webhook_drops_total).
const (
	DropProjectQueueFull = "project_queue_full" // its project had ProjectQueue events waiting (also a retry that found no room)
	DropQueueFull        = "queue_full"         // QueueSize events were waiting over all projects
	DropShutdown         = "shutdown"           // queued at or after Close, still queued when its bound ran out, or waiting for a retry at Close
)

// Stats are cumulative counters, and gauges of the queues now. They are
// totals over all projects: a label per project would grow without bound.
type Stats struct {
	// Sent, Failed (given up: an answer that is not retried, or the retry
	// bound reached), Dropped and Refused count events, each once, at its
	// end; Retried counts the attempts that failed and were retried.
	Sent, Failed, Dropped, Refused, Retried int64
	DroppedBy                               map[string]int64 // Dropped by reason (the Drop… constants)
	// ProjectOverflows counts the times a project's queue filled up and it
	// began losing events (each such project is also named in one warning).
	ProjectOverflows int64

	Queued         int // events waiting: for a worker, or for their next attempt (Retrying)
	Retrying       int // events waiting for their next attempt's time
	InFlight       int // deliveries under way
	ProjectsQueued int // projects with events waiting or under way
	ProjectsFull   int // projects whose queue is full now, so that their new events are dropped
}

// Errors of Test (and of an event refused at once).
var (
	ErrQueueFull = errors.New("webhook queue full")
	ErrClosed    = errors.New("webhook dispatcher closed")
)

// Dispatcher sends deliveries in the background, fairly between projects:
// each project has its own bounded queue and at most ProjectInFlight
// deliveries under way, and the workers take one event from each project
// with events waiting in turn (round robin). So a project whose receiver
// never answers holds ProjectInFlight workers for WEBHOOK_TIMEOUT_MS at a
// time and fills only its own queue: the other projects' events go out
// meanwhile. A failed attempt that may be retried waits in its project's
// delay set, counted in its project's queue, and when its time comes it
// takes its project's turns like any other event.
type Dispatcher struct {
	cfg    Config
	client *http.Client
	log    *slog.Logger
	now    func() time.Time
	wg     sync.WaitGroup
	// stop cancels deliveries under way once Close's bound has run out.
	stopCtx context.Context
	stop    context.CancelFunc

	mu       sync.Mutex
	cond     *sync.Cond          // signalled when ready grows or the dispatcher closes
	projects map[string]*pending // projects with events waiting or under way; owned under mu
	ready    []*pending          // projects with an event waiting and room in flight, served in turn
	queued   int                 // events waiting for a worker (first attempts and due retries)
	waiting  int                 // events waiting for a retry's time
	inFlight int
	closed   bool
	full     bool // the shared bound was reached (warned once until the queue empties)
	ids      *rand.ChaCha8
	history  history
	refusals map[string]*refusalLog // refusal log lines per project (retry.go)

	sent, failed, refused, retried, overflows int64
	dropped                                   map[string]int64
}

// pending is one project's queue. Every field is guarded by Dispatcher.mu.
type pending struct {
	id       string
	due      []*job // retries whose time has come, oldest first: taken before queue
	queue    []*job // first attempts, oldest first
	delayed  map[*job]struct{}
	inFlight int
	ready    bool  // in Dispatcher.ready
	drops    int64 // events of this project dropped since its queue last emptied
}

// size is what counts against ProjectQueue: every event of p waiting.
func (p *pending) size() int { return len(p.due) + len(p.queue) + len(p.delayed) }

// job is one event on its way: its body, the same bytes on every attempt.
type job struct {
	del     Delivery
	body    []byte    // marshalled at the first attempt
	first   time.Time // when the first attempt began
	timer   *time.Timer
	rec     *Record // in the project's history; guarded by Dispatcher.mu
	attempt int     // attempts made
}

// New starts the workers.
func New(cfg Config) *Dispatcher {
	if cfg.Workers <= 0 {
		cfg.Workers = 32
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 10000
	}
	if cfg.ProjectQueue <= 0 {
		cfg.ProjectQueue = 1000
	}
	if cfg.ProjectInFlight <= 0 {
		cfg.ProjectInFlight = 2
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2500 * time.Millisecond
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 10
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 5 * time.Minute
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = time.Second
	}
	if cfg.RetryMaxDelay <= 0 {
		cfg.RetryMaxDelay = time.Minute
	}
	if cfg.History <= 0 {
		cfg.History = 50
	}
	if cfg.HistoryProjects <= 0 {
		cfg.HistoryProjects = 1000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var seed [32]byte
	crand.Read(seed[:])
	d := &Dispatcher{
		cfg:      cfg,
		log:      cfg.Logger,
		now:      cfg.Now,
		client:   NewClient(cfg.Timeout, cfg.AllowPrivate),
		projects: map[string]*pending{},
		dropped:  map[string]int64{},
		ids:      rand.NewChaCha8(seed),
		history:  newHistory(cfg.History, cfg.HistoryProjects),
		refusals: map[string]*refusalLog{},
	}
	d.cond = sync.NewCond(&d.mu)
	d.stopCtx, d.stop = context.WithCancel(context.Background())
	for range cfg.Workers {
		d.wg.Add(1)
		go d.work()
	}
	return d
}

// NewClient is the HTTP client webhooks are sent with, and that fetches
// the other URLs a project chooses (its JWKS): timeout per request (the
// TLS handshake included), no redirect followed, and unless allowPrivate
// (WEBHOOK_ALLOW_PRIVATE_ADDRESSES) a dialer that refuses loopback,
// private, link-local and other non-public addresses, checked on the
// address dialled after DNS.
func NewClient(timeout time.Duration, allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	if !allowPrivate {
		dialer.Control = refusePrivate // checked on the resolved address: no DNS rebinding
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:         dialer.DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     30 * time.Second,
			TLSHandshakeTimeout: timeout,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// ValidURL reports whether raw is an absolute http or https URL.
func ValidURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil
}

var errPrivate = errors.New("webhook target is a private address")

// nonPublic are the special-purpose ranges (RFC 6890 and successors) that
// net/netip's predicates do not cover but that can still lead inside a
// network: "this network", carrier-grade NAT, IETF protocol assignments,
// benchmarking, reserved, and NAT64 prefixes that embed an IPv4 address.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// refusePrivate is the dialer's Control: it sees the address actually being
// dialled, after DNS, so a name that resolves inside cannot slip through.
func refusePrivate(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return errPrivate
	}
	if !publicAddr(ap.Addr()) {
		return errPrivate
	}
	return nil
}

func publicAddr(ip netip.Addr) bool {
	ip = ip.Unmap() // ::ffff:10.0.0.1 is 10.0.0.1
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// Deliver queues del without waiting (it is called from actors' Receive); a
// full queue, the project's or the shared one, drops it (counted). It gives
// the event its id when it has none.
func (d *Dispatcher) Deliver(del Delivery) {
	d.enqueue(del)
}

// Test queues a "test" event for projectID to url, signed with secret, as
// any other event (same queue, turns and retries), and returns its record.
// ErrQueueFull: the project's or the shared queue is full; ErrClosed: the
// dispatcher is shutting down.
func (d *Dispatcher) Test(projectID, url, secret string) (Record, error) {
	return d.enqueue(Delivery{URL: url, Secret: secret, Event: Event{Event: "test", ProjectID: projectID, Timestamp: Timestamp(d.now())}})
}

// Timestamp is how event bodies write a moment: UTC with milliseconds.
func Timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func (d *Dispatcher) enqueue(del Delivery) (Record, error) {
	var warn func()
	var rec Record
	var err error
	d.mu.Lock()
	switch p := d.projects[del.Event.ProjectID]; {
	case d.closed:
		d.dropped[DropShutdown]++
		err = ErrClosed
	case p != nil && p.size() >= d.cfg.ProjectQueue:
		warn = d.projectFull(p, del.URL)
		err = ErrQueueFull
	case d.queued+d.waiting >= d.cfg.QueueSize:
		warn = d.sharedFull()
		err = ErrQueueFull
	default:
		if p == nil {
			p = &pending{id: del.Event.ProjectID, delayed: map[*job]struct{}{}}
			d.projects[p.id] = p
		}
		if del.Event.ID == "" {
			del.Event.ID = d.newID()
		}
		j := &job{del: del, rec: &Record{ID: del.Event.ID, Event: del.Event.Event, CreatedAt: d.now(), Status: StatusPending}}
		d.history.add(p.id, j.rec)
		rec = *j.rec
		p.queue = append(p.queue, j)
		d.queued++
		d.makeReady(p)
	}
	d.mu.Unlock()
	if warn != nil {
		warn() // outside the lock: a slow log sink must not hold the actors
	}
	return rec, err
}

// newID is 16 random bytes, base64url without padding. Called with mu held.
func (d *Dispatcher) newID() string {
	var b [16]byte
	d.ids.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// projectFull counts an event of p dropped for p's own queue, and returns
// the warning to log at the first one since p's queue last emptied. Called
// with mu held.
func (d *Dispatcher) projectFull(p *pending, rawURL string) (warn func()) {
	d.dropped[DropProjectQueueFull]++
	if p.drops++; p.drops == 1 {
		d.overflows++
		id, url := p.id, RedactURL(rawURL)
		return func() {
			d.log.Warn("webhook queue of a project is full: its events are dropped until its receiver catches up",
				"project", id, "url", url, "queued", d.cfg.ProjectQueue, "timeout", d.cfg.Timeout)
		}
	}
	return nil
}

// sharedFull counts an event dropped for the shared bound. Called with mu held.
func (d *Dispatcher) sharedFull() (warn func()) {
	d.dropped[DropQueueFull]++
	if !d.full {
		d.full = true
		return func() {
			d.log.Warn("webhook queue is full: events of every project are dropped", "queued", d.cfg.QueueSize)
		}
	}
	return nil
}

// makeReady puts p in line if it has an event waiting and room in flight.
// Called with mu held.
func (d *Dispatcher) makeReady(p *pending) {
	if p.ready || len(p.queue)+len(p.due) == 0 || p.inFlight >= d.cfg.ProjectInFlight {
		return
	}
	p.ready = true
	d.ready = append(d.ready, p)
	d.cond.Signal()
}

// next waits for an event to send and takes it, or reports false once the
// dispatcher is closed and nothing is left.
func (d *Dispatcher) next() (*pending, *job, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.ready) == 0 {
		if d.closed && d.queued == 0 {
			return nil, nil, false
		}
		d.cond.Wait()
	}
	p := d.ready[0]
	d.ready[0] = nil
	d.ready = d.ready[1:]
	p.ready = false
	var j *job
	if len(p.due) > 0 { // a retry is older than any first attempt waiting
		j, p.due[0] = p.due[0], nil
		p.due = p.due[1:]
	} else {
		j, p.queue[0] = p.queue[0], nil
		p.queue = p.queue[1:]
	}
	p.inFlight++
	d.inFlight++
	d.queued--
	if d.queued+d.waiting == 0 {
		d.full = false
	}
	if d.queued == 0 && d.closed {
		d.cond.Broadcast() // the idle workers can stop
	}
	j.attempt++
	j.rec.Attempts = j.attempt
	j.rec.NextAttemptAt = time.Time{}
	if j.attempt == 1 {
		j.first = d.now()
	}
	d.makeReady(p) // to the back of the line: one event per project per turn
	return p, j, true
}

// done ends one attempt of j, of p: counts its outcome, or puts j in p's
// delay set for a retry; and forgets p once it has nothing left.
func (d *Dispatcher) done(p *pending, j *job, res result) {
	var notes []func()
	now := d.now()
	d.mu.Lock()
	j.rec.LastAttemptAt, j.rec.StatusCode = now, res.status
	if res.err != "" { // a success keeps the error of the attempt before it
		j.rec.LastError = res.err
	}
	switch {
	case res.outcome == outcomeSent:
		d.sent++
		j.rec.Status = StatusDelivered
	case res.outcome == outcomeRefused:
		d.refused++
		j.rec.Status = StatusRefused
		if note := d.refusal(p.id, j.del.URL, res.err, now); note != nil {
			notes = append(notes, note)
		}
	default:
		delay, retry := d.retryDelay(j, res, now)
		switch {
		case !retry:
			d.failed++
			j.rec.Status = StatusFailed
		case p.size() >= d.cfg.ProjectQueue:
			notes = append(notes, d.projectFull(p, j.del.URL))
			j.rec.Status, j.rec.LastError = StatusDropped, res.err+"; no room to retry: the project's webhook queue is full"
		case d.queued+d.waiting >= d.cfg.QueueSize:
			notes = append(notes, d.sharedFull())
			j.rec.Status, j.rec.LastError = StatusDropped, res.err+"; no room to retry: the webhook queue is full"
		default:
			d.retried++
			j.rec.Status, j.rec.NextAttemptAt = StatusRetrying, now.Add(delay)
			p.delayed[j] = struct{}{}
			d.waiting++
			j.timer = time.AfterFunc(delay, func() { d.retryDue(p, j) })
		}
	}
	p.inFlight--
	d.inFlight--
	d.makeReady(p)
	if p.size() == 0 && p.inFlight == 0 {
		delete(d.projects, p.id)
		if p.drops > 0 {
			id, n := p.id, p.drops
			notes = append(notes, func() { d.log.Info("webhook queue of a project caught up", "project", id, "dropped", n) })
		}
	}
	d.mu.Unlock()
	for _, note := range notes {
		if note != nil {
			note()
		}
	}
}

// retryDue moves j, whose delay is over, from p's delay set to p's line.
func (d *Dispatcher) retryDue(p *pending, j *job) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := p.delayed[j]; !ok { // Close dropped it meanwhile
		return
	}
	delete(p.delayed, j)
	d.waiting--
	p.due = append(p.due, j)
	d.queued++
	d.makeReady(p)
}

func (d *Dispatcher) work() {
	defer d.wg.Done()
	for {
		p, j, ok := d.next()
		if !ok {
			return
		}
		d.done(p, j, d.send(j))
	}
}

type outcome int

const (
	outcomeSent outcome = iota
	outcomeFailed
	outcomeRefused
)

// result is how one attempt ended: its outcome, the receiver's status (0
// without an answer), what went wrong ("" when sent), and whether a failure
// may be retried (after at least retryAfter, when the receiver said so).
type result struct {
	outcome    outcome
	status     int
	err        string
	retryable  bool
	retryAfter time.Duration
}

func (d *Dispatcher) send(j *job) result {
	del := j.del
	if j.body == nil {
		j.body, _ = json.Marshal(del.Event)
	}
	ctx, cancel := context.WithTimeout(d.stopCtx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, del.URL, bytes.NewReader(j.body))
	if err != nil {
		d.log.Debug("webhook not delivered", "project", del.Event.ProjectID, "event", del.Event.Event, "err", redactErr(err))
		return result{outcome: outcomeRefused, err: "invalid URL"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "relay-webhook/1")
	req.Header.Set("X-Service-Signature", Sign(del.Secret, j.body))
	req.Header.Set("X-Relay-Event-Id", del.Event.ID)
	res, err := d.client.Do(req)
	if err != nil {
		d.log.Debug("webhook not delivered", "project", del.Event.ProjectID, "event", del.Event.Event, "attempt", j.attempt, "err", redactErr(err))
		if errors.Is(err, errPrivate) {
			return result{outcome: outcomeRefused, err: refusedPrivate}
		}
		return result{outcome: outcomeFailed, err: attemptError(err, d.cfg.Timeout), retryable: true}
	}
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		return result{outcome: outcomeSent, status: res.StatusCode}
	}
	d.log.Debug("webhook refused by receiver", "project", del.Event.ProjectID, "status", res.StatusCode, "attempt", j.attempt)
	return result{outcome: outcomeFailed, status: res.StatusCode, err: "HTTP " + strconv.Itoa(res.StatusCode),
		retryable: retryableStatus(res.StatusCode), retryAfter: retryAfter(res.Header.Get("Retry-After"))}
}

// RedactURL is raw for logs: a query string (and a fragment, and a password
// should there be one) often carries a token, so it is replaced by
// "redacted"; scheme, host and path stay, to tell receivers apart.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.RawQuery != "" {
		u.RawQuery = "redacted"
	}
	if u.Fragment != "" || u.RawFragment != "" {
		u.Fragment, u.RawFragment = "redacted", ""
	}
	return u.Redacted()
}

// redactErr hides the query string of the URL net/http puts in its errors.
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return &url.Error{Op: ue.Op, URL: RedactURL(ue.URL), Err: ue.Err}
	}
	return err
}

// Stats returns the counters and gauges.
func (d *Dispatcher) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := Stats{Sent: d.sent, Failed: d.failed, Refused: d.refused, Retried: d.retried, ProjectOverflows: d.overflows,
		DroppedBy: map[string]int64{}, Queued: d.queued + d.waiting, Retrying: d.waiting, InFlight: d.inFlight, ProjectsQueued: len(d.projects)}
	for _, r := range []string{DropProjectQueueFull, DropQueueFull, DropShutdown} {
		st.DroppedBy[r] = d.dropped[r]
		st.Dropped += d.dropped[r]
	}
	for _, p := range d.projects {
		if p.size() >= d.cfg.ProjectQueue {
			st.ProjectsFull++
		}
	}
	return st
}

// Close stops taking events, drops the retries waiting for their time (they
// are held in memory only: a restart loses them), and waits for the queued
// events until ctx ends; then what is still queued is dropped (counted) and
// deliveries under way are cut short. An attempt that fails from now on is
// not retried.
func (d *Dispatcher) Close(ctx context.Context) error {
	d.mu.Lock()
	d.closed = true
	for id, p := range d.projects {
		for j := range p.delayed {
			j.timer.Stop()
			j.rec.Status, j.rec.NextAttemptAt = StatusDropped, time.Time{}
			d.dropped[DropShutdown]++
		}
		d.waiting -= len(p.delayed)
		clear(p.delayed)
		if p.size() == 0 && p.inFlight == 0 {
			delete(d.projects, id)
		}
	}
	d.cond.Broadcast()
	d.mu.Unlock()
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
		d.stop()
		return nil
	case <-ctx.Done():
	}
	d.mu.Lock()
	for id, p := range d.projects {
		for _, q := range [][]*job{p.due, p.queue} {
			for _, j := range q {
				j.rec.Status = StatusDropped
			}
			d.dropped[DropShutdown] += int64(len(q))
		}
		p.due, p.queue, p.ready = nil, nil, false
		if p.inFlight == 0 {
			delete(d.projects, id)
		}
	}
	d.ready, d.queued = nil, 0
	d.cond.Broadcast()
	d.mu.Unlock()
	d.stop()
	return ctx.Err()
}
