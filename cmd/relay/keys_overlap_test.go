package main

import (
	"net/http"
	"net/url"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// Keys rotated with an overlap window, and last use (api/README.md › Keys).

// cpRotate rotates keyType with body extra fields and returns the answer.
func cpRotate(c *client, projectID, body string) response {
	c.T.Helper()
	return c.Do("POST", "/api/projects/"+projectID+"/keys", body)
}

// cpKeyOf finds a listed key by the masked prefix of raw.
func cpKeyOf(keys []map[string]any, raw string) map[string]any {
	for _, k := range keys {
		if p, _ := k["keyPrefix"].(string); strings.HasPrefix(p, raw[:12]) && strings.HasSuffix(p, "************") {
			return k
		}
	}
	return nil
}

// TestKeyOverlap: during the window both the old and the new key
// authenticate (emit, /ws) and a socket opened with the old public key stays
// open; once the server's clock passes its end the old keys are refused
// exactly as revoked ones (401, same body), the sockets opened with the old
// public key close with 4001, and the list shows revokedAt = expiresAt.
func TestKeyOverlap(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, nil, clock.Now)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Overlap", aliceID)
		emitter := ts.Client()
		emitOK := func(secret string) {
			t.Helper()
			if r := emitter.Emit(secret, `{"channel":"c","payload":1}`); r.Status != http.StatusOK {
				t.Fatalf("emit: %d %s", r.Status, r.Raw)
			}
		}
		before := ts.DialWS(p.PublicKey) // opened before the rotation

		// Out of range or not a whole number: invalid_overlap, nothing rotated.
		for _, v := range []string{"-1", "86401", "1.5", `"60"`, "true", "1e3"} {
			cpRotate(alice, p.ID, `{"keyType":"secret","overlapSeconds":`+v+`}`).Expect(t, http.StatusBadRequest, `{"error":"invalid_overlap"}`)
		}
		cpRotate(alice, p.ID, `{"keyType":"both","overlapSeconds":-1}`).Expect(t, http.StatusBadRequest, `{"error":"invalid_key_type"}`)
		if keys, raw := relaytest.Keys(alice, t, p.ID); len(keys) != 2 {
			t.Fatalf("a refused rotation changed the keys: %s", raw)
		}

		// Rotate both keys with a 60 s window.
		start := clock.Now()
		end := start.Add(60 * time.Second)
		endText := end.UTC().Format("2006-01-02T15:04:05.000Z")
		rs := cpRotate(alice, p.ID, `{"keyType":"secret","overlapSeconds":60}`)
		if rs.Status != http.StatusCreated || rs.Str("previousValidUntil") != endText {
			t.Fatalf("rotate secret: %d %s; want previousValidUntil %s", rs.Status, rs.Raw, endText)
		}
		rp := cpRotate(alice, p.ID, `{"keyType":"public","overlapSeconds":60}`)
		if rp.Status != http.StatusCreated || rp.Str("previousValidUntil") != endText {
			t.Fatalf("rotate public: %d %s", rp.Status, rp.Raw)
		}
		newSecret, newPublic := rs.Str("key", "raw"), rp.Str("key", "raw")

		keys, raw := relaytest.Keys(alice, t, p.ID)
		if len(keys) != 4 {
			t.Fatalf("after two rotations: %s", raw)
		}
		for _, old := range []string{p.SecretKey, p.PublicKey} {
			k := cpKeyOf(keys, old)
			if k == nil || k["expiresAt"] != endText || k["revokedAt"] != nil {
				t.Fatalf("old key in its window listed as %v; want expiresAt %s, revokedAt null", k, endText)
			}
		}
		for _, nk := range []string{newSecret, newPublic} {
			if k := cpKeyOf(keys, nk); k == nil || k["expiresAt"] != nil || k["revokedAt"] != nil {
				t.Fatalf("new key listed as %v", k)
			}
		}

		// Inside the window: both keys work, the old socket stays open.
		clock.Advance(59 * time.Second)
		emitOK(p.SecretKey)
		emitOK(newSecret)
		during := ts.DialWS(p.PublicKey)
		ts.DialWS(newPublic)
		before.ExpectSilence(1500 * time.Millisecond) // KeyTick ran at least once

		// At the end: the old keys are refused as revoked ones are, the
		// sockets opened with the old public key close with 4001.
		clock.Advance(time.Second)
		emitter.Emit(p.SecretKey, `{"channel":"c","payload":1}`).Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		ts.Handshake("/ws?publicKey="+url.QueryEscape(p.PublicKey)).Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		emitOK(newSecret)
		before.ExpectClose(4001, 5*time.Second)
		during.ExpectClose(4001, 5*time.Second)
		fresh := ts.DialWS(newPublic)
		fresh.ExpectSilence(1500 * time.Millisecond)

		keys, raw = relaytest.Keys(alice, t, p.ID)
		for _, old := range []string{p.SecretKey, p.PublicKey} {
			if k := cpKeyOf(keys, old); k == nil || k["expiresAt"] != endText || k["revokedAt"] != endText {
				t.Fatalf("old key after its window: %v; want revokedAt = expiresAt = %s (%s)", k, endText, raw)
			}
		}

		// Revoking a key inside its window takes effect at once; overlap 0
		// revokes at once as before; 86400 is accepted.
		r3 := cpRotate(alice, p.ID, `{"keyType":"secret","overlapSeconds":86400}`)
		if r3.Status != http.StatusCreated || r3.Str("previousValidUntil") != clock.Now().Add(24*time.Hour).UTC().Format("2006-01-02T15:04:05.000Z") {
			t.Fatalf("24 h overlap: %d %s", r3.Status, r3.Raw)
		}
		emitOK(newSecret)
		keys, _ = relaytest.Keys(alice, t, p.ID)
		id, _ := cpKeyOf(keys, newSecret)["id"].(string)
		alice.Do("POST", "/api/projects/"+p.ID+"/keys/"+id+"/revoke", "").Expect(t, http.StatusOK, `{"ok":true}`)
		emitter.Emit(newSecret, `{"channel":"c","payload":1}`).Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		last := r3.Str("key", "raw")
		emitOK(last)
		r4 := cpRotate(alice, p.ID, `{"keyType":"secret","overlapSeconds":0}`)
		if r4.Status != http.StatusCreated || strings.Contains(r4.Raw, "previousValidUntil") {
			t.Fatalf("overlap 0: %d %s", r4.Status, r4.Raw)
		}
		emitter.Emit(last, `{"channel":"c","payload":1}`).Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		emitOK(r4.Str("key", "raw"))
	})
}

