package main

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestTenantIsolation: two projects (two owners) use the same channel names
// and clientIds; no key of one reaches anything of the other, on any surface.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		aliceC, bobC := ts.Signup("alice@example.com"), ts.Signup("bob@example.com")
		a, b := aliceC.CreateProject("a"), bobC.CreateProject("b")
		secretA := aliceC.Do("PATCH", "/api/projects/"+a.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		secretB := bobC.Do("PATCH", "/api/projects/"+b.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")

		// Same channel, same clientId, in both projects, with presence.
		subA := ts.PresenceSub(t, a.PublicKey, "shared", "x")
		subA.Expect(`{"type":"presence","channel":"shared","event":"sync","members":[]}`)
		subB := ts.PresenceSub(t, b.PublicKey, "shared", "x")
		subB.Expect(`{"type":"presence","channel":"shared","event":"sync","members":[]}`) // A's "x" is not a member here
		subB2 := ts.PresenceSub(t, b.PublicKey, "shared", "y")
		subB2.Expect(`{"type":"presence","channel":"shared","event":"sync","members":["x"]}`)
		subB.Expect(`{"type":"presence","channel":"shared","event":"join","clientId":"y"}`)

		// Emit: A's secret key reaches only A's subscribers.
		r := aliceC.Emit(a.SecretKey, `{"channel":"shared","payload":"for a"}`)
		if relaytest.Num(r.JSON, "subscriberCount") != 1 {
			t.Fatalf("A's emit counted %v subscribers", r.JSON["subscriberCount"])
		}
		subA.ExpectExcept(`{"channel":"shared","payload":"for a"}`, "seq")
		// Replay: B asking for everything since 0 gets nothing of A.
		replayB := ts.DialWS(b.PublicKey)
		replayB.Send(`{"action":"subscribe","channel":"shared","since":0}`)
		replayB.Expect(`{"type":"replay_gap","channel":"shared","since":0}`)
		replayB.Expect(`{"action":"subscribe","channel":"shared","ok":true}`)

		// Client-emit: a token of A on B's connection, and B's secret's token for A's project id, fail.
		tokA, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secretA, ProjectID: a.ID, Channel: "shared", ClientID: "x", Types: []string{"t"}, TTL: time.Minute})
		subB.Send(relaytest.EmitFrame("shared", "t", "1", tokA))
		subB.Expect(`{"error":"invalid_emit_token","channel":"shared"}`)
		forged, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secretB, ProjectID: a.ID, Channel: "shared", ClientID: "x", Types: []string{"t"}, TTL: time.Minute})
		subA.Send(relaytest.EmitFrame("shared", "t", "1", forged))
		subA.Expect(`{"error":"invalid_emit_token","channel":"shared"}`)

		// Revoke: B's secret key revoking clientId x does not touch A's x.
		bobC.Revoke(b.SecretKey, `{"clientId":"x"}`).Expect(t, 200, `{"ok":true}`)
		subA.Send(relaytest.EmitFrame("shared", "t", "1", tokA))
		subA.ExpectExcept(`{"action":"emit","channel":"shared","ok":true}`, "seq")
		tokB, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secretB, ProjectID: b.ID, Channel: "shared", ClientID: "x", Types: []string{"t"}, TTL: time.Minute, Now: time.Now().Add(-2 * time.Second)})
		subB.Send(relaytest.EmitFrame("shared", "t", "1", tokB))
		subB.Expect(`{"error":"emit_token_revoked","channel":"shared"}`)

		// Nothing of A reached B's subscribers, nothing of B reached A's.
		subB.ExpectSilence(200 * time.Millisecond)
		subB2.ExpectSilence(50 * time.Millisecond)
		subA.ExpectSilence(50 * time.Millisecond)

		// Keys: A's keys are refused for B's control-plane objects, and the
		// control plane answers 404 across owners (also covered per route).
		bobC.Do("GET", "/api/projects/"+a.ID+"/keys", "").Expect(t, 404, `{"error":"project_not_found"}`)
		if rows, _ := ts.app.store.Revocations(context.Background(), a.ID, time.Now()); len(rows) != 0 {
			t.Fatalf("B's revocation landed on A: %+v", rows)
		}
	})
}

// TestSecretsNeverLogged runs a full session at debug level and looks for
// every raw key and secret it created in the logs.
func TestSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"SESSION_SECRET": strings.Repeat("s3cr3t-", 6), "LOG_FORMAT": "json"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	rot := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public"}`)
	ces := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{"regenerate":true}`).Str("clientEmitSecret")
	if err := ts.app.store.SaveSettings(context.Background(), store.Settings{ProjectID: p.ID, WebhookURL: "http://127.0.0.1:1/x", WebhookSecret: "whsec-very-secret-value"}); err != nil {
		t.Fatal(err)
	}
	ts.app.actors.SettingsChanged(p.ID)
	c := ts.PresenceSub(t, rot.Str("key", "raw"), "a", "u")
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: ces, ProjectID: p.ID, Channel: "a", ClientID: "u", Types: []string{"t"}, TTL: time.Minute})
	c.Send(relaytest.EmitFrame("a", "t", "1", tok))
	owner.Emit(p.SecretKey, `{"channel":"a","payload":1}`)
	ts.Client().Emit("sk_live_"+strings.Repeat("z", 32), `{"channel":"a","payload":1}`)
	ts.Client().Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong-password-123"}`)
	var cookie string
	for _, ck := range owner.HTTP.Jar.Cookies(mustURL(ts.Base)) {
		cookie = ck.Value
	}
	ts.Stop()
	logs := ts.Logs.String()
	if len(logs) < 500 {
		t.Fatalf("suspiciously short logs:\n%s", logs)
	}
	for name, secret := range map[string]string{
		"public key": p.PublicKey, "secret key": p.SecretKey, "rotated key": rot.Str("key", "raw"),
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
