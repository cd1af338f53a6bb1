package wire

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// Channel authorization end to end, on both stores, over real sockets:
// off, the protocol is as before (a token is ignored, refresh unknown); on,
// handshakes check the connection token, private channels need a grant,
// presence is the token's sub, and live connections follow the setting.
func TestChannelAuthorization(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")

		// Off: a token is ignored, private- is a channel name like any.
		off := ts.DialWithToken(p.PublicKey, "junk")
		off.Send(`{"action":"subscribe","channel":"private-x","presence":true,"clientId":"anyone"}`)
		off.Expect(`{"action":"subscribe","channel":"private-x","ok":true}`)
		off.Expect(`{"type":"presence","channel":"private-x","event":"sync","members":[]}`)
		off.Send(`{"action":"refresh","token":"junk"}`)
		off.Expect(`{"error":"unknown_action"}`)
		anon := ts.DialWS(p.PublicKey) // opened while off; follows the setting from now on

		on := owner.Do("PATCH", "/api/projects/"+p.ID+"/authorization", `{"authorization":true}`)
		if on.Status != http.StatusOK || on.Str("secret") == "" {
			t.Fatalf("turning authorization on: %d %s", on.Status, on.Raw)
		}
		secret := on.Str("secret")
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
			r := ts.Handshake("/ws?publicKey=" + url.QueryEscape(p.PublicKey) + "&token=" + url.QueryEscape(token))
			r.Expect(t, http.StatusUnauthorized, want)
		}
		// The key's 401 comes first.
		ts.Handshake("/ws?publicKey=pk_live_nope&token=junk").Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)

		// A user with a grant of private-user-42.
		u42 := ts.DialWithToken(p.PublicKey, mint("user-42", time.Hour, map[string][]string{"private-user-42": {"subscribe", "presence"}}))
		u42.Send(`{"action":"subscribe","channel":"private-user-42","presence":true,"clientId":"user-42"}`)
		u42.Expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
		u42.Expect(`{"type":"presence","channel":"private-user-42","event":"sync","members":[]}`)
		u42.Send(`{"action":"subscribe","channel":"private-user-43"}`)
		u42.Expect(`{"error":"channel_forbidden","channel":"private-user-43"}`)
		u42.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-43"}`)
		u42.Expect(`{"error":"client_id_mismatch","channel":"lobby"}`)

		// A subscribe token for a channel learnt later; a bad one is named.
		doc, _ := backend.MintSubscribeToken(backend.SubscribeTokenOptions{Secret: secret, Channel: "private-doc-9", UserID: "user-42", TTL: time.Minute})
		u42.Send(`{"action":"subscribe","channel":"private-doc-9","token":"` + doc + `"}`)
		u42.Expect(`{"action":"subscribe","channel":"private-doc-9","ok":true}`)
		u42.Send(`{"action":"subscribe","channel":"private-doc-10","token":"` + doc + `"}`)
		u42.Expect(`{"error":"invalid_subscribe_token","channel":"private-doc-10"}`)

		// The anonymous connection opened while it was off: public only, no presence.
		anon.Send(`{"action":"subscribe","channel":"private-user-42"}`)
		anon.Expect(`{"error":"channel_forbidden","channel":"private-user-42"}`)
		anon.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-42"}`)
		anon.Expect(`{"error":"token_required","channel":"lobby"}`)
		anon.Send(`{"action":"subscribe","channel":"lobby"}`)
		anon.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)

		// An emit reaches the one granted subscriber, and only it.
		r := ts.Client().Send("POST", "/emit", `{"channel":"private-user-42","payload":{"n":1}}`, "application/json",
			map[string]string{"Authorization": "Bearer " + p.SecretKey})
		if r.Status != http.StatusOK || r.JSON["subscriberCount"] != float64(1) {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		u42.ExpectExcept(`{"channel":"private-user-42","payload":{"n":1}}`, "seq")
		anon.ExpectSilence(100 * time.Millisecond)

		// Refresh on the socket, for the same user only.
		u42.Send(`{"action":"refresh","token":"` + mint("user-43", time.Hour, nil) + `"}`)
		u42.Expect(`{"error":"invalid_token"}`)
		u42.Send(`{"action":"refresh","token":"` + mint("user-42", 2*time.Hour, map[string][]string{"private-user-*": {"subscribe"}}) + `"}`)
		u42.Expect(`{"action":"refresh","ok":true}`)
		u42.Send(`{"action":"subscribe","channel":"private-user-43"}`)
		u42.Expect(`{"action":"subscribe","channel":"private-user-43","ok":true}`)

		// A token about to expire: told at once, closed 4011 when it has.
		short := ts.DialWithToken(p.PublicKey, mint("user-44", 3*time.Second, nil))
		m := short.ExpectExcept(`{"type":"token_expiring"}`, "exp")
		if exp, _ := m["exp"].(float64); exp < float64(time.Now().Unix()) || exp > float64(time.Now().Add(4*time.Second).Unix()) {
			t.Fatalf("token_expiring exp %v", m["exp"])
		}
		short.ExpectClose(4011, 10*time.Second)

		// A disconnect that sticks: the user's sockets close (4003), a token
		// minted before it is refused with 4012, one minted after gets in;
		// the clientId's client-emit tokens issued before it are revoked too.
		before := mint("user-42", time.Hour, nil)
		emitSecret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
		emitToken := func(at time.Time) string {
			tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: emitSecret, ProjectID: p.ID, Channel: "lobby", ClientID: "user-42",
				Types: []string{"chat"}, TTL: time.Minute, Now: at})
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}
		emitBefore := emitToken(time.Now())
		r = ts.Client().Send("POST", "/clients/user-42/disconnect", `{"revokeTokens":true}`, "application/json",
			map[string]string{"Authorization": "Bearer " + p.SecretKey})
		r.Expect(t, http.StatusOK, `{"ok":true,"closed":1}`)
		u42.ExpectClose(4003, 5*time.Second)
		ts.DialWithToken(p.PublicKey, before).ExpectClose(4012, 5*time.Second)
		after, _ := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: secret, UserID: "user-42", TTL: time.Hour,
			Now: time.Now().Add(time.Second)}) // iat in whole seconds, after the revocation's
		back := ts.DialWithToken(p.PublicKey, after)
		back.Send(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"user-42"}`)
		back.Expect(`{"action":"subscribe","channel":"lobby","ok":true}`)
		back.Expect(`{"type":"presence","channel":"lobby","event":"sync","members":[]}`)
		back.Send(`{"action":"emit","channel":"lobby","type":"chat","payload":1,"token":"` + emitBefore + `"}`)
		back.Expect(`{"error":"emit_token_revoked","channel":"lobby"}`)
		back.Send(`{"action":"emit","channel":"lobby","type":"chat","payload":2,"token":"` + emitToken(time.Now().Add(time.Second)) + `"}`)
		back.ExpectExcept(`{"action":"emit","channel":"lobby","ok":true}`, "seq")
		// anon, on lobby, gets only the emit of the token issued after the revocation.
		anon.ExpectExcept(`{"channel":"lobby","type":"chat","payload":2,"clientId":"user-42"}`, "seq")
		ts.DialWithToken(p.PublicKey, mint("user-45", time.Hour, nil)).ExpectSilence(200 * time.Millisecond) // another user is not covered

		// Channels the project marks private besides the private- ones.
		r = owner.Do("PATCH", "/api/projects/"+p.ID+"/authorization", `{"privateChannels":["vault","team-*","vault"]}`)
		if r.Status != http.StatusOK || relaytest.Canonical(r.JSON["privateChannels"]) != `["team-*","vault"]` || r.JSON["authorization"] != true {
			t.Fatalf("marking channels private: %d %s", r.Status, r.Raw)
		}
		anon.Send(`{"action":"subscribe","channel":"team-7"}`)
		anon.Expect(`{"error":"channel_forbidden","channel":"team-7"}`)
		anon.Send(`{"action":"subscribe","channel":"teams"}`)
		anon.Expect(`{"action":"subscribe","channel":"teams","ok":true}`)
		team := ts.DialWithToken(p.PublicKey, mint("user-46", time.Hour, map[string][]string{"team-*": {"subscribe"}}))
		team.Send(`{"action":"subscribe","channel":"team-7"}`)
		team.Expect(`{"action":"subscribe","channel":"team-7","ok":true}`)
		for body, want := range map[string]string{
			`{"privateChannels":["bad channel!"]}`:                             `{"error":"invalid_private_channels"}`,
			`{"privateChannels":["*x"]}`:                                       `{"error":"invalid_private_channels"}`,
			`{"privateChannels":["a",` + strings.Repeat(`"b",`, 100) + `"c"]}`: `{"error":"invalid_private_channels"}`,
			`{"privateChannels":"vault"}`:                                      `{"error":"invalid_json"}`,
		} {
			owner.Do("PATCH", "/api/projects/"+p.ID+"/authorization", body).Expect(t, http.StatusBadRequest, want)
		}
		if r := owner.Do("GET", "/api/projects/"+p.ID+"/authorization", ""); relaytest.Canonical(r.JSON["privateChannels"]) != `["team-*","vault"]` {
			t.Fatalf("a refused change changed them: %s", r.Raw)
		}

		// Off again: the anonymous connection may subscribe to private- channels.
		if r := owner.Do("PATCH", "/api/projects/"+p.ID+"/authorization", `{"authorization":false}`); r.Status != http.StatusOK || r.JSON["authorization"] != false {
			t.Fatalf("turning authorization off: %d %s", r.Status, r.Raw)
		}
		anon.Send(`{"action":"subscribe","channel":"private-user-42"}`)
		anon.Expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
	})
}

// On a project without channel authorization a disconnect's body is
// ignored, as SPEC.md says: revokeTokens revokes nothing (the clientId's
// client-emit tokens still work).
func TestDisconnectBodyIgnoredWithoutAuthorization(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	r := ts.Client().Send("POST", "/clients/ann/disconnect", `{"revokeTokens":true}`, "application/json",
		map[string]string{"Authorization": "Bearer " + p.SecretKey})
	r.Expect(t, http.StatusOK, `{"ok":true,"closed":0}`)
	c := ts.DialWS(p.PublicKey)
	c.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"ann"}`)
	c.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
	c.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "room", ClientID: "ann",
		Types: []string{"chat"}, TTL: time.Minute, Now: time.Now().Add(-2 * time.Second)}) // issued before the disconnect
	c.Send(`{"action":"emit","channel":"room","type":"chat","payload":1,"token":"` + tok + `"}`)
	c.ExpectExcept(`{"action":"emit","channel":"room","ok":true}`, "seq")
}
