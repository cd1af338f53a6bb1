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
func (c *client) cpRotate(projectID, body string) response {
	c.t.Helper()
	return c.do("POST", "/api/projects/"+projectID+"/keys", body)
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
	t.Parallel() // waits on real time: it overlaps the others that do (Makefile: -parallel)
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, nil, clock.Now)
		alice, aliceID := ts.cpSignup(t, "alice@example.com")
		p, _ := alice.cpCreate(t, "Overlap", aliceID)
		emitter := ts.client()
		emitOK := func(secret string) {
			t.Helper()
			if r := emitter.emit(secret, `{"channel":"c","payload":1}`); r.status != http.StatusOK {
				t.Fatalf("emit: %d %s", r.status, r.raw)
			}
		}
		before := ts.dialWS(p.publicKey) // opened before the rotation

		// Out of range or not a whole number: invalid_overlap, nothing rotated.
		for _, v := range []string{"-1", "86401", "1.5", `"60"`, "true", "1e3"} {
			alice.cpRotate(p.id, `{"keyType":"secret","overlapSeconds":`+v+`}`).expect(t, http.StatusBadRequest, `{"error":"invalid_overlap"}`)
		}
		alice.cpRotate(p.id, `{"keyType":"both","overlapSeconds":-1}`).expect(t, http.StatusBadRequest, `{"error":"invalid_key_type"}`)
		if keys, raw := alice.cpKeys(t, p.id); len(keys) != 2 {
			t.Fatalf("a refused rotation changed the keys: %s", raw)
		}

		// Rotate both keys with a 60 s window.
		start := clock.Now()
		end := start.Add(60 * time.Second)
		endText := end.UTC().Format("2006-01-02T15:04:05.000Z")
		rs := alice.cpRotate(p.id, `{"keyType":"secret","overlapSeconds":60}`)
		if rs.status != http.StatusCreated || rs.str("previousValidUntil") != endText {
			t.Fatalf("rotate secret: %d %s; want previousValidUntil %s", rs.status, rs.raw, endText)
		}
		rp := alice.cpRotate(p.id, `{"keyType":"public","overlapSeconds":60}`)
		if rp.status != http.StatusCreated || rp.str("previousValidUntil") != endText {
			t.Fatalf("rotate public: %d %s", rp.status, rp.raw)
		}
		newSecret, newPublic := rs.str("key", "raw"), rp.str("key", "raw")

		keys, raw := alice.cpKeys(t, p.id)
		if len(keys) != 4 {
			t.Fatalf("after two rotations: %s", raw)
		}
		for _, old := range []string{p.secretKey, p.publicKey} {
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
		emitOK(p.secretKey)
		emitOK(newSecret)
		during := ts.dialWS(p.publicKey)
		ts.dialWS(newPublic)
		before.expectSilence(1500 * time.Millisecond) // KeyTick ran at least once

		// At the end: the old keys are refused as revoked ones are, the
		// sockets opened with the old public key close with 4001.
		clock.Advance(time.Second)
		emitter.emit(p.secretKey, `{"channel":"c","payload":1}`).expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		ts.handshake("/ws?publicKey="+url.QueryEscape(p.publicKey)).expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		emitOK(newSecret)
		before.expectClose(4001, 5*time.Second)
		during.expectClose(4001, 5*time.Second)
		fresh := ts.dialWS(newPublic)
		fresh.expectSilence(1500 * time.Millisecond)

		keys, raw = alice.cpKeys(t, p.id)
		for _, old := range []string{p.secretKey, p.publicKey} {
			if k := cpKeyOf(keys, old); k == nil || k["expiresAt"] != endText || k["revokedAt"] != endText {
				t.Fatalf("old key after its window: %v; want revokedAt = expiresAt = %s (%s)", k, endText, raw)
			}
		}

		// Revoking a key inside its window takes effect at once; overlap 0
		// revokes at once as before; 86400 is accepted.
		r3 := alice.cpRotate(p.id, `{"keyType":"secret","overlapSeconds":86400}`)
		if r3.status != http.StatusCreated || r3.str("previousValidUntil") != clock.Now().Add(24*time.Hour).UTC().Format("2006-01-02T15:04:05.000Z") {
			t.Fatalf("24 h overlap: %d %s", r3.status, r3.raw)
		}
		emitOK(newSecret)
		keys, _ = alice.cpKeys(t, p.id)
		id, _ := cpKeyOf(keys, newSecret)["id"].(string)
		alice.do("POST", "/api/projects/"+p.id+"/keys/"+id+"/revoke", "").expect(t, http.StatusOK, `{"ok":true}`)
		emitter.emit(newSecret, `{"channel":"c","payload":1}`).expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		last := r3.str("key", "raw")
		emitOK(last)
		r4 := alice.cpRotate(p.id, `{"keyType":"secret","overlapSeconds":0}`)
		if r4.status != http.StatusCreated || strings.Contains(r4.raw, "previousValidUntil") {
			t.Fatalf("overlap 0: %d %s", r4.status, r4.raw)
		}
		emitter.emit(last, `{"channel":"c","payload":1}`).expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		emitOK(r4.str("key", "raw"))
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
	t.Parallel() // waits on real time: it overlaps the others that do (Makefile: -parallel)
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := &keyTicks{Clock: newClock()}
		ts := startServerAt(t, dbURL, nil, clock.Now)
		alice, aliceID := ts.cpSignup(t, "alice@example.com")
		p, _ := alice.cpCreate(t, "Last used", aliceID)
		lastUsed := func(raw string) any {
			t.Helper()
			keys, _ := alice.cpKeys(t, p.id)
			return cpKeyOf(keys, raw)["lastUsedAt"]
		}
		stamp := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
		if lastUsed(p.secretKey) != nil || lastUsed(p.publicKey) != nil {
			t.Fatal("a new key has a last use")
		}

		t0 := clock.Now()
		emitter := ts.client()
		if r := emitter.emit(p.secretKey, `{"channel":"c","payload":1}`); r.status != http.StatusOK {
			t.Fatalf("emit: %d %s", r.status, r.raw)
		}
		ts.dialWS(p.publicKey)
		clock.wait(t) // a tick passes; no minute of the clock has
		if lastUsed(p.secretKey) != nil {
			t.Fatal("last use written before a minute passed")
		}
		clock.Advance(time.Minute)
		relaytest.Eventually(t, 5*time.Second, func() bool {
			return lastUsed(p.secretKey) == stamp(t0) && lastUsed(p.publicKey) == stamp(t0)
		}, "lastUsedAt %v / %v, want %s", lastUsed(p.secretKey), lastUsed(p.publicKey), stamp(t0))

		// Used again: written at the next minute only, with the new time.
		clock.wait(t) // a tick has moved the use clock
		t1 := clock.Now()
		if r := emitter.emit(p.secretKey, `{"channel":"c","payload":2}`); r.status != http.StatusOK {
			t.Fatalf("emit: %d %s", r.status, r.raw)
		}
		clock.Advance(30 * time.Second)
		clock.wait(t) // a tick passes within the minute
		if got := lastUsed(p.secretKey); got != stamp(t0) {
			t.Fatalf("lastUsedAt %v within the minute, want still %s", got, stamp(t0))
		}
		clock.Advance(30 * time.Second)
		relaytest.Eventually(t, 5*time.Second, func() bool { return lastUsed(p.secretKey) == stamp(t1) },
			"lastUsedAt %v, want %s", lastUsed(p.secretKey), stamp(t1))
		if got := lastUsed(p.publicKey); got != stamp(t0) {
			t.Fatalf("the public key's last use moved without a use: %v", got)
		}

		// Uses not yet written when the server stops are written at shutdown.
		clock.wait(t) // a tick has moved the use clock
		t2 := clock.Now()
		ts.dialWS(p.publicKey)
		ts.stop()
		ts = startServerAt(t, dbURL, nil, clock.Now)
		alice = ts.client()
		alice.do("POST", "/api/auth/login", cpJSON(map[string]string{"email": "alice@example.com", "password": cpPassword}))
		if got := lastUsed(p.publicKey); got != stamp(t2) {
			t.Fatalf("after shutdown the public key's lastUsedAt is %v, want %s", got, stamp(t2))
		}

		// The dashboard shows it.
		c := ts.dash(t)
		c.submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {cpPassword}}).expectRedirect(t, "/")
		page := c.get("/projects/" + p.id)
		keys, _ := alice.cpKeys(t, p.id)
		pubID, _ := cpKeyOf(keys, p.publicKey)["id"].(string)
		secID, _ := cpKeyOf(keys, p.secretKey)["id"].(string)
		if got, want := page.byID("last-used-"+pubID), t2.UTC().Format("2006-01-02 15:04 UTC"); got != want {
			t.Fatalf("dashboard last used of the public key %q, want %q", got, want)
		}
		if got, want := page.byID("last-used-"+secID), t1.UTC().Format("2006-01-02 15:04 UTC"); got != want {
			t.Fatalf("dashboard last used of the secret key %q, want %q", got, want)
		}
	})
}

