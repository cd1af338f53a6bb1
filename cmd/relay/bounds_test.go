package main

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// Bounds on what one client or tenant can make the server hold: each is
// refused with its own error, and no innocent connection is closed for it.

// A presence clientId over MAX_CLIENT_ID_BYTES is refused with an error
// frame; the connection stays usable.
func TestClientIDTooLong(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_CLIENT_ID_BYTES": "16"})
	p := ts.Signup("alice@example.com").CreateProject("demo")
	c := ts.DialWS(p.PublicKey)
	c.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"` + strings.Repeat("x", 17) + `"}`)
	c.Expect(`{"error":"client_id_too_long","channel":"room"}`)
	c.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"` + strings.Repeat("x", 16) + `"}`)
	c.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
	c.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
}

// With MAX_PRESENCE_MEMBERS_PER_CHANNEL members, a new clientId's presence
// subscribe is refused; the members, a repeated clientId and a plain
// subscriber are not affected. A newcomer's sync at the caps is small
// enough for its write queue (the attack: 36 members with 250 KB clientIds
// closed every new presence subscriber with 1013).
func TestPresenceMembersCapped(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_PRESENCE_MEMBERS_PER_CHANNEL": "40"})
	p := ts.Signup("alice@example.com").CreateProject("demo")
	long := func(i int) string { return fmt.Sprintf("%03d", i) + strings.Repeat("m", 125) } // 128 bytes, the default cap
	var members []*wsClient
	for i := range 40 {
		m := ts.PresenceSub(t, p.PublicKey, "room", long(i))
		m.ExpectExcept(`{"type":"presence","channel":"room","event":"sync"}`, "members")
		members = append(members, m)
	}
	extra := ts.DialWS(p.PublicKey)
	extra.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"one-too-many"}`)
	extra.Expect(`{"error":"too_many_presence_members","channel":"room"}`)
	extra.Send(`{"action":"ping"}`)
	extra.Expect(`{"action":"pong","ok":true}`)

	again := ts.PresenceSub(t, p.PublicKey, "room", long(7)) // a second tab of a member
	sync := again.ExpectExcept(`{"type":"presence","channel":"room","event":"sync"}`, "members")
	if n := len(sync["members"].([]any)); n != 40 {
		t.Errorf("sync lists %d members, want 40", n)
	}
	plain := ts.Subscribed(t, p.PublicKey, "room")
	plain.ExpectSilence(100 * time.Millisecond)
	last := members[len(members)-1] // joined last: nothing came after its sync
	last.Send(`{"action":"ping"}`)
	last.Expect(`{"action":"pong","ok":true}`)
}

// MAX_CONNECTIONS_PER_ADDRESS: one client address cannot take a project's
// connections; other projects, and the slot once freed, are not affected.
func TestConnectionsPerAddress(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_CONNECTIONS_PER_ADDRESS": "3"})
	owner := ts.Signup("alice@example.com")
	p, other := owner.CreateProject("a"), owner.CreateProject("b")
	var open []*wsClient
	for range 3 {
		open = append(open, ts.DialWS(p.PublicKey))
	}
	ts.Handshake("/ws?publicKey="+p.PublicKey).Expect(t, http.StatusTooManyRequests, `{"error":"too_many_connections"}`) // the 4th from one address
	ts.DialWS(other.PublicKey)                                                                                           // another project has its own count
	open[0].Conn.Close()
	var c *wsClient
	relaytest.Eventually(t, 5*time.Second, func() bool {
		cc, status, _ := ts.TryDialWS(p.PublicKey)
		c = cc
		return status == http.StatusSwitchingProtocols
	}, "no slot after a connection closed")
	c.Send(`{"action":"ping"}`)
	c.Expect(`{"action":"pong","ok":true}`)
}

// MAX_CHANNELS_PER_PROJECT: a new channel past the cap is refused (emit
// 429, subscribe error frame); existing channels and other projects work.
func TestChannelsPerProject(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_CHANNELS_PER_PROJECT": "2"})
	owner := ts.Signup("alice@example.com")
	p, other := owner.CreateProject("a"), owner.CreateProject("b")
	sub := ts.Subscribed(t, p.PublicKey, "one")
	if r := owner.Emit(p.SecretKey, `{"channel":"two","payload":1}`); r.Status != http.StatusOK {
		t.Fatalf("second channel: %d %s", r.Status, r.Raw)
	}
	owner.Emit(p.SecretKey, `{"channel":"three","payload":1}`).Expect(t, http.StatusTooManyRequests, `{"error":"too_many_channels"}`)
	c := ts.DialWS(p.PublicKey)
	c.Send(`{"action":"subscribe","channel":"four"}`)
	c.Expect(`{"error":"too_many_channels","channel":"four"}`)
	c.Send(`{"action":"unsubscribe","channel":"five"}`) // leaving what it never joined starts nothing
	c.Expect(`{"action":"unsubscribe","channel":"five","ok":true}`)
	if r := owner.Emit(p.SecretKey, `{"channel":"one","payload":2}`); r.Status != http.StatusOK || relaytest.Num(r.JSON, "delivered") != 1 {
		t.Fatalf("existing channel: %d %s", r.Status, r.Raw)
	}
	sub.ExpectExcept(`{"channel":"one","payload":2}`, "seq")
	if r := owner.Emit(other.SecretKey, `{"channel":"three","payload":1}`); r.Status != http.StatusOK {
		t.Fatalf("other project: %d %s", r.Status, r.Raw)
	}
}

// MAX_REPLAY_BYTES_PER_PROJECT: a project's rings together stay under the
// cap; what had to go is reported as a replay_gap, never silently missing.
func TestReplayBytesPerProject(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"MAX_REPLAY_BYTES_PER_PROJECT": "3000"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("a")
	big := `"` + strings.Repeat("x", 1200) + `"`
	first := owner.Emit(p.SecretKey, `{"channel":"a","payload":`+big+`}`)
	owner.Emit(p.SecretKey, `{"channel":"a","payload":`+big+`}`)
	b1 := owner.Emit(p.SecretKey, `{"channel":"b","payload":`+big+`}`) // over the project's 3000 bytes: not kept
	since := fmt.Sprint(int64(relaytest.Num(first.JSON, "seq")) - 1)
	c := ts.DialWS(p.PublicKey)
	c.Send(`{"action":"subscribe","channel":"a","since":` + since + `}`)
	c.ExpectExcept(`{"channel":"a","replay":true}`, "payload", "seq")
	c.ExpectExcept(`{"channel":"a","replay":true}`, "payload", "seq")
	c.Expect(`{"action":"subscribe","channel":"a","ok":true}`)
	sinceB := fmt.Sprint(int64(relaytest.Num(b1.JSON, "seq")) - 1)
	c.Send(`{"action":"subscribe","channel":"b","since":` + sinceB + `}`)
	c.Expect(`{"type":"replay_gap","channel":"b","since":` + sinceB + `}`)
	c.Expect(`{"action":"subscribe","channel":"b","ok":true}`)
}

// MAX_PROJECTS_PER_USER, on both stores, through the API and the dashboard.
func TestProjectsPerUser(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"MAX_PROJECTS_PER_USER": "2"})
		owner := ts.Signup("alice@example.com")
		owner.CreateProject("one")
		owner.CreateProject("two")
		owner.Do("POST", "/api/projects", `{"name":"three"}`).Expect(t, http.StatusForbidden, `{"error":"too_many_projects"}`)
		ts.Signup("bob@example.com").CreateProject("bob's") // per user
		if r := owner.Do("GET", "/api/projects", ""); r.Status != http.StatusOK || strings.Count(r.Raw, `"name"`) != 2 {
			t.Errorf("projects after the refusal: %d %s", r.Status, r.Raw)
		}

		// The dashboard: the home page again, with the reason, the name
		// typed kept in the form, and still two projects listed.
		d := ts.Dash(t)
		d.Signup("carol@example.com")
		d.Create("one")
		d.Create("two")
		page := d.Submit("/", "/projects", url.Values{"name": {"three"}})
		page.ExpectError(t, http.StatusForbidden,
			"You have reached the number of projects an account may have (MAX_PROJECTS_PER_USER). Delete one to create another.")
		if n := strings.Count(page.Body, `<a href="/projects/`); n != 2 || !strings.Contains(page.Body, `value="three"`) {
			t.Fatalf("refused page lists %d projects (want 2) or lost the name typed:\n%s", n, page.Body)
		}
		if n := strings.Count(d.Get("/").Body, `<a href="/projects/`); n != 2 {
			t.Fatalf("home lists %d projects after the refusal, want 2", n)
		}
	})
}

