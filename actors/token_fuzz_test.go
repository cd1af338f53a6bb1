package actors

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzVerifyEmitToken: verifyEmitToken never panics and never accepts a
// token that acceptedEmitToken, an independent reading of CONTRACT.md ›
// Tokens and SPEC.md › Client-emit rules, refuses: the signature must be
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
		token := fuzzToken(header, claims, sig, mode, []byte(secret))
		got, ok := verifyEmitToken(token, secret, pid, ch, typ, now, maxTTL)
		if !ok {
			return
		}
		if why := acceptedEmitToken(token, []byte(secret), pid, ch, typ, now, maxTTL, got); why != "" {
			t.Fatalf("accepted %q: %s", token, why)
		}
	})
}

// fuzzToken builds the token a fuzz input stands for (see FuzzVerifyEmitToken).
func fuzzToken(header, claims, sig string, mode uint8, key []byte) string {
	b64 := base64.RawURLEncoding.EncodeToString
	signing := b64([]byte(header)) + "." + b64([]byte(claims))
	switch mode % 4 {
	case 0:
		return header + claims + sig
	case 1:
		return signing + "." + b64(hmacSHA256(key, signing))
	case 2:
		return signing + "." + b64(hmacSHA256(append([]byte("not "), key...), signing))
	default:
		return signing + "." + sig
	}
}

func hmacSHA256(key []byte, s string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(s))
	return m.Sum(nil)
}

// acceptedEmitToken says what is wrong with accepting token, or "".
func acceptedEmitToken(token string, key []byte, pid, ch, typ string, now time.Time, maxTTL time.Duration, got emitClaims) string {
	payload, why := hs256Payload(token, key)
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
	exp, ok := numericDate(c["exp"])
	if !ok {
		return "exp missing or not a NumericDate"
	}
	if !now.Before(exp.Add(grace)) {
		return "expired at " + exp.String()
	}
	iat, ok := numericDate(c["iat"])
	if !ok {
		return "iat missing or not a NumericDate"
	}
	if iat.After(now.Add(grace)) || now.Sub(iat) > maxTTL+grace {
		return "iat " + iat.String() + " outside the maximum TTL"
	}
	if v, present := c["nbf"]; present {
		if nbf, ok := numericDate(v); !ok || nbf.After(now.Add(grace)) {
			return "not yet valid"
		}
	}
	return ""
}

// hs256Payload returns the payload of token if it is a JWS (compact, or JSON
// flattened or general) with a signature that is HMAC-SHA256 under key over
// its signing input, under a protected header that is base64 JSON; else why not.
func hs256Payload(token string, key []byte) ([]byte, string) {
	if parts := strings.Split(token, "."); len(parts) == 3 {
		return hs256Part(parts[0], parts[1], parts[2], key)
	}
	var js struct {
		Payload    string `json:"payload"`
		Protected  string `json:"protected"`
		Signature  string `json:"signature"`
		Signatures []struct {
			Protected string `json:"protected"`
			Signature string `json:"signature"`
		} `json:"signatures"`
	}
	if json.Unmarshal([]byte(token), &js) != nil {
		return nil, "neither compact nor JSON serialization"
	}
	if p, why := hs256Part(js.Protected, js.Payload, js.Signature, key); why == "" {
		return p, ""
	}
	for _, s := range js.Signatures {
		if p, why := hs256Part(s.Protected, js.Payload, s.Signature, key); why == "" {
			return p, ""
		}
	}
	return nil, "no signature of the JSON serialization is HS256 with the key"
}

func hs256Part(protected, payload, sig string, key []byte) ([]byte, string) {
	var h map[string]any
	hb, ok := b64Any(protected)
	if !ok || json.Unmarshal(hb, &h) != nil {
		return nil, "protected header is not base64 JSON"
	}
	// The header's alg is not checked: jwx verifies with the algorithm the
	// caller pins (jwt.WithKey(jwa.HS256, …)) whatever the header says, so a
	// token whose header claims "none" or "HS512" but whose signature is
	// HMAC-SHA256 with the key passes. Only the key holder can make one.
	s, ok := b64Any(sig)
	if !ok || !hmac.Equal(s, hmacSHA256(key, protected+"."+payload)) {
		return nil, "signature is not HMAC-SHA256 with the key"
	}
	if h["b64"] == false {
		return []byte(payload), ""
	}
	p, ok := b64Any(payload)
	if !ok {
		return nil, "payload is not base64"
	}
	return p, ""
}

// b64Any decodes any of the four base64 alphabets a lenient reader takes.
func b64Any(s string) ([]byte, bool) {
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.StdEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, true
		}
	}
	return nil, false
}

// numericDate reads a JWT time claim: a number of seconds (RFC 7519), or as a
// lenient reader also takes it, a string of one or an RFC 3339 time.
func numericDate(v any) (time.Time, bool) {
	var s string
	switch x := v.(type) {
	case json.Number:
		s = x.String()
	case string:
		if t, err := time.Parse(time.RFC3339, x); err == nil {
			return t, true
		}
		s = x
	default:
		return time.Time{}, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return time.Time{}, false
	}
	sec := int64(f)
	return time.Unix(sec, int64((f-float64(sec))*1e9)), true
}
