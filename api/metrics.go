package api

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/transport"
)

// Metrics are the Prometheus figures of one process. Most are read at scrape
// time from counters the transport, actors and webhook sender keep anyway;
// the rest are observed here.
type Metrics struct {
	Registry *prometheus.Registry

	handshakesRefused *prometheus.CounterVec
	emitDuration      prometheus.Histogram
	storeQuery        *prometheus.HistogramVec
}

// Handshake refusal reasons (relay_handshakes_refused_total{reason}).
const (
	refusedMissingKey   = "missing_key"
	refusedUnknownKey   = "unknown_key"
	refusedRevokedKey   = "revoked_key"
	refusedNotPublic    = "not_public_key"
	refusedShuttingDown = "shutting_down"
	refusedStoreDown    = "store_unavailable"
	refusedBadUpgrade   = "bad_upgrade"
	refusedTooMany      = "too_many_connections"
)

// MetricSources are what the scrape-time metrics read.
type MetricSources struct {
	Actors    *actors.System
	Transport *transport.Server
	Webhooks  *webhook.Dispatcher
}

// NewMetrics registers every metric, including Go runtime and process ones.
func NewMetrics(src MetricSources) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		handshakesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_handshakes_refused_total", Help: "WebSocket handshakes refused before the upgrade, by reason.",
		}, []string{"reason"}),
		emitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "relay_emit_duration_seconds", Help: "POST /emit from authenticated request to answer.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}),
		storeQuery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "relay_store_query_duration_seconds", Help: "Database queries, by operation.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 16),
		}, []string{"op"}),
	}
	for _, r := range []string{refusedMissingKey, refusedUnknownKey, refusedRevokedKey, refusedNotPublic, refusedShuttingDown, refusedStoreDown, refusedBadUpgrade, refusedTooMany} {
		m.handshakesRefused.WithLabelValues(r)
	}
	reg.MustRegister(m.handshakesRefused, m.emitDuration, m.storeQuery,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	counter := func(name, help string, labels prometheus.Labels, f func() int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f()) }))
	}
	if tr := src.Transport; tr != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "relay_connections_open", Help: "Live WebSocket connections."},
			func() float64 { return float64(tr.Len()) }))
		counter("relay_connections_opened_total", "WebSocket connections opened.", nil, func() int64 { return tr.Stats().Opened })
		for _, c := range transport.Causes() {
			c := c
			counter("relay_connections_closed_total", "WebSocket connections closed, by cause (README › Close codes).",
				prometheus.Labels{"cause": c.String()}, func() int64 { return tr.Stats().ClosedBy[c.String()] })
		}
		counter("relay_frames_sent_total", "Frames written to sockets.", nil, func() int64 { return tr.Stats().FramesSent })
		counter("relay_write_calls_total", "writev calls (frames per call = frames_sent / write_calls).", nil, func() int64 { return tr.Stats().WriteCalls })
	}
	if sys := src.Actors; sys != nil {
		c := sys.Counters()
		counter("relay_messages_emitted_total", "Messages accepted for fan-out, by path.", prometheus.Labels{"path": "http"}, c.EmittedHTTP.Load)
		counter("relay_messages_emitted_total", "Messages accepted for fan-out, by path.", prometheus.Labels{"path": "client"}, c.EmittedClient.Load)
		counter("relay_deliveries_total", "Messages handed to subscribers' write queues.", nil, c.Deliveries.Load)
		counter("relay_delivery_drops_total", "Deliveries refused by a gone or overflowing connection.", nil, c.Drops.Load)
		for kind, f := range map[string]func() int64{"channel": c.RateLimitedChannel.Load, "project": c.RateLimitedProject.Load, "client": c.RateLimitedClient.Load} {
			counter("relay_emits_rate_limited_total", "Emits refused by a budget, by kind.", prometheus.Labels{"kind": kind}, f)
		}
		counter("relay_replay_requests_total", "Subscribes with since.", nil, c.ReplayRequests.Load)
		counter("relay_replay_gaps_total", "replay_gap events sent.", nil, c.ReplayGaps.Load)
	}
	if wh := src.Webhooks; wh != nil {
		for outcome, f := range map[string]func(webhook.Stats) int64{
			"sent": func(s webhook.Stats) int64 { return s.Sent }, "failed": func(s webhook.Stats) int64 { return s.Failed },
			"dropped": func(s webhook.Stats) int64 { return s.Dropped }, "refused": func(s webhook.Stats) int64 { return s.Refused },
		} {
			f := f
			counter("relay_webhooks_total", "Webhook deliveries by outcome (refused: private target).", prometheus.Labels{"outcome": outcome},
				func() int64 { return f(wh.Stats()) })
		}
		// Fairness between projects, as totals over all projects: a
		// project_id label would grow without bound (the project whose queue
		// overflows is named in a warning instead).
		for _, reason := range []string{webhook.DropProjectQueueFull, webhook.DropQueueFull, webhook.DropShutdown} {
			counter("relay_webhook_drops_total", "Webhook events dropped unsent, by reason (project_queue_full: that project's own queue).",
				prometheus.Labels{"reason": reason}, func() int64 { return wh.Stats().DroppedBy[reason] })
		}
		counter("relay_webhook_project_overflows_total", "Times a project's webhook queue filled up and its events began to be dropped.", nil,
			func() int64 { return wh.Stats().ProjectOverflows })
		for name, g := range map[string]struct {
			help string
			f    func(webhook.Stats) int
		}{
			"relay_webhook_queued":          {"Webhook events waiting, over all projects.", func(s webhook.Stats) int { return s.Queued }},
			"relay_webhook_in_flight":       {"Webhook deliveries under way.", func(s webhook.Stats) int { return s.InFlight }},
			"relay_webhook_projects_queued": {"Projects with webhook events waiting or under way.", func(s webhook.Stats) int { return s.ProjectsQueued }},
			"relay_webhook_projects_full":   {"Projects whose webhook queue is full now (their new events are dropped).", func(s webhook.Stats) int { return s.ProjectsFull }},
		} {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: g.help},
				func() float64 { return float64(g.f(wh.Stats())) }))
		}
	}
	return m
}

// ObserveQuery records one store query (store.ObserveQueries).
func (m *Metrics) ObserveQuery(op string, d time.Duration, _ error) {
	if m == nil {
		return
	}
	m.storeQuery.WithLabelValues(op).Observe(d.Seconds())
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.handshakesRefused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) emitted(d time.Duration) {
	if m != nil {
		m.emitDuration.Observe(d.Seconds())
	}
}
