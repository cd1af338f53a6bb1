package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestDatabaseGoesAwayAndComesBack: with PostgreSQL stopped, live
// connections keep receiving and emits with known keys keep working (no
// query on that path); what needs the database answers a clear 503; all of
// it recovers when the database is back, and usage counted meanwhile is written.
func TestDatabaseGoesAwayAndComesBack(t *testing.T) {
	url := storetest.PostgresURL(t)
	ts := startServer(t, url, map[string]string{"USAGE_ROLLUP_SECONDS": "1"})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	sub := subscribed(t, ts, p.publicKey, "a")
	r := owner.emit(p.secretKey, `{"channel":"a","payload":"before"}`)
	sub.expectExcept(`{"channel":"a","payload":"before"}`, "seq")
	if r.status != 200 {
		t.Fatal(r.raw)
	}

	storetest.StopPostgres(t)
	stopped := true
	defer func() {
		if stopped {
			storetest.StartPostgres(t)
		}
	}()
	for i := range 5 {
		r := owner.emit(p.secretKey, fmt.Sprintf(`{"channel":"a","payload":%d}`, i))
		if r.status != 200 || num(r.json, "delivered") != 1 {
			t.Fatalf("emit with the database down: %d %s", r.status, r.raw)
		}
		sub.expectExcept(fmt.Sprintf(`{"channel":"a","payload":%d}`, i), "seq")
	}
	late := subscribed(t, ts, p.publicKey, "a") // a known key still connects
	late.send(`{"action":"ping"}`)
	late.expect(`{"action":"pong","ok":true}`)
	status, body := getText(t, ts.base+"/readyz")
	if status != 503 || !strings.Contains(body, `"unavailable"`) {
		t.Fatalf("/readyz with the database down: %d %s", status, body)
	}
	owner.do("GET", "/api/projects", "").expect(t, 503, `{"error":"service_unavailable"}`)
	ts.client().emit("sk_live_neverseen", `{"channel":"a","payload":1}`).expect(t, 503, `{"error":"service_unavailable"}`)

	storetest.StartPostgres(t)
	stopped = false
	waitUntil(t, func() bool { s, _ := getText(t, ts.base+"/readyz"); return s == 200 })
	waitUntil(t, func() bool { return owner.do("GET", "/api/projects", "").status == 200 })
	day := time.Now().UTC().Format(time.DateOnly)
	waitUntil(t, func() bool {
		us, err := ts.app.store.Usage(context.Background(), p.id, day)
		return err == nil && len(us) == 1 && us[0].MessageCount == 6 && us[0].ConnectionCount == 2
	})
	if strings.Contains(ts.logs.String(), "panic") {
		t.Fatalf("a panic was logged:\n%s", ts.logs.String())
	}
}

// relayBinary builds the service once per test binary.
var relayBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "relay-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "relay")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return bin, nil
})

// process is the real binary, started with env, ready when it logs its listener.
type process struct {
	cmd  *exec.Cmd
	base string
}

func startProcess(t *testing.T, env ...string) *process {
	t.Helper()
	bin, err := relayBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), append([]string{"RELAY_ADDR=127.0.0.1:0", "RELAY_DEBUG_ADDR=", "ALLOWED_SIGNUP_EMAILS=alice@example.com"}, env...)...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg=listening listener=public addr=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		return &process{cmd: cmd, base: "http://" + a}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not start")
	}
	return nil
}

// TestSIGKILLLosesNothingAcknowledged: projects, keys, revocations and
// settings answered 200 survive kill -9; usage loses at most one rollup.
func TestSIGKILLLosesNothingAcknowledged(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		env := []string{"DATABASE_URL=" + url, "USAGE_ROLLUP_SECONDS=1"}
		proc := startProcess(t, env...)
		ts := &testServer{t: t, base: proc.base}
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")
		rot := owner.do("POST", "/api/projects/"+p.id+"/keys", `{"keyType":"secret"}`)
		secret := owner.do("PATCH", "/api/projects/"+p.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
		ts.client().revoke(rot.str("key", "raw"), `{"clientId":"mallory"}`).expect(t, 200, `{"ok":true}`)
		c := ts.dialWS(p.publicKey)
		c.send(`{"action":"ping"}`)
		c.expect(`{"action":"pong","ok":true}`)
		for range 3 {
			if r := owner.emit(rot.str("key", "raw"), `{"channel":"a","payload":1}`); r.status != 200 {
				t.Fatal(r.raw)
			}
		}
		time.Sleep(2500 * time.Millisecond) // at least one rollup after the traffic
		proc.cmd.Process.Signal(syscall.SIGKILL)
		proc.cmd.Wait()

		st, err := store.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		ctx := context.Background()
		pr, err := st.Project(ctx, p.id)
		if err != nil || pr.ClientEmitSecret != secret {
			t.Fatalf("project after kill: %+v %v", pr, err)
		}
		keys, _ := st.Keys(ctx, p.id)
		if len(keys) != 3 {
			t.Fatalf("keys after kill: %+v", keys)
		}
		if k, err := st.KeyByHash(ctx, hashOf(rot.str("key", "raw"))); err != nil || !k.Active() {
			t.Fatalf("rotated key after kill: %+v %v", k, err)
		}
		if rs, _ := st.Revocations(ctx, p.id, time.Now()); len(rs) != 1 || rs[0].Value != "mallory" {
			t.Fatalf("revocations after kill: %+v", rs)
		}
		us, err := st.Usage(ctx, p.id, time.Now().UTC().Format(time.DateOnly))
		if err != nil || len(us) != 1 || us[0].ConnectionCount != 1 || us[0].MessageCount != 3 {
			t.Fatalf("usage after kill (one rollup interval may be lost, none was due): %+v %v", us, err)
		}
		// And the service starts again on that database.
		proc2 := startProcess(t, env...)
		ts2 := &testServer{t: t, base: proc2.base}
		if r := ts2.client().emit(rot.str("key", "raw"), `{"channel":"a","payload":1}`); r.status != 200 {
			t.Fatalf("emit after restart: %d %s", r.status, r.raw)
		}
	})
}

func hashOf(raw string) string { return api.HashKey(raw) }
