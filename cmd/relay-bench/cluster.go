package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/relayhq/relay/actors/membership/tempetcd"
)

// cluster: several nodes as one relay (cmd/relay/CLUSTER.md)
// against one node, measured in the same run. It starts on loopback its own
// etcd and a throwaway PostgreSQL, then for each round one relay node, then
// N nodes joined through etcd (alternated: one, N, one, N…), each time on a
// fresh database of that PostgreSQL, and runs the same scenarios against
// both: the N-node runs spread subscribers over the nodes and emit through
// all of them (fanout, conns: -base with every node). One node is on the same
// PostgreSQL, so the difference is the cluster's alone. It ends with a table
// of the multi-node targets, each as ranges over the rounds:
//
//   - server CPU per delivery, 2 000 subscribers of one channel spread over
//     the nodes, at 50 and 100 emits/s: N nodes within 1.25× of one (CPU
//     summed over every relay process, from /proc);
//   - added latency per cross-node hop at 100 emits/s: p50 ≤ 1 ms, p99 ≤
//     5 ms (a channel's emits all go through one node and each channel has a
//     subscriber on every node, so each subscriber's messages take 0, 1 or
//     2 hops, known from where the channel's grain is);
//   - HTTP emit p99 < 10 ms at 1 000 emits/s round robin over the nodes
//     (open loop, one subscriber per node);
//   - idle memory per connection on a node within +10 % of one node: RSS
//     growth over the connections each node holds (5 000 by default: the
//     tool holds every node's at once, under its open-file limit), both
//     readings after two forced garbage collections (through the nodes'
//     operator listeners), and the live heap per connection beside it.
//
// A further relay on the same database, not a member and not measured,
// takes the sign-ups and project creations: a password hash would otherwise
// leave freed memory in a measured node. Every process it started is
// stopped by the tool, and the whole run is bounded by -timeout.
func runCluster(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cluster", flag.ExitOnError)
	bin := fs.String("relay", "bin/relay", "the relay binary to start (make build writes it)")
	nodes := fs.Int("nodes", 3, "nodes of the cluster (against one)")
	rounds := fs.Int("rounds", 3, "rounds, each one node then -nodes nodes")
	connsPerNode := fs.Int("conns-per-node", 5000, "idle subscribed connections each node holds for the memory target (one node: this many; N nodes: N times it, which the tool's open-file limit must allow)")
	fanoutSubs := fs.Int("fanout-subs", 2000, "subscribers of one channel for the CPU-per-delivery target")
	fanoutRateList := fs.String("fanout-rates", "50,100", "emits per second to them, comma-separated: one run each")
	latChannels := fs.Int("latency-channels", 24, "channels of the hop-latency run, each with one subscriber per node (one node: the same subscribers, all on it)")
	latRate := fs.Float64("latency-rate", 100, "emits per second of the hop-latency run, over its channels")
	latDuration := fs.Duration("latency-duration", 20*time.Second, "length of the hop-latency run")
	emitRate := fs.Float64("emit-rate", 1000, "emits per second of the HTTP emit target (open loop)")
	emitChannels := fs.Int("emit-channels", 100, "channels of the HTTP emit run")
	emitSubs := fs.Int("emit-subs", -1, "subscribers of the HTTP emit run (-1: one per node of the cluster)")
	duration := fs.Duration("duration", 10*time.Second, "length of the fan-out and HTTP emit runs")
	only := fs.String("only", "conns,fanout,latency,emit,clientemit", "the measurements to make, comma-separated")
	ceClients := fs.Int("clientemit-clients", 20, "sockets of the client-emit run, each its own clientId and channel, spread over the nodes")
	ceRate := fs.Float64("clientemit-rate", 5, "client emits per second of each socket")
	connsSettle := fs.Duration("conns-settle", 3*time.Second, "idle time of the memory run before its last reading")
	timeout := fs.Duration("timeout", 45*time.Minute, "hard bound on the whole run")
	remoteTLS := fs.Bool("remote-tls", true, "the nodes' actor remotes speak mutual TLS (false: RELAY_CLUSTER_INSECURE=true, to measure what TLS costs)")
	fs.Parse(args)
	if *nodes < 2 || *rounds < 1 || *connsPerNode < 0 || *fanoutSubs < 1 || *latChannels < 1 || *emitChannels < 1 {
		return errors.New("want -nodes ≥ 2, -rounds ≥ 1, -fanout-subs ≥ 1, -latency-channels ≥ 1, -emit-channels ≥ 1")
	}
	var fanoutRates []float64
	for _, f := range strings.Split(*fanoutRateList, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("-fanout-rates: want rates like 50,100, got %q", *fanoutRateList)
		}
		fanoutRates = append(fanoutRates, r)
	}
	if *emitSubs < 0 {
		*emitSubs = *nodes
	}
	want := map[string]bool{}
	for _, m := range strings.Split(*only, ",") {
		switch m = strings.TrimSpace(m); m {
		case "conns", "fanout", "latency", "emit", "clientemit":
			want[m] = true
		default:
			return fmt.Errorf("-only: unknown measurement %q (conns, fanout, latency, emit, clientemit)", m)
		}
	}
	if _, err := os.Stat(*bin); err != nil {
		return fmt.Errorf("-relay: %w (run make build first)", err)
	}
	// The tool holds every node's connections at once; the nodes inherit
	// the limit.
	if err := ensureFiles(uint64(max(*connsPerNode**nodes, *fanoutSubs, *latChannels**nodes) + 1000)); err != nil {
		return fmt.Errorf("%w: lower -conns-per-node", err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	began := time.Now()
	etcd, err := tempetcd.Start(ctx, "relay-bench-etcd")
	if err != nil {
		return err
	}
	defer etcd.Stop()
	pg, err := startPostgres(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop()
	progress("etcd and PostgreSQL up in %v (etcd pid %d, postmaster pid %d)", time.Since(began).Round(time.Millisecond), etcd.PID(), pg.PID())

	// The nodes' actor remotes speak mutual TLS, as in production: a CA
	// made with the relay's own relay cert, and a certificate per node
	// (-remote-tls=false: plain gRPC, no certificates).
	var certs string
	if *remoteTLS {
		if certs, err = os.MkdirTemp("", fmt.Sprintf("relay-bench-certs-%d-", os.Getpid())); err != nil {
			return err
		}
		defer os.RemoveAll(certs)
		if out, err := exec.CommandContext(ctx, *bin, "cert", "ca", "--out", filepath.Join(certs, "ca")).CombinedOutput(); err != nil {
			return fmt.Errorf("relay cert ca: %v: %s", err, out)
		}
	} else {
		progress("-remote-tls=false: the nodes' actor remotes run without TLS (RELAY_CLUSTER_INSECURE=true)")
	}

	// MAX_CONNECTIONS_PER_PROJECT counts every node of a cluster.
	maxConns := max(*connsPerNode**nodes, *fanoutSubs, 1000) + 1000
	cb := &clusterBench{
		ctx: ctx, bin: *bin, etcd: etcd, pg: pg, certs: certs,
		env: []string{
			"EMIT_RATE_LIMIT_PER_MINUTE=100000000",
			"PROJECT_RATE_LIMIT_PER_MINUTE=100000000",
			fmt.Sprintf("MAX_CONNECTIONS_PER_PROJECT=%d", maxConns),
			fmt.Sprintf("MAX_CONNECTIONS_PER_ADDRESS=%d", maxConns), // the tool's sockets come from 4 addresses
			"MAX_HTTP_CONNECTIONS_PER_ADDRESS=4096",                 // handshake bursts from the tool's few addresses
			"RELAY_DEBUG_ADDR=127.0.0.1:0",                          // the hop run asks where each channel's grain is
			"SHUTDOWN_TIMEOUT_SECONDS=10",
		},
	}
	const connsChannels = 100 // channels of the memory run
	dur := duration.String()
	for round := 1; round <= *rounds; round++ {
		for _, n := range []int{1, *nodes} {
			run := topoRun{Round: round, Nodes: n}
			err := cb.with(round, n, &run, func(s *suite, debugs []string) error {
				if want["conns"] && *connsPerNode > 0 {
					// One connection per channel per node first, outside the
					// reading: each channel's actors (in a cluster its grain
					// and the links between nodes) start once, not per connection.
					out, err := s.run(runConns, "-n", fmt.Sprint(*connsPerNode*n), "-channels", fmt.Sprint(connsChannels),
						"-warmup", fmt.Sprint(connsChannels*n), "-settle", connsSettle.String(), "-debug", strings.Join(debugs, ","))
					if err != nil {
						return err
					}
					run.conns = out
				}
				for _, rate := range fanoutRates {
					if want["fanout"] {
						out, err := s.run(runFanout, "-subs", fmt.Sprint(*fanoutSubs), "-channels", "1",
							"-rate", fmtFloat(rate), "-duration", dur, "-workers", "128", "-warmup")
						if err != nil {
							return err
						}
						run.fanout = append(run.fanout, out)
					}
				}
				if want["latency"] {
					args := []string{"-subs", fmt.Sprint(*latChannels * *nodes), "-channels", fmt.Sprint(*latChannels),
						"-rate", fmtFloat(*latRate), "-duration", latDuration.String(), "-workers", "32", "-via", "channel", "-warmup"}
					if n > 1 {
						args = append(args, "-debug", strings.Join(debugs, ","))
					}
					out, err := s.run(runFanout, args...)
					if err != nil {
						return err
					}
					run.latency = out
				}
				if want["emit"] {
					out, err := s.run(runFanout, "-subs", fmt.Sprint(*emitSubs), "-channels", fmt.Sprint(*emitChannels),
						"-rate", fmtFloat(*emitRate), "-duration", dur, "-workers", "64", "-warmup")
					if err != nil {
						return err
					}
					run.emit = out
				}
				if want["clientemit"] {
					out, err := s.run(runClientEmit, "-clients", fmt.Sprint(*ceClients), "-rate", fmtFloat(*ceRate), "-duration", dur)
					if err != nil {
						return err
					}
					run.clientEmit = out
				}
				return nil
			})
			if err != nil {
				return err
			}
			cb.runs = append(cb.runs, run)
		}
	}
	cb.summary(*nodes, *rounds, clusterSetup{
		ConnsPerNode: *connsPerNode, FanoutSubs: *fanoutSubs, FanoutRates: fanoutRates,
		LatencyChannels: *latChannels, LatencyRate: *latRate, EmitRate: *emitRate, EmitChannels: *emitChannels,
		EmitSubs: *emitSubs, Duration: dur, LatencyDuration: latDuration.String(), RemoteTLS: *remoteTLS,
		ClientEmitClients: *ceClients, ClientEmitRate: *ceRate,
	})
	progress("done in %v", time.Since(began).Round(time.Second))
	return nil
}

type clusterBench struct {
	ctx   context.Context
	bin   string
	etcd  *tempetcd.Etcd
	pg    *pgServer
	certs string // the cluster CA in certs/ca, node certificates beside it; "" without TLS
	env   []string
	runs  []topoRun
}

// nodeTLS makes a certificate for a node at addr with relay cert node and
// returns the node's RELAY_CLUSTER_TLS_* variables (without certs,
// RELAY_CLUSTER_INSECURE=true instead).
func (cb *clusterBench) nodeTLS(addr, name string) ([]string, error) {
	if cb.certs == "" {
		return []string{"RELAY_CLUSTER_INSECURE=true"}, nil
	}
	ca, dir := filepath.Join(cb.certs, "ca"), filepath.Join(cb.certs, name)
	if out, err := exec.CommandContext(cb.ctx, cb.bin, "cert", "node", "--ca", ca, "--addr", addr, "--out", dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("relay cert node: %v: %s", err, out)
	}
	return []string{"RELAY_CLUSTER_TLS_CA=" + filepath.Join(ca, "ca.pem"),
		"RELAY_CLUSTER_TLS_CERT=" + filepath.Join(dir, "node.pem"), "RELAY_CLUSTER_TLS_KEY=" + filepath.Join(dir, "node-key.pem")}, nil
}

// topoRun is one topology's turn: the JSON lines of its runs.
type topoRun struct {
	Round, Nodes         int
	StartSeconds         float64
	conns, latency, emit map[string]any
	clientEmit           map[string]any
	fanout               []map[string]any // one per -fanout-rates
}

// outputs are the run's JSON lines by measurement.
func (r topoRun) outputs() map[string][]map[string]any {
	out := map[string][]map[string]any{"fanout": r.fanout}
	for k, v := range map[string]map[string]any{"conns": r.conns, "latency": r.latency, "emit": r.emit, "clientemit": r.clientEmit} {
		if v != nil {
			out[k] = []map[string]any{v}
		}
	}
	return out
}

// with starts n relay nodes on a fresh database (n > 1: a cluster through
// the etcd, named after the round), waits until every node sees n members,
// runs body against them and stops them all.
func (cb *clusterBench) with(round, n int, run *topoRun, body func(s *suite, debugs []string) error) error {
	began := time.Now()
	url, err := cb.pg.createDB(cb.ctx, fmt.Sprintf("bench_r%d_n%d", round, n))
	if err != nil {
		return err
	}
	base := append(append([]string(nil), cb.env...), "DATABASE_URL="+url)
	env := base
	if n > 1 {
		env = append(append([]string(nil), base...), "RELAY_CLUSTER_ETCD="+cb.etcd.Endpoint, fmt.Sprintf("RELAY_CLUSTER_NAME=bench-r%d", round))
	}
	var procs []*relayProcess // every relay started here, the nodes after the first
	defer func() { stopAll(procs) }()
	s := &suite{ctx: cb.ctx, helpers: []int{cb.etcd.PID()}}
	if pid := cb.pg.PID(); pid > 0 {
		s.helpers = append(s.helpers, pid)
	}
	// A relay on the same database, not a member and not measured, that
	// every scenario signs up and creates its project through: it migrates
	// the schema and hashes the passwords, whose freed memory would
	// otherwise stay in a measured node (the single node, or the first of
	// the cluster) for new connections to reuse without growing its RSS.
	prov, err := startRelay(cb.bin, base...)
	if err != nil {
		return fmt.Errorf("round %d: the provisioning relay: %w", round, err)
	}
	procs = append(procs, prov)
	s.provisionVia = prov.base
	s.helpers = append(s.helpers, prov.pid)
	var debugs []string
	for i := 0; i < n; i++ {
		nodeEnv := env
		if n > 1 {
			addr, err := freeAddr()
			if err != nil {
				return err
			}
			tlsEnv, err := cb.nodeTLS(addr, fmt.Sprintf("r%d-n%d-%d", round, n, i+1))
			if err != nil {
				return err
			}
			nodeEnv = append(append(append([]string(nil), env...), "RELAY_CLUSTER_ADDR="+addr), tlsEnv...)
		}
		r, err := startRelay(cb.bin, nodeEnv...)
		if err != nil {
			return fmt.Errorf("round %d, node %d of %d: %w", round, i+1, n, err)
		}
		procs = append(procs, r)
		s.bases, s.pids, debugs = append(s.bases, r.base), append(s.pids, r.pid), append(debugs, r.debug)
	}
	if n > 1 {
		for i, d := range debugs {
			if err := waitMembers(cb.ctx, d, n, 30*time.Second); err != nil {
				return fmt.Errorf("round %d, node %d: %w\nits log:\n%s", round, i+1, err, procs[i+1].logText())
			}
		}
	}
	run.StartSeconds = time.Since(began).Seconds()
	progress("round %d: %d node(s) serving in %.1f s (pids %v)", round, n, run.StartSeconds, s.pids)
	if err := body(s, debugs); err != nil {
		var logs strings.Builder
		for i, p := range procs[1:] {
			fmt.Fprintf(&logs, "\nnode %d log:\n%s", i+1, p.logText())
		}
		return fmt.Errorf("round %d, %d node(s): %w%s", round, n, err, logs.String())
	}
	return nil
}

// stopAll stops relays at the same time (each bounded: interrupt, then kill
// after 20 s).
func stopAll(procs []*relayProcess) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
}

// actorsCluster is the part of /debug/actors this tool reads.
type actorsCluster struct {
	Cluster *struct {
		Members     []json.RawMessage `json:"members"`
		Grains      []string          `json:"grains"`
		GrainsTotal int               `json:"grainsTotal"`
	} `json:"cluster"`
}

func debugActors(ctx context.Context, debug string) (actorsCluster, error) {
	var v actorsCluster
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, debug+"/debug/actors", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return v, fmt.Errorf("%s/debug/actors: %s", debug, res.Status)
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		return v, err
	}
	if v.Cluster == nil {
		return v, fmt.Errorf("%s/debug/actors has no cluster: the node is not in one", debug)
	}
	return v, nil
}

