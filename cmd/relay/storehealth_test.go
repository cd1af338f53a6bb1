package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// readyStatus is GET /readyz: its status, after checking the body that goes
// with it.
func readyStatus(t *testing.T, ts *testServer) int {
	t.Helper()
	return probeStatus(t, ts, "/readyz")
}

// trafficStatus is GET /readyz/traffic, the load balancer's readiness, as
// readyStatus.
func trafficStatus(t *testing.T, ts *testServer) int {
	t.Helper()
	return probeStatus(t, ts, "/readyz/traffic")
}

func probeStatus(t *testing.T, ts *testServer, path string) int {
	t.Helper()
	status, body := relaytest.GetText(t, ts.Base+path)
	want := map[int]string{200: `{"status":"ok"}`, 503: `{"status":"unavailable"}`}[status]
	if want == "" || strings.TrimSpace(body) != want {
		t.Fatalf("%s: %d %s", path, status, body)
	}
	return status
}

// TestSQLiteDirectoryGone replays "delete its directory → /readyz stays 200;
// creates answer 201 into deleted files", as root can (chmod stops no write
// of root's): the directory is moved away and back, then removed. While the
// database is not where it was opened, /readyz answers 503 and every write
// 503 service_unavailable, nothing is created in its place, and the rest of
// the process carries on (live sockets, emits with known keys, /healthz, and
// /readyz/traffic 200: a load balancer keeps the node).
// The files the relay created are its user's only.
func TestSQLiteDirectoryGone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "relay.db")
	ts := startServer(t, "sqlite:"+path, map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:0"})
	for p, want := range map[string]os.FileMode{dir: os.ModeDir | 0o700, path: 0o600, path + "-wal": 0o600, path + "-shm": 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode() != want {
			t.Fatalf("%s: %v, %v; want mode %v", p, fi.Mode(), err, want)
		}
	}
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	sub := ts.Subscribed(t, p.PublicKey, "a")
	if readyStatus(t, ts) != 200 {
		t.Fatal("/readyz not 200 at start")
	}

	// /readyz is cheap: however often it is polled, at most one write a second.
	inserts := func() float64 { return ts.Metrics(t).Get(t, "relay_store_query_duration_seconds_count", `op="INSERT"`) }
	before := inserts()
	start := time.Now()
	for range 50 {
		readyStatus(t, ts)
	}
	if n, most := inserts()-before, time.Since(start).Seconds()+1; n > most {
		t.Fatalf("50 probes in %v wrote %v times", time.Since(start), n)
	}

	carriesOn := func(what string, i int) {
		t.Helper()
		body := `{"channel":"a","payload":` + string(rune('0'+i)) + `}`
		if r := owner.Emit(p.SecretKey, body); r.Status != 200 {
			t.Fatalf("%s: emit with a known key: %d %s", what, r.Status, r.Raw)
		}
		sub.ExpectExcept(body, "seq")
		if s, _ := relaytest.GetText(t, ts.Base+"/healthz"); s != 200 {
			t.Fatalf("%s: /healthz %d", what, s)
		}
		if s := trafficStatus(t, ts); s != 200 {
			t.Fatalf("%s: /readyz/traffic %d", what, s)
		}
	}
	unavailable := func(what string) {
		t.Helper()
		relaytest.Eventually(t, 5*time.Second, func() bool { return readyStatus(t, ts) == 503 }, "%s: /readyz 503", what)
		owner.Do("POST", "/api/projects", `{"name":"after"}`).Expect(t, 503, `{"error":"service_unavailable"}`)
		owner.Do("PATCH", "/api/projects/"+p.ID, `{"name":"renamed"}`).Expect(t, 503, `{"error":"service_unavailable"}`)
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("%s: something was created at %s: %v", what, path, err)
		}
	}

	carriesOn("before", 0) // the secret key is now known (cmd/relay/OPERATING.md › The database goes away)
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	unavailable("directory moved away")
	carriesOn("directory moved away", 1)
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 5*time.Second, func() bool { return readyStatus(t, ts) == 200 }, "/readyz 200 once moved back")
	owner.CreateProject("after")

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	unavailable("directory removed")
	carriesOn("directory removed", 2)
	// A recreated, empty directory is not the database either.
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	unavailable("an empty directory in its place")
	carriesOn("an empty directory in its place", 3)

	logs := ts.Logs.String()
	if !strings.Contains(logs, "not ready: the store cannot commit a write") || !strings.Contains(logs, "ready again") {
		t.Fatalf("readiness changes not logged:\n%s", logs)
	}
	if strings.Contains(logs, "level=ERROR") {
		t.Fatalf("errors logged for an unavailable store:\n%s", logs)
	}
}

