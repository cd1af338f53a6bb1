package wire

import (
	"crypto/rand"
	"crypto/rsa"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// Channel authorization with the project's own keys, end to end on both
// stores over real sockets: the JWKS URL set through the API, a
// connection token signed RS256 with a key of that set (served on
// loopback, which WEBHOOK_ALLOW_PRIVATE_ADDRESSES lets the server fetch)
// opens the socket; its grant subscribes to a private channel, which
// receives an emit; HS256 with the secret works beside it; a key not in
// the set is refused at the handshake. A server with the SSRF guard on
// (the default) refuses the same token: it will not fetch from loopback.
func TestJWKSChannelAuthorization(t *testing.T) {
	t.Parallel()
	js := relaytest.NewJWKS(t)
	priv, body, jwksURL := js.Key, js.Body, js.URL
	exp := func() int64 { return time.Now().Add(time.Hour).Unix() }
	token := func() string {
		return relaytest.SignRS256(t, priv, "k1", map[string]any{"sub": "user-42", "exp": exp(),
			"channels": map[string]any{"private-user-42": []any{"subscribe", "presence"}}})
	}

	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		path := "/api/projects/" + p.ID + "/authorization"
		on := owner.Do("PATCH", path, `{"authorization":true,"jwksUrl":"`+jwksURL+`"}`)
		on.Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, on.Str("secret"), nil, jwksURL))

		before := js.Fetches.Load()
		u42 := ts.DialWithToken(p.PublicKey, token())
		u42.Send(`{"action":"subscribe","channel":"private-user-42","presence":true,"clientId":"user-42"}`)
		u42.Expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
		u42.Expect(`{"type":"presence","channel":"private-user-42","event":"sync","members":[]}`)
		u42.Send(`{"action":"subscribe","channel":"private-user-43"}`)
		u42.Expect(`{"error":"channel_forbidden","channel":"private-user-43"}`)
		r := ts.Client().Send("POST", "/emit", `{"channel":"private-user-42","payload":{"n":1}}`, "application/json",
			map[string]string{"Authorization": "Bearer " + p.SecretKey})
		if r.Status != http.StatusOK || r.JSON["subscriberCount"] != float64(1) {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		u42.ExpectExcept(`{"channel":"private-user-42","payload":{"n":1}}`, "seq")

		// A refresh and a subscribe token signed with the same key.
		u42.Send(`{"action":"refresh","token":"` + token() + `"}`)
		u42.Expect(`{"action":"refresh","ok":true}`)
		doc := relaytest.SignRS256(t, priv, "k1", map[string]any{"ch": "private-doc-9", "sub": "user-42", "exp": exp()})
		u42.Send(`{"action":"subscribe","channel":"private-doc-9","token":"` + doc + `"}`)
		u42.Expect(`{"action":"subscribe","channel":"private-doc-9","ok":true}`)
		if n := js.Fetches.Load() - before; n != 1 {
			t.Fatalf("%d fetches of the JWKS, want 1 (cached)", n)
		}

		// HS256 with the secret beside it.
		hs, err := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: on.Str("secret"), UserID: "user-7", TTL: time.Hour,
			Channels: map[string][]string{"private-user-7": {"subscribe"}}})
		if err != nil {
			t.Fatal(err)
		}
		u7 := ts.DialWithToken(p.PublicKey, hs)
		u7.Send(`{"action":"subscribe","channel":"private-user-7"}`)
		u7.Expect(`{"action":"subscribe","channel":"private-user-7","ok":true}`)

		// A key not in the set, or the public key used as an HS256 secret: refused.
		other, _ := rsa.GenerateKey(rand.Reader, 2048)
		handshake := func(token string) relaytest.Response {
			return ts.Handshake("/ws?publicKey=" + url.QueryEscape(p.PublicKey) + "&token=" + url.QueryEscape(token))
		}
		handshake(relaytest.SignRS256(t, other, "k1", map[string]any{"sub": "x", "exp": exp()})).Expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
		k1 := jws.NewHeaders() // naming the set's key, so that only the algorithm is wrong
		_ = k1.Set(jws.KeyIDKey, "k1")
		confused, _ := jwt.Sign(relaytest.Must(jwt.NewBuilder().Subject("x").Expiration(time.Now().Add(time.Hour)).Build()), jwt.WithKey(jwa.HS256, body, jws.WithProtectedHeaders(k1)))
		if h := relaytest.Must(jws.Parse(confused)).Signatures()[0].ProtectedHeaders(); h.KeyID() != "k1" || h.Algorithm() != jwa.HS256 {
			t.Fatalf("the confused token's header: kid %q alg %v", h.KeyID(), h.Algorithm())
		}
		handshake(string(confused)).Expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)

		// With the guard on (the default), the loopback JWKS is not fetched.
		guarded := relaytest.Start(t, dbURL, nil)
		bob := guarded.Signup("bob@example.com")
		q := bob.CreateProject("guarded")
		bob.Do("PATCH", "/api/projects/"+q.ID+"/authorization", `{"authorization":true,"jwksUrl":"`+jwksURL+`"}`).Expect(t, http.StatusOK,
			relaytest.AuthorizationBody(true, bob.Do("GET", "/api/projects/"+q.ID+"/authorization", "").Str("secret"), nil, jwksURL))
		before = js.Fetches.Load()
		guarded.Handshake("/ws?publicKey="+url.QueryEscape(q.PublicKey)+"&token="+url.QueryEscape(token())).Expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
		if js.Fetches.Load() != before {
			t.Fatal("the guarded server fetched from loopback")
		}
	})
}