// TestDashboardKeyOverlap: the rotate form's overlap choice; the key in its
// window shows "valid until …" and keeps working until then, "expired …"
// after; a value that is not offered is refused with a message.
func TestDashboardKeyOverlap(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, nil, clock.Now)
		c := ts.dash(t)
		c.signup("alice@example.com")
		p := c.create("Overlap")
		page := "/projects/" + p.id
		emitter := ts.client()

		view := c.get(page)
		for _, typ := range []string{"public", "secret"} {
			sel := dashFind(regexp.MustCompile("<select name=\"overlapSeconds\" id=\"rotate-"+typ+"-overlap\">([\\s\\S]*?)</select>"), view.body)
			for _, v := range []string{`value="0" selected`, `value="300"`, `value="3600"`, `value="86400"`} {
				if !strings.Contains(sel, v) {
					t.Fatalf("the %s rotate form offers no %s: %q", typ, v, sel)
				}
			}
		}

		c.submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}, "overlapSeconds": {"90000"}}).
			expectError(t, http.StatusBadRequest, "from 0 (revoke the old key at once) to 86400")

		end := clock.Now().Add(5 * time.Minute).UTC().Format("2006-01-02 15:04:05 UTC")
		rot := c.shown(c.submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}, "overlapSeconds": {"300"}}))
		if rot.status != http.StatusOK || !strings.Contains(rot.noticeText(), "stays valid until "+end) {
			t.Fatalf("rotation with overlap: %d notice %q, want until %s", rot.status, rot.noticeText(), end)
		}
		newSecret := rot.byID("raw-secret-key")
		view = c.get(page)
		if n := strings.Count(view.body, `class="key overlap"`); n != 1 {
			t.Fatalf("%d keys in their overlap window listed, want 1", n)
		}
		if !strings.Contains(view.body, ">valid until "+end+"<") {
			t.Fatalf("the page does not say valid until %s", end)
		}
		for _, k := range []string{p.secretKey, newSecret} {
			if r := emitter.emit(k, `{"channel":"c","payload":1}`); r.status != http.StatusOK {
				t.Fatalf("emit during the window: %d %s", r.status, r.raw)
			}
		}

		clock.Advance(5 * time.Minute)
		emitter.emit(p.secretKey, `{"channel":"c","payload":1}`).expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		view = c.get(page)
		if strings.Contains(view.body, `class="key overlap"`) || !strings.Contains(view.body, ">expired "+end+"<") ||
			strings.Count(view.body, `class="key revoked"`) != 1 {
			t.Fatalf("after the window the page does not show the old key expired %s", end)
		}
	})
}
