package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/api"
)

// joinCluster makes this node a member of the cluster named by
// RELAY_CLUSTER_ETCD and RELAY_CLUSTER_NAME before the public listener
// serves; without RELAY_CLUSTER_ETCD it does nothing and no cluster code runs.
func (a *app) joinCluster(cfg Config, metrics *api.Metrics) error {
	if len(cfg.ClusterEtcd) == 0 {
		return nil
	}
	began := time.Now()
	delay, err := firstSendDelay()
	if err != nil {
		return err
	}
	if delay > 0 {
		a.log.Warn("test hook on: the first attempt of every publish to a channel grain is held back", "var", firstSendDelayVar, "delay", delay)
	}
	if cfg.ClusterInsecure {
		a.log.Warn("RELAY_CLUSTER_INSECURE=true: the actor remote runs without TLS; anything that reaches RELAY_CLUSTER_ADDR "+
			"can act as a member (read every message, change any project's state). Loopback tests only", "addr", cfg.ClusterAddr)
	}
	if cfg.EtcdPassword != "" && cfg.EtcdTLS == nil {
		a.log.Warn("RELAY_CLUSTER_ETCD_PASSWORD goes to etcd without TLS: anyone on the path can read it (use https:// endpoints)")
	}
	c, err := a.actors.JoinCluster(actors.ClusterConfig{
		Etcd: cfg.ClusterEtcd, Addr: cfg.ClusterAddr, Name: cfg.ClusterName, FirstSendDelay: delay,
		TLS: cfg.ClusterTLS, Insecure: cfg.ClusterInsecure,
		EtcdTLS: cfg.EtcdTLS, EtcdUsername: cfg.EtcdUsername, EtcdPassword: cfg.EtcdPassword,
		// Another node changed a project's keys (or anything else of it):
		// drop this node's cached keys of the project before acking.
		RemoteChange: a.api.ForgetKeys,
		Logger:       a.log.With("component", "cluster"),
	})
	if err != nil {
		return fmt.Errorf("RELAY_CLUSTER_ETCD: %w", err)
	}
	a.cluster = c
	registerClusterMetrics(metrics.Registry, c)
	a.log.Info("joined the cluster", "name", cfg.ClusterName, "member", c.Self(), "addr", cfg.ClusterAddr,
		"members", len(c.Members()), "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// firstSendDelayVar is a test hook of the cluster tests, not a setting: it
// makes every publish's first attempt arrive after its retry, so that the
// tests can see the grain drop the duplicate.
const firstSendDelayVar = "RELAY_TEST_FIRST_SEND_DELAY"

func firstSendDelay() (time.Duration, error) {
	v := os.Getenv(firstSendDelayVar)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > time.Minute {
		return 0, fmt.Errorf("%s=%q: want a Go duration between 0 and 1m", firstSendDelayVar, v)
	}
	return d, nil
}

// clusterLost delivers an error if this node drops out of the membership;
// nil (never ready) on one node.
func (a *app) clusterLost() <-chan error {
	if a.cluster == nil {
		return nil
	}
	return a.cluster.Lost()
}

// handOff gives this node's channel grains to their next owners and
// deregisters; nothing on one node.
func (a *app) handOff(ctx context.Context) error {
	if a.cluster == nil {
		return nil
	}
	began := time.Now()
	st, err := a.cluster.HandOff(ctx)
	took := time.Since(began).Round(time.Millisecond)
	a.log.Info("handed off channel grains", "grains", st.Grains, "to_members", st.Members, "failed", st.Failed, "took", took)
	if errors.Is(err, actors.ErrLeaveTimeout) { // etcd does not answer: not a failure of this stop
		a.log.Warn("could not deregister from etcd", "took", took, "err", err)
		return nil
	}
	return err
}

// leaveCluster deregisters the node (the others drop it at once) and stops
// the cluster; nothing on one node.
func (a *app) leaveCluster(ctx context.Context) error {
	if a.cluster == nil {
		return nil
	}
	began := time.Now()
	err := a.cluster.Leave(ctx)
	took := time.Since(began).Round(time.Millisecond)
	if errors.Is(err, actors.ErrLeaveTimeout) { // etcd does not answer: not a failure of this stop
		a.log.Warn("left the cluster without deregistering", "took", took, "err", err)
		return nil
	}
	a.log.Info("left the cluster", "took", took, "err", err)
	return err
}

// registerClusterMetrics adds relay_cluster_* to the operator's /metrics.
func registerClusterMetrics(reg *prometheus.Registry, c *actors.Cluster) {
	reg.MustRegister(clusterCollector{c})
}

// clusterCollector reads the cluster's figures once per scrape.
type clusterCollector struct{ c *actors.Cluster }

// clusterMetric is one relay_cluster_* series and its figure.
type clusterMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(actors.ClusterStats) float64
}

func gauge(name, help string, f func(actors.ClusterStats) float64) clusterMetric {
	return clusterMetric{prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, f}
}

func counter(name, help string, f func(actors.ClusterStats) int64) clusterMetric {
	return clusterMetric{prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue,
		func(s actors.ClusterStats) float64 { return float64(f(s)) }}
}

var clusterMetrics = []clusterMetric{
	gauge("relay_cluster_members", "Members of the cluster as this node sees them, itself included.",
		func(s actors.ClusterStats) float64 { return float64(s.Members) }),
	gauge("relay_cluster_grains", "Channel grains running on this node.",
		func(s actors.ClusterStats) float64 { return float64(s.Grains) }),
	gauge("relay_cluster_etcd_up", "1 if etcd answered this node's last check (every 2 s); while 0 the member list is frozen.",
		func(s actors.ClusterStats) float64 {
			if s.EtcdUp {
				return 1
			}
			return 0
		}),
	counter("relay_cluster_broadcasts_sent_total", "Control-plane changes sent to other members (one per member per change).",
		func(s actors.ClusterStats) int64 { return s.BroadcastsSent }),
	counter("relay_cluster_broadcasts_acked_total", "Control-plane changes other members acknowledged within the bound (2 s).",
		func(s actors.ClusterStats) int64 { return s.BroadcastsAcked }),
	counter("relay_cluster_broadcasts_timed_out_total", "Control-plane changes a member did not acknowledge within the bound (2 s), or could not take.",
		func(s actors.ClusterStats) int64 { return s.BroadcastsTimedOut }),
	counter("relay_cluster_broadcasts_received_total", "Control-plane changes from other members applied on this node.",
		func(s actors.ClusterStats) int64 { return s.BroadcastsReceived }),
	counter("relay_cluster_grain_activations_total", "Grains (channel and project) started on this node.",
		func(s actors.ClusterStats) int64 { return s.Activations }),
	counter("relay_cluster_cross_node_messages_total", "Channel messages (publishes, deliveries, subscriptions, presence) this node sent to another member.",
		func(s actors.ClusterStats) int64 { return s.CrossNode }),
	counter("relay_cluster_duplicates_dropped_total", "Requests a grain on this node had already applied (a retried publish or budget take): answered again, not applied twice.",
		func(s actors.ClusterStats) int64 { return s.Duplicates }),
	counter("relay_cluster_owner_refusals_total", "Publishes and budget takes a grain on this node refused because its channel or project is now owned by another member.",
		func(s actors.ClusterStats) int64 { return s.OwnerRefusals }),
	counter("relay_cluster_activation_refusals_total", "Requests from other members to start a grain on this node that another member owns in this node's member list: refused, and asked again of the owner.",
		func(s actors.ClusterStats) int64 { return s.ActivationRefusals }),
	counter("relay_cluster_publish_retries_total", "Publishes this node sent again to a channel grain that had not answered within 300 ms.",
		func(s actors.ClusterStats) int64 { return s.Retries }),
}

func (clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range clusterMetrics {
		ch <- m.desc
	}
}

func (cc clusterCollector) Collect(ch chan<- prometheus.Metric) {
	s := cc.c.Stats()
	for _, m := range clusterMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(s))
	}
}
