package actors

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// Channel authorization (proto/PROTOCOL.md › Channel authorization), an
// extension a project turns on: connection tokens name the user (presence
// identity) and grant private channels; a subscribe token grants one
// channel. A project that has not turned it on takes none of these paths.

// Identity is what a valid connection token says: who the user is, until
// when, and the channels it grants. Every connection with a token holds
// one, so it is kept to 32 bytes: unix seconds in 32 bits (to 2106; a
// later exp counts as then) and the grants, which most tokens lack, behind
// a pointer.
type Identity struct {
	Sub      string
	exp, iat uint32 // unix seconds; iat 0 when the token names none (or 1970)
	grants   *[]grant
}

// Exp is when the token expires.
func (id *Identity) Exp() time.Time { return time.Unix(int64(id.exp), 0) }

// unix32 is t in unix seconds, within what 32 bits hold.
func unix32(t time.Time) uint32 {
	return uint32(min(max(t.Unix(), 0), math.MaxUint32))
}

// grant is one entry of a token's channels claim: a channel, or a prefix
// (written with a trailing *), and its rights.
type grant struct {
	name      string
	prefix    bool
	subscribe bool
	presence  bool
}

// Token limits.
const (
	maxSubBytes   = 128
	maxGrants     = 100
	privatePrefix = "private-"
	// expiringNotice: a connection is told this long before its token expires.
	expiringNotice = 30 * time.Second
)

// Why a token is refused.
var (
	ErrInvalidToken = errors.New("invalid token")
	ErrTokenExpired = errors.New("token expired")
)

// ProjectAuthz is a project's channel authorization settings, as the
// handshake and the connection actors see them. Immutable once shared.
type ProjectAuthz struct {
	On      bool
	Secrets []string // HS256 secrets, current first
	// PreviousUntil ends the overlap of the secrets after the first (a
	// rotation's previous one); zero: no end.
	PreviousUntil time.Time
	// JWKSURL is the project's key set for tokens signed with its own keys
	// (RS256, ES256, EdDSA; authz_jwks.go); "": none, HS256 only.
	JWKSURL string
	// Private are the channels the project marks private besides the
	// private- ones: names, or prefixes ending in *.
	Private []string
}

// private: channel needs a grant (a private- channel, or one the project marks so).
func (az *ProjectAuthz) private(channel string) bool {
	if strings.HasPrefix(channel, privatePrefix) {
		return true
	}
	for _, p := range az.Private {
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(channel, prefix) || p == channel {
			return true
		}
	}
	return false
}

// SecretsAt is the secrets a token may be signed with at now.
func (az *ProjectAuthz) SecretsAt(now time.Time) []string {
	if len(az.Secrets) > 1 && !az.PreviousUntil.IsZero() && !now.Before(az.PreviousUntil) {
		return az.Secrets[:1]
	}
	return az.Secrets
}

// authzHolder is a project's current settings, shared by its connection
// actors and replaced (never changed) by its project actor at every load.
type authzHolder struct {
	cur    atomic.Pointer[ProjectAuthz]
	mu     sync.Mutex  // orders a handshake's seed against the actor's load
	loaded atomic.Bool // the project actor has stored what it loaded: handshakes no longer seed it
}

// seed stores a handshake's reading unless the project actor has stored
// what it loaded (a reading from before the load must not replace it).
func (h *authzHolder) seed(az *ProjectAuthz) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.loaded.Load() {
		h.cur.Store(az)
	}
}

// load stores what the project actor loaded (or was told); handshakes no
// longer seed it while the actor runs.
func (h *authzHolder) load(az *ProjectAuthz) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur.Store(az)
	h.loaded.Store(true)
}

// authzOf returns project id's holder, created empty (off) if need be.
func (s *System) authzOf(id string) *authzHolder {
	if h, ok := s.authz.Load(id); ok {
		return h.(*authzHolder)
	}
	h, _ := s.authz.LoadOrStore(id, &authzHolder{})
	return h.(*authzHolder)
}

// on: the project has turned authorization on (h may be nil: never).
func (h *authzHolder) on() *ProjectAuthz {
	if h == nil {
		return nil
	}
	if az := h.cur.Load(); az != nil && az.On {
		return az
	}
	return nil
}

// claims are what Relay reads of a verified token: a connection token's
// sub, exp, iat and channels; a subscribe token's ch, sub and presence. A
// claim of the wrong JSON type refuses the token.
type claims struct {
	Sub      string              `json:"sub"`
	Exp      *float64            `json:"exp"`
	Iat      *float64            `json:"iat"`
	Channels map[string][]string `json:"channels"`
	Ch       string              `json:"ch"`
	Presence bool                `json:"presence"`
}

// verifiedClaims reads the claims of a payload whose signature was checked:
// exp present and not passed (tokenSkew; jwx would take exp 0 as unset, and
// 1970 has passed).
func verifiedClaims(payload []byte, now time.Time) (*claims, error) {
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil || c.Exp == nil || *c.Exp <= 0 {
		return nil, ErrInvalidToken
	}
	if !now.Before(c.exp().Add(tokenSkew)) {
		return nil, ErrTokenExpired
	}
	return &c, nil
}

