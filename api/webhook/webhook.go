// Package webhook delivers webhook events (README.md › Webhooks and usage:
// connect and disconnect, and the channel and presence events a project
// opted in to) off the hot path: a bounded queue per project, workers shared
// fairly between projects, one attempt each, a timeout, and counters for
// what was sent, failed or dropped.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// Event is one webhook body, in README.md › Webhooks and usage's field
// order: event, projectId, then connectionId (connect and disconnect) or
// channel (and clientId for member_added and member_removed), timestamp,
// then the disconnect status and reason.
type Event struct {
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

// Config of a Dispatcher. Zero values take the defaults (README › Webhooks
// and usage).
type Config struct {
	Timeout         time.Duration // per attempt (WEBHOOK_TIMEOUT_MS)
	Workers         int           // deliveries at once over all projects (WEBHOOK_WORKERS, 32)
	QueueSize       int           // events waiting over all projects (WEBHOOK_QUEUE_TOTAL, 10 000)
	ProjectQueue    int           // events waiting for one project (WEBHOOK_QUEUE_PER_PROJECT, 1 000)
	ProjectInFlight int           // deliveries of one project at once (WEBHOOK_IN_FLIGHT_PER_PROJECT, 2)
	AllowPrivate    bool          // allow loopback, private and link-local targets
	Logger          *slog.Logger
}

// Drop reasons: why an event was never sent (the reason label of
// relay_webhook_drops_total).
const (
	DropProjectQueueFull = "project_queue_full" // its project had ProjectQueue events waiting
	DropQueueFull        = "queue_full"         // QueueSize events were waiting over all projects
	DropShutdown         = "shutdown"           // queued at or after Close, or still queued when its bound ran out
)

// Stats are cumulative counters, and gauges of the queues now. They are
// totals over all projects: a label per project would grow without bound.
type Stats struct {
	Sent, Failed, Dropped, Refused int64
	DroppedBy                      map[string]int64 // Dropped by reason (the Drop… constants)
	// ProjectOverflows counts the times a project's queue filled up and it
	// began losing events (each such project is also named in one warning).
	ProjectOverflows int64

	Queued         int // events waiting
	InFlight       int // deliveries under way
	ProjectsQueued int // projects with events waiting or under way
	ProjectsFull   int // projects whose queue is full now, so that their new events are dropped
}

// Dispatcher sends deliveries in the background, fairly between projects:
// each project has its own bounded queue and at most ProjectInFlight
// deliveries under way, and the workers take one event from each project
// with events waiting in turn (round robin). So a project whose receiver
// never answers holds ProjectInFlight workers for WEBHOOK_TIMEOUT_MS at a
// time and fills only its own queue: the other projects' events go out
// meanwhile.
type Dispatcher struct {
	cfg    Config
	client *http.Client
	log    *slog.Logger
	wg     sync.WaitGroup
	// stop cancels deliveries under way once Close's bound has run out.
	stopCtx context.Context
	stop    context.CancelFunc

	mu       sync.Mutex
	cond     *sync.Cond          // signalled when ready grows or the dispatcher closes
	projects map[string]*pending // projects with events waiting or under way; owned under mu
	ready    []*pending          // projects with an event waiting and room in flight, served in turn
	queued   int
	inFlight int
	closed   bool
	full     bool // the shared bound was reached (warned once until the queue empties)

	sent, failed, refused, overflows int64
	dropped                          map[string]int64
}

// pending is one project's queue. Every field is guarded by Dispatcher.mu.
type pending struct {
	id       string
	queue    []Delivery // oldest first
	inFlight int
	ready    bool  // in Dispatcher.ready
	drops    int64 // events of this project dropped since its queue last emptied
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &Dispatcher{
		cfg:      cfg,
		log:      cfg.Logger,
		client:   NewClient(cfg.Timeout, cfg.AllowPrivate),
		projects: map[string]*pending{},
		dropped:  map[string]int64{},
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
// full queue, the project's or the shared one, drops it (counted).
func (d *Dispatcher) Deliver(del Delivery) {
	var warn func()
	d.mu.Lock()
	switch p := d.projects[del.Event.ProjectID]; {
	case d.closed:
		d.dropped[DropShutdown]++
	case p != nil && len(p.queue) >= d.cfg.ProjectQueue:
		d.dropped[DropProjectQueueFull]++
		if p.drops++; p.drops == 1 {
			d.overflows++
			id, url := p.id, RedactURL(del.URL)
			warn = func() {
				d.log.Warn("webhook queue of a project is full: its events are dropped until its receiver catches up",
					"project", id, "url", url, "queued", d.cfg.ProjectQueue, "timeout", d.cfg.Timeout)
			}
		}
	case d.queued >= d.cfg.QueueSize:
		d.dropped[DropQueueFull]++
		if !d.full {
			d.full = true
			warn = func() {
				d.log.Warn("webhook queue is full: events of every project are dropped", "queued", d.cfg.QueueSize)
			}
		}
	default:
		if p == nil {
			p = &pending{id: del.Event.ProjectID}
			d.projects[p.id] = p
		}
		p.queue = append(p.queue, del)
		d.queued++
		d.makeReady(p)
	}
	d.mu.Unlock()
	if warn != nil {
		warn() // outside the lock: a slow log sink must not hold the actors
	}
}

// makeReady puts p in line if it has an event waiting and room in flight.
// Called with mu held.
func (d *Dispatcher) makeReady(p *pending) {
	if p.ready || len(p.queue) == 0 || p.inFlight >= d.cfg.ProjectInFlight {
		return
	}
	p.ready = true
	d.ready = append(d.ready, p)
	d.cond.Signal()
}

// next waits for an event to send and takes it, or reports false once the
// dispatcher is closed and nothing is left.
func (d *Dispatcher) next() (*pending, Delivery, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.ready) == 0 {
		if d.closed && d.queued == 0 {
			return nil, Delivery{}, false
		}
		d.cond.Wait()
	}
	p := d.ready[0]
	d.ready[0] = nil
	d.ready = d.ready[1:]
	p.ready = false
	del := p.queue[0]
	p.queue[0] = Delivery{}
	p.queue = p.queue[1:]
	p.inFlight++
	d.inFlight++
	d.queued--
	if d.queued == 0 {
		d.full = false
		if d.closed {
			d.cond.Broadcast() // the idle workers can stop
		}
	}
	d.makeReady(p) // to the back of the line: one event per project per turn
	return p, del, true
}

// done ends one delivery of p, counting its outcome, and forgets p once it
// has nothing left.
func (d *Dispatcher) done(p *pending, o outcome) {
	var note func()
	d.mu.Lock()
	switch o {
	case outcomeSent:
		d.sent++
	case outcomeRefused:
		d.refused++
	default:
		d.failed++
	}
	p.inFlight--
	d.inFlight--
	d.makeReady(p)
	if len(p.queue) == 0 && p.inFlight == 0 {
		delete(d.projects, p.id)
		if p.drops > 0 {
			id, n := p.id, p.drops
			note = func() { d.log.Info("webhook queue of a project caught up", "project", id, "dropped", n) }
		}
	}
	d.mu.Unlock()
	if note != nil {
		note()
	}
}

func (d *Dispatcher) work() {
	defer d.wg.Done()
	for {
		p, del, ok := d.next()
		if !ok {
			return
		}
		d.done(p, d.send(del))
	}
}

type outcome int

const (
	outcomeSent outcome = iota
	outcomeFailed
	outcomeRefused
)

func (d *Dispatcher) send(del Delivery) outcome {
	body, _ := json.Marshal(del.Event)
	ctx, cancel := context.WithTimeout(d.stopCtx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, del.URL, bytes.NewReader(body))
	if err != nil {
		d.log.Debug("webhook not delivered", "project", del.Event.ProjectID, "event", del.Event.Event, "err", redactErr(err))
		return outcomeFailed
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "relay-webhook/1")
	req.Header.Set("X-Service-Signature", Sign(del.Secret, body))
	res, err := d.client.Do(req)
	if err != nil {
		d.log.Debug("webhook not delivered", "project", del.Event.ProjectID, "event", del.Event.Event, "err", redactErr(err))
		if errors.Is(err, errPrivate) {
			return outcomeRefused
		}
		return outcomeFailed
	}
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		return outcomeSent
	}
	d.log.Debug("webhook refused by receiver", "project", del.Event.ProjectID, "status", res.StatusCode)
	return outcomeFailed
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
	st := Stats{Sent: d.sent, Failed: d.failed, Refused: d.refused, ProjectOverflows: d.overflows,
		DroppedBy: map[string]int64{}, Queued: d.queued, InFlight: d.inFlight, ProjectsQueued: len(d.projects)}
	for _, r := range []string{DropProjectQueueFull, DropQueueFull, DropShutdown} {
		st.DroppedBy[r] = d.dropped[r]
		st.Dropped += d.dropped[r]
	}
	for _, p := range d.projects {
		if len(p.queue) >= d.cfg.ProjectQueue {
			st.ProjectsFull++
		}
	}
	return st
}

// Close stops taking events and waits for the queued ones until ctx ends;
// then what is still queued is dropped (counted) and deliveries under way
// are cut short.
func (d *Dispatcher) Close(ctx context.Context) error {
	d.mu.Lock()
	d.closed = true
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
		d.dropped[DropShutdown] += int64(len(p.queue))
		p.queue, p.ready = nil, false
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
