package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// emit: HTTP emit throughput and latency, closed loop (K keep-alive workers
// emitting back to back) for D seconds on one channel, once per subscriber
// count in -subs (by default with none and with 100). One JSON line each.
func runEmit(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("emit", flag.ExitOnError)
	c.register(fs)
	subsList := fs.String("subs", "0,100", "comma-separated subscriber counts, one run each")
	workers := fs.Int("workers", 16, "keep-alive HTTP emit workers")
	duration := fs.Duration("duration", 10*time.Second, "how long each run emits")
	payloadBytes := fs.Int("payload-bytes", 100, "size of the JSON payload of each message")
	sources := fs.Int("sources", 4, "loopback source addresses 127.0.0.2… for the subscribers (0: kernel's choice)")
	drain := fs.Duration("drain", 3*time.Second, "after the last emit, how long to wait for missing deliveries")
	channels := fs.Int("channels", 1, "channels the workers emit on, round robin (more than 1 only with -subs 0)")
	history := fs.Int("history", 0, "the project's historyRetentionSeconds (channel history: an emit is answered once its message is stored); 0: off")
	secretKey := fs.String("secret-key", "", "emit with this secret key instead of signing up and creating a project (e.g. to a naive hub: relay-bench naive); no subscribers then")
	profile := cpuProfile(fs)
	stopProfile, err := c.begin(fs, args, profile)
	if err != nil {
		return err
	}
	defer stopProfile()
	var counts []int
	for _, f := range strings.Split(*subsList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return fmt.Errorf("-subs: want counts like 0,100, got %q", *subsList)
		}
		counts = append(counts, n)
	}
	if *workers < 1 || *duration <= 0 || *channels < 1 {
		return errors.New("want -workers ≥ 1, -channels ≥ 1 and -duration > 0")
	}
	if *channels > 1 && slices.ContainsFunc(counts, func(n int) bool { return n > 0 }) {
		return errors.New("-channels: more than 1 only with -subs 0")
	}
	if *history > 0 && *secretKey != "" {
		return errors.New("-history: not with -secret-key (it sets up its own project)")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	var p project
	var em *emitters
	var b budgets
	if *secretKey != "" {
		if slices.ContainsFunc(counts, func(n int) bool { return n > 0 }) {
			return errors.New("-secret-key: only with -subs 0 (subscribers need a project's public key)")
		}
		p.SecretKey = *secretKey
		em = newEmitters(c.bases, p.SecretKey, *workers, *payloadBytes)
		b, err = em.nodes[0].preflight(ctx)
	} else {
		p, em, b, err = emitterFor(ctx, &c, "bench-emit", *workers, *payloadBytes, keepHistory(*history))
	}
	if err != nil {
		return err
	}
	defer em.closeIdle()
	// A closed loop goes as fast as the server answers: assume up to 50 000/s.
	advice := budgetAdvice(b, 50000*min(duration.Minutes(), 1), 50000*min(duration.Minutes(), 1)*float64(len(counts)))
	if advice != "" {
		warn("%s", advice)
	}
	for run, n := range counts {
		if err := emitRun(ctx, &c, em, p, run, n, *channels, *workers, *duration, *drain, *payloadBytes, *sources, advice); err != nil {
			return err
		}
	}
	return nil
}

func emitRun(ctx context.Context, c *common, em *emitters, p project, run, n, channels, workers int, duration, drain time.Duration, payloadBytes, sources int, advice string) error {
	name := fmt.Sprintf("bench-emit-%d", run)
	names := []string{name}
	for i := 1; i < channels; i++ {
		names = append(names, fmt.Sprintf("%s-%d", name, i))
	}
	conns, failed, dialErr := dialMany(ctx, wsURLsFor(c.bases, p.PublicKey), c.base, n, 1, 64, sources,
		func(int) string { return name })
	defer closeAll(conns)
	if len(conns) == 0 && n > 0 {
		return fmt.Errorf("no subscriber connected: %v", dialErr)
	}
	var sampler *procSampler
	if c.measured() {
		sampler = startSampler(c.serverPIDs, c.helperPIDs)
	}
	meter := startClientMeter()
	et := em.closedLoop(ctx, names, duration, workers)
	client := meter.stop()
	server := sampler.stop()
	if len(conns) > 0 {
		want := int64(len(conns)) * int64(len(et.expected[0]))
		for deadline := time.Now().Add(drain); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
			var got int64
			for _, s := range conns {
				got += s.recv.Load()
			}
			if got >= want {
				break
			}
		}
	}
	closeAll(conns)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("run cut short: %w", err)
	}
	out := map[string]any{
		"scenario": "emit", "nodes": len(c.bases), "subscribers": len(conns), "subscribe_failed": failed, "workers": workers,
		"duration_s": duration.Seconds(), "payload_bytes": payloadBytes, "channels": channels, "emits": et,
		"emits_per_sec": et.PerSec, "client": client,
	}
	human := fmt.Sprintf("emit: %d workers, %d subscribers, %v: %s", workers, len(conns), duration, et)
	if len(c.bases) > 1 {
		human = fmt.Sprintf("emit through %d nodes (worker w through node w%%%d): ", len(c.bases), len(c.bases)) + strings.TrimPrefix(human, "emit: ")
	}
	if len(conns) > 0 {
		st := tally(conns, et.expected, true)
		out["subs"] = st
		human += fmt.Sprintf("; deliveries %d of %d, lost %d, out of order %d, delivery latency %s",
			st.Deliveries, st.Expected, st.Lost, st.OutOfOrder, st.Latency)
	}
	if failed > 0 {
		out["first_error"] = fmt.Sprint(dialErr)
		human += fmt.Sprintf("; %d subscribers failed to connect (%v)", failed, dialErr)
	}
	if c.measured() {
		out["server"] = server
		human += "; " + server.String()
	}
	human = usageNotes(out, human, c, server, client, len(conns) > 0, et, false, advice)
	report(out, human)
	return nil
}
