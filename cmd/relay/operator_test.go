package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestOperatorEndpointsDuringTraffic(t *testing.T) {
	t.Parallel()
	// The clock stands still: the channel budget's minute window stays whole.
	ts := debugServerAt(t, map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "2"}, newClock().Now)
	debug := ts.Debug
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	owner.CreateProject("idle") // no traffic: no actor
	subs := []*wsClient{ts.Subscribed(t, p.PublicKey, "a"), ts.Subscribed(t, p.PublicKey, "a")}
	x := ts.PresenceSub(t, p.PublicKey, "a", "x")
	x.Expect(`{"type":"presence","channel":"a","event":"sync","members":[]}`)
	var seq int64
	for range 2 {
		r := owner.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
		seq = int64(relaytest.Num(r.JSON, "seq"))
	}
	if r := owner.Emit(p.SecretKey, `{"channel":"a","payload":1}`); r.Status != 429 {
		t.Fatalf("third emit: %s", r.Raw)
	}
	late := ts.DialWS(p.PublicKey)
	late.Send(`{"action":"subscribe","channel":"b","since":1}`) // a gap: nothing of b is known
	late.Expect(`{"type":"replay_gap","channel":"b","since":1}`)
	if _, status, _ := ts.TryDialWS("pk_live_unknown"); status != 401 {
		t.Fatal("unknown key accepted")
	}
	for _, s := range append(subs, x) {
		s.ExpectExcept(`{"channel":"a","payload":1}`, "seq")
		s.ExpectExcept(`{"channel":"a","payload":1}`, "seq")
	}

	// /debug/actors: the project, then its channel.
	status, body := relaytest.GetText(t, debug+"/debug/actors")
	var v struct {
		Projects []struct {
			ID          string `json:"id"`
			Connections int    `json:"connections"`
			Channels    int    `json:"channels"`
			ChannelList []struct {
				Name            string   `json:"name"`
				Seq             int64    `json:"seq"`
				Subscribers     int      `json:"subscribers"`
				PresenceMembers []string `json:"presenceMembers"`
				ReplayLength    int      `json:"replayLength"`
				ReplayBytes     int      `json:"replayBytes"`
				ChannelBudget   struct{ Limit, Remaining int }
			} `json:"channelList"`
		} `json:"projects"`
		ProjectsMatching int `json:"projectsMatching"`
		Transport        struct{ Open int }
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || status != 200 {
		t.Fatalf("/debug/actors: %d %s", status, body)
	}
	if v.ProjectsMatching != 1 || v.Projects[0].ID != p.ID || v.Projects[0].Connections != 4 || v.Projects[0].Channels != 2 || v.Transport.Open != 4 {
		t.Fatalf("/debug/actors: %s", body)
	}
	status, body = relaytest.GetText(t, debug+"/debug/actors?project="+p.ID+"&channel=a")
	if err := json.Unmarshal([]byte(body), &v); err != nil || status != 200 || len(v.Projects) != 1 || len(v.Projects[0].ChannelList) != 1 {
		t.Fatalf("/debug/actors?project&channel: %d %s", status, body)
	}
	ch := v.Projects[0].ChannelList[0]
	if ch.Name != "a" || ch.Seq != seq || ch.Subscribers != 3 || strings.Join(ch.PresenceMembers, ",") != "x" ||
		ch.ReplayLength != 2 || ch.ReplayBytes == 0 || ch.ChannelBudget.Limit != 2 || ch.ChannelBudget.Remaining != 0 {
		t.Fatalf("channel a: %+v", ch)
	}
	if _, body = relaytest.GetText(t, debug+"/debug/actors?project="+p.ID+"&channel=*&limit=1&offset=1"); !strings.Contains(body, `"name":"b"`) || strings.Contains(body, `"name":"a"`) {
		t.Fatalf("second page of channels: %s", body)
	}
	if status, body = relaytest.GetText(t, debug+"/debug/"); status != 200 || !strings.Contains(body, p.ID) {
		t.Fatalf("/debug/: %d", status)
	}
	if status, _ = relaytest.GetText(t, debug+"/debug/pprof/"); status != 200 {
		t.Fatalf("/debug/pprof/: %d", status)
	}

	// /metrics against what the test did.
	m := ts.Metrics(t)
	checks := []struct {
		name, labels string
		want         float64
	}{
		{"relay_connections_open", "", 4},
		{"relay_connections_opened_total", "", 4},
		{"relay_messages_emitted_total", `path="http"`, 2},
		{"relay_messages_emitted_total", `path="client"`, 0},
		{"relay_deliveries_total", "", 6},
		{"relay_emits_rate_limited_total", `kind="channel"`, 1},
		{"relay_handshakes_refused_total", `reason="unknown_key"`, 1},
		{"relay_replay_requests_total", "", 1},
		{"relay_replay_gaps_total", "", 1},
		{"relay_emit_duration_seconds_count", "", 3},
		{"relay_connections_closed_total", `cause="idle"`, 0},
	}
	for _, c := range checks {
		if got := m.Get(t, c.name, c.labels); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if m.Get(t, "relay_store_query_duration_seconds_count", `op="SELECT"`) == 0 || m.Get(t, "go_goroutines", "") == 0 {
		t.Error("store or runtime metrics missing")
	}
	// The operator endpoints are not on the public listener.
	for _, path := range []string{"/metrics", "/debug/actors", "/debug/pprof/"} {
		if status, _ := relaytest.GetText(t, ts.Base+path); status != 404 {
			t.Errorf("public %s: %d, want 404", path, status)
		}
	}
}

// TestShutdownWithThousandConnections: every connection gets 1001, every
// emit answered 200 reaches every connected subscriber, usage rows are whole.
func TestShutdownWithThousandConnections(t *testing.T) {
	t.Parallel()
	url := storetest.SQLiteURL(t)
	ts := startServer(t, url, map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	const n = 1000
	clients := make([]*wsClient, n)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := ts.TryDialWS(p.PublicKey)
			if err != nil {
				t.Error(err)
				return
			}
			c.Send(`{"action":"subscribe","channel":"all"}`)
			clients[i] = c
		}()
	}
	wg.Wait()
	for _, c := range clients {
		c.Expect(`{"action":"subscribe","channel":"all","ok":true}`)
	}
	// Emit while the shutdown starts; remember what was acknowledged.
	var acked []int64
	var mu sync.Mutex
	stopEmit := make(chan struct{})
	emitted := make(chan struct{})
	go func() {
		defer close(emitted)
		c := ts.Client()
		for i := 0; ; i++ {
			select {
			case <-stopEmit:
				return
			default:
			}
			r := c.EmitNoFail(p.SecretKey, fmt.Sprintf(`{"channel":"all","payload":%d}`, i))
			if r.Status == 200 {
				mu.Lock()
				acked = append(acked, int64(relaytest.Num(r.JSON, "seq")))
				mu.Unlock()
			}
			if r.Status == 0 {
				return // the listener is closed
			}
		}
	}()
	relaytest.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) > 0 }, "an emit acknowledged before the shutdown")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	a := ts.app
	ts.app = nil // this test shuts it down
	if err := a.shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("shutdown with %d connections took %v", n, time.Since(start))
	close(stopEmit)
	<-emitted
	mu.Lock()
	defer mu.Unlock()
	if len(acked) == 0 {
		t.Fatal("no emit was acknowledged")
	}
	for i, c := range clients {
		got := map[int64]bool{}
		for {
			f, ok := c.Next(10 * time.Second)
			if !ok {
				t.Fatalf("client %d: no close frame", i)
			}
			if f.Closed {
				if f.CloseCode != 1001 {
					t.Fatalf("client %d closed with %d", i, f.CloseCode)
				}
				break
			}
			if f.Err != nil {
				t.Fatalf("client %d: %v", i, f.Err)
			}
			var m map[string]any
			json.Unmarshal([]byte(f.Text), &m)
			got[int64(relaytest.Num(m, "seq"))] = true
		}
		for _, s := range acked {
			if !got[s] {
				t.Fatalf("client %d lost acknowledged seq %d (%d acked)", i, s, len(acked))
			}
		}
	}
	// Usage rows are complete after the restart.
	ts2 := startServer(t, url, nil)
	us, err := ts2.app.store.Usage(context.Background(), p.ID, time.Now().UTC().Format(time.DateOnly))
	if err != nil || len(us) != 1 || us[0].ConnectionCount != n || us[0].MessageCount < int64(len(acked)) {
		t.Fatalf("usage after shutdown: %+v %v; want %d connects and at least %d messages", us, err, n, len(acked))
	}
}
