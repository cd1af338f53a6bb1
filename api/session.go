package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/proto"
)

// CookieName and SessionLifetime are fixed by cmd/relay/OPERATING.md › Sessions (the service_session
// cookie: an HS256 JWT, 7 days).
const (
	CookieName      = "service_session"
	SessionLifetime = 7 * 24 * time.Hour
)

// epochClaim carries the user's session epoch (session_state.go) the cookie
// was minted in; a cookie without it belongs to epoch 0.
const epochClaim = "epoch"

// sessions issues and verifies the service_session JWT (HS256), and asks
// state whether a signed cookie has been ended on the server (logout, log
// out everywhere).
type sessions struct {
	key    []byte
	secure string // COOKIE_SECURE: auto, true or false
	now    func() time.Time
	state  *sessionState // nil: the signature, exp and iat are all that is checked
	log    *slog.Logger
}

// session is a service_session cookie whose signature and times check out.
type session struct {
	userID string
	id     string    // the jti; for a cookie without one, a hash of the whole token
	epoch  int64     // the user's session epoch it was minted in
	ends   time.Time // when it is refused whatever the server holds: exp, or iat + SessionLifetime if earlier
}

// mint signs a session for userID in epoch (0: no epoch claim).
func (s *sessions) mint(userID string, epoch int64) (string, error) {
	now := s.now()
	b := jwt.NewBuilder().Subject(userID).IssuedAt(now).Expiration(now.Add(SessionLifetime)).JwtID(newSessionID())
	if epoch > 0 {
		b = b.Claim(epochClaim, epoch)
	}
	tok, err := b.Build()
	if err != nil {
		return "", err
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256, s.key))
	return string(signed), err
}

// newSessionID is a jti: 128 random bits.
func newSessionID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// start mints a session for userID in the user's current epoch.
func (s *sessions) start(ctx context.Context, userID string) (string, error) {
	var epoch int64
	if s.state != nil {
		e, err := s.state.epoch(ctx, userID)
		if err != nil {
			return "", err
		}
		epoch = e
	}
	return s.mint(userID, epoch)
}

// parse checks a session token's signature and times. The algorithm is
// pinned to HS256 with our key, so "none" and other algorithms are refused. A
// session lives at most SessionLifetime from its iat, whatever its exp says.
func (s *sessions) parse(token string) (session, error) {
	if !proto.SignedHS256(token) {
		return session{}, errors.New("session token is not a single HS256 signature")
	}
	t, err := jwt.ParseString(token,
		jwt.WithKey(jwa.HS256, s.key),
		jwt.WithValidate(true),
		jwt.WithClock(jwt.ClockFunc(s.now)),
		jwt.WithRequiredClaim("exp"),
		jwt.WithRequiredClaim("iat"),
		jwt.WithRequiredClaim("sub"),
	)
	if err != nil {
		return session{}, err
	}
	if t.Subject() == "" {
		return session{}, errors.New("session without subject")
	}
	now := s.now()
	if !now.Before(t.Expiration()) { // jwx does not check an exp of 0 (its "unset")
		return session{}, errors.New("session expired")
	}
	ends := t.IssuedAt().Add(SessionLifetime)
	if !now.Before(ends) {
		return session{}, errors.New("session older than its lifetime")
	}
	if t.Expiration().Before(ends) {
		ends = t.Expiration()
	}
	var epoch int64
	if v, ok := t.Get(epochClaim); ok {
		f, isNum := v.(float64)
		if !isNum || f < 0 || f != math.Trunc(f) || f > 1<<53 {
			return session{}, errors.New("session epoch is not a whole number")
		}
		epoch = int64(f)
	}
	id := t.JwtID()
	if id == "" {
		sum := sha256.Sum256([]byte(token))
		id = "sha256:" + hex.EncodeToString(sum[:])
	}
	return session{userID: t.Subject(), id: id, epoch: epoch, ends: ends}, nil
}

// check returns the session of a token that parse accepts and the server has
// not ended. ok is false for a refused token; err is set only when the store
// could not say.
func (s *sessions) check(ctx context.Context, token string) (sess session, ok bool, err error) {
	sess, err = s.parse(token)
	if err != nil {
		return session{}, false, nil
	}
	if s.state == nil {
		return sess, true, nil
	}
	ended, err := s.state.ended(ctx, sess)
	if err != nil || ended {
		return session{}, false, err
	}
	return sess, true, nil
}

// end ends one session on the server, at once on this node.
func (s *sessions) end(ctx context.Context, sess session) error {
	if s.state == nil {
		return nil
	}
	return s.state.revoke(ctx, sess)
}

// endAll ends every session of a user, on every browser.
func (s *sessions) endAll(ctx context.Context, userID string) error {
	if s.state == nil {
		return nil
	}
	return s.state.nextEpoch(ctx, userID)
}

func (s *sessions) secureFor(r *http.Request) bool {
	switch s.secure {
	case "true":
		return true
	case "false":
		return false
	}
	return viaHTTPS(r)
}

func (s *sessions) setCookie(w http.ResponseWriter, r *http.Request, token string) {
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: token, Path: "/",
		MaxAge: int(SessionLifetime / time.Second), Expires: s.now().Add(SessionLifetime),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.secureFor(r),
	})
}

func (s *sessions) clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: "", Path: "/", MaxAge: -1, Expires: time.Unix(1, 0),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.secureFor(r),
	})
}

type userIDKey struct{}

// fromRequest returns the request's session; ok is false without a valid
// one, err is set only when the store could not say.
func (s *sessions) fromRequest(r *http.Request) (sess session, ok bool, err error) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return session{}, false, nil
	}
	return s.check(r.Context(), c.Value)
}

// requireUser wraps a session route: without a valid session it answers
// 401 {error: unauthorized} (api/openapi.yaml); when the store cannot
// say whether the session was ended, 503 service_unavailable.
func (s *sessions) requireUser(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, ok, err := s.fromRequest(r)
		if err != nil {
			writeInternal(w, s.log, "check session", err)
			return
		}
		if !ok {
			writeError(w, proto.CodeUnauthorized)
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), userIDKey{}, sess.userID)))
	}
}

func userID(r *http.Request) string {
	id, _ := r.Context().Value(userIDKey{}).(string)
	return id
}
