package relaytest

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"
)

// Must is v, or a panic on err: for values a test cannot do without.
func Must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// JWKS serves a JWKS of one RSA key (kid k1, RS256) on loopback and
// counts its fetches.
type JWKS struct {
	URL     string
	Key     *rsa.PrivateKey
	Body    []byte // the set as served
	Fetches atomic.Int64
}

// NewJWKS starts a JWKS server, closed when t ends.
func NewJWKS(t testing.TB) *JWKS {
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
	js := &JWKS{Key: priv}
	js.Body, _ = json.Marshal(set)
	keys := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		js.Fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write(js.Body)
	}))
	t.Cleanup(keys.Close)
	js.URL = keys.URL + "/.well-known/jwks.json"
	return js
}

// SignRS256 signs claims RS256 with key, the header naming kid.
func SignRS256(t testing.TB, key any, kid string, claims map[string]any) string {
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
