package main

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestTenantIsolation: two projects (two owners) use the same channel names
// and clientIds; no key of one reaches anything of the other, on any surface.
func TestTenantIsolation(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		aliceC, bobC := ts.signup("alice@example.com"), ts.signup("bob@example.com")
		a, b := aliceC.createProject("a"), bobC.createProject("b")
		secretA := aliceC.do("PATCH", "/api/projects/"+a.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
		secretB := bobC.do("PATCH", "/api/projects/"+b.id+"/client-emit-secret", `{}`).str("clientEmitSecret")

		// Same channel, same clientId, in both projects, with presence.
		subA := presenceSub(t, ts, a.publicKey, "shared", "x")
		subA.expect(`{"type":"presence","channel":"shared","event":"sync","members":[]}`)
		subB := presenceSub(t, ts, b.publicKey, "shared", "x")
		subB.expect(`{"type":"presence","channel":"shared","event":"sync","members":[]}`) // A's "x" is not a member here
		subB2 := presenceSub(t, ts, b.publicKey, "shared", "y")
		subB2.expect(`{"type":"presence","channel":"shared","event":"sync","members":["x"]}`)
		subB.expect(`{"type":"presence","channel":"shared","event":"join","clientId":"y"}`)

		// Emit: A's secret key reaches only A's subscribers.
		r := aliceC.emit(a.secretKey, `{"channel":"shared","payload":"for a"}`)
		if num(r.json, "subscriberCount") != 1 {
			t.Fatalf("A's emit counted %v subscribers", r.json["subscriberCount"])
		}
		subA.expectExcept(`{"channel":"shared","payload":"for a"}`, "seq")
		// Replay: B asking for everything since 0 gets nothing of A.
		replayB := ts.dialWS(b.publicKey)
		replayB.send(`{"action":"subscribe","channel":"shared","since":0}`)
		replayB.expect(`{"type":"replay_gap","channel":"shared","since":0}`)
		replayB.expect(`{"action":"subscribe","channel":"shared","ok":true}`)

		// Client-emit: a token of A on B's connection, and B's secret's token for A's project id, fail.
		tokA, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secretA, ProjectID: a.id, Channel: "shared", ClientID: "x", Types: []string{"t"}, TTL: time.Minute})
		subB.send(emitFrame2("shared", tokA))
		subB.expect(`{"error":"invalid_emit_token","channel":"shared"}`)
		forged, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secretB, ProjectID: a.id, Channel: "shared", ClientID: "x", Types: []string{"t"}, TTL: time.Minute})
		subA.send(emitFrame2("shared", forged))
		subA.expect(`{"error":"invalid_emit_token","channel":"shared"}`)

		// Revoke: B's secret key revoking clientId x does not touch A's x.
		bobC.revoke(b.secretKey, `{"clientId":"x"}`).expect(t, 200, `{"ok":true}`)
		subA.send(emitFrame2("shared", tokA))
		subA.expectExcept(`{"action":"emit","channel":"shared","ok":true}`, "seq")
		tokB, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secretB, ProjectID: b.id, Channel: "shared", ClientID: "x", Types: []string{"t"}, TTL: time.Minute, Now: time.Now().Add(-2 * time.Second)})
		subB.send(emitFrame2("shared", tokB))
		subB.expect(`{"error":"emit_token_revoked","channel":"shared"}`)

		// Nothing of A reached B's subscribers, nothing of B reached A's.
		subB.expectSilence(200 * time.Millisecond)
		subB2.expectSilence(50 * time.Millisecond)
		subA.expectSilence(50 * time.Millisecond)

		// Keys: A's keys are refused for B's control-plane objects, and the
		// control plane answers 404 across owners (also covered per route).
		bobC.do("GET", "/api/projects/"+a.id+"/keys", "").expect(t, 404, `{"error":"project_not_found"}`)
		if rows, _ := ts.app.store.Revocations(context.Background(), a.id, time.Now()); len(rows) != 0 {
			t.Fatalf("B's revocation landed on A: %+v", rows)
		}
	})
}

func emitFrame2(channel, token string) string {
	return `{"action":"emit","channel":"` + channel + `","type":"t","payload":1,"token":"` + token + `"}`
}

// TestSecretsNeverLogged runs a full session at debug level and looks for
// every raw key and secret it created in the logs.
func TestSecretsNeverLogged(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"SESSION_SECRET": strings.Repeat("s3cr3t-", 6), "LOG_FORMAT": "json"})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	rot := owner.do("POST", "/api/projects/"+p.id+"/keys", `{"keyType":"public"}`)
	ces := owner.do("PATCH", "/api/projects/"+p.id+"/client-emit-secret", `{"regenerate":true}`).str("clientEmitSecret")
	if err := ts.app.store.SaveSettings(context.Background(), store.Settings{ProjectID: p.id, WebhookURL: "http://127.0.0.1:1/x", WebhookSecret: "whsec-very-secret-value"}); err != nil {
		t.Fatal(err)
	}
	ts.app.actors.SettingsChanged(p.id)
	c := presenceSub(t, ts, rot.str("key", "raw"), "a", "u")
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: ces, ProjectID: p.id, Channel: "a", ClientID: "u", Types: []string{"t"}, TTL: time.Minute})
	c.send(emitFrame2("a", tok))
	owner.emit(p.secretKey, `{"channel":"a","payload":1}`)
	ts.client().emit("sk_live_"+strings.Repeat("z", 32), `{"channel":"a","payload":1}`)
	ts.client().do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong-password-123"}`)
	var cookie string
	for _, ck := range owner.http.Jar.Cookies(mustURL(ts.base)) {
		cookie = ck.Value
	}
	ts.stop()
	logs := ts.logs.String()
	if len(logs) < 500 {
		t.Fatalf("suspiciously short logs:\n%s", logs)
	}
	for name, secret := range map[string]string{
		"public key": p.publicKey, "secret key": p.secretKey, "rotated key": rot.str("key", "raw"),
		"client-emit secret": ces, "webhook secret": "whsec-very-secret-value", "session secret": strings.Repeat("s3cr3t-", 6),
		"session cookie": cookie, "client-emit token": tok, "unknown key": "sk_live_" + strings.Repeat("z", 32),
		"password": "correct horse", "wrong password": "wrong-password-123",
	} {
		if secret == "" {
			t.Fatalf("%s is empty: the test did not get it", name)
		}
		if strings.Contains(logs, secret) {
			t.Errorf("the %s appears in the logs", name)
		}
	}
}

func mustURL(raw string) *neturl.URL {
	u, err := neturl.Parse(raw)
	if err != nil {
		panic(err)
	}
	return u
}