// keyTicks is a test clock that counts the server's key ticks
// (api.Server.KeyTick, every second of real time), each of which reads the
// clock once: a test waits for them instead of for time.
type keyTicks struct {
	*relaytest.Clock
	n atomic.Int64
}

// Now is the clock's time; a call made by KeyTick counts a tick.
func (k *keyTicks) Now() time.Time {
	var pc [4]uintptr
	frames := runtime.CallersFrames(pc[:runtime.Callers(2, pc[:])])
	for f, more := frames.Next(); ; f, more = frames.Next() {
		if strings.HasSuffix(f.Function, "api.(*Server).KeyTick") {
			k.n.Add(1) // before the clock is read: a tick counted after wait began reads it after too
			break
		}
		if !more || !strings.HasSuffix(f.Function, "-fm") { // past the method value's wrapper: not KeyTick's own call
			break
		}
	}
	return k.Clock.Now()
}

// wait returns once a whole key tick has run after the call: the second
// one to begin has begun, so the first is over.
func (k *keyTicks) wait(t *testing.T) {
	t.Helper()
	n := k.n.Load()
	relaytest.Eventually(t, 10*time.Second, func() bool { return k.n.Load() >= n+2 }, "two key ticks")
}

// TestKeyLastUsed: lastUsedAt is null until a key is used, then moves to the
// time of use once a minute of the server's clock has passed (not before),
// for emits and WebSocket handshakes; the dashboard shows it.
func TestKeyLastUsed(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := &keyTicks{Clock: newClock()}
		ts := startServerAt(t, dbURL, nil, clock.Now)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Last used", aliceID)
		lastUsed := func(raw string) any {
			t.Helper()
			keys, _ := relaytest.Keys(alice, t, p.ID)
			return cpKeyOf(keys, raw)["lastUsedAt"]
		}
		stamp := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
		if lastUsed(p.SecretKey) != nil || lastUsed(p.PublicKey) != nil {
			t.Fatal("a new key has a last use")
		}

		t0 := clock.Now()
		emitter := ts.Client()
		if r := emitter.Emit(p.SecretKey, `{"channel":"c","payload":1}`); r.Status != http.StatusOK {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		ts.DialWS(p.PublicKey)
		clock.wait(t) // a tick passes; no minute of the clock has
		if lastUsed(p.SecretKey) != nil {
			t.Fatal("last use written before a minute passed")
		}
		clock.Advance(time.Minute)
		relaytest.Eventually(t, 5*time.Second, func() bool {
			return lastUsed(p.SecretKey) == stamp(t0) && lastUsed(p.PublicKey) == stamp(t0)
		}, "lastUsedAt %v / %v, want %s", lastUsed(p.SecretKey), lastUsed(p.PublicKey), stamp(t0))

		// Used again: written at the next minute only, with the new time.
		clock.wait(t) // a tick has moved the use clock
		t1 := clock.Now()
		if r := emitter.Emit(p.SecretKey, `{"channel":"c","payload":2}`); r.Status != http.StatusOK {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		clock.Advance(30 * time.Second)
		clock.wait(t) // a tick passes within the minute
		if got := lastUsed(p.SecretKey); got != stamp(t0) {
			t.Fatalf("lastUsedAt %v within the minute, want still %s", got, stamp(t0))
		}
		clock.Advance(30 * time.Second)
		relaytest.Eventually(t, 5*time.Second, func() bool { return lastUsed(p.SecretKey) == stamp(t1) },
			"lastUsedAt %v, want %s", lastUsed(p.SecretKey), stamp(t1))
		if got := lastUsed(p.PublicKey); got != stamp(t0) {
			t.Fatalf("the public key's last use moved without a use: %v", got)
		}

		// Uses not yet written when the server stops are written at shutdown.
		clock.wait(t) // a tick has moved the use clock
		t2 := clock.Now()
		ts.DialWS(p.PublicKey)
		ts.Stop()
		ts = startServerAt(t, dbURL, nil, clock.Now)
		alice = ts.Client()
		alice.Do("POST", "/api/auth/login", relaytest.JSON(map[string]string{"email": "alice@example.com", "password": relaytest.Password}))
		if got := lastUsed(p.PublicKey); got != stamp(t2) {
			t.Fatalf("after shutdown the public key's lastUsedAt is %v, want %s", got, stamp(t2))
		}

		// The dashboard shows it.
		c := ts.Dash(t)
		c.Submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {relaytest.Password}}).ExpectRedirect(t, "/")
		page := c.Get("/projects/" + p.ID)
		keys, _ := relaytest.Keys(alice, t, p.ID)
		pubID, _ := cpKeyOf(keys, p.PublicKey)["id"].(string)
		secID, _ := cpKeyOf(keys, p.SecretKey)["id"].(string)
		if got, want := page.ByID("last-used-"+pubID), t2.UTC().Format("2006-01-02 15:04 UTC"); got != want {
			t.Fatalf("dashboard last used of the public key %q, want %q", got, want)
		}
		if got, want := page.ByID("last-used-"+secID), t1.UTC().Format("2006-01-02 15:04 UTC"); got != want {
			t.Fatalf("dashboard last used of the secret key %q, want %q", got, want)
		}
	})
}

