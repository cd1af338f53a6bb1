package api

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

// FuzzSessionVerify: sessions.verify never panics and never accepts a
// service_session token that acceptedSession, an independent reading of
// CONTRACT.md › Tokens, refuses: the signature must be HMAC-SHA256 with
// SESSION_SECRET, the subject (the user id it returns) a non-empty string,
// and exp present and not past. A session it issued verifies.
//
// mode picks what the fuzzer controls, as in actors' FuzzVerifyEmitToken: 0
// the whole token; 1 header and claims JSON, signed correctly; 2 the same
// signed with another key; 3 header and claims JSON with sig as the raw
// signature part.
func FuzzSessionVerify(f *testing.F) {
	const hs = `{"alg":"HS256","typ":"JWT"}`
	good := `{"sub":"user-1","iat":1700000000,"exp":1700604800}`
	for _, s := range []struct {
		header, claims, sig string
		mode                uint8
	}{
		{hs, good, "", 1},
		{hs, good, "", 2},
		{`{"alg":"none"}`, good, "", 3},
		{`{"alg":"none"}`, good, "", 1},
		{`{"alg":"HS384"}`, good, "", 1},
		{`{"alg":"HS256","b64":false,"crit":["b64"]}`, good, "", 1},
		{hs, `{"sub":"user-1","exp":0}`, "", 1},
		{hs, `{"sub":"user-1","exp":0.5}`, "", 1},
		{hs, `{"sub":"user-1","exp":1699999999}`, "", 1},
		{hs, `{"sub":"user-1","exp":"2030-01-01T00:00:00Z"}`, "", 1},
		{hs, `{"sub":"user-1"}`, "", 1},
		{hs, `{"sub":"","exp":1700604800}`, "", 1},
		{hs, `{"sub":42,"exp":1700604800}`, "", 1},
		{hs, `{"sub":"user-1","exp":1700604800,"nbf":1800000000}`, "", 1},
		{hs, `{"sub":"user-1","exp":1700604800,"iat":1800000000}`, "", 1},
		{hs, `"just a string"`, "", 1},
		{hs, `{"sub":"a","sub":"b","exp":1700604800}`, "", 1},
		{hs, good, "", 0},
		{`{"sub":"user-1","exp":1700604800}`, "", "", 0},
		{"eyJhbGciOiJub25lIn0.", "eyJzdWIiOiJ1c2VyLTEiLCJleHAiOjE3MDA2MDQ4MDB9", ".", 0},
		{"a.b.c.d.e", "", "", 0},
	} {
		f.Add(s.header, s.claims, s.sig, s.mode)
	}
	key := []byte("session-secret")
	now := time.Unix(1_700_000_000, 0)
	s := &sessions{key: key, now: func() time.Time { return now }}
	issued, err := s.issue("user-1")
	if err != nil {
		f.Fatal(err)
	}
	if id, err := s.verify(issued); err != nil || id != "user-1" {
		f.Fatalf("an issued session does not verify: %q, %v", id, err)
	}
	f.Fuzz(func(t *testing.T, header, claims, sig string, mode uint8) {
		token := fuzzToken(header, claims, sig, mode, key)
		id, err := s.verify(token)
		if err != nil {
			if id != "" {
				t.Fatalf("refused %q but returned user %q", token, id)
			}
			return
		}
		if why := acceptedSession(token, key, now, id); why != "" {
			t.Fatalf("accepted %q as user %q: %s", token, id, why)
		}
	})
}

// acceptedSession says what is wrong with accepting token as user id, or "".
func acceptedSession(token string, key []byte, now time.Time, id string) string {
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
	if sub, _ := c["sub"].(string); sub == "" || sub != id {
		return "sub " + strconv.Quote(sub)
	}
	// A second's grace for sub-second rounding; sessions allow no skew.
	exp, ok := numericDate(c["exp"])
	if !ok {
		return "exp missing or not a NumericDate"
	}
	if !now.Before(exp.Add(time.Second)) {
		return "expired at " + exp.String()
	}
	for _, name := range []string{"nbf", "iat"} {
		if v, present := c[name]; present {
			if t, ok := numericDate(v); !ok || t.After(now.Add(time.Second)) {
				return name + " in the future"
			}
		}
	}
	return ""
}

// fuzzToken builds the token a fuzz input stands for (see FuzzSessionVerify).
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