// TestReadyzPostgresStopped: /readyz is 503 while PostgreSQL is stopped and
// 200 again once it is back; /readyz/traffic stays 200 all along, as emits
// with a known key still succeed, so a load balancer checking it keeps every
// node in rotation through the outage.
func TestReadyzPostgresStopped(t *testing.T) {
	ts := startServer(t, storetest.PostgresURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	sub := ts.Subscribed(t, p.PublicKey, "a")
	emits := 0
	emit := func(what string) {
		t.Helper()
		emits++
		body := fmt.Sprintf(`{"channel":"a","payload":%d}`, emits)
		if r := owner.Emit(p.SecretKey, body); r.Status != 200 {
			t.Fatalf("%s: emit with a known key: %d %s", what, r.Status, r.Raw)
		}
		sub.ExpectExcept(body, "seq")
	}
	emit("before") // the secret key is now cached
	if readyStatus(t, ts) != 200 || trafficStatus(t, ts) != 200 {
		t.Fatal("/readyz or /readyz/traffic not 200 at start")
	}
	storetest.StopPostgres(t)
	stopped := true
	defer func() {
		if stopped {
			storetest.StartPostgres(t)
		}
	}()
	relaytest.Eventually(t, 5*time.Second, func() bool { return readyStatus(t, ts) == 503 }, "/readyz 503 with PostgreSQL stopped")
	if got := trafficStatus(t, ts); got != 200 {
		t.Fatalf("/readyz/traffic with PostgreSQL stopped: %d, want 200", got)
	}
	emit("PostgreSQL stopped")
	owner.Do("POST", "/api/projects", `{"name":"during"}`).Expect(t, 503, `{"error":"service_unavailable"}`)
	if got := trafficStatus(t, ts); got != 200 {
		t.Fatalf("/readyz/traffic with PostgreSQL stopped, after an emit: %d, want 200", got)
	}
	storetest.StartPostgres(t)
	stopped = false
	relaytest.Eventually(t, 10*time.Second, func() bool { return readyStatus(t, ts) == 200 }, "/readyz 200 with PostgreSQL back")
	if got := trafficStatus(t, ts); got != 200 {
		t.Fatalf("/readyz/traffic with PostgreSQL back: %d", got)
	}
}

// TestReadyzFailsWhileDraining: from the moment a node starts shutting down
// (it refuses new emits and handshakes), /readyz and /readyz/traffic answer
// 503, so a load balancer's next check sends traffic elsewhere while the node
// hands off and closes its sockets; /healthz stays 200. On both databases.
func TestReadyzFailsWhileDraining(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		if readyStatus(t, ts) != 200 || trafficStatus(t, ts) != 200 {
			t.Fatal("/readyz or /readyz/traffic not 200 before draining")
		}
		ts.app.api.Drain(context.Background())
		if got := readyStatus(t, ts); got != 503 {
			t.Fatalf("/readyz while draining: %d, want 503", got)
		}
		if got := trafficStatus(t, ts); got != 503 {
			t.Fatalf("/readyz/traffic while draining: %d, want 503", got)
		}
		if status, body := relaytest.GetText(t, ts.Base+"/healthz"); status != 200 {
			t.Fatalf("/healthz while draining: %d %s", status, body)
		}
	})
}
