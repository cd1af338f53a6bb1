package backend_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"strings"
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

// startOwnRelay starts the package's build of the relay with env on a free
// loopback port and a throwaway SQLite file, stopped (SIGINT) when the test
// ends, and creates a project on it.
func startOwnRelay(t *testing.T, env ...string) *ownRelay {
	t.Helper()
	p, err := startRelay(t.TempDir(), append([]string{"ALLOWED_SIGNUP_EMAILS=owner@example.com"}, env...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Error(err)
		}
	})
	r := &ownRelay{base: p.base, emitURL: p.base + "/emit"}
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
// at resetAt, the end of the run's minute.
func checkBudget(t *testing.T, what string, b backend.Budget, limit, remaining int, resetAt time.Time) {
	t.Helper()
	if b.Limit != limit || b.Remaining != remaining || !b.ResetAt.Equal(resetAt) {
		t.Fatalf("%s = %+v, want limit %d remaining %d resetAt %v", what, b, limit, remaining, resetAt)
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
	// Fixed windows on minute boundaries: every emit of a run must fall in
	// one. The relay's clock cannot be set from here, so a run whose answers
	// name more than one resetAt crossed a boundary and is made again, on a
	// fresh relay (a run takes well under a second).
	for attempt := 1; ; attempt++ {
		run := rateLimitedRun(t)
		if resetAt, ok := run.oneWindow(); ok {
			run.check(t, resetAt)
			return
		}
		if attempt == 3 {
			t.Fatal("three runs in a row crossed a minute boundary")
		}
		t.Logf("run %d crossed a minute boundary; once more on a fresh relay", attempt)
	}
}

// rateLimitRun is what TestEmitRateLimitedResult's emits answered.
type rateLimitRun struct {
	before, after time.Time             // around the emits
	a             [4]backend.EmitResult // three under the channel budget of 3, then one over
	b             [2]backend.EmitResult // another channel, up to the backstop of 5
	c             backend.EmitResult    // one over the backstop
	publicKey     error                 // emit with the public key
	rotatedOut    error                 // emit with the secret key rotated out
	rotated       backend.EmitResult    // emit with the new secret key
	rotatedErr    error
}

func rateLimitedRun(t *testing.T) *rateLimitRun {
	t.Helper()
	r := startOwnRelay(t, "EMIT_RATE_LIMIT_PER_MINUTE=3", "PROJECT_RATE_LIMIT_PER_MINUTE=5")
	ctx := context.Background()
	emit := func(channel string) backend.EmitResult {
		t.Helper()
		res, err := backend.Emit(ctx, nil, r.emitURL, r.secretKey, channel, map[string]any{"n": 1})
		if err != nil {
			t.Fatalf("emit on %s: %v", channel, err)
		}
		return res
	}
	run := &rateLimitRun{before: time.Now()}
	for i := range run.a {
		run.a[i] = emit("a")
	}
	for i := range run.b {
		run.b[i] = emit("b")
	}
	run.c = emit("c")
	// Keys that are not an active secret key: 401 invalid_secret_key.
	_, run.publicKey = backend.Emit(ctx, nil, r.emitURL, r.publicKey, "a", 1)
	var rotated struct{ Key struct{ Raw string } }
	r.call(t, "POST", "/api/projects/"+r.projectID+"/keys", `{"keyType":"secret"}`, http.StatusCreated, &rotated)
	_, run.rotatedOut = backend.Emit(ctx, nil, r.emitURL, r.secretKey, "a", 1)
	run.rotated, run.rotatedErr = backend.Emit(ctx, nil, r.emitURL, rotated.Key.Raw, "d", 1)
	run.after = time.Now()
	return run
}

// oneWindow is the resetAt every answer names, and whether there is one.
func (run *rateLimitRun) oneWindow() (time.Time, bool) {
	var all []backend.EmitResult
	all = append(append(append(all, run.a[:]...), run.b[:]...), run.c)
	if run.rotatedErr == nil {
		all = append(all, run.rotated)
	}
	at := all[0].RateLimit.ResetAt
	for _, res := range all {
		if !res.RateLimit.ResetAt.Equal(at) || !res.ProjectRateLimit.ResetAt.Equal(at) {
			return time.Time{}, false
		}
	}
	return at, true
}

func (run *rateLimitRun) check(t *testing.T, resetAt time.Time) {
	t.Helper()
	// The window is the minute the emits were sent in: it ends on the next
	// minute boundary.
	if !resetAt.After(run.before) || resetAt.After(run.after.Add(time.Minute)) || resetAt.Second() != 0 || resetAt.Nanosecond() != 0 {
		t.Fatalf("resetAt %v, want the next minute boundary after %v", resetAt, run.before)
	}
	var lastSeq uint64
	for i, res := range run.a[:3] {
		if !res.OK || res.RateLimited || res.Error != "" || res.Channel != "a" || res.Seq <= lastSeq || res.SubscriberCount != 0 || res.Delivered != 0 {
			t.Fatalf("emit %d: %+v", i, res)
		}
		lastSeq = res.Seq
		checkBudget(t, "rate_limit", res.RateLimit, 3, 2-i, resetAt)
		checkBudget(t, "project_rate_limit", res.ProjectRateLimit, 5, 4-i, resetAt)
	}
	res := run.a[3]
	if !res.RateLimited || res.Error != "channel_rate_limited" || res.OK || res.Seq != 0 || res.Channel != "" {
		t.Fatalf("4th emit on a: %+v", res)
	}
	checkBudget(t, "429 rate_limit", res.RateLimit, 3, 0, resetAt)
	checkBudget(t, "429 project_rate_limit", res.ProjectRateLimit, 5, 2, resetAt) // a refused emit does not use the backstop

	for i, res := range run.b {
		if !res.OK || res.RateLimited {
			t.Fatalf("emit %d on b: %+v", i, res)
		}
	}
	res = run.c
	if !res.RateLimited || res.Error != "project_rate_limited" || res.OK || res.Seq != 0 {
		t.Fatalf("6th emit in the project: %+v", res)
	}
	checkBudget(t, "429 rate_limit", res.RateLimit, 3, 3, resetAt)
	checkBudget(t, "429 project_rate_limit", res.ProjectRateLimit, 5, 0, resetAt)

	// Keys that are not an active secret key: 401 invalid_secret_key.
	checkAPIError(t, "public key", run.publicKey, 401, "invalid_secret_key", `{"error":"invalid_secret_key"}`)
	checkAPIError(t, "rotated-out key", run.rotatedOut, 401, "invalid_secret_key", `{"error":"invalid_secret_key"}`)
	if res, err := run.rotated, run.rotatedErr; err != nil || !res.RateLimited || res.Error != "project_rate_limited" {
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