// MAX_REVOCATIONS_PER_PROJECT and REVOKE_REQUESTS_PER_MINUTE, on both stores.
// Revoking is idempotent at the cap too: a value the project holds already
// is revoked again (it takes no further room); one paired with a new value
// is not.
func TestRevocationBounds(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, map[string]string{"MAX_REVOCATIONS_PER_PROJECT": "2", "REVOKE_REQUESTS_PER_MINUTE": "5"}, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("a")
		revoke := func(body string) response {
			return owner.Send("POST", "/emit-tokens/revoke", body, "application/json", map[string]string{"Authorization": "Bearer " + p.SecretKey})
		}
		revoke(`{"jti":"one"}`).Expect(t, http.StatusOK, `{"ok":true}`)
		revoke(`{"jti":"two"}`).Expect(t, http.StatusOK, `{"ok":true}`)
		revoke(`{"jti":"three"}`).Expect(t, http.StatusTooManyRequests, `{"error":"too_many_revocations"}`)
		revoke(`{"jti":"one"}`).Expect(t, http.StatusOK, `{"ok":true}`)
		revoke(`{"jti":"one","clientId":"new"}`).Expect(t, http.StatusTooManyRequests, `{"error":"too_many_revocations"}`)
		r := revoke(`{"jti":"five"}`) // the sixth request this minute
		r.Expect(t, http.StatusTooManyRequests, `{"error":"too_many_attempts"}`)
		if r.Header.Get("Retry-After") == "" {
			t.Error("no Retry-After")
		}
		// Revocations stop counting once no token can match them (the token
		// TTL cap, 600 s, plus a minute), and the revoke budget is per minute.
		clock.Advance(12 * time.Minute)
		revoke(`{"jti":"six"}`).Expect(t, http.StatusOK, `{"ok":true}`)
	})
}

