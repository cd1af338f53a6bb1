package proto

import (
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// SignedHS256 reports whether token is a JWS with exactly one signature
// whose protected header names HS256, the only encoding allowed for
// client-emit tokens (PROTOCOL.md › Client-emit tokens) and the session cookie. jwx verifies with the
// algorithm of the key it is given whatever the header says, so without this
// check a token whose header claims "none", RS256 or HS512 but that is
// HMAC-SHA256-signed with the right key would pass.
func SignedHS256(token string) bool {
	msg, err := jws.ParseString(token)
	if err != nil || len(msg.Signatures()) != 1 {
		return false
	}
	return msg.Signatures()[0].ProtectedHeaders().Algorithm() == jwa.HS256
}
