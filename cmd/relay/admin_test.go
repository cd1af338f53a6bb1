package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// admin runs `relay admin args…` on dbURL and returns its stdout, its log
// and its error.
func admin(t *testing.T, dbURL string, args ...string) (string, string, error) {
	t.Helper()
	return adminWith(t, map[string]string{"DATABASE_URL": dbURL}, args...)
}

// adminWith is admin with the environment env.
func adminWith(t *testing.T, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var out, logs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := runCommandTo(ctx, append([]string{"admin"}, args...), cfgEnv(env), &out, &logs)
	return out.String(), logs.String(), err
}

// adminOK is admin that must succeed; it decodes the JSON printed.
func adminOK(t *testing.T, dbURL string, args ...string) map[string]any {
	t.Helper()
	out, logs, err := admin(t, dbURL, args...)
	if err != nil {
		t.Fatalf("relay admin %q: %v\n%s", args, err, logs)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("relay admin %q printed no JSON object: %v\n%s", args, err, out)
	}
	return v
}

// adminFails is admin that must fail with exit status code and an error
// containing want.
func adminFails(t *testing.T, dbURL string, code int, want string, args ...string) {
	t.Helper()
	out, _, err := admin(t, dbURL, args...)
	if err == nil {
		t.Fatalf("relay admin %q succeeded: %s", args, out)
	}
	if got := exitCode(err); got != code || !strings.Contains(err.Error(), want) {
		t.Fatalf("relay admin %q: exit %d, %v; want exit %d and %q", args, got, err, code, want)
	}
	if out != "" {
		t.Fatalf("relay admin %q failed but printed %q", args, out)
	}
}

// keysOf lists the JSON object's keys, sorted.
func keysOf(v any) string {
	m, _ := v.(map[string]any)
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return strings.Join(ks, ",")
}

