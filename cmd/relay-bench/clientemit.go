package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/relayhq/relay/api/backend"
)

// clientemit: client-emit ack latency, open loop. Each of -clients sockets
// subscribes with presence to a channel of its own under a clientId of its
// own (socket i through node i%nodes), then emits there at -rate a second,
// each emit answered by an ack or an error frame, in order. The latency is
// from the emit's frame written to its answer read. One JSON line.
//
// In a cluster a client emit passes the clientId's window (client-emit
// rule 6), which the project's grain counts for the whole cluster, on some
// node; then the channel's grain stamps it, on some node. So this measures
// what those cost beside an HTTP emit's path.
func runClientEmit(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("clientemit", flag.ExitOnError)
	c.register(fs)
	clients := fs.Int("clients", 20, "sockets, each its own clientId and channel")
	rate := fs.Float64("rate", 5, "emits per second of each socket (CLIENT_EMIT_RATE_LIMIT_PER_SECOND bounds it)")
	duration := fs.Duration("duration", 10*time.Second, "how long the sockets emit")
	stopProfile, err := c.begin(fs, args, cpuProfile(fs))
	if err != nil {
		return err
	}
	defer stopProfile()
	if *clients < 1 || *rate <= 0 || *duration <= 0 {
		return errors.New("want -clients ≥ 1, -rate > 0 and -duration > 0")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	p, api, err := provisionWith(ctx, &c, "clientemit")
	if err != nil {
		return err
	}
	status, out, err := api("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", map[string]any{})
	secret, _ := out["clientEmitSecret"].(string)
	if err != nil || status != http.StatusOK || secret == "" {
		return fmt.Errorf("client-emit secret: %d %v %v", status, out, err)
	}
	emitters := make([]*clientEmitter, *clients)
	for i := range emitters {
		if emitters[i], err = dialClientEmitter(ctx, wsURLFor(c.bases[i%len(c.bases)], p.PublicKey), p.ID, secret, i); err != nil {
			for _, e := range emitters[:i] {
				e.conn.Close()
			}
			return fmt.Errorf("socket %d: %w", i, err)
		}
	}
	sampler, meter := startSampler(c.serverPIDs, c.helperPIDs), startClientMeter()
	var wg sync.WaitGroup
	began := time.Now()
	every := time.Duration(float64(time.Second) / *rate)
	for i, e := range emitters {
		wg.Add(1)
		offset := every * time.Duration(i) / time.Duration(len(emitters)) // spread: not every socket at once
		go func() { defer wg.Done(); e.emitFor(ctx, offset, every, *duration) }()
	}
	wg.Wait()
	elapsed := time.Since(began)
	usage := sampler.stop()
	var hist mergedHist
	sent, acked, unanswered := 0, 0, 0
	refused := map[string]int{}
	for _, e := range emitters {
		e.conn.Close()
		<-e.done
		e.mu.Lock()
		hist.add(&e.hist)
		sent += e.sent
		acked += e.acked
		unanswered += len(e.pending)
		for code, n := range e.refused {
			refused[code] += n
		}
		e.mu.Unlock()
	}
	lat := hist.summary()
	line := map[string]any{
		"scenario": "clientemit", "nodes": len(c.bases), "clients": *clients, "rate_per_client": *rate,
		"seconds": elapsed.Seconds(), "sent": sent, "acked": acked, "refused": refused, "refused_total": sent - acked - unanswered, "unanswered": unanswered,
		"latency": lat, "server": usage,
	}
	human := fmt.Sprintf("clientemit over %d nodes: %d sockets at %s/s, %d sent, %d acked, %d refused, %d unanswered; ack latency %s",
		len(c.bases), *clients, fmtFloat(*rate), sent, acked, sent-acked-unanswered, unanswered, lat)
	report(line, usageNotes(line, human, &c, usage, meter.stop(), false, emitTotals{}, true, ""))
	return nil
}

// clientEmitter is one socket that emits, and what came back.
type clientEmitter struct {
	conn    net.Conn // written by emitFor alone, read by the reader
	channel string
	token   string
	done    chan struct{} // the reader has stopped

	mu      sync.Mutex
	pending []time.Time // emits unanswered, in the order sent
	sent    int
	acked   int
	refused map[string]int
	hist    latHist
}

func dialClientEmitter(ctx context.Context, wsURL, projectID, secret string, i int) (*clientEmitter, error) {
	conn, br, _, err := ws.Dialer{Timeout: 10 * time.Second}.Dial(ctx, wsURL)
	if err != nil {
		return nil, err
	}
	if br != nil {
		ws.PutReader(br) // the server sends nothing before the subscribe
	}
	clientID, channel := fmt.Sprintf("bench-%d", i), fmt.Sprintf("ce-%d", i)
	token, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: projectID, Channel: channel,
		ClientID: clientID, Types: []string{"msg"}, TTL: 10 * time.Minute})
	if err != nil {
		conn.Close()
		return nil, err
	}
	e := &clientEmitter{conn: conn, channel: channel, token: token, done: make(chan struct{}), refused: map[string]int{}}
	sub := fmt.Appendf(nil, `{"action":"subscribe","channel":%q,"presence":true,"clientId":%q}`, channel, clientID)
	if err := wsutil.WriteClientText(conn, sub); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		msg, err := wsutil.ReadServerText(conn)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("waiting for the subscribe ack: %w", err)
		}
		if bytes.Contains(msg, []byte(`"error"`)) {
			conn.Close()
			return nil, fmt.Errorf("subscribe refused: %s", msg)
		}
		if bytes.Contains(msg, []byte(`"action":"subscribe"`)) {
			break
		}
	}
	conn.SetReadDeadline(time.Time{})
	go func() {
		defer close(e.done)
		for {
			msg, err := wsutil.ReadServerText(conn)
			if err != nil {
				return
			}
			e.answer(msg, time.Now())
		}
	}()
	return e, nil
}

// answer matches an emit's answer to the oldest emit unanswered (a
// socket's emits are answered in order); other frames (presence) pass.
func (e *clientEmitter) answer(msg []byte, at time.Time) {
	var f struct {
		Action string `json:"action"`
		OK     bool   `json:"ok"`
		Error  string `json:"error"`
		Event  string `json:"event"`
	}
	if json.Unmarshal(msg, &f) != nil || (f.Error == "" && !(f.Action == "emit" && f.OK)) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.pending) == 0 {
		return
	}
	sentAt := e.pending[0]
	e.pending = e.pending[1:]
	if f.Error != "" {
		e.refused[f.Error]++
		return
	}
	e.acked++
	e.hist.record(uint64(at.Sub(sentAt).Microseconds()))
}

// emitFor emits every every for d, beginning after offset.
func (e *clientEmitter) emitFor(ctx context.Context, offset, every, d time.Duration) {
	time.Sleep(offset)
	t := time.NewTicker(every)
	defer t.Stop()
	end := time.After(d)
	for {
		select {
		case <-ctx.Done():
			return
		case <-end:
			time.Sleep(time.Second) // the last answers
			return
		case <-t.C:
		}
		frame := fmt.Appendf(nil, `{"action":"emit","channel":%q,"type":"msg","payload":{"n":%d},"token":%q}`, e.channel, e.sent, e.token)
		e.mu.Lock()
		e.pending = append(e.pending, time.Now())
		e.sent++
		e.mu.Unlock()
		if err := wsutil.WriteClientText(e.conn, frame); err != nil {
			return
		}
	}
}
