package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// emitClient posts to /emit. The payload is {"t":<send time, unix
// ns>,"pad":"xx…"}, sized to -payload-bytes, so that subscribers measure
// end-to-end latency from it. Each worker has its own keep-alive connection
// (emitConn) speaking just enough HTTP/1.1 for this one request: net/http's
// client costs tens of microseconds of CPU per request on this kind of
// machine, which would make the tool compete with the server it measures.
type emitClient struct {
	url      string
	hostport string // to dial
	head     []byte // the request up to the Content-Length value
	pad      string
	auth     string
	hc       *http.Client // the preflight only
}

func newEmitClient(base, secretKey string, workers, payloadBytes int) *emitClient {
	u, _ := url.Parse(base) // checkLoopback parsed it already
	port := u.Port()
	if port == "" {
		port = "80"
	}
	path := strings.TrimRight(u.Path, "/") + "/emit"
	head := "POST " + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: relay-bench\r\n" +
		"Authorization: Bearer " + secretKey + "\r\nContent-Type: application/json\r\nContent-Length: "
	// {"t":1234567890123456789,"pad":""} is 34 bytes.
	return &emitClient{
		url:      strings.TrimRight(base, "/") + "/emit",
		hostport: net.JoinHostPort(u.Hostname(), port),
		head:     []byte(head),
		pad:      strings.Repeat("x", max(payloadBytes-34, 0)),
		auth:     "Bearer " + secretKey,
		hc:       &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}},
	}
}

func (e *emitClient) closeIdle() { e.hc.CloseIdleConnections() }

// emitReply is what the hot path scans out of a response.
type emitReply struct {
	status int
	seq    uint64
	hasSeq bool
	subs   int
	code   string // the error code of a non-200
}

func (e *emitClient) body(dst []byte, channel string, t int64) []byte {
	dst = append(dst, `{"channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","payload":{"t":`...)
	dst = strconv.AppendInt(dst, t, 10)
	dst = append(dst, `,"pad":"`...)
	dst = append(dst, e.pad...)
	return append(dst, `"}}`...)
}

// emitConn is one worker's keep-alive connection. Not safe for concurrent use.
type emitConn struct {
	e    *emitClient
	c    net.Conn
	br   *bufio.Reader
	last time.Time
	req  []byte
	body []byte
	resp []byte
}

func (e *emitClient) newConn() *emitConn { return &emitConn{e: e} }

func (w *emitConn) close() {
	if w.c != nil {
		w.c.Close()
		w.c, w.br = nil, nil
	}
}

// idleRedial: a connection idle longer than this may have been closed by
// the server; it is replaced rather than risked (an emit is not idempotent).
const idleRedial = 5 * time.Second

var errProtocol = errors.New("malformed HTTP response")

// emit posts one message and scans the answer. On any error the connection
// is dropped; the next emit dials a new one.
func (w *emitConn) emit(ctx context.Context, channel string, t int64) (emitReply, error) {
	if err := ctx.Err(); err != nil {
		return emitReply{}, err
	}
	if w.c != nil && time.Since(w.last) > idleRedial {
		w.close()
	}
	if w.c == nil {
		c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", w.e.hostport)
		if err != nil {
			return emitReply{}, err
		}
		w.c, w.br = c, bufio.NewReaderSize(c, 4096)
	}
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	w.c.SetDeadline(deadline)
	w.body = w.e.body(w.body[:0], channel, t)
	w.req = append(w.req[:0], w.e.head...)
	w.req = strconv.AppendInt(w.req, int64(len(w.body)), 10)
	w.req = append(w.req, "\r\n\r\n"...)
	w.req = append(w.req, w.body...)
	r, err := w.roundTrip()
	w.last = time.Now()
	if err != nil {
		w.close()
	}
	return r, err
}

