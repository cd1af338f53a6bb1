package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jwt"
)

// jwksConnectionTokens serves a one-key JWKS on loopback until ctx ends,
// turns channel authorization on for project id with that set as its
// jwksUrl, and mints n connection tokens (one user each, an hour long)
// signed RS256 with the key: a handshake verifies each through the relay's
// cache of the set, fetched once.
func jwksConnectionTokens(ctx context.Context, api apiCall, id string, n int) ([]string, error) {
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := jwk.FromRaw(&priv.PublicKey)
	if err != nil {
		return nil, err
	}
	const kid = "relay-bench"
	if err := pub.Set(jwk.KeyIDKey, kid); err != nil {
		return nil, err
	}
	if err := pub.Set(jwk.AlgorithmKey, jwa.RS256); err != nil {
		return nil, err
	}
	set := jwk.NewSet()
	if err := set.AddKey(pub); err != nil {
		return nil, err
	}
	body, err := json.Marshal(set)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})}
	go srv.Serve(ln)
	context.AfterFunc(ctx, func() { srv.Close() })

	url := "http://" + ln.Addr().String() + "/.well-known/jwks.json"
	status, out, err := api("PATCH", "/api/projects/"+id+"/authorization", map[string]any{"authorization": true, "jwksUrl": url})
	if err != nil || status != http.StatusOK {
		return nil, fmt.Errorf("turn channel authorization on with jwksUrl %s: %d %v %v", url, status, out, err)
	}
	key, err := jwk.FromRaw(priv)
	if err != nil {
		return nil, err
	}
	if err := key.Set(jwk.KeyIDKey, kid); err != nil {
		return nil, err
	}
	now := time.Now()
	tokens := make([]string, n)
	for i := range tokens {
		tok, err := jwt.NewBuilder().Subject(fmt.Sprint("bench-", i)).IssuedAt(now).Expiration(now.Add(time.Hour)).Build()
		if err != nil {
			return nil, err
		}
		signed, err := jwt.Sign(tok, jwt.WithKey(jwa.RS256, key))
		if err != nil {
			return nil, err
		}
		tokens[i] = string(signed)
	}
	return tokens, nil
}