// TestAdminCommands: every `relay admin` subcommand on both stores: the JSON
// it prints, and that the keys it creates authenticate on a relay started on
// the same store (the rotated and revoked ones do not).
func TestAdminCommands(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		u := adminOK(t, dbURL, "create-user", "--email", " Dana@example.com ", "--password", "correct horse")
		if keysOf(u) != "email,id" || u["email"] != "Dana@example.com" {
			t.Fatalf("create-user printed %v", u)
		}
		adminFails(t, dbURL, 1, "email_already_registered", "create-user", "--email", "dana@example.com", "--password", "another one")
		adminFails(t, dbURL, 1, "password_too_short", "create-user", "--email", "eve@example.com", "--password", "short")

		p := adminOK(t, dbURL, "create-project", "--email", "DANA@example.com", "--name", " demo ")
		if keysOf(p) != "keys,project" || keysOf(p["keys"]) != "publicKey,secretKey" || keysOf(p["project"]) != "createdAt,id,name,ownerUserId" {
			t.Fatalf("create-project printed %v", p)
		}
		project := p["project"].(map[string]any)
		keys := p["keys"].(map[string]any)
		pid, pub, sec := project["id"].(string), keys["publicKey"].(string), keys["secretKey"].(string)
		if project["name"] != "demo" || project["ownerUserId"] != u["id"] || !strings.HasPrefix(pub, "pk_live_") || !strings.HasPrefix(sec, "sk_live_") {
			t.Fatalf("create-project printed %v", p)
		}
		adminFails(t, dbURL, 1, "no user with this email", "create-project", "--email", "nobody@example.com", "--name", "x")
		adminFails(t, dbURL, 1, "name_required", "create-project", "--email", "dana@example.com", "--name", "  ")

		// Keys made by the command line authenticate on a relay on the same store.
		ts := startServer(t, dbURL, nil)
		c := ts.Client()
		if r := c.EmitNoFail(sec, `{"channel":"c","payload":1}`); r.Status != 200 {
			t.Fatalf("emit with the new secret key: %d %s", r.Status, r.Raw)
		}
		ts.Stop()

		r := adminOK(t, dbURL, "rotate-key", "--project", pid, "--type", "secret")
		key := r["key"].(map[string]any)
		if keysOf(r) != "key" || keysOf(key) != "id,keyPrefix,keyType,raw" || key["keyType"] != "secret" {
			t.Fatalf("rotate-key printed %v", r)
		}
		sec2 := key["raw"].(string)
		r = adminOK(t, dbURL, "rotate-key", "--project", pid, "--type", "public")
		pub2ID := r["key"].(map[string]any)["id"].(string)
		if v := adminOK(t, dbURL, "revoke-key", "--project", pid, "--key", pub2ID); keysOf(v) != "ok" || v["ok"] != true {
			t.Fatalf("revoke-key printed %v", v)
		}
		adminFails(t, dbURL, 1, "key_not_found", "revoke-key", "--project", pid, "--key", "00000000-0000-0000-0000-000000000000")
		adminFails(t, dbURL, 1, "project_not_found", "rotate-key", "--project", "00000000-0000-0000-0000-000000000000", "--type", "public")

		ts = startServer(t, dbURL, nil)
		c = ts.Client()
		if r := c.EmitNoFail(sec2, `{"channel":"c","payload":1}`); r.Status != 200 {
			t.Fatalf("emit with the new secret key: %d %s", r.Status, r.Raw)
		}
		if r := c.EmitNoFail(sec, `{"channel":"c","payload":1}`); r.Status != 401 {
			t.Fatalf("emit with the rotated secret key: %d %s", r.Status, r.Raw)
		}
		st, err := store.Open(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		ks, err := st.Keys(context.Background(), pid)
		if err != nil {
			t.Fatal(err)
		}
		active := 0
		for _, k := range ks {
			if k.Active() {
				active++
				if k.KeyType != "secret" || k.KeyHash == "" || strings.Contains(k.KeyPrefix, sec2[12:]) {
					t.Fatalf("active key %+v", k)
				}
			}
		}
		if len(ks) != 4 || active != 1 { // pub, sec (rotated), sec2, pub2 (revoked); pub was revoked by the rotation
			t.Fatalf("keys after rotations and a revocation: %d, %d active", len(ks), active)
		}

		// mint-token needs a client-emit secret, then signs with it.
		adminFails(t, dbURL, 1, "no client-emit secret", "mint-token", "--project", pid, "--channel", "room", "--client-id", "u1", "--types", "move")
		secret, err := st.EnsureClientEmitSecret(context.Background(), pid, "s3cret-s3cret-s3cret-s3cret-s3cret")
		if err != nil {
			t.Fatal(err)
		}
		m := adminOK(t, dbURL, "mint-token", "--project", pid, "--channel", "room", "--client-id", "u1", "--types", "move, chat", "--ttl", "2m")
		if keysOf(m) != "channel,clientId,expiresAt,projectId,token,types" {
			t.Fatalf("mint-token printed %v", m)
		}
		tok, err := jwt.Parse([]byte(m["token"].(string)), jwt.WithKey(jwa.HS256, []byte(secret)))
		if err != nil {
			t.Fatalf("the minted token does not verify with the client-emit secret: %v", err)
		}
		claims := tok.PrivateClaims()
		if claims["pid"] != pid || claims["ch"] != "room" || claims["clientId"] != "u1" || relaytest.Canonical(claims["types"]) != `["move","chat"]` {
			t.Fatalf("token claims %v", claims)
		}
		if ttl := tok.Expiration().Sub(tok.IssuedAt()); ttl != 2*time.Minute {
			t.Fatalf("token lifetime %v", ttl)
		}
		adminFails(t, dbURL, 1, "CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS", "mint-token", "--project", pid, "--channel", "room", "--client-id", "u1", "--types", "move", "--ttl", "1h")
	})
}