func (w *emitConn) roundTrip() (emitReply, error) {
	if _, err := w.c.Write(w.req); err != nil {
		return emitReply{}, err
	}
	line, err := w.br.ReadSlice('\n')
	if err != nil {
		return emitReply{}, err
	}
	// HTTP/1.1 200 OK
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return emitReply{}, errProtocol
	}
	code, ok := scanUint(line, 9)
	if !ok {
		return emitReply{}, errProtocol
	}
	r := emitReply{status: int(code)}
	length, chunked, closeAfter := -1, false, false
	for {
		line, err := w.br.ReadSlice('\n')
		if err != nil {
			return r, err
		}
		if len(line) <= 2 { // the blank line
			break
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case asciiEqualFold(name, "content-length"):
			v, ok := scanUint(value, 0)
			if !ok || v > maxFrameBytes {
				return r, errProtocol
			}
			length = int(v)
		case asciiEqualFold(name, "transfer-encoding"):
			chunked = asciiEqualFold(value, "chunked")
		case asciiEqualFold(name, "connection"):
			closeAfter = asciiEqualFold(value, "close")
		}
	}
	w.resp = w.resp[:0]
	switch {
	case chunked:
		for {
			line, err := w.br.ReadSlice('\n')
			if err != nil {
				return r, err
			}
			size, err := strconv.ParseUint(string(bytes.TrimSpace(bytes.SplitN(line, []byte(";"), 2)[0])), 16, 32)
			if err != nil || size > maxFrameBytes {
				return r, errProtocol
			}
			if size == 0 {
				for { // trailers up to the blank line
					if line, err = w.br.ReadSlice('\n'); err != nil || len(line) <= 2 {
						break
					}
				}
				if err != nil {
					return r, err
				}
				break
			}
			if err := w.readN(int(size)); err != nil {
				return r, err
			}
			if _, err := w.br.Discard(2); err != nil {
				return r, err
			}
		}
	case length >= 0:
		if err := w.readN(length); err != nil {
			return r, err
		}
	default: // until the server closes
		b, err := io.ReadAll(io.LimitReader(w.br, maxFrameBytes))
		if err != nil {
			return r, err
		}
		w.resp = append(w.resp, b...)
		closeAfter = true
	}
	if closeAfter {
		w.close()
	}
	scanReply(&r, w.resp)
	return r, nil
}

func (w *emitConn) readN(n int) error {
	start := len(w.resp)
	w.resp = slices.Grow(w.resp, n)[:start+n]
	_, err := io.ReadFull(w.br, w.resp[start:])
	return err
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

var (
	subsKey  = []byte(`"subscriberCount":`)
	errorKey = []byte(`"error":"`)
)

// scanReply reads seq and subscriberCount of a 200, the error code otherwise.
func scanReply(r *emitReply, b []byte) {
	if r.status == http.StatusOK {
		if i := bytes.Index(b, seqKey); i >= 0 {
			r.seq, r.hasSeq = scanUint(b, i+len(seqKey))
		}
		if i := bytes.Index(b, subsKey); i >= 0 {
			n, _ := scanUint(b, i+len(subsKey))
			r.subs = int(n)
		}
	} else if i := bytes.Index(b, errorKey); i >= 0 {
		rest := b[i+len(errorKey):]
		if j := bytes.IndexByte(rest, '"'); j >= 0 {
			r.code = string(rest[:j])
		}
	}
}

// budgets are the server's emit budgets per minute, from an emit response.
type budgets struct{ Channel, Project int }

// preflight emits once to a channel of its own and reads the budgets.
func (e *emitClient) preflight(ctx context.Context) (budgets, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(e.body(nil, "bench-preflight", time.Now().UnixNano())))
	req.Header.Set("Authorization", e.auth)
	req.Header.Set("Content-Type", "application/json")
	res, err := e.hc.Do(req)
	if err != nil {
		return budgets{}, err
	}
	defer res.Body.Close()
	var out struct {
		Error     string `json:"error"`
		RateLimit struct {
			Limit int `json:"limit"`
		} `json:"rate_limit"`
		ProjectRateLimit struct {
			Limit int `json:"limit"`
		} `json:"project_rate_limit"`
	}
	json.NewDecoder(res.Body).Decode(&out)
	defer e.hc.CloseIdleConnections()
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusTooManyRequests {
		return budgets{}, fmt.Errorf("preflight emit: %d %s", res.StatusCode, out.Error)
	}
	return budgets{out.RateLimit.Limit, out.ProjectRateLimit.Limit}, nil
}

// emitStats is one worker's tally; merge adds them up.
type emitStats struct {
	sent, ok         int64
	limitedChan      int64
	limitedProj      int64
	status           map[int]int64 // non-200 statuses, 429 included
	errs             int64
	firstErr         string
	http             latHist // request latency
	lag              latHist // open loop: how late the request started against its schedule
	seqs             [][]uint64
	minSubs, maxSubs int
	dropped          int64 // open loop: the backlog was full, not sent
}

func newEmitStats(channels int) *emitStats {
	return &emitStats{status: map[int]int64{}, seqs: make([][]uint64, channels), minSubs: -1}
}

func (s *emitStats) record(r emitReply, err error, ch int, took time.Duration) {
	s.sent++
	s.http.record(uint64(took.Microseconds()))
	switch {
	case err != nil:
		s.errs++
		if s.firstErr == "" {
			s.firstErr = err.Error()
		}
	case r.status == http.StatusOK:
		s.ok++
		if r.hasSeq {
			s.seqs[ch] = append(s.seqs[ch], r.seq)
		}
		if s.minSubs < 0 || r.subs < s.minSubs {
			s.minSubs = r.subs
		}
		s.maxSubs = max(s.maxSubs, r.subs)
	default:
		s.status[r.status]++
		switch r.code {
		case "channel_rate_limited":
			s.limitedChan++
		case "project_rate_limited":
			s.limitedProj++
		}
	}
}

