// Package webhook delivers connect and disconnect events (SPEC.md ›
// Webhooks) off the hot path: a bounded queue and a few workers, one attempt
// each, a timeout, and counters for what was sent, failed or dropped.
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
	"sync/atomic"
	"syscall"
	"time"
)

// Event is one webhook body. Field order is SPEC.md's.
type Event struct {
	Event                string  `json:"event"` // "connect" or "disconnect"
	ProjectID            string  `json:"projectId"`
	ConnectionID         string  `json:"connectionId"`
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

// Config of a Dispatcher.
type Config struct {
	Timeout      time.Duration // per attempt (WEBHOOK_TIMEOUT_MS)
	Workers      int           // concurrent deliveries
	QueueSize    int           // events waiting; more are dropped and counted
	AllowPrivate bool          // allow loopback, private and link-local targets
	Logger       *slog.Logger
}

// Stats are cumulative counters.
type Stats struct {
	Sent, Failed, Dropped, Refused int64
}

// Dispatcher sends deliveries in the background.
type Dispatcher struct {
	cfg    Config
	client *http.Client
	queue  chan Delivery
	wg     sync.WaitGroup
	closed atomic.Bool
	mu     sync.RWMutex // guards queue closing against Deliver

	sent, failed, dropped, refused atomic.Int64
}

// New starts the workers.
func New(cfg Config) *Dispatcher {
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 10000
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2500 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	if !cfg.AllowPrivate {
		dialer.Control = refusePrivate // checked on the resolved address: no DNS rebinding
	}
	d := &Dispatcher{
		cfg:   cfg,
		queue: make(chan Delivery, cfg.QueueSize),
		client: &http.Client{
			Timeout: cfg.Timeout,
			Transport: &http.Transport{
				DialContext:         dialer.DialContext,
				MaxIdleConnsPerHost: 4,
				IdleConnTimeout:     30 * time.Second,
				TLSHandshakeTimeout: cfg.Timeout,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	for range cfg.Workers {
		d.wg.Add(1)
		go d.work()
	}
	return d
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

// Deliver queues d without waiting; a full queue drops it (counted).
func (d *Dispatcher) Deliver(del Delivery) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		d.dropped.Add(1)
		return
	}
	select {
	case d.queue <- del:
	default:
		d.dropped.Add(1)
	}
}

func (d *Dispatcher) work() {
	defer d.wg.Done()
	for del := range d.queue {
		d.send(del)
	}
}

func (d *Dispatcher) send(del Delivery) {
	body, _ := json.Marshal(del.Event)
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, del.URL, bytes.NewReader(body))
	if err != nil {
		d.failed.Add(1)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "relay-webhook/1")
	req.Header.Set("X-Service-Signature", Sign(del.Secret, body))
	res, err := d.client.Do(req)
	if err != nil {
		if errors.Is(err, errPrivate) {
			d.refused.Add(1)
		} else {
			d.failed.Add(1)
		}
		d.cfg.Logger.Debug("webhook not delivered", "project", del.Event.ProjectID, "event", del.Event.Event, "err", err)
		return
	}
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		d.sent.Add(1)
		return
	}
	d.failed.Add(1)
	d.cfg.Logger.Debug("webhook refused by receiver", "project", del.Event.ProjectID, "status", res.StatusCode)
}

// Stats returns the counters.
func (d *Dispatcher) Stats() Stats {
	return Stats{Sent: d.sent.Load(), Failed: d.failed.Load(), Dropped: d.dropped.Load(), Refused: d.refused.Load()}
}

// Close stops taking events and waits for the queued ones until ctx ends.
func (d *Dispatcher) Close(ctx context.Context) error {
	d.mu.Lock()
	if !d.closed.Swap(true) {
		close(d.queue)
	}
	d.mu.Unlock()
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