// TestAdminUsage: a bad command line exits 2 with a usage message before any
// store is opened; help goes to stdout.
func TestAdminUsage(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "never.db")
	url := "sqlite:" + db
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: relay admin"},
		{[]string{"bogus"}, `unknown admin command "bogus"`},
		{[]string{"create-user", "--email", "a@example.com"}, "--password is required"},
		{[]string{"create-user", "--nope"}, "flag provided but not defined"},
		{[]string{"create-project", "--email", "a@example.com", "--name", "x", "extra"}, "unexpected argument"},
		{[]string{"rotate-key", "--project", "p", "--type", "both"}, "--type must be public or secret"},
		{[]string{"mint-token", "--project", "p", "--channel", "c", "--client-id", "x", "--types", " , "}, "--types names no event type"},
		{[]string{"mint-token", "--project", "p", "--channel", "c", "--client-id", "x", "--types", "a", "--ttl", "soon"}, "invalid value"},
	} {
		adminFails(t, url, 2, tc.want, tc.args...)
	}
	for _, args := range [][]string{{"version", "x"}, {"bogus"}, {"serve", "extra"}} {
		err := runCommandTo(context.Background(), args, cfgEnv(nil), &bytes.Buffer{}, &bytes.Buffer{})
		if exitCode(err) != 2 {
			t.Fatalf("relay %q: exit %d (%v), want 2", args, exitCode(err), err)
		}
	}
	if exitCode(errors.New("boom")) != 1 {
		t.Fatal("a failure does not exit 1")
	}
	var out bytes.Buffer
	if err := runCommandTo(context.Background(), []string{"admin", "help"}, cfgEnv(nil), &out, &bytes.Buffer{}); err != nil || !strings.Contains(out.String(), "mint-token") {
		t.Fatalf("relay admin help: %v\n%s", err, out.String())
	}
	if m, _ := filepath.Glob(db + "*"); len(m) > 0 {
		t.Fatalf("a usage error touched the store: %v", m)
	}
}

// `relay` with no command prints its usage and exits 2: it never serves
// (on every interface) by accident.
func TestNoCommandPrintsUsage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, relaytest.Binary(t))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "RELAY_ADDR=127.0.0.1:0", "DATABASE_URL=sqlite:" + filepath.Join(t.TempDir(), "r.db")}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.HasPrefix(string(out), "relay: usage: relay command\n") {
		t.Fatalf("relay with no command: %v, output:\n%s", err, out)
	}
}

// TestVersionCommand: `relay version` prints the module version, VCS
// revision, time and Go version; /metrics has relay_build_info with the same.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := runCommandTo(context.Background(), []string{"version"}, cfgEnv(nil), &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	b := readBuildInfo()
	want := regexp.MustCompile(`^relay \S+\nrevision: \S+( \(modified\))?\ntime: \S+\ngo: go\S+\n$`)
	if !want.MatchString(out.String()) || !strings.Contains(out.String(), "go: "+runtime.Version()) || !strings.HasPrefix(out.String(), "relay "+b.Version+"\n") {
		t.Fatalf("relay version printed:\n%s", out.String())
	}
	out.Reset()
	printVersion(&out, buildInfo{Version: "v1.2.3", Revision: "abc123", Time: "2026-01-02T03:04:05Z", Modified: true, GoVersion: "go1.99"})
	if out.String() != "relay v1.2.3\nrevision: abc123 (modified)\ntime: 2026-01-02T03:04:05Z\ngo: go1.99\n" {
		t.Fatalf("printVersion:\n%s", out.String())
	}

	ts := debugServer(t, nil)
	labels := `goversion="` + b.GoVersion + `",revision="` + b.Revision + `",version="` + b.Version + `"`
	if v := ts.Metrics(t).Get(t, "relay_build_info", labels); v != 1 {
		t.Fatalf("relay_build_info{%s} = %v", labels, v)
	}
}