// emitTotals is the JSON shape of an emitter's run.
type emitTotals struct {
	Scheduled     int64            `json:"scheduled,omitempty"`
	Sent          int64            `json:"sent"`
	OK            int64            `json:"ok"`
	PerSec        float64          `json:"ok_per_sec"`
	Refused429    int64            `json:"refused_429"`
	RefusedChan   int64            `json:"refused_channel_rate_limited"`
	RefusedProj   int64            `json:"refused_project_rate_limited"`
	Non200        map[string]int64 `json:"non_200,omitempty"`
	Failed        int64            `json:"failed"` // transport errors and timeouts
	FirstError    string           `json:"first_error,omitempty"`
	Dropped       int64            `json:"not_sent_backlog_full,omitempty"`
	Latency       latSummary       `json:"http_latency"`
	Lag           *latSummary      `json:"schedule_lag,omitempty"`
	SubsCountMin  int              `json:"subscriber_count_min"`
	SubsCountMax  int              `json:"subscriber_count_max"`
	Seconds       float64          `json:"seconds"`
	Workers       int              `json:"workers"`
	MaxBusy       int              `json:"max_busy_workers,omitempty"` // open loop: most requests in flight at once
	expected      [][]uint64       // per channel, sorted
	http, lagHist mergedHist
}

func mergeEmitStats(all []*emitStats, channels int, elapsed time.Duration, openLoop bool) emitTotals {
	t := emitTotals{Non200: map[string]int64{}, expected: make([][]uint64, channels), SubsCountMin: -1, Seconds: elapsed.Seconds()}
	for _, s := range all {
		t.Sent += s.sent
		t.OK += s.ok
		t.RefusedChan += s.limitedChan
		t.RefusedProj += s.limitedProj
		t.Refused429 += s.status[http.StatusTooManyRequests]
		for code, n := range s.status {
			t.Non200[strconv.Itoa(code)] += n
		}
		t.Failed += s.errs
		if t.FirstError == "" {
			t.FirstError = s.firstErr
		}
		t.Dropped += s.dropped
		t.http.add(&s.http)
		t.lagHist.add(&s.lag)
		for c := range s.seqs {
			t.expected[c] = append(t.expected[c], s.seqs[c]...)
		}
		if s.minSubs >= 0 && (t.SubsCountMin < 0 || s.minSubs < t.SubsCountMin) {
			t.SubsCountMin = s.minSubs
		}
		t.SubsCountMax = max(t.SubsCountMax, s.maxSubs)
	}
	for _, e := range t.expected {
		slices.Sort(e)
	}
	t.SubsCountMin = max(t.SubsCountMin, 0)
	t.PerSec = float64(t.OK) / elapsed.Seconds()
	t.Latency = t.http.summary()
	if openLoop {
		l := t.lagHist.summary()
		t.Lag = &l
	}
	return t
}

// emitters posts through every node of a relay, one emitClient each. In an
// open loop emit i goes through node i%N (round robin) or, with byChannel,
// every emit to channel c through node c%N, so that each subscriber's
// messages take one known path (fanout -via channel); in a closed loop
// worker w stays on node w%N.
type emitters struct {
	nodes     []*emitClient
	byChannel bool
}

func newEmitters(bases []string, secretKey string, workers, payloadBytes int) *emitters {
	e := &emitters{}
	for _, b := range bases {
		e.nodes = append(e.nodes, newEmitClient(b, secretKey, workers, payloadBytes))
	}
	return e
}

func (e *emitters) closeIdle() {
	for _, n := range e.nodes {
		n.closeIdle()
	}
}

// newConn is a connection to the first node (a probe's).
func (e *emitters) newConn() *emitConn { return e.nodes[0].newConn() }

// warmup emits once to each channel through each node, 8 at a time: the
// channels' actors (grains, in a cluster) start and every node has the
// project's keys before a measured run.
func (e *emitters) warmup(ctx context.Context, channels []string) error {
	type job struct{ node, ch int }
	jobs := make(chan job)
	var first firstErr
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns := make([]*emitConn, len(e.nodes))
			for k, n := range e.nodes {
				conns[k] = n.newConn()
				defer conns[k].close()
			}
			for j := range jobs {
				r, err := conns[j.node].emit(ctx, channels[j.ch], time.Now().UnixNano())
				if err == nil && r.status != http.StatusOK {
					err = fmt.Errorf("warm-up emit to %s through node %d: %d %s", channels[j.ch], j.node, r.status, r.code)
				}
				if err != nil {
					first.set(err)
				}
			}
		}()
	}
	for ch := range channels {
		for node := range e.nodes {
			jobs <- job{node, ch}
		}
	}
	close(jobs)
	wg.Wait()
	return first.get()
}

