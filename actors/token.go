package actors

import (
	"slices"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/proto"
)

// emitClaims are the checked claims of a client-emit token (proto/PROTOCOL.md › Client-emit tokens).
type emitClaims struct {
	clientID string
	jti      string
	iat      time.Time
}

// tokenSkew tolerates clock differences between the minting backend and us.
const tokenSkew = 5 * time.Second

// verifyEmitToken checks a client-emit token: HS256 with the project's secret
// only (no other algorithm, no "none"), exp, iat and jti present, not expired,
// not older than maxTTL from its iat whatever its exp says, pid and ch
// matching, and typ in its types allowlist. Any failure is invalid_emit_token.
func verifyEmitToken(token, secret, projectID, channel, typ string, now time.Time, maxTTL time.Duration) (emitClaims, bool) {
	if !proto.SignedHS256(token) {
		return emitClaims{}, false
	}
	t, err := jwt.ParseString(token,
		jwt.WithKey(jwa.HS256, []byte(secret)),
		jwt.WithValidate(true),
		jwt.WithClock(jwt.ClockFunc(func() time.Time { return now })),
		jwt.WithAcceptableSkew(tokenSkew),
		jwt.WithRequiredClaim(jwt.ExpirationKey),
		jwt.WithRequiredClaim(jwt.IssuedAtKey),
		jwt.WithRequiredClaim(jwt.JwtIDKey),
		jwt.WithMaxDelta(maxTTL, "", jwt.IssuedAtKey),
		jwt.WithClaimValue("pid", projectID),
		jwt.WithClaimValue("ch", channel),
		jwt.WithTypedClaim("types", []string{}),
	)
	// jwx skips its exp check when exp is 0 (its "unset"); a token that says 1970 is expired.
	if err != nil || !now.Before(t.Expiration().Add(tokenSkew)) {
		return emitClaims{}, false
	}
	raw, _ := t.Get("types")
	types, _ := raw.([]string)
	cid, _ := t.Get("clientId")
	clientID, _ := cid.(string)
	if !slices.Contains(types, typ) || clientID == "" || t.JwtID() == "" {
		return emitClaims{}, false
	}
	return emitClaims{clientID: clientID, jti: t.JwtID(), iat: t.IssuedAt()}, true
}