// Revoking or rotating a public key closes the sockets opened with it (4001);
// sockets of the project's other keys stay.
func TestRevokedPublicKeyClosesItsSockets(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("a")
		old := ts.Subscribed(t, p.PublicKey, "room")
		r := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public"}`)
		if r.Status != http.StatusCreated && r.Status != http.StatusOK {
			t.Fatalf("rotate: %d %s", r.Status, r.Raw)
		}
		f := old.ExpectClose(4001, 5*time.Second)
		if f.Reason != "key revoked" {
			t.Errorf("close reason %q", f.Reason)
		}
		newKey, activeID := r.Str("key", "raw"), r.Str("key", "id")
		if newKey == "" || activeID == "" {
			t.Fatalf("no new key in %s", r.Raw)
		}
		fresh := ts.Subscribed(t, newKey, "room")
		secretSocketsUnaffected := owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`)
		if secretSocketsUnaffected.Status != http.StatusOK {
			t.Fatalf("emit: %s", secretSocketsUnaffected.Raw)
		}
		fresh.ExpectExcept(`{"channel":"room","payload":1}`, "seq")
		owner.Do("POST", "/api/projects/"+p.ID+"/keys/"+activeID+"/revoke", "").Expect(t, http.StatusOK, `{"ok":true}`)
		fresh.ExpectClose(4001, 5*time.Second)
	})
}

// The attack rows, against the real binary with every limit at its default,
// its RSS read from /proc: 50 sockets sending presence subscriptions with
// 100 KB clientIds (each refused) and a secret key holder emitting 130 KB
// payloads over 250 channels. Before the bounds these added 1.78 GiB and
// 401 MiB; the figure here is bounded by the limits, not by the traffic.
func TestAttackRowsStayBounded(t *testing.T) {
	t.Parallel()
	proc := relaytest.StartBinary(t)
	ts := binaryServer(t, proc)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("target")
	rss := func() float64 { return relaytest.RSS(t, proc.Cmd.Process.Pid) / 1024 }
	before := rss()
	huge := strings.Repeat("x", 100_000)
	var socks []*wsClient
	for range 50 {
		c := ts.DialWS(p.PublicKey)
		for ch := range 5 {
			c.Send(fmt.Sprintf(`{"action":"subscribe","channel":"c%d","presence":true,"clientId":"%s"}`, ch, huge))
		}
		socks = append(socks, c)
	}
	for _, c := range socks {
		for ch := range 5 {
			c.Expect(fmt.Sprintf(`{"error":"client_id_too_long","channel":"c%d"}`, ch))
		}
	}
	payload := `"` + strings.Repeat("y", 130_000) + `"`
	for i := range 500 {
		if r := owner.EmitNoFail(p.SecretKey, fmt.Sprintf(`{"channel":"e%d","payload":%s}`, i%250, payload)); r.Status != http.StatusOK {
			t.Fatalf("emit %d: %d %s", i, r.Status, r.Raw)
		}
	}
	grown := rss() - before
	t.Logf("RSS %.0f MiB before, +%.0f MiB after 250 refused 100 KB clientIds and 500 emits of 130 KB", before, grown)
	// 32 MiB of replay at most, plus buffers and the garbage of 65 MB of
	// payloads that the collector has not returned yet.
	if grown > 128 {
		t.Errorf("RSS grew %.0f MiB", grown)
	}
}

// MAX_QUEUED_BYTES_PER_CONNECTION: a subscriber that stops reading stays
// while everything it was sent fits in its write queue's cap, and is closed
// as a slow consumer (1013 "slow consumer", or no frame when its socket is
// full) in the emit that finds the queue over the cap, at the latest once it
// was sent the cap plus what the kernel's socket buffers hold. The cap here
// is 8 MiB, above the default (2 MiB) by more than those buffers: a setting
// that did not reach the transport would close it too early.
func TestQueuedBytesPerConnection(t *testing.T) {
	t.Parallel()
	const queueCap = 8 << 20
	absorbed, ok := lcSocketBuffers()
	if !ok || 2<<20+absorbed+len(lcBigPayload) >= queueCap {
		t.Fatalf("this host's TCP socket buffers (%d bytes with tcp_wmem's maximum) are too big to tell an 8 MiB queue from a 2 MiB one", absorbed)
	}
	ts := debugServer(t, map[string]string{"MAX_QUEUED_BYTES_PER_CONNECTION": fmt.Sprint(queueCap),
		"EMIT_RATE_LIMIT_PER_MINUTE": "100000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	slow := lcDialSmallBuffer(t, ts, p.PublicKey)
	// Bounds on the bytes queued for it: its frames carry a channel and a
	// seq besides the payload, and the probes of lcSubscribeUnread are small.
	sentHi := 100 * lcSubscribeUnread(t, slow, owner, p.SecretKey, "firehose")
	sentLo := 0
	for {
		r := owner.Emit(p.SecretKey, `{"channel":"firehose","payload":`+lcBigPayload+`}`)
		if r.Status != http.StatusOK || relaytest.Num(r.JSON, "subscriberCount") != 1 {
			t.Fatalf("emit after %d bytes: %d %s", sentLo, r.Status, r.Raw)
		}
		sentLo, sentHi = sentLo+len(lcBigPayload), sentHi+len(lcBigPayload)+100
		if relaytest.Num(r.JSON, "delivered") == 1 {
			if sentLo > queueCap+absorbed {
				t.Fatalf("still queued after %d bytes to a peer that does not read: the %d-byte cap is not applied", sentLo, queueCap)
			}
			continue
		}
		if sentHi <= queueCap {
			t.Fatalf("dropped after at most %d bytes, within MAX_QUEUED_BYTES_PER_CONNECTION (%d)", sentHi, queueCap)
		}
		break
	}
	lcExpectSlowConsumerEnd(t, slow)
	// The queue overflowed (abrupt=false), not a blocked write's timeout.
	lcWaitLogs(t, ts.Logs, map[*regexp.Regexp]int{
		regexp.MustCompile(lcCloseLog("slow_consumer", 1013).String() + `reason="slow consumer" abrupt=false `): 1})
	mtWaitMetrics(t, ts, mtSample{"relay_connections_closed_total", `cause="slow_consumer"`, 1})
	relaytest.Eventually(t, 5*time.Second, func() bool {
		return relaytest.Num(owner.Emit(p.SecretKey, `{"channel":"firehose","payload":1}`).JSON, "subscriberCount") == 0
	}, "the slow consumer unsubscribed")
}

// A subscribe refused by a cap is not left behind on the connection: it does
// not use up one of the connection's MAX_SUBSCRIPTIONS_PER_CONNECTION.
func TestRefusedSubscribeIsForgotten(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{
		"MAX_CHANNELS_PER_PROJECT": "2", "MAX_SUBSCRIPTIONS_PER_CONNECTION": "2", "MAX_PRESENCE_MEMBERS_PER_CHANNEL": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("a")
	if r := owner.Emit(p.SecretKey, `{"channel":"alpha","payload":1}`); r.Status != http.StatusOK {
		t.Fatalf("emit: %d %s", r.Status, r.Raw)
	}
	ts.PresenceSub(t, p.PublicKey, "alpha", "first").Expect(`{"type":"presence","channel":"alpha","event":"sync","members":[]}`)
	c := ts.DialWS(p.PublicKey)
	c.Send(`{"action":"subscribe","channel":"one"}`) // the project's second channel
	c.Expect(`{"action":"subscribe","channel":"one","ok":true}`)
	c.Send(`{"action":"subscribe","channel":"alpha","presence":true,"clientId":"second"}`)
	c.Expect(`{"error":"too_many_presence_members","channel":"alpha"}`)
	c.Send(`{"action":"subscribe","channel":"two"}`)
	c.Expect(`{"error":"too_many_channels","channel":"two"}`)
	// Had either refusal stayed recorded, this would be too_many_subscriptions.
	c.Send(`{"action":"subscribe","channel":"alpha"}`)
	c.Expect(`{"action":"subscribe","channel":"alpha","ok":true}`)
	if r := owner.Emit(p.SecretKey, `{"channel":"alpha","payload":2}`); relaytest.Num(r.JSON, "delivered") != 2 {
		t.Fatalf("emit after the subscribe: %s", r.Raw)
	}
}