func (c *claims) exp() time.Time { return numericDate(c.Exp) }
func (c *claims) iat() time.Time { return numericDate(c.Iat) }

// numericDate is a JWT NumericDate (seconds, maybe fractional); zero when absent.
func numericDate(f *float64) time.Time {
	if f == nil {
		return time.Time{}
	}
	sec, frac := math.Modf(*f)
	if sec > math.MaxInt64/2 { // far past any clock: no overflow into the past
		sec = math.MaxInt64 / 2
	}
	return time.Unix(int64(sec), int64(frac*1e9))
}

// parseHS256 checks a token signed HS256 with one of secrets (no other
// algorithm, "none" included) and reads its claims.
func parseHS256(token string, secrets []string, now time.Time) (*claims, error) {
	if !proto.SignedHS256(token) {
		return nil, ErrInvalidToken
	}
	for _, secret := range secrets {
		if payload, err := jws.Verify([]byte(token), jws.WithKey(jwa.HS256, []byte(secret))); err == nil {
			return verifiedClaims(payload, now)
		}
	}
	return nil, ErrInvalidToken
}

// parseToken checks a token against a project's keys: HS256 with its
// secrets (SecretsAt now), or RS256, ES256 or EdDSA with the key of its
// JWKS that the header's kid names (keys, nil: none). No other algorithm,
// "none" and the other HS* included; a JWKS key verifies only the
// algorithm of its kty (no alg confusion). Compact form only.
func parseToken(ctx context.Context, keys *jwksCache, az *ProjectAuthz, token string, now time.Time) (*claims, error) {
	if strings.Count(token, ".") != 2 {
		return nil, ErrInvalidToken
	}
	if proto.SignedHS256(token) { // the common case, without a second parse of the header
		return parseHS256(token, az.SecretsAt(now), now)
	}
	msg, err := jws.ParseString(token)
	if err != nil || len(msg.Signatures()) != 1 {
		return nil, ErrInvalidToken
	}
	h := msg.Signatures()[0].ProtectedHeaders()
	switch alg := h.Algorithm(); alg {
	case jwa.RS256, jwa.ES256, jwa.EdDSA:
		if az.JWKSURL == "" {
			return nil, ErrInvalidToken
		}
		key, err := keys.publicKey(ctx, az.JWKSURL, h.KeyID(), alg)
		if err != nil {
			return nil, ErrInvalidToken
		}
		payload, err := jws.Verify([]byte(token), jws.WithKey(alg, key))
		if err != nil {
			return nil, ErrInvalidToken
		}
		return verifiedClaims(payload, now)
	}
	return nil, ErrInvalidToken
}

// VerifyConnectionToken checks a connection token against the project's
// keys (az): its secrets, and its JWKS through this process's cache.
func (s *System) VerifyConnectionToken(ctx context.Context, token string, az *ProjectAuthz, now time.Time) (*Identity, error) {
	return verifyConnection(ctx, s.cfg.jwks, az, token, now)
}

func verifyConnection(ctx context.Context, keys *jwksCache, az *ProjectAuthz, token string, now time.Time) (*Identity, error) {
	c, err := parseToken(ctx, keys, az, token, now)
	if err != nil {
		return nil, err
	}
	return identityOf(c)
}

// identityOf reads a verified connection token's claims.
func identityOf(c *claims) (*Identity, error) {
	if c.Sub == "" || len(c.Sub) > maxSubBytes || c.Ch != "" { // ch: a subscribe token, not a connection's
		return nil, ErrInvalidToken
	}
	id := &Identity{Sub: c.Sub, exp: unix32(c.exp())}
	if c.Iat != nil {
		id.iat = unix32(c.iat())
	}
	if c.Channels != nil {
		grants, ok := parseGrants(c.Channels)
		if !ok {
			return nil, ErrInvalidToken
		}
		id.grants = &grants
	}
	return id, nil
}

// parseGrants reads a channels claim: {"name or prefix*": ["subscribe", "presence"]}.
func parseGrants(obj map[string][]string) ([]grant, bool) {
	if len(obj) > maxGrants {
		return nil, false
	}
	out := make([]grant, 0, len(obj))
	for name, rights := range obj {
		g := grant{name: name}
		if strings.HasSuffix(name, "*") {
			g.name, g.prefix = strings.TrimSuffix(name, "*"), true
		}
		if g.name == "" && !g.prefix || rights == nil {
			return nil, false
		}
		for _, r := range rights {
			switch r {
			case "subscribe":
				g.subscribe = true
			case "presence":
				g.presence = true
			default:
				return nil, false
			}
		}
		out = append(out, g)
	}
	return out, true
}

// allows: the identity's grants cover subscribing to channel (with presence).
func (id *Identity) allows(channel string, presence bool) bool {
	if id == nil || id.grants == nil {
		return false
	}
	for _, g := range *id.grants {
		match := g.name == channel || g.prefix && strings.HasPrefix(channel, g.name)
		if match && g.subscribe && (!presence || g.presence) {
			return true
		}
	}
	return false
}

