package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// churn: connections join at -rate per second, each subscribes to one
// channel and lives a random -min-life…-max-life (a share of them leaving
// abruptly, without a close frame), while the channel streams at -emit-rate
// for D seconds; -resident connections stay for the whole run. Reports loss
// per connection while it was connected (one that got seq a and later seq b
// must have every announced seq in between), and leaks: the subscriptions the
// server counts (subscriberCount of a probe emit) against the connections the
// tool believes open (server-initiated closes are seen as close frames or
// drops), the server's sockets and RSS before and after.
func runChurn(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("churn", flag.ExitOnError)
	c.register(fs)
	rate := fs.Float64("rate", 200, "connections joining per second")
	minLife := fs.Duration("min-life", 500*time.Millisecond, "shortest connection life")
	maxLife := fs.Duration("max-life", 3*time.Second, "longest connection life")
	abrupt := fs.Float64("abrupt", 0.1, "share of connections that leave by dropping the socket instead of a close frame")
	resident := fs.Int("resident", 10, "connections that stay for the whole run")
	emitRate := fs.Float64("emit-rate", 100, "messages per second on the channel (open loop)")
	duration := fs.Duration("duration", 10*time.Second, "how long connections join and the channel streams")
	workers := fs.Int("workers", 4, "keep-alive HTTP emit workers")
	payloadBytes := fs.Int("payload-bytes", 100, "size of the JSON payload of each message")
	sources := fs.Int("sources", 4, "loopback source addresses 127.0.0.2… to spread ports over (0: kernel's choice)")
	maxDialing := fs.Int("max-dialing", 256, "handshakes in flight; a join beyond it is skipped and counted")
	settle := fs.Duration("settle", time.Second, "wait after closes before comparing counts")
	profile := cpuProfile(fs)
	stopProfile, err := c.begin(fs, args, profile)
	if err != nil {
		return err
	}
	defer stopProfile()
	if *rate <= 0 || *emitRate <= 0 || *duration <= 0 || *minLife <= 0 || *maxLife < *minLife || *workers < 1 {
		return errors.New("want -rate > 0, -emit-rate > 0, -duration > 0, 0 < -min-life ≤ -max-life, -workers ≥ 1")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	p, em, b, err := emitterFor(ctx, &c, "bench-churn", *workers, *payloadBytes)
	if err != nil {
		return err
	}
	defer em.closeIdle()
	advice := budgetAdvice(b, *emitRate*60*min(duration.Minutes(), 1), *emitRate*60*min(duration.Minutes(), 1)+10)
	if advice != "" {
		warn("%s", advice)
	}
	const name = "bench-churn"
	wsURLs := wsURLsFor(c.bases, p.PublicKey)

	// A probe emit reads the server's subscriber count; its seq is expected too.
	var probeSeqs []uint64
	probeConn := em.newConn()
	defer probeConn.close()
	probe := func() (int, error) {
		r, err := probeConn.emit(ctx, name, time.Now().UnixNano())
		if err == nil && r.status != http.StatusOK {
			err = fmt.Errorf("probe emit: %d %s", r.status, r.code)
		}
		if err != nil {
			return -1, err
		}
		probeSeqs = append(probeSeqs, r.seq)
		return r.subs, nil
	}
	sockets := func() int {
		if !c.measured() {
			return -1
		}
		em.closeIdle() // our own keep-alive connections are not the server's leak
		probeConn.close()
		time.Sleep(100 * time.Millisecond)
		total := 0
		for _, pid := range c.serverPIDs {
			n, _ := countSockets(pid)
			total += n
		}
		return total
	}

	socketsBefore := sockets()
	var sampler *procSampler
	if c.measured() {
		sampler = startSampler(c.serverPIDs, c.helperPIDs)
	}
	meter := startClientMeter()
	residents, resFailed, resErr := dialMany(ctx, wsURLs, c.base, *resident, 1, 16, *sources, func(int) string { return name })
	defer closeAll(residents)
	if len(residents) < *resident {
		return fmt.Errorf("%d resident connections failed: %v", resFailed, resErr)
	}

	var (
		mu       sync.Mutex
		churners []*wsSub
		wg       sync.WaitGroup
		dialing  atomic.Int64
		skipped  atomic.Int64
		failed   atomic.Int64
		abrupts  atomic.Int64
		first    firstErr
	)
	spawnDone := make(chan struct{})
	go func() {
		defer close(spawnDone)
		total := int(*rate * duration.Seconds())
		start := time.Now()
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for i := 0; i < total; i++ {
			due := start.Add(time.Duration(float64(i) * float64(time.Second) / *rate))
			if wait := time.Until(due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
			}
			if dialing.Load() >= int64(*maxDialing) {
				skipped.Add(1)
				continue
			}
			dialing.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := (i + *resident) % len(wsURLs)
				s, err := dialSub(ctx, wsURLs[node], srcIP(i+*resident, *sources, c.base), name, 0)
				dialing.Add(-1)
				if err != nil {
					failed.Add(1)
					first.set(err)
					return
				}
				mu.Lock()
				churners = append(churners, s)
				mu.Unlock()
				life := *minLife + time.Duration(rand.Int64N(int64(*maxLife-*minLife)+1))
				drop := rand.Float64() < *abrupt
				if drop {
					abrupts.Add(1)
				}
				t := time.AfterFunc(life, func() { s.close(drop) })
				<-s.done
				t.Stop()
			}()
		}
	}()
	et := em.openLoop(ctx, []string{name}, *emitRate, *duration, *workers)
	<-spawnDone

	// At the end of the stream: what the tool believes open against what the
	// server counts (racy by the joins and leaves in flight at that instant).
	openNow := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range append(churners[:len(churners):len(churners)], residents...) {
			if !s.closing.Load() {
				n++
			}
		}
		return n
	}
	believedAtEnd := openNow()
	serverAtEnd, err := probe()
	if err != nil {
		return err
	}
	wg.Wait() // every churning connection ends within max-life (+2 s for its close)
	time.Sleep(*settle)
	believedQuiet := openNow()
	serverQuiet, err := probe()
	if err != nil {
		return err
	}
	socketsQuiet := sockets()
	time.Sleep(200 * time.Millisecond) // let the last probe reach the residents
	closeAll(residents)
	time.Sleep(*settle)
	serverFinal, err := probe()
	if err != nil {
		return err
	}
	socketsAfter := sockets()
	client := meter.stop()
	server := sampler.stop()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("run cut short: %w", err)
	}

	// The last probe went out after the residents left; the others reached them.
	expected := append(append([]uint64(nil), et.expected[0]...), probeSeqs[:len(probeSeqs)-1]...)
	slices.Sort(expected)
	all := append(append([]uint64(nil), expected...), probeSeqs[len(probeSeqs)-1])
	ct := tally(churners, [][]uint64{all}, false)
	rt := tally(residents, [][]uint64{expected}, true)

	out := map[string]any{
		"scenario": "churn", "nodes": len(c.bases), "join_rate": *rate, "min_life_s": minLife.Seconds(), "max_life_s": maxLife.Seconds(),
		"emit_rate": *emitRate, "duration_s": duration.Seconds(), "payload_bytes": *payloadBytes,
		"joined": len(churners), "join_failed": failed.Load(), "join_skipped": skipped.Load(), "left_abruptly": abrupts.Load(),
		"churners": ct, "residents": rt, "emits": et,
		"open_at_end":       map[string]int{"tool": believedAtEnd, "server": serverAtEnd},
		"open_quiesced":     map[string]int{"tool": believedQuiet, "server": serverQuiet},
		"quiesced_mismatch": serverQuiet - believedQuiet, "leaked_after_all_closed": serverFinal, "client": client,
	}
	human := fmt.Sprintf("churn: %d joined (%d failed, %d skipped, %d left abruptly) at %.0f/s for %v while %.0f msgs/s streamed: lost while connected %d (%d conns), out of order %d, server closed %d; residents lost %d; open at end tool %d / server %d, quiesced tool %d / server %d, after all closed server %d",
		len(churners), failed.Load(), skipped.Load(), abrupts.Load(), *rate, *duration, *emitRate,
		ct.Lost, ct.SubsWithLoss, ct.OutOfOrder+rt.OutOfOrder, ct.ServerClosed+rt.ServerClosed, rt.Lost,
		believedAtEnd, serverAtEnd, believedQuiet, serverQuiet, serverFinal)
	if err := first.get(); err != nil {
		out["first_error"] = err.Error()
		human += fmt.Sprintf("; first join error: %v", err)
	}
	if c.measured() {
		out["server"] = server
		out["server_sockets"] = map[string]int{"before": socketsBefore, "residents_only": socketsQuiet, "after": socketsAfter}
		human += fmt.Sprintf("; server sockets %d before, %d with %d residents, %d after; %s",
			socketsBefore, socketsQuiet, believedQuiet, socketsAfter, server)
	}
	human += "; emits: " + et.String()
	human = usageNotes(out, human, &c, server, client, true, et, true, advice)
	report(out, human)
	return nil
}