// TestDashboardKeyOverlap: the rotate form's overlap choice; the key in its
// window shows "valid until …" and keeps working until then, "expired …"
// after; a value that is not offered is refused with a message.
func TestDashboardKeyOverlap(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, nil, clock.Now)
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Overlap")
		page := "/projects/" + p.ID
		emitter := ts.Client()

		view := c.Get(page)
		for _, typ := range []string{"public", "secret"} {
			sel := relaytest.FindText(regexp.MustCompile("<select name=\"overlapSeconds\" id=\"rotate-"+typ+"-overlap\">([\\s\\S]*?)</select>"), view.Body)
			for _, v := range []string{`value="0" selected`, `value="300"`, `value="3600"`, `value="86400"`} {
				if !strings.Contains(sel, v) {
					t.Fatalf("the %s rotate form offers no %s: %q", typ, v, sel)
				}
			}
		}

		c.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}, "overlapSeconds": {"90000"}}).
			ExpectError(t, http.StatusBadRequest, "from 0 (revoke the old key at once) to 86400")

		end := clock.Now().Add(5 * time.Minute).UTC().Format("2006-01-02 15:04:05 UTC")
		rot := c.Shown(c.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}, "overlapSeconds": {"300"}}))
		if rot.Status != http.StatusOK || !strings.Contains(rot.NoticeText(), "stays valid until "+end) {
			t.Fatalf("rotation with overlap: %d notice %q, want until %s", rot.Status, rot.NoticeText(), end)
		}
		newSecret := rot.ByID("raw-secret-key")
		view = c.Get(page)
		if n := strings.Count(view.Body, `class="key overlap"`); n != 1 {
			t.Fatalf("%d keys in their overlap window listed, want 1", n)
		}
		if !strings.Contains(view.Body, ">valid until "+end+"<") {
			t.Fatalf("the page does not say valid until %s", end)
		}
		for _, k := range []string{p.SecretKey, newSecret} {
			if r := emitter.Emit(k, `{"channel":"c","payload":1}`); r.Status != http.StatusOK {
				t.Fatalf("emit during the window: %d %s", r.Status, r.Raw)
			}
		}

		clock.Advance(5 * time.Minute)
		emitter.Emit(p.SecretKey, `{"channel":"c","payload":1}`).Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		view = c.Get(page)
		if strings.Contains(view.Body, `class="key overlap"`) || !strings.Contains(view.Body, ">expired "+end+"<") ||
			strings.Count(view.Body, `class="key revoked"`) != 1 {
			t.Fatalf("after the window the page does not show the old key expired %s", end)
		}
	})
}
