// Command relay-bench drives a running relay over its public interface only
// (control plane to provision, WebSocket to subscribe, HTTP to emit). It only
// talks to loopback addresses and every scenario is bounded in count and time.
//
//	relay-bench conns -n 10000 -server-pid $(pgrep -f 'relay serve')
//	relay-bench suite -relay bin/relay   # starts its own relays, ends with a table
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
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: relay-bench suite|fanout|conns|emit|churn [flags] (-h for a scenario's flags)")
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
	case "churn":
		err = runChurn(ctx, os.Args[2:])
	case "suite":
		err = runSuite(ctx, os.Args[2:])
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
	base      string
	email     string
	password  string
	serverPID int
	timeout   time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.base, "base", "http://127.0.0.1:8080", "relay base URL (loopback only)")
	fs.StringVar(&c.email, "email", "bench@example.com", "account to sign up or log in with (must be in ALLOWED_SIGNUP_EMAILS)")
	fs.StringVar(&c.password, "password", "bench-password", "its password")
	fs.IntVar(&c.serverPID, "server-pid", 0, "pid of the relay process, to read its CPU and RSS from /proc")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "hard bound on the whole run")
}

// begin parses a scenario's flags, refuses a non-loopback target and starts
// the tool's CPU profile if -cpuprofile asked for one.
func (c *common) begin(fs *flag.FlagSet, args []string, profile func() (func(), error)) (stopProfile func(), err error) {
	fs.Parse(args)
	if err := c.checkLoopback(); err != nil {
		return nil, err
	}
	return profile()
}

// checkLoopback refuses anything but 127.0.0.0/8 and ::1.
func (c *common) checkLoopback() error {
	u, err := url.Parse(c.base)
	if err != nil {
		return err
	}
	ips, err := net.LookupIP(u.Hostname())
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return errors.New("refusing a non-loopback target: " + c.base)
		}
	}
	return nil
}

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
