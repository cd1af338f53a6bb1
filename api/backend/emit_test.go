package backend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
)

// ownRelay is a relay process of one test, with its own limits, and a
// project on it.
type ownRelay struct {
	base, emitURL                   string
	projectID, publicKey, secretKey string
	session                         *http.Client // logged in as the project's owner
}

// addrWatcher is the process's stderr: it keeps the text and finds the
// public listener's address in it.
type addrWatcher struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	addr chan string
	sent bool
}

var listeningRe = regexp.MustCompile(`msg=listening listener=public addr=(\S+)`)

func (w *addrWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if m := listeningRe.FindSubmatch(w.buf.Bytes()); m != nil && !w.sent {
		w.sent = true
		w.addr <- string(m[1])
	}
	return len(p), nil
}

func (w *addrWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// startOwnRelay builds and starts bin/relay with env on a free loopback port
// and a throwaway SQLite file, stopped (SIGINT) when the test ends.
func startOwnRelay(t *testing.T, env ...string) *ownRelay {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "relay")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/relay").CombinedOutput(); err != nil {
		t.Fatalf("build relay: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(append(os.Environ(), "RELAY_ADDR=127.0.0.1:0", "RELAY_DEBUG_ADDR=",
		"DATABASE_URL=sqlite:"+filepath.Join(dir, "relay.db"), "ALLOWED_SIGNUP_EMAILS=owner@example.com"), env...)
	stderr := &addrWatcher{addr: make(chan string, 1)}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("relay did not stop on SIGINT:\n%s", stderr)
		}
	})
	r := &ownRelay{}
	select {
	case a := <-stderr.addr:
		r.base = "http://" + a
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not start:\n%s", stderr)
	}
	r.emitURL = r.base + "/emit"
	jar, _ := cookiejar.New(nil)
	r.session = &http.Client{Jar: jar, Timeout: 10 * time.Second}
	r.call(t, "POST", "/api/auth/signup", `{"email":"owner@example.com","password":"password123"}`, http.StatusCreated, nil)
	var created struct {
		Project struct{ ID string }
		Keys    struct{ PublicKey, SecretKey string }
	}
	r.call(t, "POST", "/api/projects", `{"name":"emit tests"}`, http.StatusCreated, &created)
	r.projectID, r.publicKey, r.secretKey = created.Project.ID, created.Keys.PublicKey, created.Keys.SecretKey
	if r.projectID == "" || r.secretKey == "" || r.publicKey == "" {
		t.Fatalf("project not created: %+v", created)
	}
	return r
}

