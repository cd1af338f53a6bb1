// Command relay-bench drives a running relay over its public interface only
// (control plane to provision, WebSocket to subscribe, HTTP to emit). It only
// talks to loopback addresses and every scenario is bounded in count and time.
//
//	relay-bench conns -n 10000 -server-pid $(pgrep -f 'relay serve')
//	relay-bench suite -relay bin/relay   # starts its own relays, ends with a table
//	relay-bench cluster -relay bin/relay # etcd, PostgreSQL and 3 nodes against 1
//
// Every scenario takes several nodes of one relay too: -base and -server-pid
// accept comma-separated lists (in the same order), subscribers are spread
// over the nodes and emits go through all of them (see spread and via).
//
// Each run prints one JSON line and one human line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: relay-bench suite|cluster|fanout|conns|emit|clientemit|churn|naive|transport [flags] (-h for a scenario's flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "conns":
		err = runConns(ctx, os.Args[2:])
	case "fanout":
		err = runFanout(ctx, os.Args[2:])
	case "emit":
		err = runEmit(ctx, os.Args[2:])
	case "clientemit":
		err = runClientEmit(ctx, os.Args[2:])
	case "churn":
		err = runChurn(ctx, os.Args[2:])
	case "suite":
		err = runSuite(ctx, os.Args[2:])
	case "cluster":
		err = runCluster(ctx, os.Args[2:])
	case "naive":
		err = runNaive(ctx, os.Args[2:])
	case "transport":
		err = runTransport(ctx, os.Args[2:])
	case "transport-peer":
		err = runTransportPeer(os.Args[2:])
	default:
		err = fmt.Errorf("unknown scenario %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay-bench:", err)
		os.Exit(1)
	}
}

// common flags of every scenario.
type common struct {
	base          string   // the first node
	bases         []string // every node of the relay, from -base a,b,c
	provisionBase string   // where to sign up and create the project, if not the first node
	email         string
	password      string
	serverPIDs    []int // the relay processes to read from /proc, from -server-pid p,q,r
	helperPIDs    []int // processes the relay depends on (etcd, PostgreSQL), counted apart
	timeout       time.Duration

	baseList, pidList, helperList string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.baseList, "base", "http://127.0.0.1:8080", "relay base URL (loopback only); several nodes of one relay: comma-separated, subscribers spread over them and emits through all")
	fs.StringVar(&c.provisionBase, "provision-base", "", "sign up and create the project through this relay instead of the first -base (a relay process on the same database that is not measured: a sign-up hashes a password, whose freed memory would otherwise sit in a measured node for connections to reuse without growing its RSS)")
	fs.StringVar(&c.email, "email", "bench@example.com", "account to sign up or log in with (must be in ALLOWED_SIGNUP_EMAILS)")
	fs.StringVar(&c.password, "password", "bench-password", "its password")
	fs.StringVar(&c.pidList, "server-pid", "", "pid of the relay process, to read its CPU and RSS from /proc (several nodes: comma-separated, summed, in -base's order)")
	fs.StringVar(&c.helperList, "helper-pid", "", "pids of processes the relay uses (etcd, the PostgreSQL postmaster; comma-separated): their CPU, children included, is reported apart instead of as other processes'")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "hard bound on the whole run")
}

// begin parses a scenario's flags, refuses a non-loopback target and starts
// the tool's CPU profile if -cpuprofile asked for one.
func (c *common) begin(fs *flag.FlagSet, args []string, profile func() (func(), error)) (stopProfile func(), err error) {
	fs.Parse(args)
	if err := c.parse(); err != nil {
		return nil, err
	}
	return profile()
}

// parse splits the list flags and refuses a non-loopback target.
func (c *common) parse() error {
	var err error
	if c.bases, err = loopbackURLs(c.baseList); err != nil {
		return fmt.Errorf("-base: %w", err)
	}
	c.base = c.bases[0]
	if c.provisionBase != "" {
		if _, err := loopbackURLs(c.provisionBase); err != nil {
			return fmt.Errorf("-provision-base: %w", err)
		}
	}
	if c.serverPIDs, err = pids(c.pidList); err != nil {
		return fmt.Errorf("-server-pid: %w", err)
	}
	if len(c.serverPIDs) > 0 && len(c.serverPIDs) != len(c.bases) {
		return fmt.Errorf("-server-pid names %d processes for %d -base URLs", len(c.serverPIDs), len(c.bases))
	}
	if c.helperPIDs, err = pids(c.helperList); err != nil {
		return fmt.Errorf("-helper-pid: %w", err)
	}
	return nil
}

// loopbackURLs splits comma-separated URLs and refuses any whose host is not
// 127.0.0.0/8 or ::1.
func loopbackURLs(list string) ([]string, error) {
	var out []string
	for _, b := range strings.Split(list, ",") {
		b = strings.TrimRight(strings.TrimSpace(b), "/")
		if b == "" {
			continue
		}
		u, err := url.Parse(b)
		if err != nil {
			return nil, err
		}
		ips, err := net.LookupIP(u.Hostname())
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if !ip.IsLoopback() {
				return nil, errors.New("refusing a non-loopback target: " + b)
			}
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, errors.New("no URL")
	}
	return out, nil
}

func pids(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("want pids separated by commas, got %q", list)
		}
		if n > 0 { // 0 means none, as when the flag was a single int
			out = append(out, n)
		}
	}
	return out, nil
}

// measured: the relay's processes are known, so /proc is read.
func (c *common) measured() bool { return len(c.serverPIDs) > 0 }

// spread is the node of a channel's k-th subscriber: round robin over the
// nodes, starting at a node that shifts with the channel, so that every
// channel with at least as many subscribers as there are nodes has some on
// each, and a few subscribers on as many channels land on different nodes.
func spread(channel, k, nodes int) int { return (channel + k) % nodes }

// onReport, when set (by suite), receives every run's JSON line too.
var onReport func(line []byte)

// report prints the JSON line and the human line.
func report(v any, human string) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
	fmt.Println(human)
	if onReport != nil {
		onReport(b)
	}
}
