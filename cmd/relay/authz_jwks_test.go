package main

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/api/backend"
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
	js := newJWKSServer(t)
	priv, body, jwksURL := js.priv, js.body, js.url
	exp := func() int64 { return time.Now().Add(time.Hour).Unix() }
	token := func() string {
		return signRS256(t, priv, "k1", map[string]any{"sub": "user-42", "exp": exp(),
			"channels": map[string]any{"private-user-42": []any{"subscribe", "presence"}}})
	}

	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")
		path := "/api/projects/" + p.id + "/authorization"
		on := owner.do("PATCH", path, `{"authorization":true,"jwksUrl":"`+jwksURL+`"}`)
		on.expect(t, http.StatusOK, cpAuthorizationJWKS(true, on.str("secret"), nil, jwksURL))

		before := js.fetches.Load()
		u42 := ts.dialWithToken(p.publicKey, token())
		u42.send(`{"action":"subscribe","channel":"private-user-42","presence":true,"clientId":"user-42"}`)
		u42.expect(`{"action":"subscribe","channel":"private-user-42","ok":true}`)
		u42.expect(`{"type":"presence","channel":"private-user-42","event":"sync","members":[]}`)
		u42.send(`{"action":"subscribe","channel":"private-user-43"}`)
		u42.expect(`{"error":"channel_forbidden","channel":"private-user-43"}`)
		r := ts.client().send("POST", "/emit", `{"channel":"private-user-42","payload":{"n":1}}`, "application/json",
			map[string]string{"Authorization": "Bearer " + p.secretKey})
		if r.status != http.StatusOK || r.json["subscriberCount"] != float64(1) {
			t.Fatalf("emit: %d %s", r.status, r.raw)
		}
		u42.expectExcept(`{"channel":"private-user-42","payload":{"n":1}}`, "seq")

		// A refresh and a subscribe token signed with the same key.
		u42.send(`{"action":"refresh","token":"` + token() + `"}`)
		u42.expect(`{"action":"refresh","ok":true}`)
		doc := signRS256(t, priv, "k1", map[string]any{"ch": "private-doc-9", "sub": "user-42", "exp": exp()})
		u42.send(`{"action":"subscribe","channel":"private-doc-9","token":"` + doc + `"}`)
		u42.expect(`{"action":"subscribe","channel":"private-doc-9","ok":true}`)
		if n := js.fetches.Load() - before; n != 1 {
			t.Fatalf("%d fetches of the JWKS, want 1 (cached)", n)
		}

		// HS256 with the secret beside it.
		hs, err := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: on.str("secret"), UserID: "user-7", TTL: time.Hour,
			Channels: map[string][]string{"private-user-7": {"subscribe"}}})
		if err != nil {
			t.Fatal(err)
		}
		u7 := ts.dialWithToken(p.publicKey, hs)
		u7.send(`{"action":"subscribe","channel":"private-user-7"}`)
		u7.expect(`{"action":"subscribe","channel":"private-user-7","ok":true}`)

		// A key not in the set, or the public key used as an HS256 secret: refused.
		other, _ := rsa.GenerateKey(rand.Reader, 2048)
		handshake := func(token string) response {
			return ts.handshake("/ws?publicKey=" + url.QueryEscape(p.publicKey) + "&token=" + url.QueryEscape(token))
		}
		handshake(signRS256(t, other, "k1", map[string]any{"sub": "x", "exp": exp()})).expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
		k1 := jws.NewHeaders() // naming the set's key, so that only the algorithm is wrong
		_ = k1.Set(jws.KeyIDKey, "k1")
		confused, _ := jwt.Sign(must(jwt.NewBuilder().Subject("x").Expiration(time.Now().Add(time.Hour)).Build()), jwt.WithKey(jwa.HS256, body, jws.WithProtectedHeaders(k1)))
		if h := must(jws.Parse(confused)).Signatures()[0].ProtectedHeaders(); h.KeyID() != "k1" || h.Algorithm() != jwa.HS256 {
			t.Fatalf("the confused token's header: kid %q alg %v", h.KeyID(), h.Algorithm())
		}
		handshake(string(confused)).expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)

		// With the guard on (the default), the loopback JWKS is not fetched.
		guarded := startServer(t, dbURL, nil)
		bob := guarded.signup("bob@example.com")
		q := bob.createProject("guarded")
		bob.do("PATCH", "/api/projects/"+q.id+"/authorization", `{"authorization":true,"jwksUrl":"`+jwksURL+`"}`).expect(t, http.StatusOK,
			cpAuthorizationJWKS(true, bob.do("GET", "/api/projects/"+q.id+"/authorization", "").str("secret"), nil, jwksURL))
		before = js.fetches.Load()
		guarded.handshake("/ws?publicKey="+url.QueryEscape(q.publicKey)+"&token="+url.QueryEscape(token())).expect(t, http.StatusUnauthorized, `{"error":"invalid_token"}`)
		if js.fetches.Load() != before {
			t.Fatal("the guarded server fetched from loopback")
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// jwksServer serves a JWKS of one RSA key (kid k1, RS256) on loopback and
// counts its fetches.
type jwksServer struct {
	url     string
	priv    *rsa.PrivateKey
	body    []byte // the set as served
	fetches atomic.Int64
}

func newJWKSServer(t testing.TB) *jwksServer {
	t.Helper()
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := jwk.FromRaw(&priv.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	_ = pub.Set(jwk.KeyIDKey, "k1")
	_ = pub.Set(jwk.AlgorithmKey, jwa.RS256)
	set := jwk.NewSet()
	_ = set.AddKey(pub)
	js := &jwksServer{priv: priv}
	js.body, _ = json.Marshal(set)
	keys := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		js.fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write(js.body)
	}))
	t.Cleanup(keys.Close)
	js.url = keys.URL + "/.well-known/jwks.json"
	return js
}

// signRS256 signs claims RS256 with key, the header naming kid.
func signRS256(t testing.TB, key any, kid string, claims map[string]any) string {
	t.Helper()
	b := jwt.NewBuilder()
	for k, v := range claims {
		b = b.Claim(k, v)
	}
	tok, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	h := jws.NewHeaders()
	_ = h.Set(jws.KeyIDKey, kid)
	out, err := jwt.Sign(tok, jwt.WithKey(jwa.RS256, key, jws.WithProtectedHeaders(h)))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
