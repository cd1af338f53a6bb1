package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"
)

// fanout: S subscribers over C channels, an open-loop emitter at E messages
// per second (in total, round robin over the channels) for D seconds over
// HTTP. Reports deliveries per second, end-to-end latency, loss and order per
// subscriber (against the seqs the emit responses announced), connections
// the server closed, refused and failed emits, the server's CPU and peak RSS,
// and the tool's own CPU.
//
// With several nodes (-base a,b,c) each channel's subscribers are spread
// over them and the emits go through all of them; with -via channel and
// every node's operator listener (-debug), the latency is also reported by
// the cross-node hops each message took to each subscriber (emit node →
// the channel grain's node → the subscriber's node: 0, 1 or 2).
func runFanout(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("fanout", flag.ExitOnError)
	c.register(fs)
	subs := fs.Int("subs", 2000, "subscribers")
	channels := fs.Int("channels", 1, "channels; subscriber i takes channel i%channels")
	rate := fs.Float64("rate", 300, "emits per second, in total over the channels (open loop)")
	duration := fs.Duration("duration", 10*time.Second, "how long to emit")
	workers := fs.Int("workers", 64, "keep-alive HTTP emit workers (enough to cover rate × the server's emit latency)")
	payloadBytes := fs.Int("payload-bytes", 100, "size of the JSON payload of each message")
	parallel := fs.Int("parallel", 64, "handshakes in flight while connecting")
	sources := fs.Int("sources", 4, "loopback source addresses 127.0.0.2… to spread ports over (0: kernel's choice)")
	drain := fs.Duration("drain", 5*time.Second, "after the last emit, how long to wait for missing deliveries")
	via := fs.String("via", "roundrobin", "several nodes: emit i goes through node i%nodes (roundrobin), or every emit to channel c through node c%nodes (channel)")
	warmup := fs.Bool("warmup", false, "before the subscribers connect, emit once to every channel through every node (the channels' actors or grains start then, not during the measured run)")
	history := fs.Int("history", 0, "the project's historyRetentionSeconds (channel history: each message is stored before it is delivered); 0: off")
	debugList := fs.String("debug", "", "several nodes: their operator listeners (http://127.0.0.1:PORT, comma-separated, in -base's order), to find each channel grain's node and report latency by hops (with -via channel)")
	profile := cpuProfile(fs)
	stopProfile, err := c.begin(fs, args, profile)
	if err != nil {
		return err
	}
	defer stopProfile()
	if *subs < 0 || *channels < 1 || *rate <= 0 || *duration <= 0 || *workers < 1 {
		return errors.New("want -subs ≥ 0, -channels ≥ 1, -rate > 0, -duration > 0, -workers ≥ 1")
	}
	if *via != "roundrobin" && *via != "channel" {
		return errors.New("-via: roundrobin or channel")
	}
	var debugs []string
	if *debugList != "" {
		if debugs, err = loopbackURLs(*debugList); err != nil {
			return fmt.Errorf("-debug: %w", err)
		}
		if len(debugs) != len(c.bases) {
			return fmt.Errorf("-debug names %d listeners for %d nodes", len(debugs), len(c.bases))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	p, em, b, err := emitterFor(ctx, &c, "bench-fanout", *workers, *payloadBytes, keepHistory(*history))
	if err != nil {
		return err
	}
	defer em.closeIdle()
	em.byChannel = *via == "channel"
	busiest := *rate * min(duration.Minutes(), 1) // per minute, in the fixed 1-minute window
	advice := budgetAdvice(b, busiest/float64(*channels), busiest)
	if advice != "" {
		warn("%s", advice)
	}

	names := make([]string, *channels)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%d", i)
	}
	if *warmup {
		if err := em.warmup(ctx, names); err != nil {
			return err
		}
	}
	connStart := time.Now()
	conns, failed, dialErr := dialMany(ctx, wsURLsFor(c.bases, p.PublicKey), c.base, *subs, *channels, *parallel, *sources,
		func(i int) string { return names[i] })
	connTime := time.Since(connStart)
	defer closeAll(conns)
	if len(conns) == 0 && *subs > 0 {
		return fmt.Errorf("no subscriber connected: %v", dialErr)
	}
	perChannel := make([]int64, *channels)
	for _, s := range conns {
		perChannel[s.channel]++
	}

	var sampler *procSampler
	if c.measured() {
		sampler = startSampler(c.serverPIDs, c.helperPIDs)
	}
	meter := startClientMeter()
	emitStart := time.Now()
	et := em.openLoop(ctx, names, *rate, *duration, *workers)

	// Wait for the deliveries the emit responses announced.
	var want int64
	for ch, seqs := range et.expected {
		want += perChannel[ch] * int64(len(seqs))
	}
	deadline := time.Now().Add(*drain)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var got int64
		for _, s := range conns {
			got += s.recv.Load()
		}
		if got >= want {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	client := meter.stop()
	server := sampler.stop()
	// Which node holds each channel's grain (asked while the subscribers
	// still hold them).
	var owners []int
	var ownersErr error
	if len(debugs) > 1 && em.byChannel {
		owners, ownersErr = grainOwners(ctx, debugs, p.ID, names)
	}
	closeAll(conns)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("run cut short: %w", err)
	}

	st := tally(conns, et.expected, true)
	span := time.Duration(st.lastNs - emitStart.UnixNano())
	if span < *duration {
		span = *duration
	}
	perSec := float64(st.Deliveries) / span.Seconds()
	out := map[string]any{
		"scenario": "fanout", "nodes": len(c.bases), "via": *via, "subscribers": len(conns), "subscribe_failed": failed, "channels": *channels,
		"rate": *rate, "duration_s": duration.Seconds(), "payload_bytes": *payloadBytes, "workers": *workers,
		"connect_seconds": connTime.Seconds(), "emits": et, "subs": st,
		"deliveries_per_sec": perSec, "offered_deliveries_per_sec": float64(st.Expected) / duration.Seconds(),
		"client": client,
	}
	human := fmt.Sprintf("fanout: %d subs on %d channel(s), %.0f emits/s for %v: %.0f deliveries/s (%d of %d expected), latency %s; lost %d, out of order %d, server closed %d; emits: %s",
		len(conns), *channels, *rate, *duration, perSec, st.Deliveries, st.Expected, st.Latency,
		st.Lost, st.OutOfOrder, st.ServerClosed, et)
	if len(c.bases) > 1 {
		human = fmt.Sprintf("fanout over %d nodes (emits %s): ", len(c.bases), *via) + strings.TrimPrefix(human, "fanout: ")
	}
	if owners != nil {
		byHops, text := latencyByHops(conns, et.expected, owners, em)
		out["by_hops"] = byHops
		human += "; latency by cross-node hops: " + text
	} else if ownersErr != nil {
		out["by_hops_error"] = ownersErr.Error()
		human += "; no latency by hops: " + ownersErr.Error()
	}
	if failed > 0 {
		out["first_error"] = fmt.Sprint(dialErr)
		human += fmt.Sprintf("; %d subscribers failed to connect (%v)", failed, dialErr)
	}
	if c.measured() {
		out["server"] = server
		human += "; " + server.String()
	}
	human = usageNotes(out, human, &c, server, client, len(conns) > 0, et, true, advice)
	report(out, human)
	return nil
}
