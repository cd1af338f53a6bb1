package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/store/storetest"
)

// dialWithToken connects with a connection token (channel authorization).
func (ts *testServer) dialWithToken(publicKey, token string) *wsClient {
	ts.t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	conn, _, err := d.Dial(ts.wsURL(publicKey)+"&token="+url.QueryEscape(token), nil)
	if err != nil {
		ts.t.Fatalf("dial with a token: %v", err)
	}
	c := &wsClient{t: ts.t, conn: conn, frames: make(chan frame, 1024)}
	ts.t.Cleanup(func() { conn.Close() })
	go c.readLoop()
	return c
}

// Channel authorization end to end, on both stores, over real sockets:
// off, the protocol is as before (a token is ignored, refresh unknown); on,
// handshakes check the connection token, private channels need a grant,
// presence is the token's sub, and live connections follow the setting.
func TestChannelAuthorization(t *testing.T) {
	t.Parallel() // waits on real time: it overlaps the others that do (Makefile: -parallel)
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")

		// Off: a token is ignored, private- is a channel name like any.
		off := ts.dialWithToken(p.publicKey, "junk")
		off.send(`{"action":"subscribe","channel":"private-x","presence":true,"clientId":"anyone"}`)
		off.expect(`{"action":"subscribe","channel":"private-x","ok":true}`)
		off.expect(`{"type":"presence","channel":"private-x","event":"sync","members":[]}`)
		off.send(`{"action":"refresh","token":"junk"}`)
		off.expect(`{"error":"unknown_action"}`)
		anon := ts.dialWS(p.publicKey) // opened while off; follows the setting from now on

		on := owner.do("PATCH", "/api/projects/"+p.id+"/authorization", `{"authorization":true}`)
		if on.status != http.StatusOK || on.str("secret") == "" {
			t.Fatalf("turning authorization on: %d %s", on.status, on.raw)
		}
		secret := on.str("secret")
		mint := func(sub string, ttl time.Duration, channels map[string][]string) string {
			tok, err := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: secret, UserID: sub, TTL: ttl, Channels: channels})
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}

		// Handshakes: a bad or expired token is refused before the upgrade.
		bad, _ := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: "not-the-secret", UserID: "u", TTL: time.Hour})
		expired, _ := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: secret, UserID: "u", TTL: time.Minute, Now: time.Now().Add(-time.Hour)})
		for token, want := range map[string]string{"junk": `{"error":"invalid_token"}`, bad: `{"error":"invalid_token"}`, expired: `{"error":"token_expired"}`} {
			r := ts.handshake("/ws?publicKey=" + url.QueryEscape(p.publicKey) + "&token=" + url.QueryEscape(token))
			r.expect(t, http.StatusUnauthorized, want)
		}
		// The key's 401 comes first.
		ts.handshake("/ws?publicKey=pk_live_nope&token=junk").expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)

		// A user with a grant of private-user-42.
		u42 := ts.dialWithToken(p.publicKey, mint("user-42", time.Hour, map[string][]string{"private-user-42": {"subscribe", "presence"}}))
		u42.send(`{"action":"subscribe","channel":"private-user-42","presence":true,"clientId":"user-42"}`)
		u42.expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
		u42.expect(`{"type":"presence","channel":"private-user-42","event":"sync","members":[]}`)
		u42.send(`{"action":"subscribe","channel":"private-user-43"}`)
		u42.expect(`{"error":"channel_forbidden","channel":"private-user-43"}`)
		u42.send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-43"}`)
		u42.expect(`{"error":"client_id_mismatch","channel":"lobby"}`)

		// A subscribe token for a channel learnt later; a bad one is named.
		doc, _ := backend.MintSubscribeToken(backend.SubscribeTokenOptions{Secret: secret, Channel: "private-doc-9", UserID: "user-42", TTL: time.Minute})
		u42.send(`{"action":"subscribe","channel":"private-doc-9","token":"` + doc + `"}`)
		u42.expect(`{"action":"subscribe","channel":"private-doc-9","ok":true}`)
		u42.send(`{"action":"subscribe","channel":"private-doc-10","token":"` + doc + `"}`)
		u42.expect(`{"error":"invalid_subscribe_token","channel":"private-doc-10"}`)

		// The anonymous connection opened while it was off: public only, no presence.
		anon.send(`{"action":"subscribe","channel":"private-user-42"}`)
		anon.expect(`{"error":"channel_forbidden","channel":"private-user-42"}`)
		anon.send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-42"}`)
		anon.expect(`{"error":"token_required","channel":"lobby"}`)
		anon.send(`{"action":"subscribe","channel":"lobby"}`)
		anon.expect(`{"action":"subscribe","channel":"lobby","ok":true}`)

		// An emit reaches the one granted subscriber, and only it.
		r := ts.client().send("POST", "/emit", `{"channel":"private-user-42","payload":{"n":1}}`, "application/json",
			map[string]string{"Authorization": "Bearer " + p.secretKey})
		if r.status != http.StatusOK || r.json["subscriberCount"] != float64(1) {
			t.Fatalf("emit: %d %s", r.status, r.raw)
		}
		u42.expectExcept(`{"channel":"private-user-42","payload":{"n":1}}`, "seq")
		anon.expectSilence(100 * time.Millisecond)

		// Refresh on the socket, for the same user only.
		u42.send(`{"action":"refresh","token":"` + mint("user-43", time.Hour, nil) + `"}`)
		u42.expect(`{"error":"invalid_token"}`)
		u42.send(`{"action":"refresh","token":"` + mint("user-42", 2*time.Hour, map[string][]string{"private-user-*": {"subscribe"}}) + `"}`)
		u42.expect(`{"action":"refresh","ok":true}`)
		u42.send(`{"action":"subscribe","channel":"private-user-43"}`)
		u42.expect(`{"action":"subscribe","channel":"private-user-43","ok":true}`)

		// A token about to expire: told at once, closed 4011 when it has.
		short := ts.dialWithToken(p.publicKey, mint("user-44", 3*time.Second, nil))
		m := short.expectExcept(`{"type":"token_expiring"}`, "exp")
		if exp, _ := m["exp"].(float64); exp < float64(time.Now().Unix()) || exp > float64(time.Now().Add(4*time.Second).Unix()) {
			t.Fatalf("token_expiring exp %v", m["exp"])
		}
		short.expectClose(4011, 10*time.Second)

		// A disconnect that sticks: the user's sockets close (4003), a token
		// minted before it is refused with 4012, one minted after gets in;
		// the clientId's client-emit tokens issued before it are revoked too.
		before := mint("user-42", time.Hour, nil)
		emitSecret := owner.do("PATCH", "/api/projects/"+p.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
		emitToken := func(at time.Time) string {
			tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: emitSecret, ProjectID: p.id, Channel: "lobby", ClientID: "user-42",
				Types: []string{"chat"}, TTL: time.Minute, Now: at})
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}
		emitBefore := emitToken(time.Now())
		r = ts.client().send("POST", "/clients/user-42/disconnect", `{"revokeTokens":true}`, "application/json",
			map[string]string{"Authorization": "Bearer " + p.secretKey})
		r.expect(t, http.StatusOK, `{"ok":true,"closed":1}`)
		u42.expectClose(4003, 5*time.Second)
		ts.dialWithToken(p.publicKey, before).expectClose(4012, 5*time.Second)
		after, _ := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: secret, UserID: "user-42", TTL: time.Hour,
			Now: time.Now().Add(time.Second)}) // iat in whole seconds, after the revocation's
		back := ts.dialWithToken(p.publicKey, after)
		back.send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-42"}`)
		back.expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
		back.expect(`{"type":"presence","channel":"lobby","event":"sync","members":[]}`)
		back.send(`{"action":"emit","channel":"lobby","type":"chat","payload":1,"token":"` + emitBefore + `"}`)
		back.expect(`{"error":"emit_token_revoked","channel":"lobby"}`)
		back.send(`{"action":"emit","channel":"lobby","type":"chat","payload":2,"token":"` + emitToken(time.Now().Add(time.Second)) + `"}`)
		back.expectExcept(`{"action":"emit","channel":"lobby","ok":true}`, "seq")
		// anon, on lobby, gets only the emit of the token issued after the revocation.
		anon.expectExcept(`{"channel":"lobby","type":"chat","payload":2,"clientId":"user-42"}`, "seq")
		ts.dialWithToken(p.publicKey, mint("user-45", time.Hour, nil)).expectSilence(200 * time.Millisecond) // another user is not covered

		// Channels the project marks private besides the private- ones.
		r = owner.do("PATCH", "/api/projects/"+p.id+"/authorization", `{"privateChannels":["vault","team-*","vault"]}`)
		if r.status != http.StatusOK || canonical(r.json["privateChannels"]) != `["team-*","vault"]` || r.json["authorization"] != true {
			t.Fatalf("marking channels private: %d %s", r.status, r.raw)
		}
		anon.send(`{"action":"subscribe","channel":"team-7"}`)
		anon.expect(`{"error":"channel_forbidden","channel":"team-7"}`)
		anon.send(`{"action":"subscribe","channel":"teams"}`)
		anon.expect(`{"action":"subscribe","channel":"teams","ok":true}`)
		team := ts.dialWithToken(p.publicKey, mint("user-46", time.Hour, map[string][]string{"team-*": {"subscribe"}}))
		team.send(`{"action":"subscribe","channel":"team-7"}`)
		team.expect(`{"action":"subscribe","channel":"team-7","ok":true}`)
		for body, want := range map[string]string{
			`{"privateChannels":["bad channel!"]}`:                             `{"error":"invalid_private_channels"}`,
			`{"privateChannels":["*x"]}`:                                       `{"error":"invalid_private_channels"}`,
			`{"privateChannels":["a",` + strings.Repeat(`"b",`, 100) + `"c"]}`: `{"error":"invalid_private_channels"}`,
			`{"privateChannels":"vault"}`:                                      `{"error":"invalid_json"}`,
		} {
			owner.do("PATCH", "/api/projects/"+p.id+"/authorization", body).expect(t, http.StatusBadRequest, want)
		}
		if r := owner.do("GET", "/api/projects/"+p.id+"/authorization", ""); canonical(r.json["privateChannels"]) != `["team-*","vault"]` {
			t.Fatalf("a refused change changed them: %s", r.raw)
		}

		// Off again: the anonymous connection may subscribe to private- channels.
		if r := owner.do("PATCH", "/api/projects/"+p.id+"/authorization", `{"authorization":false}`); r.status != http.StatusOK || r.json["authorization"] != false {
			t.Fatalf("turning authorization off: %d %s", r.status, r.raw)
		}
		anon.send(`{"action":"subscribe","channel":"private-user-42"}`)
		anon.expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
	})
}

// On a project without channel authorization a disconnect's body is
// ignored, as SPEC.md says: revokeTokens revokes nothing (the clientId's
// client-emit tokens still work).
func TestDisconnectBodyIgnoredWithoutAuthorization(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("demo")
	secret := owner.do("PATCH", "/api/projects/"+p.id+"/client-emit-secret", `{}`).str("clientEmitSecret")
	r := ts.client().send("POST", "/clients/ann/disconnect", `{"revokeTokens":true}`, "application/json",
		map[string]string{"Authorization": "Bearer " + p.secretKey})
	r.expect(t, http.StatusOK, `{"ok":true,"closed":0}`)
	c := ts.dialWS(p.publicKey)
	c.send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"ann"}`)
	c.expect(`{"action":"subscribe","channel":"room","ok":true}`)
	c.expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.id, Channel: "room", ClientID: "ann",
		Types: []string{"chat"}, TTL: time.Minute, Now: time.Now().Add(-2 * time.Second)}) // issued before the disconnect
	c.send(`{"action":"emit","channel":"room","type":"chat","payload":1,"token":"` + tok + `"}`)
	c.expectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
}
