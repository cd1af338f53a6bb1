package proto

import (
	"encoding/base64"
	"encoding/json"
	"strings"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// SignedHS256 reports whether token is a JWS with exactly one signature
// whose protected header names HS256, the only encoding allowed for
// client-emit tokens (PROTOCOL.md › Client-emit tokens) and the session cookie. jwx verifies with the
// algorithm of the key it is given whatever the header says, so without this
// check a token whose header claims "none", RS256 or HS512 but that is
// HMAC-SHA256-signed with the right key would pass.
//
// A compact token (three parts) is judged by its header alone, decoded
// here: parsing the whole JWS for it was most of a token check's cost.
func SignedHS256(token string) bool {
	if header, rest, ok := strings.Cut(token, "."); ok && strings.Count(rest, ".") == 1 {
		return headerNamesHS256(header)
	}
	msg, err := jws.ParseString(token)
	if err != nil || len(msg.Signatures()) != 1 {
		return false
	}
	return msg.Signatures()[0].ProtectedHeaders().Algorithm() == jwa.HS256
}

// headerNamesHS256: a compact JWS's first part is a base64url (unpadded)
// JSON object whose alg is HS256. The member is named exactly "alg" (a map:
// a struct field would also take "ALg", as encoding/json matches names
// without case).
func headerNamesHS256(header string) bool {
	b, err := base64.RawURLEncoding.DecodeString(header)
	if err != nil {
		return false
	}
	var h map[string]any
	return json.Unmarshal(b, &h) == nil && h["alg"] == string(jwa.HS256)
}
