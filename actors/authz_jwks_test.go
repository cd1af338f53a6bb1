package actors

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/proto"
)

// jwksKey is a private key of the test's, with its kid.
type jwksKey struct {
	kid  string
	alg  jwa.SignatureAlgorithm
	priv crypto.Signer
}

func newJWKSKey(t *testing.T, kid string, alg jwa.SignatureAlgorithm) jwksKey {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch alg {
	case jwa.RS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case jwa.ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jwa.EdDSA:
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	return jwksKey{kid: kid, alg: alg, priv: priv}
}

// public is the key as a JWKS publishes it (with its alg when withAlg).
func (k jwksKey) public(t *testing.T, withAlg bool) jwk.Key {
	t.Helper()
	pub, err := jwk.FromRaw(k.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	_ = pub.Set(jwk.KeyIDKey, k.kid)
	_ = pub.Set(jwk.KeyUsageKey, "sig")
	if withAlg {
		_ = pub.Set(jwk.AlgorithmKey, k.alg)
	}
	return pub
}

// sign signs claims with the key, the header naming kid (the key's unless given).
func (k jwksKey) sign(t *testing.T, claims map[string]any, kid ...string) string {
	t.Helper()
	h := jws.NewHeaders()
	_ = h.Set(jws.KeyIDKey, k.kid)
	if len(kid) > 0 {
		_ = h.Set(jws.KeyIDKey, kid[0])
	}
	return signClaims(t, claims, k.alg, k.priv, h)
}

func signClaims(t *testing.T, claims map[string]any, alg jwa.SignatureAlgorithm, key any, h jws.Headers) string {
	t.Helper()
	b := jwt.NewBuilder()
	for name, v := range claims {
		b = b.Claim(name, v)
	}
	tok, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	out, err := jwt.Sign(tok, jwt.WithKey(alg, key, jws.WithProtectedHeaders(h)))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// jwksServer serves a JWKS on loopback; set replaces what it serves.
type jwksServer struct {
	*httptest.Server
	body    atomic.Pointer[[]byte]
	fetches atomic.Int64
}

func newJWKSServer(t *testing.T, keys ...jwk.Key) *jwksServer {
	t.Helper()
	s := &jwksServer{}
	s.set(t, keys...)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write(*s.body.Load())
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(t *testing.T, keys ...jwk.Key) {
	t.Helper()
	set := jwk.NewSet()
	for _, k := range keys {
		if err := set.AddKey(k); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	s.body.Store(&b)
}

// logBuffer is a logger whose lines the test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// testJWKSCache is a cache on the test's clock, whose client reaches
// loopback (as the webhook tests allow it: AllowPrivate) unless guarded.
func testJWKSCache(t *testing.T, guarded bool, clock *atomic.Int64) (*jwksCache, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	c := newJWKSCache(webhook.BoundedGetter{Client: webhook.NewClient(2*time.Second, !guarded), Max: JWKSMaxBody}, logs.logger(), func() time.Time { return time.Unix(0, clock.Load()) })
	t.Cleanup(c.close)
	return c, logs
}

func base64JSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestJWKSTokens: tokens signed RS256, ES256 and EdDSA with keys of the
// project's JWKS verify, with the claim rules of HS256 tokens, which keep
// working beside them; a key not in the set, an algorithm other than its
// key's, alg confusion (HS256 with the public key as secret), alg none
// and a token naming no kid are refused; a key rotation is picked up by a
// refresh when a token names a new kid, at most once per 5 s per URL; a
// set over 64 KiB, a server that fails, and (with the guard on) a
// loopback or private address are refused, logged once a minute.
func TestJWKSTokens(t *testing.T) {
	var clock atomic.Int64
	clock.Store(authT0.UnixNano())
	advance := func(d time.Duration) { clock.Add(int64(d)) }
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	ctx := context.Background()

	rsaKey, ecKey, edKey := newJWKSKey(t, "rsa-1", jwa.RS256), newJWKSKey(t, "ec-1", jwa.ES256), newJWKSKey(t, "ed-1", jwa.EdDSA)
	// Keys of the set no token may use, each under its own kid: an RSA
	// key of 1024 bits, a P-384 key that says ES256, a key for encryption,
	// a key whose alg is another algorithm's.
	weak := jwksKey{kid: "rsa-1024", alg: jwa.RS256, priv: must(rsa.GenerateKey(rand.Reader, 1024))}
	p384 := jwksKey{kid: "ec-p384", alg: jwa.ES256, priv: must(ecdsa.GenerateKey(elliptic.P384(), rand.Reader))}
	enc := newJWKSKey(t, "rsa-enc", jwa.RS256)
	encPub := enc.public(t, true)
	_ = encPub.Set(jwk.KeyUsageKey, "enc")
	otherAlg := newJWKSKey(t, "rsa-rs384", jwa.RS256)
	otherAlgPub := otherAlg.public(t, true)
	_ = otherAlgPub.Set(jwk.AlgorithmKey, jwa.RS384)
	srv := newJWKSServer(t, rsaKey.public(t, true), ecKey.public(t, false), edKey.public(t, true),
		weak.public(t, true), p384.public(t, true), encPub, otherAlgPub)
	keys, logs := testJWKSCache(t, false, &clock)
	az := &ProjectAuthz{On: true, Secrets: []string{authSecret}, JWKSURL: srv.URL + "/.well-known/jwks.json"}
	exp := authT0.Add(time.Hour).Unix()
	claims := func(sub string) map[string]any {
		return map[string]any{"sub": sub, "exp": exp, "channels": map[string]any{"private-" + sub: []any{"subscribe", "presence"}}}
	}
	verify := func(token string) (*Identity, error) { return verifyConnection(ctx, keys, az, token, now()) }

	// Each algorithm, with the grants of its token.
	for _, k := range []jwksKey{rsaKey, ecKey, edKey} {
		id, err := verify(k.sign(t, claims("u-"+k.kid)))
		if err != nil || id.Sub != "u-"+k.kid || !id.allows("private-u-"+k.kid, true) || id.allows("private-other", false) {
			t.Fatalf("%s: %+v, %v", k.alg, id, err)
		}
	}
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches for three tokens, want the set fetched once and cached", n)
	}
	// HS256 with the project's secret keeps working beside them.
	if id, err := verify(connToken(t, "hs", time.Hour, nil)); err != nil || id.Sub != "hs" {
		t.Fatalf("HS256 beside a JWKS: %+v, %v", id, err)
	}
	// The claim rules are the same: exp (with its skew), sub, channels.
	for name, c := range map[string]map[string]any{
		"no sub":       {"exp": exp},
		"no exp":       {"sub": "u"},
		"bad channels": {"sub": "u", "exp": exp, "channels": map[string]any{"private-x": []any{"publish"}}},
	} {
		if _, err := verify(rsaKey.sign(t, c)); !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("%s: %v, want invalid", name, err)
		}
	}
	if _, err := verify(ecKey.sign(t, map[string]any{"sub": "u", "exp": authT0.Add(-tokenSkew).Unix()})); !errors.Is(err, ErrTokenExpired) {
		t.Fatalf("expired: %v", err)
	}

	// Subscribe tokens: ch, sub, presence, as HS256 ones.
	id, _ := verify(rsaKey.sign(t, map[string]any{"sub": "ann", "exp": exp}))
	sub := edKey.sign(t, map[string]any{"ch": "private-doc", "sub": "ann", "presence": true, "exp": exp})
	if presence, ok := verifySubscribeToken(ctx, keys, az, sub, "private-doc", id, now()); !ok || !presence {
		t.Fatalf("EdDSA subscribe token: %v %v", presence, ok)
	}
	if _, ok := verifySubscribeToken(ctx, keys, az, sub, "private-other", id, now()); ok {
		t.Fatal("a subscribe token for another channel passed")
	}
	m := &proto.ClientMessage{Action: proto.ActionSubscribe, Channel: "private-doc", Presence: true, ClientID: "ann", Token: sub}
	if code := authorizeSubscribe(ctx, keys, az, id, m, now()); code != "" {
		t.Fatalf("authorizeSubscribe with an EdDSA subscribe token: %q", code)
	}

	// Refused, each as invalid_token.
	stranger := newJWKSKey(t, "stranger", jwa.RS256)
	impostor := newJWKSKey(t, "rsa-1", jwa.RS256) // the set's kid, another key
	rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: must(x509.MarshalPKIXPublicKey(rsaKey.priv.Public()))})
	rsaJWK := must(json.Marshal(rsaKey.public(t, true)))
	hsHeader := func(kid string) jws.Headers {
		h := jws.NewHeaders()
		_ = h.Set(jws.KeyIDKey, kid)
		return h
	}
	noKid := jws.NewHeaders()
	refused := map[string]string{
		"a key not in the set":       stranger.sign(t, claims("x")),
		"another key with its kid":   impostor.sign(t, claims("x")),
		"ES256 naming the RSA key":   ecKey.sign(t, claims("x"), "rsa-1"),
		"EdDSA naming the EC key":    edKey.sign(t, claims("x"), "ec-1"),
		"RS256 naming the Ed key":    rsaKey.sign(t, claims("x"), "ed-1"),
		"no kid":                     signClaims(t, claims("x"), jwa.RS256, rsaKey.priv, noKid),
		"RS384 with the set's key":   signClaims(t, claims("x"), jwa.RS384, rsaKey.priv, hsHeader("rsa-1")),
		"PS256 with the set's key":   signClaims(t, claims("x"), jwa.PS256, rsaKey.priv, hsHeader("rsa-1")),
		"HS256 with the public PEM":  signClaims(t, claims("x"), jwa.HS256, rsaPEM, hsHeader("rsa-1")),
		"HS256 with the public JWK":  signClaims(t, claims("x"), jwa.HS256, rsaJWK, hsHeader("rsa-1")),
		"HS512 with the secret":      signed(t, claims("x"), jwa.HS512, authSecret),
		"alg none":                   base64JSON(t, map[string]any{"alg": "none", "kid": "rsa-1"}) + "." + base64JSON(t, claims("x")) + ".",
		"alg none, a signature kept": base64JSON(t, map[string]any{"alg": "none", "kid": "rsa-1"}) + "." + base64JSON(t, claims("x")) + "." + strings.Split(rsaKey.sign(t, claims("x")), ".")[2],
		"not compact":                `{"payload":"e30","signatures":[]}`,
		"an RSA key of 1024 bits":    weak.sign(t, claims("x")),
		"ES256 with a P-384 key":     p384.sign(t, claims("x")),
		"a key with use enc":         enc.sign(t, claims("x")),
		"a key whose alg is RS384":   otherAlg.sign(t, claims("x")),
	}
	for name, token := range refused {
		if _, err := verify(token); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%s: %v, want invalid_token", name, err)
		}
	}
	// Without a JWKS URL, a token signed with a key is refused.
	if _, err := verifyConnection(ctx, keys, &ProjectAuthz{On: true, Secrets: []string{authSecret}}, rsaKey.sign(t, claims("x")), now()); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("no JWKS URL: %v", err)
	}
	// None of those fetched the set again: a fetch less than 5 s ago.
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches, want 1 (unknown kids within 5 s of a fetch do not refetch)", n)
	}

	// Key rotation: the server serves a new key; a token naming it makes
	// the cache fetch the set again (5 s after the last fetch) and verifies.
	rotated := newJWKSKey(t, "rsa-2", jwa.RS256)
	srv.set(t, rotated.public(t, true), ecKey.public(t, false), edKey.public(t, true))
	advance(jwksRefreshEvery)
	if id, err := verify(rotated.sign(t, claims("r"))); err != nil || id.Sub != "r" {
		t.Fatalf("a token of the rotated-in key: %+v, %v", id, err)
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches after the rotation, want 2", n)
	}
	// The key rotated out is refused now that the set no longer has it.
	if _, err := verify(rsaKey.sign(t, claims("x"))); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("the rotated-out key: %v", err)
	}
	// Another rotation within 5 s: refused until 5 s have passed.
	again := newJWKSKey(t, "ed-2", jwa.EdDSA)
	srv.set(t, rotated.public(t, true), again.public(t, true))
	advance(jwksRefreshEvery - time.Second)
	if _, err := verify(again.sign(t, claims("x"))); !errors.Is(err, ErrInvalidToken) || srv.fetches.Load() != 2 {
		t.Fatalf("a new kid within 5 s of the last fetch: %v, %d fetches", err, srv.fetches.Load())
	}
	advance(time.Second)
	if _, err := verify(again.sign(t, claims("x"))); err != nil || srv.fetches.Load() != 3 {
		t.Fatalf("a new kid 5 s after the last fetch: %v, %d fetches", err, srv.fetches.Load())
	}
	// Tokens naming unknown kids make at most one fetch per 5 s, and after
	// jwksRefreshesPerEntry refreshes the URL gets a fresh cache entry (the
	// old one, with the background fetches each refresh scheduled, leaves).
	keys.mu.Lock()
	first := keys.urls[az.JWKSURL].key
	keys.mu.Unlock()
	for range jwksRefreshesPerEntry + 1 {
		advance(jwksRefreshEvery)
		for range 3 {
			verify(stranger.sign(t, claims("x")))
		}
	}
	if n := srv.fetches.Load(); n != 3+jwksRefreshesPerEntry+1 {
		t.Fatalf("%d fetches, want one per 5 s", n)
	}
	keys.mu.Lock()
	renewed := keys.urls[az.JWKSURL].key
	keys.mu.Unlock()
	if renewed == first || keys.cache.IsRegistered(first) || !keys.cache.IsRegistered(renewed) || len(keys.urls) != 1 {
		t.Fatalf("entry %q → %q: want a fresh one, the old one unregistered", first, renewed)
	}
	if _, err := verify(again.sign(t, claims("x"))); err != nil {
		t.Fatalf("after the renewal: %v", err)
	}
	if strings.Contains(logs.String(), "JWKS") {
		t.Fatalf("a working JWKS logged: %s", logs)
	}

	// A set over 64 KiB is refused (and logged), as is a server that fails.
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"keys":[],"pad":"` + strings.Repeat("a", JWKSMaxBody) + `"}`))
	}))
	defer big.Close()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer down.Close()
	for name, u := range map[string]string{"over 64 KiB": big.URL + "/big", "a 500": down.URL + "/down"} {
		bad := &ProjectAuthz{On: true, JWKSURL: u}
		for range 2 {
			if _, err := verifyConnection(ctx, keys, bad, rsaKey.sign(t, claims("x")), now()); !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("%s: %v", name, err)
			}
		}
		if n := strings.Count(logs.String(), "url="+u); n != 1 {
			t.Fatalf("%s: logged %d times, want once a minute:\n%s", name, n, logs)
		}
	}
	if !strings.Contains(logs.String(), "larger than 65536 bytes") {
		t.Fatalf("the big set's refusal does not say why:\n%s", logs)
	}

	// The SSRF guard (the server's client, WEBHOOK_ALLOW_PRIVATE_ADDRESSES
	// off): loopback and private addresses are refused before any request.
	guarded, glogs := testJWKSCache(t, true, &clock)
	before := srv.fetches.Load()
	for _, u := range []string{srv.URL + "/jwks.json", "http://10.0.0.1/jwks.json", "http://[::1]:9/jwks.json"} {
		g := &ProjectAuthz{On: true, JWKSURL: u}
		if _, err := verifyConnection(ctx, guarded, g, rsaKey.sign(t, claims("x")), now()); !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("%s through the guard: %v", u, err)
		}
	}
	if srv.fetches.Load() != before || strings.Count(glogs.String(), "private address") != 3 {
		t.Fatalf("the guard let a request through (%d), or did not say why:\n%s", srv.fetches.Load()-before, glogs)
	}

	// Without a client (a System configured with none) nothing is fetched.
	if _, err := verifyConnection(ctx, newJWKSCache(nil, logs.logger(), now), az, again.sign(t, claims("x")), now()); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("no client: %v", err)
	}

	// A URL no token asked for in an hour leaves the cache.
	advance(jwksIdle + time.Minute)
	if _, err := verify(again.sign(t, map[string]any{"sub": "late", "exp": now().Add(time.Hour).Unix()})); err != nil {
		t.Fatal(err)
	}
	keys.mu.Lock()
	n := len(keys.urls)
	keys.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d URLs held, want only the one in use", n)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestJWKSOnAConnection: on a project whose settings name a JWKS, a
// connection opened with an RS256 token refreshes with an EdDSA one and
// subscribes to a private channel with an ES256 subscribe token.
func TestJWKSOnAConnection(t *testing.T) {
	rsaKey, ecKey, edKey := newJWKSKey(t, "rsa-1", jwa.RS256), newJWKSKey(t, "ec-1", jwa.ES256), newJWKSKey(t, "ed-1", jwa.EdDSA)
	srv := newJWKSServer(t, rsaKey.public(t, true), ecKey.public(t, true), edKey.public(t, true))
	url := srv.URL + "/jwks"
	var clock atomic.Int64
	clock.Store(authT0.UnixNano())
	sys := newTestSystem(t, Config{
		Now:        func() time.Time { return time.Unix(0, clock.Load()) },
		JWKSClient: webhook.BoundedGetter{Client: webhook.NewClient(2*time.Second, true), Max: JWKSMaxBody},
		LoadSettings: func(context.Context, string) (Settings, error) {
			return Settings{Authz: ProjectAuthz{On: true, Secrets: []string{authSecret}, JWKSURL: url}}, nil
		},
	})
	az := &ProjectAuthz{On: true, Secrets: []string{authSecret}, JWKSURL: url}
	exp := authT0.Add(time.Hour).Unix()
	id, err := sys.VerifyConnectionToken(context.Background(), rsaKey.sign(t, map[string]any{"sub": "ann", "exp": exp}), az, sys.cfg.Now())
	if err != nil {
		t.Fatal(err)
	}
	l, ok := sys.Reserve("p", "addr")
	if !ok {
		t.Fatal("reserve refused")
	}
	k := &sink{id: 1}
	sess := sys.OpenAuthorized(l, "key", k, az, id)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-doc"}`))
	if m := lastFrame(t, k, 1); m["error"] != "channel_forbidden" {
		t.Fatalf("got %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"refresh","token":"` + edKey.sign(t, map[string]any{"sub": "ann", "exp": exp + 60,
		"channels": map[string]any{"private-ann": []any{"subscribe"}}}) + `"}`))
	if m := lastFrame(t, k, 2); m["action"] != "refresh" || m["ok"] != true {
		t.Fatalf("refresh with an EdDSA token: %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"refresh","token":"` + rsaKey.sign(t, map[string]any{"sub": "bob", "exp": exp}) + `"}`))
	if m := lastFrame(t, k, 3); m["error"] != "invalid_token" {
		t.Fatalf("refresh for another sub: %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-ann"}`))
	if m := lastFrame(t, k, 4); m["ok"] != true || m["channel"] != "private-ann" {
		t.Fatalf("a grant of the refreshed token: %v", m)
	}
	sub := ecKey.sign(t, map[string]any{"ch": "private-doc", "sub": "ann", "exp": exp})
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-doc","token":"` + sub + `"}`))
	if m := lastFrame(t, k, 5); m["ok"] != true || m["channel"] != "private-doc" {
		t.Fatalf("an ES256 subscribe token: %v", m)
	}
	forged := newJWKSKey(t, "ec-1", jwa.ES256).sign(t, map[string]any{"ch": "private-x", "exp": exp})
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-x","token":"` + forged + `"}`))
	if m := lastFrame(t, k, 6); m["error"] != "invalid_subscribe_token" {
		t.Fatalf("a forged subscribe token: %v", m)
	}
}
