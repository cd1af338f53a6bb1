package actors

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/proto/jwstest"
)

// FuzzVerifyEmitToken: verifyEmitToken never panics and never accepts a
// token that acceptedEmitToken, an independent reading of proto/PROTOCOL.md ›
// Client-emit tokens and its client-emit rules, refuses: the signature must be
// HMAC-SHA256 with the project's secret, and the claims must name the
// project, the channel and the type, carry a clientId and a jti, and be
// within exp and the maximum TTL from iat.
//
// mode picks what the fuzzer controls: 0 the whole token (header, claims
// and sig concatenated); 1 header and claims JSON, signed correctly; 2 the
// same signed with another secret; 3 header and claims JSON with sig as the
// raw signature part (alg none, empty or forged signatures).
func FuzzVerifyEmitToken(f *testing.F) {
	const hs = `{"alg":"HS256","typ":"JWT"}`
	good := `{"pid":"p1","ch":"room","clientId":"ann","types":["chat","typing"],"jti":"j1","iat":1700000000,"exp":1700000300}`
	for _, s := range []struct {
		header, claims, sig string
		mode                uint8
	}{
		{hs, good, "", 1},
		{hs, good, "", 2},
		{`{"alg":"none"}`, good, "", 3},
		{`{"alg":"none","typ":"JWT"}`, good, "", 1},
		{`{"alg":"HS512"}`, good, "", 1},
		{`{"alg":"hs256"}`, good, "", 1},
		{`{"alg":"RS256"}`, good, "AAAA", 3},
		{`{"alg":"HS256","b64":false,"crit":["b64"]}`, good, "", 1},
		{`{"alg":"HS256","jwk":{"kty":"oct","k":"AAAA"}}`, good, "", 1},
		{hs, strings.Replace(good, `"exp":1700000300`, `"exp":0`, 1), "", 1},
		{hs, strings.Replace(good, `"exp":1700000300`, `"exp":1699999000`, 1), "", 1},
		{hs, strings.Replace(good, `"exp":1700000300`, `"exp":"2023-11-14T22:18:20Z"`, 1), "", 1},
		{hs, strings.Replace(good, `"exp":1700000300`, `"exp":"1700000300.5"`, 1), "", 1},
		{hs, strings.Replace(good, `"iat":1700000000`, `"iat":1699990000`, 1), "", 1}, // older than the max TTL
		{hs, strings.Replace(good, `"iat":1700000000`, `"iat":1700009000`, 1), "", 1}, // issued in the future
		{hs, strings.Replace(good, `"iat":1700000000`, `"iat":0`, 1), "", 1},
		{hs, strings.Replace(good, `"pid":"p1"`, `"pid":"p2"`, 1), "", 1},
		{hs, strings.Replace(good, `"pid":"p1"`, `"pid":"p2","pid":"p1"`, 1), "", 1},
		{hs, strings.Replace(good, `"ch":"room"`, `"ch":"ROOM"`, 1), "", 1},
		{hs, strings.Replace(good, `["chat","typing"]`, `"chat"`, 1), "", 1},
		{hs, strings.Replace(good, `["chat","typing"]`, `["chat",1]`, 1), "", 1},
		{hs, strings.Replace(good, `"clientId":"ann"`, `"clientId":""`, 1), "", 1},
		{hs, strings.Replace(good, `"clientId":"ann"`, `"clientId":7`, 1), "", 1},
		{hs, strings.Replace(good, `"jti":"j1"`, `"jti":""`, 1), "", 1},
		{hs, strings.Replace(good, `"jti":"j1",`, ``, 1), "", 1},
		{hs, strings.Replace(good, `}`, `,"nbf":1700009000}`, 1), "", 1},
		{hs, good, "", 0},
		{"eyJhbGciOiJub25lIn0.", good, ".", 0},
		{`{"payload":"e30","protected":"eyJhbGciOiJIUzI1NiJ9","signature":"AAAA"}`, "", "", 0},
		{"a.b.c.d.e", "", "", 0},
		{"...", "", "", 0},
	} {
		f.Add(s.header, s.claims, s.sig, s.mode)
	}
	const secret, pid, ch, typ = "emit-secret", "p1", "room", "chat"
	now := time.Unix(1_700_000_000, 0)
	const maxTTL = 600 * time.Second
	f.Fuzz(func(t *testing.T, header, claims, sig string, mode uint8) {
		token := jwstest.Token(header, claims, sig, mode, []byte(secret))
		got, ok := verifyEmitToken(token, secret, pid, ch, typ, now, maxTTL)
		if !ok {
			return
		}
		if why := acceptedEmitToken(token, []byte(secret), pid, ch, typ, now, maxTTL, got); why != "" {
			t.Fatalf("accepted %q: %s", token, why)
		}
	})
}

// acceptedEmitToken says what is wrong with accepting token, or "".
func acceptedEmitToken(token string, key []byte, pid, ch, typ string, now time.Time, maxTTL time.Duration, got emitClaims) string {
	payload, why := jwstest.HS256Payload(token, key)
	if why != "" {
		return why
	}
	var c map[string]any
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if err := dec.Decode(&c); err != nil {
		return "claims are not a JSON object: " + err.Error()
	}
	if s, _ := c["pid"].(string); s != pid {
		return "pid " + strconv.Quote(s)
	}
	if s, _ := c["ch"].(string); s != ch {
		return "ch " + strconv.Quote(s)
	}
	types, _ := c["types"].([]any)
	allowed := false
	for _, v := range types {
		if s, ok := v.(string); ok && s == typ {
			allowed = true
		}
	}
	if !allowed {
		return "type not in the types allowlist"
	}
	if s, _ := c["clientId"].(string); s == "" || s != got.clientID {
		return "clientId " + strconv.Quote(s) + ", returned " + strconv.Quote(got.clientID)
	}
	if s, _ := c["jti"].(string); s == "" || s != got.jti {
		return "jti " + strconv.Quote(s) + ", returned " + strconv.Quote(got.jti)
	}
	// Times, with tokenSkew and a second's grace for sub-second rounding.
	grace := tokenSkew + time.Second
	exp, ok := jwstest.NumericDate(c["exp"])
	if !ok {
		return "exp missing or not a NumericDate"
	}
	if !now.Before(exp.Add(grace)) {
		return "expired at " + exp.String()
	}
	iat, ok := jwstest.NumericDate(c["iat"])
	if !ok {
		return "iat missing or not a NumericDate"
	}
	if iat.After(now.Add(grace)) || now.Sub(iat) > maxTTL+grace {
		return "iat " + iat.String() + " outside the maximum TTL"
	}
	if v, present := c["nbf"]; present {
		if nbf, ok := jwstest.NumericDate(v); !ok || nbf.After(now.Add(grace)) {
			return "not yet valid"
		}
	}
	return ""
}