func (e *emitters) via(i, ch int) int {
	if e.byChannel {
		return ch % len(e.nodes)
	}
	return i % len(e.nodes)
}

// openLoop emits rate messages per second for d, round robin over channels,
// from a schedule that does not wait for answers: workers take the scheduled
// emits as they come due. Each payload carries the time its request started;
// how late that was against the schedule (timer granularity, or every worker
// waiting on the server) is reported apart as schedule_lag, so a reader sees
// when the emitter fell behind. If every worker is busy and the backlog is
// full, an emit is dropped and counted.
func (e *emitters) openLoop(ctx context.Context, channels []string, rate float64, d time.Duration, workers int) emitTotals {
	type job struct {
		i   int
		due time.Time
	}
	total := int64(rate * d.Seconds())
	jobs := make(chan job, min(max(int(rate), 1024), 1<<16))
	all := make([]*emitStats, workers)
	var wg sync.WaitGroup
	var busy, maxBusy atomic.Int64
	for w := range all {
		st := newEmitStats(len(channels))
		all[w] = st
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns := make([]*emitConn, len(e.nodes)) // one keep-alive connection per node
			for k, n := range e.nodes {
				conns[k] = n.newConn()
				defer conns[k].close()
			}
			for j := range jobs {
				if b := busy.Add(1); b > maxBusy.Load() {
					maxBusy.Store(b) // racy max: good enough to tell "all busy"
				}
				start := time.Now()
				st.lag.record(uint64(max(start.Sub(j.due), 0).Microseconds()))
				ch := j.i % len(channels)
				r, err := conns[e.via(j.i, ch)].emit(ctx, channels[ch], start.UnixNano())
				st.record(r, err, ch, time.Since(start))
				busy.Add(-1)
			}
		}()
	}
	start := time.Now()
	interval := float64(time.Second) / rate
	timer := time.NewTimer(time.Hour)
	var dropped int64
schedule:
	for i := int64(0); i < total; i++ {
		due := start.Add(time.Duration(float64(i) * interval))
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break schedule
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			break
		}
		select {
		case jobs <- job{int(i), due}:
		default:
			dropped++
		}
	}
	timer.Stop()
	close(jobs)
	wg.Wait()
	t := mergeEmitStats(all, len(channels), min(time.Since(start), max(d, time.Millisecond)), true)
	t.Scheduled = total
	t.Dropped += dropped
	t.Workers, t.MaxBusy = workers, int(maxBusy.Load())
	return t
}

// closedLoop has each worker emit back to back until d has passed, worker w
// through node w%N.
func (e *emitters) closedLoop(ctx context.Context, channels []string, d time.Duration, workers int) emitTotals {
	all := make([]*emitStats, workers)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range all {
		st := newEmitStats(len(channels))
		all[w] = st
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := e.nodes[w%len(e.nodes)].newConn()
			defer conn.close()
			for i := w; ctx.Err() == nil; i += workers {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				ch := i % len(channels)
				r, err := conn.emit(ctx, channels[ch], t0.UnixNano())
				st.record(r, err, ch, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	t := mergeEmitStats(all, len(channels), time.Since(start), false)
	t.Workers = workers
	return t
}

func (t emitTotals) String() string {
	s := fmt.Sprintf("%d emits ok (%.0f/s), HTTP %s", t.OK, t.PerSec, t.Latency)
	if t.Refused429 > 0 {
		s += fmt.Sprintf(", %d refused 429 (%d channel, %d project budget)", t.Refused429, t.RefusedChan, t.RefusedProj)
	}
	if n := t.Sent - t.OK - t.Refused429 - t.Failed; n > 0 {
		s += fmt.Sprintf(", %d other non-200 %v", n, t.Non200)
	}
	if t.Failed > 0 {
		s += fmt.Sprintf(", %d failed (%s)", t.Failed, t.FirstError)
	}
	if t.Dropped > 0 {
		s += fmt.Sprintf(", %d not sent (every worker busy)", t.Dropped)
	}
	return s
}

// emitterBehind says when an open-loop emitter did not keep its schedule:
// the offered rate was then lower than asked.
func emitterBehind(t emitTotals) string {
	if t.Lag == nil || (t.Dropped == 0 && t.Lag.P99 < 10) {
		return ""
	}
	why := fmt.Sprintf("at most %d of %d workers were busy, so requests started late because the machine was short of CPU (the tool's goroutines waited to run)", t.MaxBusy, t.Workers)
	if t.MaxBusy >= t.Workers {
		why = "every worker was waiting on the server: raise -workers, or the server's emit latency is the limit"
	}
	return fmt.Sprintf("the emitter fell behind its schedule (lag p99 %s, %d not sent): %s", fmtMS(t.Lag.P99), t.Dropped, why)
}
