package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/relayhq/relay/api/backend"
)

// conns opens N idle subscribed connections from several loopback source
// addresses, then reports handshakes per second and the server's resident
// memory per connection once they sit idle. With several nodes (-base a,b,c)
// the connections are spread over them (each channel's round robin) and the
// memory is reported per node too: the RSS each node grew by, over the
// connections it holds.
func runConns(ctx context.Context, args []string) error {
	var c common
	fs := flag.NewFlagSet("conns", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 10000, "connections to open (the machine's fd limit is per process)")
	channels := fs.Int("channels", 100, "channels the connections subscribe to, round robin")
	parallel := fs.Int("parallel", 64, "handshakes in flight")
	sources := fs.Int("sources", 4, "loopback source addresses 127.0.0.2… to spread ports over")
	settle := fs.Duration("settle", 3*time.Second, "idle time before measuring")
	withToken := fs.Bool("token", false, "turn channel authorization on for the project and open each connection with its own HS256 connection token (minted before the clock starts)")
	tokenJWKS := fs.Bool("token-jwks", false, "with -token: sign the tokens RS256 with a key of a JWKS this tool serves on loopback (the project's jwksUrl; the relay needs WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true to fetch it), so that each handshake verifies through the relay's JWKS cache")
	warmup := fs.Int("warmup", 0, "connections (of -n) opened before the first memory reading, so that what the first subscribers start once (each channel's actors; in a cluster each channel's grain and the links between nodes) is not counted per connection")
	debugList := fs.String("debug", "", "the nodes' operator listeners (http://127.0.0.1:PORT, comma-separated, in -base's order): before each memory reading each node is asked for a garbage collection (GET /debug/pprof/heap?gc=1), so that neither reading holds garbage of what came before (the sign-up's password hash, the handshakes), and its live heap is reported too")
	fs.Parse(args)
	if err := c.parse(); err != nil {
		return err
	}
	var debugs []string
	if *debugList != "" {
		var err error
		if debugs, err = loopbackURLs(*debugList); err != nil {
			return fmt.Errorf("-debug: %w", err)
		}
		if len(debugs) != len(c.bases) || !c.measured() {
			return fmt.Errorf("-debug names %d listeners for %d nodes (and wants -server-pid)", len(debugs), len(c.bases))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	p, api, err := provisionWith(ctx, &c, "bench-conns")
	if err != nil {
		return err
	}
	wsURLs := wsURLsFor(c.bases, p.PublicKey)
	var tokens []string // with -token, connection i's
	switch {
	case *withToken && *tokenJWKS:
		if tokens, err = jwksConnectionTokens(ctx, api, p.ID, *n); err != nil {
			return err
		}
	case *withToken:
		if tokens, err = connectionTokens(api, p.ID, *n); err != nil {
			return err
		}
	case *tokenJWKS:
		return fmt.Errorf("-token-jwks needs -token")
	}
	conns := make([]net.Conn, *n)
	perNode := make([]atomic.Int64, len(c.bases))
	var next, failed atomic.Int64
	var firstErr atomic.Value
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close()
			}
		}
	}()
	// dialUpTo dials connections next… up to end, parallel at a time.
	dialUpTo := func(end int) {
		var wg sync.WaitGroup
		for w := 0; w < *parallel; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= end || ctx.Err() != nil {
						next.Add(-1) // stay at end for the next open
						return
					}
					dialOne(ctx, i, *channels, *sources, wsURLs, tokens, conns, perNode, &failed, &firstErr)
				}
			}()
		}
		wg.Wait()
	}
	*warmup = min(max(*warmup, 0), *n)
	dialUpTo(*warmup)
	warmNodes := make([]int64, len(perNode))
	for i := range perNode {
		warmNodes[i] = perNode[i].Load()
	}
	warmFailed := failed.Load()
	// The server's RSS drifts for a while after start (the startup garbage
	// is returned to the kernel gradually), so each reading waits for it to
	// settle.
	var before []procStats
	var heapBefore []memStats
	if c.measured() {
		if heapBefore, err = collectGarbage(ctx, debugs); err != nil {
			return err
		}
		if before, err = settledAll(ctx, c.serverPIDs); err != nil {
			return err
		}
	}
	start := time.Now()
	dialUpTo(*n)
	elapsed := time.Since(start)
	open := int64(*n-*warmup) - (failed.Load() - warmFailed) // opened after the first reading, the ones measured
	for i := range perNode {
		perNode[i].Add(-warmNodes[i]) // per node too: what it took after the first reading
	}
	select {
	case <-time.After(*settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	out := map[string]any{
		"scenario": "conns", "nodes": len(c.bases), "connections": open, "warmup": *warmup, "failed": failed.Load(),
		"handshakes_per_sec": float64(open) / elapsed.Seconds(), "client": selfProc(),
	}
	human := fmt.Sprintf("conns: %d open (%d failed) in %v after %d to warm up, %.0f handshakes/s", open, failed.Load(), elapsed.Round(time.Millisecond), *warmup, float64(open)/elapsed.Seconds())
	heapNote := ""
	if c.measured() {
		heapAfter, err := collectGarbage(ctx, debugs)
		if err != nil {
			return err
		}
		afterAll, err := settledAll(ctx, c.serverPIDs)
		if err != nil {
			return err
		}
		if heapAfter != nil {
			var grew, stacks int64
			for i := range heapAfter {
				grew += heapAfter[i].HeapAlloc - heapBefore[i].HeapAlloc
				stacks += heapAfter[i].StackInuse - heapBefore[i].StackInuse
			}
			perConn := float64(grew) / float64(max(open, 1))
			out["server_memstats_before"], out["server_memstats_after"], out["server_heap_bytes_per_conn"] = heapBefore, heapAfter, perConn
			heapNote = fmt.Sprintf("; both readings after a forced GC: live heap %.2f KiB per connection, goroutine stacks %+.2f KiB", perConn/1024, float64(stacks)/float64(max(open, 1))/1024)
		}
		var b, a procStats
		var nodes []map[string]any
		maxPerConn := 0.0
		for i := range afterAll {
			b.RSSKiB += before[i].RSSKiB
			b.CPUSeconds += before[i].CPUSeconds
			a.RSSKiB += afterAll[i].RSSKiB
			a.CPUSeconds += afterAll[i].CPUSeconds
			held := perNode[i].Load()
			pc := float64(afterAll[i].RSSKiB-before[i].RSSKiB) * 1024 / float64(max(held, 1))
			maxPerConn = max(maxPerConn, pc)
			nd := map[string]any{"pid": c.serverPIDs[i], "connections": held,
				"server_before": before[i], "server_after": afterAll[i], "server_rss_bytes_per_conn": pc}
			if heapAfter != nil {
				nd["server_heap_bytes_per_conn"] = float64(heapAfter[i].HeapAlloc-heapBefore[i].HeapAlloc) / float64(max(held, 1))
			}
			nodes = append(nodes, nd)
		}
		perConn := float64(a.RSSKiB-b.RSSKiB) * 1024 / float64(max(open, 1))
		out["server_before"], out["server_after"], out["server_rss_bytes_per_conn"] = b, a, perConn
		human += fmt.Sprintf("; server RSS %d → %d KiB, %.2f KiB per connection; server CPU %.2fs",
			b.RSSKiB, a.RSSKiB, perConn/1024, a.CPUSeconds-b.CPUSeconds)
		if len(nodes) > 1 {
			out["per_node"], out["server_rss_bytes_per_conn_max_node"] = nodes, maxPerConn
			human += fmt.Sprintf(" (%d nodes, summed; per node", len(nodes))
			for _, nd := range nodes {
				human += fmt.Sprintf(" %.2f", nd["server_rss_bytes_per_conn"].(float64)/1024)
			}
			human += " KiB per connection it holds)"
		}
		human += heapNote
	}
	if v := firstErr.Load(); v != nil {
		out["first_error"] = fmt.Sprint(v)
	}
	report(out, human)
	return nil
}

// readerConn reads through r (the dialer's buffered reader) and writes to the conn.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// memStats is what a node's heap profile says of its memory (the Go
// runtime's MemStats, bytes) and its goroutine count.
type memStats struct {
	HeapAlloc    int64 `json:"heap_alloc"`
	HeapInuse    int64 `json:"heap_inuse"`
	HeapIdle     int64 `json:"heap_idle"`
	HeapReleased int64 `json:"heap_released"`
	StackInuse   int64 `json:"stack_inuse"`
	Sys          int64 `json:"sys"`
	Goroutines   int64 `json:"goroutines"`
}

// collectGarbage asks each node's operator listener for a garbage collection
// (net/http/pprof's heap profile with gc=1) and returns each one's memory
// right after it (the profile's runtime.MemStats; HeapAlloc is then the live
// heap). Nothing to do without listeners.
func collectGarbage(ctx context.Context, debugs []string) ([]memStats, error) {
	if len(debugs) == 0 {
		return nil, nil
	}
	out := make([]memStats, len(debugs))
	get := func(url string, line func(string)) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, res.Status)
		}
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line(sc.Text())
		}
		return sc.Err()
	}
	for i, d := range debugs {
		m := &out[i]
		fields := map[string]*int64{"# HeapAlloc = ": &m.HeapAlloc, "# HeapInuse = ": &m.HeapInuse, "# HeapIdle = ": &m.HeapIdle,
			"# HeapReleased = ": &m.HeapReleased, "# Stack = ": &m.StackInuse, "# Sys = ": &m.Sys}
		// Twice, a second apart: the runtime returns freed memory to the
		// kernel only once it has stayed free through a whole GC cycle.
		if err := get(d+"/debug/pprof/heap?gc=1", func(string) {}); err != nil {
			return nil, err
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		err := get(d+"/debug/pprof/heap?gc=1&debug=1", func(line string) {
			for prefix, p := range fields {
				if v, ok := strings.CutPrefix(line, prefix); ok {
					v, _, _ = strings.Cut(v, " ") // "# Stack = inuse / sys"
					*p, _ = strconv.ParseInt(v, 10, 64)
				}
			}
		})
		if err == nil && m.HeapAlloc == 0 {
			err = fmt.Errorf("%s/debug/pprof/heap: no HeapAlloc", d)
		}
		if err == nil {
			err = get(d+"/debug/pprof/goroutine?debug=1", func(line string) {
				if v, ok := strings.CutPrefix(line, "goroutine profile: total "); ok {
					m.Goroutines, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				}
			})
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// settledAll is settledProc of each process, at the same time.
func settledAll(ctx context.Context, pids []int) ([]procStats, error) {
	out := make([]procStats, len(pids))
	errs := make([]error, len(pids))
	var wg sync.WaitGroup
	for i, pid := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = settledProc(ctx, pid)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// settledProc reads a process's RSS once it has stopped moving: three
// readings a second apart each within 1 % (or 256 KiB) of the one before, for
// at most 30 s. (After a garbage collection the runtime returns the freed
// memory to the kernel within a second or two, after a pause: two readings
// could both fall in the pause.)
func settledProc(ctx context.Context, pid int) (procStats, error) {
	prev, err := readProc(pid)
	if err != nil {
		return prev, err
	}
	stable := 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return prev, ctx.Err()
		}
		cur, err := readProc(pid)
		if err != nil {
			return cur, err
		}
		if d := cur.RSSKiB - prev.RSSKiB; max(d, -d) <= max(256, prev.RSSKiB/100) {
			if stable++; stable == 2 {
				return cur, nil
			}
		} else {
			stable = 0
		}
		prev = cur
	}
	return prev, nil
}

// dialOne opens connection i (from a loopback source address, to its
// channel's node) and subscribes it, counting it on its node or as failed.
func dialOne(ctx context.Context, i, channels, sources int, wsURLs, tokens []string, conns []net.Conn, perNode []atomic.Int64,
	failed *atomic.Int64, firstErr *atomic.Value) {
	src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%sources))}
	d := ws.Dialer{Timeout: 10 * time.Second, NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return (&net.Dialer{LocalAddr: src}).DialContext(ctx, network, addr)
	}}
	node := spread(i%channels, i/channels, len(wsURLs))
	u := wsURLs[node]
	if tokens != nil {
		u += "&token=" + tokens[i]
	}
	conn, br, _, err := d.Dial(ctx, u)
	if err == nil {
		ch := fmt.Sprintf("bench-%d", i%channels)
		err = wsutil.WriteClientText(conn, []byte(`{"action":"subscribe","channel":"`+ch+`"}`))
		if err == nil {
			var r io.Reader = conn
			if br != nil {
				r = br
			}
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = wsutil.ReadServerText(readerConn{conn, r}) // the ack
			conn.SetReadDeadline(time.Time{})
		}
	}
	if err != nil {
		failed.Add(1)
		firstErr.CompareAndSwap(nil, err)
		if conn != nil {
			conn.Close()
		}
		return
	}
	conns[i] = conn
	perNode[node].Add(1)
}

// connectionTokens turns channel authorization on for project id and mints
// n connection tokens (one user each, an hour long) with its secret.
func connectionTokens(api apiCall, id string, n int) ([]string, error) {
	status, out, err := api("PATCH", "/api/projects/"+id+"/authorization", map[string]bool{"authorization": true})
	secret, _ := out["secret"].(string)
	if err != nil || status != http.StatusOK || secret == "" {
		return nil, fmt.Errorf("turn channel authorization on: %d %v %v", status, out, err)
	}
	tokens := make([]string, n)
	for i := range tokens {
		if tokens[i], err = backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: secret, UserID: fmt.Sprint("bench-", i), TTL: time.Hour}); err != nil {
			return nil, err
		}
	}
	return tokens, nil
}
