package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// healthcheckTimeout bounds `relay healthcheck`: a container runtime runs it
// every few seconds and counts a hang as a failure anyway.
const healthcheckTimeout = 3 * time.Second

// runHealthcheck is `relay healthcheck`: GET /healthz of the relay serving on
// RELAY_ADDR (loopback when it names no host or every address: the
// container's own), exit 0 on 200. It is the container image's HEALTHCHECK,
// which has no shell or curl to run. Liveness, not a readiness: a runtime
// that restarts unhealthy containers would restart every node during a
// database outage on /readyz, and a draining node on /readyz/traffic.
func runHealthcheck(ctx context.Context, lookup func(string) (string, bool), out io.Writer) error {
	addr, ok := lookup("RELAY_ADDR")
	if !ok || addr == "" {
		addr = ":8080"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("healthcheck: RELAY_ADDR %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1" // a relay on every address answers on loopback
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	url := "http://" + net.JoinHostPort(host, port) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s answered %d", url, res.StatusCode)
	}
	_, err = fmt.Fprintln(out, "ok")
	return err
}