// TestAdminKeyChangesReachRunningNodes: a key revoked or rotated with
// `relay admin` (another process, its own store handle) is refused on every
// running node on the same store within 2 s, also by a node that had it
// cached, and the sockets opened with a revoked public key close with 4001
// as after a dashboard revoke (cmd/relay/README.md › Version and admin command line). Two
// nodes on one database, each reading the store's key changes on its own.
func TestAdminKeyChangesReachRunningNodes(t *testing.T) {
	// Not parallel: each change applied within 2 s.
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		adminOK(t, dbURL, "create-user", "--email", "dana@example.com", "--password", "correct horse")
		p := adminOK(t, dbURL, "create-project", "--email", "dana@example.com", "--name", "demo")
		pid := p["project"].(map[string]any)["id"].(string)
		keys := p["keys"].(map[string]any)
		secret, public := keys["secretKey"].(string), keys["publicKey"].(string)
		nodes := []*testServer{startServer(t, dbURL, nil), startServer(t, dbURL, nil)}

		st, err := store.Open(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		keyID := func(keyType string) string {
			ks, err := st.Keys(context.Background(), pid)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range ks {
				if k.KeyType == keyType && k.Active() {
					return k.ID
				}
			}
			t.Fatalf("project %s has no active %s key", pid, keyType)
			return ""
		}
		const body = `{"channel":"c","payload":1}`
		// Every node has the keys cached, and a socket open on the public key
		// (subscribed, so its project actor has it).
		var socks []*wsClient
		for _, ts := range nodes {
			if r := ts.Client().Emit(secret, body); r.Status != http.StatusOK {
				t.Fatalf("emit before the revoke: %d %s", r.Status, r.Raw)
			}
			ws := ts.DialWS(public)
			ws.Send(`{"action":"subscribe","channel":"c"}`)
			ws.Expect(`{"action":"subscribe","channel":"c","ok":true}`)
			socks = append(socks, ws)
		}
		// refused polls each node until the key is refused, and fails the
		// test if that takes 2 s from the command's end.
		refused := func(what string, done time.Time, try func(ts *testServer) response, status int, want string) {
			t.Helper()
			for i, ts := range nodes {
				var last response
				relaytest.EventuallyNil(t, time.Until(done.Add(2*time.Second)), func() error {
					if last = try(ts); last.Status != status {
						return fmt.Errorf("node %d: %s still answered %d %s 2 s after the command", i, what, last.Status, last.Raw)
					}
					return nil
				})
				last.Expect(t, status, want)
			}
		}
		emitWith := func(key string) func(*testServer) response {
			return func(ts *testServer) response { return ts.Client().EmitNoFail(key, body) }
		}

		adminOK(t, dbURL, "revoke-key", "--project", pid, "--key", keyID("secret"))
		done := time.Now()
		refused("emit with the revoked secret key", done, emitWith(secret), http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)

		adminOK(t, dbURL, "revoke-key", "--project", pid, "--key", keyID("public"))
		done = time.Now()
		for i, ws := range socks {
			if f := ws.ExpectClose(4001, time.Until(done.Add(2*time.Second))); f.Reason != "key revoked" {
				t.Fatalf("node %d: the revoked key's socket closed with 4001 %q, want \"key revoked\"", i, f.Reason)
			}
		}
		refused("handshake with the revoked public key", done, func(ts *testServer) response {
			return ts.Handshake("/ws?publicKey=" + public)
		}, http.StatusUnauthorized, `{"error":"unauthorized"}`)

		// A rotation from the command line: the key it replaced is refused,
		// the new one works, on every node.
		r := adminOK(t, dbURL, "rotate-key", "--project", pid, "--type", "secret")
		done = time.Now()
		rotated := r["key"].(map[string]any)["raw"].(string)
		if r := nodes[0].Client().Emit(rotated, body); r.Status != http.StatusOK {
			t.Fatalf("emit with the rotated-in key: %d %s", r.Status, r.Raw)
		}
		newest := adminOK(t, dbURL, "rotate-key", "--project", pid, "--type", "secret")["key"].(map[string]any)["raw"].(string)
		done = time.Now()
		refused("emit with the rotated-out secret key", done, emitWith(rotated), http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		for i, ts := range nodes {
			if r := ts.Client().Emit(newest, body); r.Status != http.StatusOK {
				t.Fatalf("node %d: emit with the new key: %d %s", i, r.Status, r.Raw)
			}
		}
	})
}

// relay admin create-project keeps MAX_PROJECTS_PER_USER like the API.
func TestAdminProjectsCap(t *testing.T) {
	t.Parallel()
	dbURL := storetest.SQLiteURL(t)
	adminOK(t, dbURL, "create-user", "--email", "erin@example.com", "--password", "correct horse")
	run := func() (string, error) {
		out, _, err := adminWith(t, map[string]string{"DATABASE_URL": dbURL, "MAX_PROJECTS_PER_USER": "1"},
			"create-project", "--email", "erin@example.com", "--name", "p")
		return out, err
	}
	if out, err := run(); err != nil || !strings.Contains(out, `"publicKey"`) {
		t.Fatalf("first project: %v %s", err, out)
	}
	out, err := run()
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "too_many_projects") || out != "" {
		t.Fatalf("second project past the cap: exit %d, %v, printed %q", exitCode(err), err, out)
	}
}