// waitMembers waits until the node behind debug sees want members.
func waitMembers(ctx context.Context, debug string, want int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		v, err := debugActors(ctx, debug)
		if err == nil && len(v.Cluster.Members) == want {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("sees %d members, want %d", len(v.Cluster.Members), want)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("membership not complete within %v: %w", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// grainOwners finds, for each of a project's channels, the node whose
// /debug/actors lists its grain (PROJECT_ID/CHANNEL), waiting up to 5 s for
// all of them to be running.
func grainOwners(ctx context.Context, debugs []string, projectID string, channels []string) ([]int, error) {
	index := make(map[string]int, len(channels))
	for i, c := range channels {
		index[projectID+"/"+c] = i
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		owners := make([]int, len(channels))
		for i := range owners {
			owners[i] = -1
		}
		missing := len(channels)
		var err error
		for node, d := range debugs {
			var v actorsCluster
			if v, err = debugActors(ctx, d); err != nil {
				break
			}
			for _, g := range v.Cluster.Grains {
				ch, ok := index[g]
				if !ok {
					continue
				}
				if owners[ch] >= 0 && owners[ch] != node {
					return nil, fmt.Errorf("the grain of %s runs on nodes %d and %d", channels[ch], owners[ch], node)
				}
				if owners[ch] < 0 {
					missing--
				}
				owners[ch] = node
			}
		}
		if err == nil && missing == 0 {
			return owners, nil
		}
		if err == nil {
			err = fmt.Errorf("%d of %d channel grains not listed by any node's /debug/actors", missing, len(channels))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// latencyByHops groups subscribers by the cross-node hops their messages
// took: the emit's node to the grain's (0 or 1) plus the grain's to the
// subscriber's (0 or 1).
func latencyByHops(subs []*wsSub, expected [][]uint64, owners []int, em *emitters) (map[string]any, string) {
	var groups [3][]*wsSub
	for _, s := range subs {
		owner, h := owners[s.channel], 0
		if em.via(0, s.channel) != owner {
			h++
		}
		if owner != s.node {
			h++
		}
		groups[h] = append(groups[h], s)
	}
	out := map[string]any{}
	var parts []string
	for h, g := range groups {
		if len(g) == 0 {
			continue
		}
		t := tally(g, expected, true)
		out[strconv.Itoa(h)] = map[string]any{"subscribers": len(g), "deliveries": t.Deliveries, "lost": t.Lost, "latency": t.Latency}
		parts = append(parts, fmt.Sprintf("%d (%d subs) p50 %s p99 %s", h, len(g), fmtMS(t.Latency.P50), fmtMS(t.Latency.P99)))
	}
	return out, strings.Join(parts, ", ")
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "relay-bench cluster: "+format+"\n", args...)
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// clusterSetup is what the summary line says was run.
type clusterSetup struct {
	ConnsPerNode    int       `json:"conns_per_node"`
	FanoutSubs      int       `json:"fanout_subscribers"`
	FanoutRates     []float64 `json:"fanout_rates"`
	LatencyChannels int       `json:"latency_channels"`
	LatencyRate     float64   `json:"latency_rate"`
	EmitRate        float64   `json:"emit_rate"`
	EmitChannels    int       `json:"emit_channels"`
	EmitSubs        int       `json:"emit_subscribers"`
	Duration        string    `json:"duration"`
	LatencyDuration string    `json:"latency_duration"`
	RemoteTLS       bool      `json:"remote_tls"`
	// The client-emit run: sockets, and emits per second of each.
	ClientEmitClients int     `json:"client_emit_clients"`
	ClientEmitRate    float64 `json:"client_emit_rate"`
}

// figures are one topology's numbers for the targets (0 when not measured).
type figures struct {
	Round              int                   `json:"round"`
	Nodes              int                   `json:"nodes"`
	StartSeconds       float64               `json:"start_seconds"`
	KiBPerConn         float64               `json:"rss_kib_per_conn,omitempty"`          // RSS growth over connections, summed over the nodes
	KiBPerConnMaxNode  float64               `json:"rss_kib_per_conn_max_node,omitempty"` // the node that grew most per connection it holds
	HeapKiBPerConn     float64               `json:"heap_kib_per_conn,omitempty"`         // live heap after a forced GC, summed over the nodes
	Handshakes         float64               `json:"handshakes_per_sec,omitempty"`
	Fanout             []fanoutFigures       `json:"fanout,omitempty"`
	LatencyP50         float64               `json:"latency_p50_ms,omitempty"`
	LatencyP99         float64               `json:"latency_p99_ms,omitempty"`
	Hops               map[string][2]float64 `json:"latency_by_hops_p50_p99_ms,omitempty"`
	EmitP50            float64               `json:"emit_http_p50_ms,omitempty"`
	EmitP99            float64               `json:"emit_http_p99_ms,omitempty"`
	EmitOKPerSec       float64               `json:"emit_ok_per_sec,omitempty"`
	EmitCPU            float64               `json:"emit_cpu_us_per_emit,omitempty"` // server CPU summed over the nodes, per accepted emit
	ClientEmitP50      float64               `json:"client_emit_p50_ms,omitempty"`
	ClientEmitP99      float64               `json:"client_emit_p99_ms,omitempty"`
	Lost               float64               `json:"lost"`
	Failed             float64               `json:"emits_failed"`
	Saturated          []string              `json:"saturated,omitempty"`
	Disturbed          []string              `json:"disturbed,omitempty"`
	OtherProcessesCPUs float64               `json:"other_processes_cpu_seconds"`
}

func (r topoRun) figures() figures {
	f := figures{Round: r.Round, Nodes: r.Nodes, StartSeconds: r.StartSeconds}
	for name, outs := range r.outputs() {
		for _, out := range outs {
			if _, ok := out["saturated"]; ok && !slices.Contains(f.Saturated, name) {
				f.Saturated = append(f.Saturated, name)
			}
			if _, ok := out["disturbed"]; ok && !slices.Contains(f.Disturbed, name) {
				f.Disturbed = append(f.Disturbed, name)
			}
			f.OtherProcessesCPUs += num(out, "other_processes_cpu_seconds")
			f.Lost += num(out, "subs.lost")
			f.Failed += num(out, "emits.failed") + num(out, "emits.refused_429")
		}
	}
	slices.Sort(f.Saturated)
	slices.Sort(f.Disturbed)
	if r.conns != nil {
		f.KiBPerConn = num(r.conns, "server_rss_bytes_per_conn") / 1024
		f.KiBPerConnMaxNode = f.KiBPerConn
		if v := num(r.conns, "server_rss_bytes_per_conn_max_node"); v > 0 {
			f.KiBPerConnMaxNode = v / 1024
		}
		f.Handshakes = num(r.conns, "handshakes_per_sec")
		f.HeapKiBPerConn = num(r.conns, "server_heap_bytes_per_conn") / 1024
	}
	for _, out := range r.fanout {
		f.Fanout = append(f.Fanout, fanoutFigures{Rate: num(out, "rate"), CPUPerDelivery: cpuPerDelivery(out),
			Deliveries: num(out, "deliveries_per_sec"), Cores: num(out, "server.cores"),
			P50: num(out, "subs.latency.p50_ms"), P99: num(out, "subs.latency.p99_ms")})
	}
	if r.latency != nil {
		f.LatencyP50, f.LatencyP99 = num(r.latency, "subs.latency.p50_ms"), num(r.latency, "subs.latency.p99_ms")
		if hops, ok := r.latency["by_hops"].(map[string]any); ok {
			f.Hops = map[string][2]float64{}
			for h := range hops {
				f.Hops[h] = [2]float64{num(r.latency, "by_hops."+h+".latency.p50_ms"), num(r.latency, "by_hops."+h+".latency.p99_ms")}
			}
		}
	}
	if r.clientEmit != nil {
		f.ClientEmitP50, f.ClientEmitP99 = num(r.clientEmit, "latency.p50_ms"), num(r.clientEmit, "latency.p99_ms")
		f.Failed += num(r.clientEmit, "unanswered") + num(r.clientEmit, "refused_total")
	}
	if r.emit != nil {
		f.EmitP50, f.EmitP99 = num(r.emit, "emits.http_latency.p50_ms"), num(r.emit, "emits.http_latency.p99_ms")
		f.EmitOKPerSec = num(r.emit, "emits.ok_per_sec")
		if ok := num(r.emit, "emits.ok"); ok > 0 {
			f.EmitCPU = num(r.emit, "server.cpu_seconds") / ok * 1e6
		}
	}
	return f
}

// fanoutFigures are one fan-out run's.
type fanoutFigures struct {
	Rate           float64 `json:"rate"`
	CPUPerDelivery float64 `json:"cpu_us_per_delivery"`
	Deliveries     float64 `json:"deliveries_per_sec"`
	Cores          float64 `json:"server_cores"`
	P50            float64 `json:"p50_ms"`
	P99            float64 `json:"p99_ms"`
}

// addedPerHop is, for one round, the most any hop count added per hop
// against one node's latency: max over h of (p(h hops) − p(one node)) / h,
// for p50 and p99 (a difference of quantiles: the two runs' distributions,
// not one message's two paths).
func addedPerHop(single, cluster figures) (p50, p99 float64, ok bool) {
	p50, p99 = -1e9, -1e9
	for h, v := range cluster.Hops {
		n, _ := strconv.Atoi(h)
		if n == 0 {
			continue
		}
		p50 = max(p50, (v[0]-single.LatencyP50)/float64(n))
		p99 = max(p99, (v[1]-single.LatencyP99)/float64(n))
		ok = true
	}
	return p50, p99, ok
}

// spanOf is "a–b" of values (one value alone, "-" for none) and their median.
func spanOf(vals []float64, format func(float64) string) (string, float64) {
	if len(vals) == 0 {
		return "-", 0
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if s[0] == s[len(s)-1] {
		return format(s[0]), med
	}
	return format(s[0]) + "–" + format(s[len(s)-1]), med
}

// summary prints the JSON line and the human line of the whole comparison,
// then the table of targets.
func (cb *clusterBench) summary(nodes, rounds int, setup clusterSetup) {
	var all []figures
	var single, multi []figures // by round, paired
	for _, r := range cb.runs {
		f := r.figures()
		all = append(all, f)
		if r.Nodes == 1 {
			single = append(single, f)
		} else {
			multi = append(multi, f)
		}
	}
	pairs := min(len(single), len(multi))
	us := func(v float64) string { return fmt.Sprintf("%.2f µs", v) }
	kib := func(v float64) string { return fmt.Sprintf("%.2f KiB", v) }
	ratio := func(v float64) string { return fmt.Sprintf("%.2f×", v) }
	ms := func(v float64) string { return fmtMS(v) }
	signedMS := func(v float64) string {
		if v < 0 {
			return "−" + fmtMS(-v)
		}
		return "+" + fmtMS(v)
	}
	collect := func(fs []figures, get func(figures) float64) []float64 {
		var out []float64
		for _, f := range fs {
			if v := get(f); v != 0 {
				out = append(out, v)
			}
		}
		return out
	}

	type row struct {
		What, Goal, One, Many, Compared string
		Met                             bool
		Measured                        bool
		Notes, Command                  string
	}
	var rows []row
	// note counts the runs of a measurement (k: the k-th of its kind in a
	// topology, -1: all) that saturated the machine or were disturbed.
	note := func(key string, k int) string {
		sat, dist, n := 0, 0, 0
		for _, r := range cb.runs {
			for i, o := range r.outputs()[key] {
				if k >= 0 && i != k {
					continue
				}
				n++
				if _, ok := o["saturated"]; ok {
					sat++
				}
				if _, ok := o["disturbed"]; ok {
					dist++
				}
			}
		}
		var parts []string
		if sat > 0 {
			parts = append(parts, fmt.Sprintf("machine saturated in %d of %d runs", sat, n))
		}
		if dist > 0 {
			parts = append(parts, fmt.Sprintf("other processes took CPU in %d of %d runs", dist, n))
		}
		return strings.Join(parts, "; ")
	}
	within := func(vals []float64, ok func(float64) bool) int {
		n := 0
		for _, v := range vals {
			if ok(v) {
				n++
			}
		}
		return n
	}
	targets := map[string]any{}

	// CPU per delivery, one row per rate.
	for k, rate := range setup.FanoutRates {
		fan := func(fs []figures, get func(fanoutFigures) float64) []float64 {
			return collect(fs, func(f figures) float64 {
				if k < len(f.Fanout) {
					return get(f.Fanout[k])
				}
				return 0
			})
		}
		at := func(f figures) float64 {
			if k < len(f.Fanout) {
				return f.Fanout[k].CPUPerDelivery
			}
			return 0
		}
		var ratios []float64
		for i := 0; i < pairs; i++ {
			if at(single[i]) > 0 && at(multi[i]) > 0 {
				ratios = append(ratios, at(multi[i])/at(single[i]))
			}
		}
		one, _ := spanOf(fan(single, func(f fanoutFigures) float64 { return f.CPUPerDelivery }), us)
		many, _ := spanOf(fan(multi, func(f fanoutFigures) float64 { return f.CPUPerDelivery }), us)
		cmp, med := spanOf(ratios, ratio)
		ok := func(v float64) bool { return v <= 1.25 }
		rows = append(rows, row{fmt.Sprintf("server CPU per delivery, %d subscribers of 1 channel, %s emits/s", setup.FanoutSubs, fmtFloat(rate)),
			fmt.Sprintf("%d nodes ≤ 1.25× one", nodes), one, many,
			fmt.Sprintf("%s (median %s; %d of %d rounds within)", cmp, ratio(med), within(ratios, ok), len(ratios)),
			len(ratios) > 0 && ok(med), len(ratios) > 0, note("fanout", k),
			fmt.Sprintf("fanout -subs %d -rate %s -workers 128 -warmup", setup.FanoutSubs, fmtFloat(rate))})
		targets["cpu_per_delivery_ratio_at_"+fmtFloat(rate)] = map[string]any{"per_round": ratios, "median": med, "goal": 1.25}
		perSec := func(v float64) string { return fmt.Sprintf("%.0f/s", v) }
		cores := func(v float64) string { return fmt.Sprintf("%.2f", v) }
		lat1, _ := spanOf(fan(single, func(f fanoutFigures) float64 { return f.P50 }), ms)
		lat1b, _ := spanOf(fan(single, func(f fanoutFigures) float64 { return f.P99 }), ms)
		latN, _ := spanOf(fan(multi, func(f fanoutFigures) float64 { return f.P50 }), ms)
		latNb, _ := spanOf(fan(multi, func(f fanoutFigures) float64 { return f.P99 }), ms)
		d1, _ := spanOf(fan(single, func(f fanoutFigures) float64 { return f.Deliveries }), perSec)
		dN, _ := spanOf(fan(multi, func(f fanoutFigures) float64 { return f.Deliveries }), perSec)
		c1, _ := spanOf(fan(single, func(f fanoutFigures) float64 { return f.Cores }), cores)
		cN, _ := spanOf(fan(multi, func(f fanoutFigures) float64 { return f.Cores }), cores)
		rows = append(rows, row{"  the same run: latency, deliveries, server cores", "(no target)",
			fmt.Sprintf("p50 %s, p99 %s; %s; %s cores", lat1, lat1b, d1, c1), fmt.Sprintf("p50 %s, p99 %s; %s; %s cores", latN, latNb, dN, cN),
			"", true, false, "", ""})
	}

	// Added latency per hop.
	{
		var a50, a99 []float64
		for i := 0; i < pairs; i++ {
			if p50, p99, ok := addedPerHop(single[i], multi[i]); ok && single[i].LatencyP50 > 0 {
				a50, a99 = append(a50, p50), append(a99, p99)
			}
		}
		one50, _ := spanOf(collect(single, func(f figures) float64 { return f.LatencyP50 }), ms)
		one99, _ := spanOf(collect(single, func(f figures) float64 { return f.LatencyP99 }), ms)
		var hops []string
		for _, h := range []string{"0", "1", "2"} {
			p50, _ := spanOf(collect(multi, func(f figures) float64 { return f.Hops[h][0] }), ms)
			p99, _ := spanOf(collect(multi, func(f figures) float64 { return f.Hops[h][1] }), ms)
			if p50 != "-" {
				hops = append(hops, fmt.Sprintf("%s hop(s) p50 %s p99 %s", h, p50, p99))
			}
		}
		c50, m50 := spanOf(a50, signedMS)
		c99, m99 := spanOf(a99, signedMS)
		okRound := 0
		for i := range a50 {
			if a50[i] <= 1 && a99[i] <= 5 {
				okRound++
			}
		}
		rows = append(rows, row{fmt.Sprintf("added latency per cross-node hop, %s emits/s over %d channels × 1 subscriber per node", fmtFloat(setup.LatencyRate), setup.LatencyChannels),
			"p50 ≤ 1 ms, p99 ≤ 5 ms", fmt.Sprintf("p50 %s, p99 %s", one50, one99), strings.Join(hops, "; "),
			fmt.Sprintf("p50 %s, p99 %s per hop (medians %s, %s; %d of %d rounds within)", c50, c99, signedMS(m50), signedMS(m99), okRound, len(a50)),
			len(a50) > 0 && m50 <= 1 && m99 <= 5, len(a50) > 0, note("latency", -1),
			fmt.Sprintf("fanout -subs %d -channels %d -rate %s -via channel -debug … -warmup", setup.LatencyChannels*nodes, setup.LatencyChannels, fmtFloat(setup.LatencyRate))})
		targets["added_latency_per_hop_ms"] = map[string]any{"p50_per_round": a50, "p99_per_round": a99, "p50_median": m50, "p99_median": m99, "goal_p50": 1, "goal_p99": 5}
	}

	// HTTP emit p99.
	{
		p99s := collect(multi, func(f figures) float64 { return f.EmitP99 })
		one, _ := spanOf(collect(single, func(f figures) float64 { return f.EmitP99 }), ms)
		one50, _ := spanOf(collect(single, func(f figures) float64 { return f.EmitP50 }), ms)
		many, med := spanOf(p99s, ms)
		many50, _ := spanOf(collect(multi, func(f figures) float64 { return f.EmitP50 }), ms)
		ok := func(v float64) bool { return v < 10 }
		rows = append(rows, row{fmt.Sprintf("HTTP emit, %s emits/s open loop over %d channels, %d subscribers", fmtFloat(setup.EmitRate), setup.EmitChannels, setup.EmitSubs),
			fmt.Sprintf("p99 < 10 ms through %d nodes", nodes), fmt.Sprintf("p50 %s, p99 %s", one50, one), fmt.Sprintf("p50 %s, p99 %s", many50, many),
			fmt.Sprintf("p99 median %s; %d of %d rounds within", ms(med), within(p99s, ok), len(p99s)),
			len(p99s) > 0 && ok(med), len(p99s) > 0, note("emit", -1),
			fmt.Sprintf("fanout -subs %d -channels %d -rate %s -workers 64 -warmup", setup.EmitSubs, setup.EmitChannels, fmtFloat(setup.EmitRate))})
		targets["emit_http_p99_ms"] = map[string]any{"cluster_per_round": p99s, "median": med, "goal": 10}

		// The same run's server CPU per emit (every node's, the deliveries to
		// its subscribers included; two channels in three are owned by
		// another node than the one an emit comes through).
		var ratios []float64
		for i := 0; i < pairs; i++ {
			if single[i].EmitCPU > 0 && multi[i].EmitCPU > 0 {
				ratios = append(ratios, multi[i].EmitCPU/single[i].EmitCPU)
			}
		}
		cpu1, _ := spanOf(collect(single, func(f figures) float64 { return f.EmitCPU }), us)
		cpuN, _ := spanOf(collect(multi, func(f figures) float64 { return f.EmitCPU }), us)
		cmp, cmed := spanOf(ratios, ratio)
		within15 := func(v float64) bool { return v <= 1.5 }
		rows = append(rows, row{"  the same run: server CPU per HTTP emit, summed over the nodes", fmt.Sprintf("%d nodes ≤ 1.5× one", nodes), cpu1, cpuN,
			fmt.Sprintf("%s (median %s; %d of %d rounds within)", cmp, ratio(cmed), within(ratios, within15), len(ratios)),
			len(ratios) > 0 && within15(cmed), len(ratios) > 0, "", ""})
		targets["cpu_per_emit_ratio"] = map[string]any{"per_round": ratios, "median": cmed, "goal": 1.5}
	}

	// Client-emit ack latency: the clientId's window (rule 6, the project
	// grain's) and the channel's grain, each on some node.
	{
		one50, _ := spanOf(collect(single, func(f figures) float64 { return f.ClientEmitP50 }), ms)
		one99, _ := spanOf(collect(single, func(f figures) float64 { return f.ClientEmitP99 }), ms)
		many50, _ := spanOf(collect(multi, func(f figures) float64 { return f.ClientEmitP50 }), ms)
		many99, _ := spanOf(collect(multi, func(f figures) float64 { return f.ClientEmitP99 }), ms)
		var a50, a99 []float64
		for i := 0; i < pairs; i++ {
			if single[i].ClientEmitP50 > 0 && multi[i].ClientEmitP50 > 0 {
				a50 = append(a50, multi[i].ClientEmitP50-single[i].ClientEmitP50)
				a99 = append(a99, multi[i].ClientEmitP99-single[i].ClientEmitP99)
			}
		}
		c50, m50 := spanOf(a50, signedMS)
		c99, m99 := spanOf(a99, signedMS)
		compared := ""
		if len(a50) > 0 {
			compared = fmt.Sprintf("p50 %s, p99 %s (medians %s, %s)", c50, c99, signedMS(m50), signedMS(m99))
		}
		rows = append(rows, row{fmt.Sprintf("client emit over WebSocket, %d sockets × %s emits/s, ack latency", setup.ClientEmitClients, fmtFloat(setup.ClientEmitRate)),
			"(no target)", fmt.Sprintf("p50 %s, p99 %s", one50, one99), fmt.Sprintf("p50 %s, p99 %s", many50, many99), compared,
			true, false, note("clientemit", -1), fmt.Sprintf("clientemit -clients %d -rate %s", setup.ClientEmitClients, fmtFloat(setup.ClientEmitRate))})
		targets["client_emit_added_ms"] = map[string]any{"p50_per_round": a50, "p99_per_round": a99, "p50_median": m50, "p99_median": m99}
	}

	// Idle memory per connection.
	{
		var ratios, ratiosMax []float64
		for i := 0; i < pairs; i++ {
			if single[i].KiBPerConn > 0 && multi[i].KiBPerConn > 0 {
				ratios = append(ratios, multi[i].KiBPerConn/single[i].KiBPerConn)
				ratiosMax = append(ratiosMax, multi[i].KiBPerConnMaxNode/single[i].KiBPerConn)
			}
		}
		one, _ := spanOf(collect(single, func(f figures) float64 { return f.KiBPerConn }), kib)
		many, _ := spanOf(collect(multi, func(f figures) float64 { return f.KiBPerConn }), kib)
		manyMax, _ := spanOf(collect(multi, func(f figures) float64 { return f.KiBPerConnMaxNode }), kib)
		cmp, med := spanOf(ratios, ratio)
		cmpMax, medMax := spanOf(ratiosMax, ratio)
		ok := func(v float64) bool { return v <= 1.10 }
		rows = append(rows, row{fmt.Sprintf("idle memory per connection on a node, %d subscribed connections each", setup.ConnsPerNode),
			"within +10 % of one node (RSS growth, both readings after a forced GC)", one, fmt.Sprintf("%s (the node that grew most: %s)", many, manyMax),
			fmt.Sprintf("%s (median %s; %d of %d rounds within); most-grown node %s (median %s)", cmp, ratio(med), within(ratios, ok), len(ratios), cmpMax, ratio(medMax)),
			len(ratios) > 0 && ok(med), len(ratios) > 0, note("conns", -1),
			fmt.Sprintf("conns -n %d (one node) / %d (%d nodes)", setup.ConnsPerNode, setup.ConnsPerNode*nodes, nodes)})
		targets["rss_per_conn_ratio"] = map[string]any{"per_round": ratios, "median": med, "most_grown_node_per_round": ratiosMax, "goal": 1.10}
		h1, _ := spanOf(collect(single, func(f figures) float64 { return f.Handshakes }), func(v float64) string { return fmt.Sprintf("%.0f/s", v) })
		hN, _ := spanOf(collect(multi, func(f figures) float64 { return f.Handshakes }), func(v float64) string { return fmt.Sprintf("%.0f/s", v) })
		rows = append(rows, row{"  the same run: handshakes", "(no target)", h1, hN, "", true, false, "", ""})
		heap1, _ := spanOf(collect(single, func(f figures) float64 { return f.HeapKiBPerConn }), kib)
		heapN, _ := spanOf(collect(multi, func(f figures) float64 { return f.HeapKiBPerConn }), kib)
		rows = append(rows, row{"  the same run: live heap per connection (after a forced GC)", "(no target)", heap1, heapN, "", true, false, "", ""})
	}

	var lost, failed float64
	for _, f := range all {
		lost += f.Lost
		failed += f.Failed
	}
	out := map[string]any{"scenario": "cluster", "nodes": nodes, "rounds": rounds, "setup": setup, "runs": all,
		"targets": targets, "lost": lost, "emits_failed_or_refused": failed}
	var human []string
	for _, r := range rows {
		if r.Measured {
			met := "met"
			if !r.Met {
				met = "NOT met"
			}
			human = append(human, fmt.Sprintf("%s: %s (%s)", r.What, r.Compared, met))
		}
	}
	report(out, fmt.Sprintf("cluster: %d nodes against one, %d round(s), lost %d, emits failed or refused %d; %s",
		nodes, rounds, int(lost), int(failed), strings.Join(human, "; ")))

	remote := "mutual TLS"
	if !setup.RemoteTLS {
		remote = "no TLS"
	}
	fmt.Printf("\nrelay-bench cluster, %s, %d cores, %d nodes (remote: %s) against one node (both on PostgreSQL), %d round(s) alternated\n\n",
		time.Now().UTC().Format("2006-01-02"), onlineCPUs(), nodes, remote, rounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "target\tgoal\tone node\t%d nodes\tcompared\tmet\tnotes\tcommand\n", nodes)
	for _, r := range rows {
		met := "-"
		if r.Measured {
			met = "yes"
			if !r.Met {
				met = "NO"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.What, r.Goal, r.One, r.Many, orDash(r.Compared), met, orDash(r.Notes), orDash(r.Command))
	}
	tw.Flush()
	if lost > 0 || failed > 0 {
		fmt.Printf("\nWARNING: %d deliveries lost and %d emits failed or refused over all runs (see the JSON lines)\n", int(lost), int(failed))
	}
}

// ensureFiles raises this process's open-file limit to at least n (the hard
// limit too, which only root may do), or says why it cannot.
func ensureFiles(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= n {
		return nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(lim.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("this run holds up to %d sockets but the open-file limit is %d (hard %d) and raising it failed (%v)", n, lim.Cur, lim.Max, err)
	}
	return nil
}