// call sends a control-plane request with the owner's session.
func (r *ownRelay) call(t *testing.T, method, path, body string, status int, out any) {
	t.Helper()
	req, _ := http.NewRequest(method, r.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := r.session.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var raw json.RawMessage
	json.NewDecoder(res.Body).Decode(&raw)
	if res.StatusCode != status {
		t.Fatalf("%s %s: %d %s, want %d", method, path, res.StatusCode, raw, status)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
}

// checkBudget checks one parsed {limit, remaining, resetAt}: the window ends
// on the next minute boundary.
func checkBudget(t *testing.T, what string, b backend.Budget, limit, remaining int) {
	t.Helper()
	now := time.Now()
	if b.Limit != limit || b.Remaining != remaining || !b.ResetAt.After(now) || b.ResetAt.After(now.Add(61*time.Second)) ||
		b.ResetAt.Second() != 0 || b.ResetAt.Nanosecond() != 0 {
		t.Fatalf("%s = %+v, want limit %d remaining %d resetAt on the next minute boundary", what, b, limit, remaining)
	}
}

// checkAPIError checks that err is a *backend.Error with status, code and
// exactly the JSON body want.
func checkAPIError(t *testing.T, what string, err error, status int, code, want string) {
	t.Helper()
	var e *backend.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: error %v (%T), want *backend.Error", what, err, err)
	}
	var got, exp any
	json.Unmarshal([]byte(e.Body), &got)
	json.Unmarshal([]byte(want), &exp)
	g, _ := json.Marshal(got)
	x, _ := json.Marshal(exp)
	if e.Status != status || e.Code != code || string(g) != string(x) {
		t.Fatalf("%s: %d %q %s, want %d %q %s", what, e.Status, e.Code, e.Body, status, code, want)
	}
	if msg := fmt.Sprintf("relay: %d %s", status, code); err.Error() != msg {
		t.Fatalf("%s: message %q, want %q", what, err.Error(), msg)
	}
}

// TestEmitRateLimitedResult: a 429 is a result, not an error, with the code
// and both budgets parsed, for the channel budget and the project backstop.
func TestEmitRateLimitedResult(t *testing.T) {
	r := startOwnRelay(t, "EMIT_RATE_LIMIT_PER_MINUTE=3", "PROJECT_RATE_LIMIT_PER_MINUTE=5")
	ctx := context.Background()
	// Fixed windows on minute boundaries: keep the test inside one minute.
	if s := time.Now().Second(); s > 50 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	emit := func(channel string) backend.EmitResult {
		t.Helper()
		res, err := backend.Emit(ctx, nil, r.emitURL, r.secretKey, channel, map[string]any{"n": 1})
		if err != nil {
			t.Fatalf("emit on %s: %v", channel, err)
		}
		return res
	}
	var lastSeq uint64
	for i := range 3 {
		res := emit("a")
		if !res.OK || res.RateLimited || res.Error != "" || res.Channel != "a" || res.Seq <= lastSeq || res.SubscriberCount != 0 || res.Delivered != 0 {
			t.Fatalf("emit %d: %+v", i, res)
		}
		lastSeq = res.Seq
		checkBudget(t, "rate_limit", res.RateLimit, 3, 2-i)
		checkBudget(t, "project_rate_limit", res.ProjectRateLimit, 5, 4-i)
	}
	res := emit("a")
	if !res.RateLimited || res.Error != "channel_rate_limited" || res.OK || res.Seq != 0 || res.Channel != "" {
		t.Fatalf("4th emit on a: %+v", res)
	}
	checkBudget(t, "429 rate_limit", res.RateLimit, 3, 0)
	checkBudget(t, "429 project_rate_limit", res.ProjectRateLimit, 5, 2) // a refused emit does not use the backstop

	for i := range 2 {
		if res := emit("b"); !res.OK || res.RateLimited {
			t.Fatalf("emit %d on b: %+v", i, res)
		}
	}
	res = emit("c")
	if !res.RateLimited || res.Error != "project_rate_limited" || res.OK || res.Seq != 0 {
		t.Fatalf("6th emit in the project: %+v", res)
	}
	checkBudget(t, "429 rate_limit", res.RateLimit, 3, 3)
	checkBudget(t, "429 project_rate_limit", res.ProjectRateLimit, 5, 0)

	// Keys that are not an active secret key: 401 invalid_secret_key.
	_, err := backend.Emit(ctx, nil, r.emitURL, r.publicKey, "a", 1)
	checkAPIError(t, "public key", err, 401, "invalid_secret_key", `{"error":"invalid_secret_key"}`)
	var rotated struct{ Key struct{ Raw string } }
	r.call(t, "POST", "/api/projects/"+r.projectID+"/keys", `{"keyType":"secret"}`, http.StatusCreated, &rotated)
	_, err = backend.Emit(ctx, nil, r.emitURL, r.secretKey, "a", 1)
	checkAPIError(t, "rotated-out key", err, 401, "invalid_secret_key", `{"error":"invalid_secret_key"}`)
	if res, err := backend.Emit(ctx, nil, r.emitURL, rotated.Key.Raw, "d", 1); err != nil || !res.RateLimited || res.Error != "project_rate_limited" {
		t.Fatalf("the new key reaches the project's (spent) backstop: %+v %v", res, err)
	}
}

// TestEmitErrorCodes: 413, 400 and 401 come back as *backend.Error with the
// status, the spec's code and the body (on the package's shared relay).
func TestEmitErrorCodes(t *testing.T) {
	ctx := context.Background()
	// Emit marshals {"channel":…,"payload":…} with the keys in this order,
	// which is what the server measures: exactly at the cap passes, one byte
	// over is refused.
	fill := strings.Repeat("x", 131072-len(`{"channel":"big","payload":""}`))
	if res, err := backend.Emit(ctx, nil, emitURL, secretKey, "big", fill); err != nil || !res.OK {
		t.Fatalf("message of exactly 131072 bytes: %+v %v", res, err)
	}
	_, err := backend.Emit(ctx, nil, emitURL, secretKey, "big", fill+"x")
	checkAPIError(t, "one byte over", err, 413, "payload_too_large", `{"error":"payload_too_large","max_bytes":131072}`)
	_, err = backend.Emit(ctx, nil, emitURL, secretKey, "big", json.RawMessage(`"`+strings.Repeat("y", 2<<20)+`"`))
	checkAPIError(t, "2 MiB", err, 413, "payload_too_large", `{"error":"payload_too_large","max_bytes":131072}`)

	_, err = backend.Emit(ctx, nil, emitURL, secretKey, "bad channel!", 1)
	checkAPIError(t, "bad channel", err, 400, "invalid_channel", `{"error":"invalid_channel","channel":"bad channel!"}`)
	_, err = backend.Emit(ctx, nil, emitURL, secretKey, "", 1)
	checkAPIError(t, "empty channel", err, 400, "invalid_channel", `{"error":"invalid_channel","channel":""}`)
	long := strings.Repeat("a", 201)
	_, err = backend.Emit(ctx, nil, emitURL, secretKey, long, 1)
	checkAPIError(t, "201-char channel", err, 400, "invalid_channel", `{"error":"invalid_channel","channel":"`+long+`"}`)

	_, err = backend.Emit(ctx, nil, emitURL, "sk_live_unknown", "a", 1)
	checkAPIError(t, "unknown key", err, 401, "invalid_secret_key", `{"error":"invalid_secret_key"}`)

	// A payload that cannot be marshaled never reaches the service.
	if _, err := backend.Emit(ctx, nil, emitURL, secretKey, "a", func() {}); err == nil || errors.As(err, new(*backend.Error)) {
		t.Fatalf("unmarshalable payload: %v", err)
	}
}
