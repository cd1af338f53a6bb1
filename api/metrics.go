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
	refusedBadToken     = "invalid_token" // channel authorization: a connection token not valid, or expired
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
	for _, r := range []string{refusedMissingKey, refusedUnknownKey, refusedRevokedKey, refusedNotPublic, refusedShuttingDown, refusedStoreDown, refusedBadUpgrade, refusedTooMany, refusedBadToken} {
		m.handshakesRefused.WithLabelValues(r)
	}
	reg.MustRegister(m.handshakesRefused, m.emitDuration, m.storeQuery,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	counter := func(name, help string, labels prometheus.Labels, f func() int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f()) }))
	}
	if tr := src.Transport; tr != nil {
		c := &statsCollector[transport.Stats]{snapshot: tr.Stats}
		c.gauge("relay_connections_open", "Live WebSocket connections.", nil, func(s transport.Stats) int64 { return s.Open })
		c.counter("relay_connections_opened_total", "WebSocket connections opened.", nil, func(s transport.Stats) int64 { return s.Opened })
		for _, cause := range transport.Causes() {
			name := cause.String()
			c.counter("relay_connections_closed_total", "WebSocket connections closed, by cause (cmd/relay/OPERATING.md › Close codes).",
				prometheus.Labels{"cause": name}, func(s transport.Stats) int64 { return s.ClosedBy[name] })
		}
		c.counter("relay_frames_sent_total", "Frames written to sockets.", nil, func(s transport.Stats) int64 { return s.FramesSent })
		c.counter("relay_write_calls_total", "writev calls (frames per call = frames_sent / write_calls).", nil, func(s transport.Stats) int64 { return s.WriteCalls })
		reg.MustRegister(c)
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
		c := &statsCollector[webhook.Stats]{snapshot: wh.Stats}
		for outcome, f := range map[string]func(webhook.Stats) int64{
			"sent": func(s webhook.Stats) int64 { return s.Sent }, "failed": func(s webhook.Stats) int64 { return s.Failed },
			"dropped": func(s webhook.Stats) int64 { return s.Dropped }, "refused": func(s webhook.Stats) int64 { return s.Refused },
		} {
			c.counter("relay_webhooks_total", "Webhook events by final outcome (failed: given up after its attempts; refused: private target).", prometheus.Labels{"outcome": outcome}, f)
		}
		c.counter("relay_webhook_retries_total", "Webhook attempts that failed and were retried.", nil, func(s webhook.Stats) int64 { return s.Retried })
		// Fairness between projects, as totals over all projects: a
		// project_id label would grow without bound (the project whose queue
		// overflows is named in a warning instead).
		for _, reason := range []string{webhook.DropProjectQueueFull, webhook.DropQueueFull, webhook.DropShutdown} {
			c.counter("relay_webhook_drops_total", "Webhook events dropped unsent, by reason (project_queue_full: that project's own queue).",
				prometheus.Labels{"reason": reason}, func(s webhook.Stats) int64 { return s.DroppedBy[reason] })
		}
		c.counter("relay_webhook_project_overflows_total", "Times a project's webhook queue filled up and its events began to be dropped.", nil,
			func(s webhook.Stats) int64 { return s.ProjectOverflows })
		c.gauge("relay_webhook_queued", "Webhook events waiting (for a worker, or for their retry), over all projects.", nil, func(s webhook.Stats) int64 { return int64(s.Queued) })
		c.gauge("relay_webhook_retrying", "Webhook events waiting for their next attempt's time, over all projects.", nil, func(s webhook.Stats) int64 { return int64(s.Retrying) })
		c.gauge("relay_webhook_in_flight", "Webhook deliveries under way.", nil, func(s webhook.Stats) int64 { return int64(s.InFlight) })
		c.gauge("relay_webhook_projects_queued", "Projects with webhook events waiting or under way.", nil,
			func(s webhook.Stats) int64 { return int64(s.ProjectsQueued) })
		c.gauge("relay_webhook_projects_full", "Projects whose webhook queue is full now (their new events are dropped).", nil,
			func(s webhook.Stats) int64 { return int64(s.ProjectsFull) })
		reg.MustRegister(c)
	}
	return m
}

// statsCollector reports metrics read from one snapshot of a source per
// scrape: Stats() takes the webhook dispatcher's lock and walks its projects,
// and the transport's walks its shards, so once per scrape rather than once
// per metric (the values of one scrape also agree with each other).
type statsCollector[S any] struct {
	snapshot func() S
	metrics  []statsMetric[S]
}

type statsMetric[S any] struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(S) int64
}

func (c *statsCollector[S]) counter(name, help string, labels prometheus.Labels, f func(S) int64) {
	c.metrics = append(c.metrics, statsMetric[S]{prometheus.NewDesc(name, help, nil, labels), prometheus.CounterValue, f})
}

func (c *statsCollector[S]) gauge(name, help string, labels prometheus.Labels, f func(S) int64) {
	c.metrics = append(c.metrics, statsMetric[S]{prometheus.NewDesc(name, help, nil, labels), prometheus.GaugeValue, f})
}

func (c *statsCollector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

func (c *statsCollector[S]) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, float64(m.value(s)))
	}
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
