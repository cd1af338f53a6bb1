// Package jwstest is an independent reading of HS256 JWS tokens (RFC 7515,
// 7519) for the fuzz tests of the client-emit token and the session cookie:
// what either verifier accepts must pass this reference too.
package jwstest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Token builds the token a fuzz input stands for: mode 0 the three raw
// strings joined, 1 header and claims HS256-signed with key, 2 the same
// signed with another key, 3 header and claims with sig as the signature.
func Token(header, claims, sig string, mode uint8, key []byte) string {
	b64 := base64.RawURLEncoding.EncodeToString
	signing := b64([]byte(header)) + "." + b64([]byte(claims))
	switch mode % 4 {
	case 0:
		return header + claims + sig
	case 1:
		return signing + "." + b64(HMACSHA256(key, signing))
	case 2:
		return signing + "." + b64(HMACSHA256(append([]byte("not "), key...), signing))
	default:
		return signing + "." + sig
	}
}

func HMACSHA256(key []byte, s string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(s))
	return m.Sum(nil)
}

// HS256Payload returns the payload of token if it is a JWS (compact, or JSON
// flattened or general) with a signature that is HMAC-SHA256 under key over
// its signing input, under a protected header that is base64 JSON; else why not.
func HS256Payload(token string, key []byte) ([]byte, string) {
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
	// proto/PROTOCOL.md › Client-emit tokens pins the encoding: the header must name HS256 too (jwx
	// alone would verify with the pinned algorithm whatever it says).
	if h["alg"] != "HS256" {
		return nil, "protected header does not name HS256"
	}
	s, ok := b64Any(sig)
	if !ok || !hmac.Equal(s, HMACSHA256(key, protected+"."+payload)) {
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

// NumericDate reads a JWT time claim: a number of seconds (RFC 7519), or as a
// lenient reader also takes it, a string of one or an RFC 3339 time.
func NumericDate(v any) (time.Time, bool) {
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