// verifySubscribeToken checks a subscribe token for channel on a connection
// of identity id (nil: anonymous), signed with the project's keys.
// presence: it grants presence too.
func verifySubscribeToken(ctx context.Context, keys *jwksCache, az *ProjectAuthz, token, channel string, id *Identity, now time.Time) (presence, ok bool) {
	c, err := parseToken(ctx, keys, az, token, now)
	if err != nil || c.Ch != channel || c.Sub != "" && (id == nil || c.Sub != id.Sub) {
		return false, false
	}
	return c.Presence, true
}

// authorizeSubscribe applies the rules of a project with authorization on
// to one subscribe; "" lets it through. keys: the JWKS cache (nil: none).
func authorizeSubscribe(ctx context.Context, keys *jwksCache, az *ProjectAuthz, id *Identity, m *proto.ClientMessage, now time.Time) proto.Code {
	if m.Presence {
		switch {
		case id == nil:
			return proto.CodeTokenRequired
		case m.ClientID != id.Sub:
			return proto.CodeClientIDMismatch
		}
	}
	if !az.private(m.Channel) || id.allows(m.Channel, m.Presence) {
		return ""
	}
	if m.Token == "" {
		return proto.CodeChannelForbidden
	}
	presence, ok := verifySubscribeToken(ctx, keys, az, m.Token, m.Channel, id, now)
	switch {
	case !ok:
		return proto.CodeInvalidSubscribeToken
	case m.Presence && !presence:
		return proto.CodeChannelForbidden
	}
	return ""
}

type tokenTick struct{}

// trackToken records (or replaces, after a refresh) the token of c, one of
// a.conns: one a revocation of its user covers closes the connection
// (4012, false), else its expiry is watched (expireTokens).
func (a *projectActor) trackToken(ctx actor.Context, c liveConn, id *Identity) bool {
	if c.ident == nil {
		a.tokenConns++
	}
	c.ident = id
	a.conns[c.sink.ID()] = c
	delete(a.warned, c.sink.ID()) // a refreshed token is told again before it expires
	if !a.checkToken(c, a.cfg.Now()) {
		return false
	}
	a.tickTokens(ctx)
	return true
}

var refreshOKFrame = transport.TextFrame(proto.RefreshOK)

// userRevoked: the token was issued (iat, whole seconds) at or before a
// revocation of its user's tokens; a token without iat is covered by any.
func (a *projectActor) userRevoked(id *Identity) bool {
	r, ok := a.revokedClients[id.Sub]
	return ok && int64(id.iat) <= r.RevokedAt.Unix()
}

// expireTokens checks every connection's token (checkToken) and ticks
// again each second while any is left. It runs at each tick, and whenever
// the revocations or the setting change: a revocation read at the first
// load of the settings covers connections that opened while it loaded. A
// project with authorization off checks nothing (a token means nothing
// there) but keeps its tokens, for when it is turned on again.
func (a *projectActor) expireTokens(ctx actor.Context) {
	if a.authz.on() == nil || a.tokenConns == 0 {
		return
	}
	now := a.cfg.Now()
	for _, c := range a.conns {
		if c.ident != nil {
			a.checkToken(c, now)
		}
	}
	a.tickTokens(ctx)
}

// checkToken closes a connection whose token a revocation covers (4012) or
// that has expired (tokenSkew after exp, as a handshake would refuse it:
// 4011), or tells it its token expires soon (once); false: closed, and the
// token no longer watched.
func (a *projectActor) checkToken(c liveConn, now time.Time) bool {
	id, exp := c.sink.ID(), c.ident.Exp()
	switch {
	case a.authz.on() == nil:
	case a.userRevoked(c.ident):
		c.sink.Close(proto.CloseTokenRevoked, "token revoked")
		a.forgetToken(c)
		return false
	case !now.Before(exp.Add(tokenSkew)):
		c.sink.Close(proto.CloseTokenExpired, "token expired")
		a.forgetToken(c)
		return false
	case !a.warned[id] && !now.Before(exp.Add(-expiringNotice)):
		if a.warned == nil {
			a.warned = map[uint64]bool{}
		}
		a.warned[id] = true
		c.sink.Send(transport.TextFrame(proto.AppendTokenExpiring(nil, int64(c.ident.exp))))
	}
	return true
}

// forgetToken stops watching c's token: c closed, or is closing.
func (a *projectActor) forgetToken(c liveConn) {
	if c.ident == nil {
		return
	}
	a.tokenConns--
	delete(a.warned, c.sink.ID())
	if _, live := a.conns[c.sink.ID()]; live {
		c.ident = nil
		a.conns[c.sink.ID()] = c
	}
}

// tickTokens schedules the next expireTokens, a second from now, unless
// one is due or no token is watched.
func (a *projectActor) tickTokens(ctx actor.Context) {
	if a.tokenConns > 0 && !a.tokenTicker {
		a.tokenTicker = true
		sendLater(ctx, time.Second, &tokenTick{})
	}
}
