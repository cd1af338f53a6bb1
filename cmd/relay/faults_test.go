package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestDatabaseGoesAwayAndComesBack: with PostgreSQL stopped, live
// connections keep receiving and emits with known keys keep working (no
// query on that path); what needs the database (the API, an unknown key on
// /emit or the handshake, a revocation) answers 503 service_unavailable; all of
// it recovers when the database is back, usage counted meanwhile is written,
// and goroutines and open files come back to where they were: nothing leaks.
func TestDatabaseGoesAwayAndComesBack(t *testing.T) {
	url := storetest.PostgresURL(t)
	ts := startServer(t, url, map[string]string{"USAGE_ROLLUP_SECONDS": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	sub := ts.Subscribed(t, p.PublicKey, "a")
	r := owner.Emit(p.SecretKey, `{"channel":"a","payload":"before"}`)
	sub.ExpectExcept(`{"channel":"a","payload":"before"}`, "seq")
	if r.Status != 200 {
		t.Fatal(r.Raw)
	}
	base := resourcesOf(t, ts)

	storetest.StopPostgres(t)
	stopped := true
	defer func() {
		if stopped {
			storetest.StartPostgres(t)
		}
	}()
	for i := range 5 {
		r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"a","payload":%d}`, i))
		if r.Status != 200 || relaytest.Num(r.JSON, "delivered") != 1 {
			t.Fatalf("emit with the database down: %d %s", r.Status, r.Raw)
		}
		sub.ExpectExcept(fmt.Sprintf(`{"channel":"a","payload":%d}`, i), "seq")
	}
	late := ts.Subscribed(t, p.PublicKey, "a") // a known key still connects
	late.Send(`{"action":"ping"}`)
	late.Expect(`{"action":"pong","ok":true}`)
	status, body := relaytest.GetText(t, ts.Base+"/readyz")
	if status != 503 || !strings.Contains(body, `"unavailable"`) {
		t.Fatalf("/readyz with the database down: %d %s", status, body)
	}
	if status, body := relaytest.GetText(t, ts.Base+"/readyz/traffic"); status != 200 || strings.TrimSpace(body) != `{"status":"ok"}` {
		t.Fatalf("/readyz/traffic with the database down: %d %s; a load balancer would drop a node that serves", status, body)
	}
	owner.Do("GET", "/api/projects", "").Expect(t, 503, `{"error":"service_unavailable"}`)
	ts.Client().Emit("sk_live_neverseen", `{"channel":"a","payload":1}`).Expect(t, 503, `{"error":"service_unavailable"}`)
	ts.Handshake("/ws?publicKey=pk_live_neverseen").Expect(t, 503, `{"error":"service_unavailable"}`)
	owner.Revoke(p.SecretKey, `{"jti":"during-the-outage"}`).Expect(t, 503, `{"error":"service_unavailable"}`) // a known key; the store must keep it

	storetest.StartPostgres(t)
	stopped = false
	relaytest.Eventually(t, 5*time.Second, func() bool { s, _ := relaytest.GetText(t, ts.Base+"/readyz"); return s == 200 }, "/readyz 200 again")
	relaytest.Eventually(t, 5*time.Second, func() bool { return owner.Do("GET", "/api/projects", "").Status == 200 }, "GET /api/projects 200 again")
	day := time.Now().UTC().Format(time.DateOnly)
	relaytest.Eventually(t, 5*time.Second, func() bool {
		us, err := ts.app.store.Usage(context.Background(), p.ID, day)
		return err == nil && len(us) == 1 && us[0].MessageCount == 6 && us[0].ConnectionCount == 2
	}, "usage of the outage written")
	if strings.Contains(ts.Logs.String(), "panic") {
		t.Fatalf("a panic was logged:\n%s", ts.Logs.String())
	}

	// The connection opened during the outage goes; the rest of the process
	// must come back to the baseline: no goroutine or file held by the outage.
	late.Conn.Close()
	var now resources
	relaytest.EventuallyNil(t, 15*time.Second, func() error {
		if now = resourcesOf(t, ts); now.goroutines <= base.goroutines && now.files <= base.files {
			return nil
		}
		return relaytest.WithStacks(fmt.Sprintf("after the outage: goroutines %d → %d, open files %d → %d (pool connections %d → %d)",
			base.goroutines, now.goroutines, base.files, now.files, base.poolConns, now.poolConns))
	})
	t.Logf("goroutines %d → %d, open files %d → %d (besides the pool's %d → %d connections)",
		base.goroutines, now.goroutines, base.files, now.files, base.poolConns, now.poolConns)
}

// TestStoreFaultIsInternalError: a store error that is not an outage (a
// table renamed behind the relay's back) answers 500 {"error":"internal_error"}
// on the API and the dashboard's own 500 page, never with its cause, which
// is logged at ERROR instead.
func TestStoreFaultIsInternalError(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		owner := ts.Signup("alice@example.com")
		owner.CreateProject("demo")
		d := ts.Dash(t)
		d.Signup("bob@example.com")
		st, err := store.Open(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if _, err := st.DB().ExecContext(context.Background(), "ALTER TABLE projects RENAME TO projects_gone"); err != nil {
			t.Fatal(err)
		}
		owner.Do("GET", "/api/projects", "").Expect(t, http.StatusInternalServerError, `{"error":"internal_error"}`)
		page := d.Get("/")
		page.ExpectError(t, http.StatusInternalServerError, "Something went wrong on our side. Try again in a moment.")
		if strings.Contains(page.Body, "no such table") || strings.Contains(page.Body, "does not exist") { // SQLite's, PostgreSQL's
			t.Fatalf("the dashboard shows the cause:\n%s", page.Body)
		}
		if logs := ts.Logs.String(); !regexp.MustCompile(`level=ERROR .*projects`).MatchString(logs) {
			t.Fatalf("the cause is not logged at ERROR:\n%s", logs)
		}
	})
}

// resources are what a leak would grow, in this process (the server and the
// test's clients).
type resources struct {
	goroutines int
	files      int // open file descriptors other than the store's pool connections
	poolConns  int
}

// resourcesOf measures after letting go of idle HTTP keep-alive connections
// (the test's and so the server's). The store's pool connections are counted
// apart: the pool keeps up to its cap open on purpose and replaces the ones the
// restart broke as it goes, so how many it holds at a moment is not a leak;
// every other descriptor must come back exactly.
func resourcesOf(t *testing.T, ts *testServer) resources {
	t.Helper()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	pool := ts.app.store.DB().Stats().OpenConnections
	return resources{goroutines: runtime.NumGoroutine(), files: len(fds) - pool, poolConns: pool}
}

// TestSIGKILLLosesNothingAcknowledged: projects, keys, revocations and
// settings answered 200 survive kill -9; usage loses at most one rollup.
func TestSIGKILLLosesNothingAcknowledged(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		env := []string{"DATABASE_URL=" + dbURL, "USAGE_ROLLUP_SECONDS=1"}
		proc := relaytest.StartBinary(t, env...)
		ts := binaryServer(t, proc)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		rot := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"secret"}`)
		secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		ts.Client().Revoke(rot.Str("key", "raw"), `{"clientId":"mallory"}`).Expect(t, 200, `{"ok":true}`)
		c := ts.DialWS(p.PublicKey)
		c.Send(`{"action":"ping"}`)
		c.Expect(`{"action":"pong","ok":true}`)
		// Settings, through the dashboard with the same session: a webhook
		// (its secret generated and shown) and a channel budget override.
		d := ts.Dash(t)
		d.HTTP.Jar = owner.HTTP.Jar
		page := "/projects/" + p.ID
		d.Submit(page, page+"/webhook", url.Values{"url": {"https://hooks.example.com/relay"}}).ExpectRedirect(t, page+"?done=webhook-saved")
		hookSecret := d.Get(page + "?done=webhook-saved").ByID("webhook-secret")
		if len(hookSecret) < 40 {
			t.Fatalf("webhook secret shown: %q", hookSecret)
		}
		d.Submit(page, page+"/budget", url.Values{"limit": {"25"}}).ExpectRedirect(t, page+"?done=budget-saved")
		emits := awaitBudget(t, owner, rot.Str("key", "raw"), 25) // the live state has it too
		for range 3 {
			r := owner.Emit(rot.Str("key", "raw"), `{"channel":"a","payload":1}`)
			if r.Status != 200 || budgetLimit(r) != 25 {
				t.Fatalf("emit under the budget override of 25: %d %s", r.Status, r.Raw)
			}
			emits++
		}
		st, err := store.Open(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		ctx := context.Background()
		// At least one rollup after the traffic: its rows are written.
		relaytest.Eventually(t, 10*time.Second, func() bool {
			us, err := st.Usage(ctx, p.ID, time.Now().UTC().Format(time.DateOnly))
			return err == nil && len(us) == 1 && us[0].ConnectionCount == 1 && us[0].MessageCount == int64(emits)
		}, "usage of the traffic rolled up")
		proc.Cmd.Process.Signal(syscall.SIGKILL)
		<-proc.Exited
		pr, err := st.Project(ctx, p.ID)
		if err != nil || pr.ClientEmitSecret != secret {
			t.Fatalf("project after kill: %+v %v", pr, err)
		}
		keys, _ := st.Keys(ctx, p.ID)
		if len(keys) != 3 {
			t.Fatalf("keys after kill: %+v", keys)
		}
		if k, err := st.KeyByHash(ctx, hashOf(rot.Str("key", "raw"))); err != nil || !k.Active() {
			t.Fatalf("rotated key after kill: %+v %v", k, err)
		}
		if rs, _ := st.Revocations(ctx, p.ID, time.Now()); len(rs) != 1 || rs[0].Value != "mallory" {
			t.Fatalf("revocations after kill: %+v", rs)
		}
		set, err := st.Settings(ctx, p.ID)
		if err != nil || set.WebhookURL != "https://hooks.example.com/relay" || set.WebhookSecret != hookSecret ||
			set.ChannelRateLimit == nil || *set.ChannelRateLimit != 25 {
			t.Fatalf("settings after kill: %+v %v", set, err)
		}
		us, err := st.Usage(ctx, p.ID, time.Now().UTC().Format(time.DateOnly))
		if err != nil || len(us) != 1 || us[0].ConnectionCount != 1 || us[0].MessageCount != int64(emits) {
			t.Fatalf("usage after kill (one rollup interval may be lost, none was due): %+v %v", us, err)
		}
		// And the service starts again on that database.
		proc2 := relaytest.StartBinary(t, env...)
		ts2 := binaryServer(t, proc2)
		if r := ts2.Client().Emit(rot.Str("key", "raw"), `{"channel":"a","payload":1}`); r.Status != 200 {
			t.Fatalf("emit after restart: %d %s", r.Status, r.Raw)
		}
		awaitBudget(t, ts2.Client(), rot.Str("key", "raw"), 25) // and applies the stored override
	})
}

// awaitBudget emits on fresh channels until an answer reports the channel
// budget want (a project actor loads its settings beside itself, so a change
// reaches emits shortly after it is stored), and returns how many emits it made.
func awaitBudget(t *testing.T, c *client, secretKey string, want float64) (emits int) {
	t.Helper()
	relaytest.Eventually(t, 10*time.Second, func() bool {
		r := c.Emit(secretKey, fmt.Sprintf(`{"channel":"probe-%d","payload":1}`, emits))
		if r.Status != 200 {
			t.Fatalf("probe emit: %d %s", r.Status, r.Raw)
		}
		emits++
		return budgetLimit(r) == want
	}, "emits report the channel budget %v", want)
	return emits
}

// budgetLimit is the channel budget an emit answer reports.
func budgetLimit(r response) float64 {
	rl, _ := r.JSON["rate_limit"].(map[string]any)
	return relaytest.Num(rl, "limit")
}

func hashOf(raw string) string { return api.HashKey(raw) }
