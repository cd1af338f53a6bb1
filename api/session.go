package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/proto"
)

// CookieName and SessionLifetime are fixed by CONTRACT.md › Tokens.
const (
	CookieName      = "service_session"
	SessionLifetime = 7 * 24 * time.Hour
)

// sessions issues and verifies the service_session JWT (HS256).
type sessions struct {
	key    []byte
	secure string // COOKIE_SECURE: auto, true or false
	now    func() time.Time
}

func (s *sessions) issue(userID string) (string, error) {
	now := s.now()
	tok, err := jwt.NewBuilder().Subject(userID).IssuedAt(now).Expiration(now.Add(SessionLifetime)).Build()
	if err != nil {
		return "", err
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256, s.key))
	return string(signed), err
}

// verify returns the user id of a valid session token. The algorithm is pinned
// to HS256 with our key, so "none" and other algorithms are refused.
func (s *sessions) verify(token string) (string, error) {
	if !proto.SignedHS256(token) {
		return "", errors.New("session token is not a single HS256 signature")
	}
	t, err := jwt.ParseString(token,
		jwt.WithKey(jwa.HS256, s.key),
		jwt.WithValidate(true),
		jwt.WithClock(jwt.ClockFunc(s.now)),
		jwt.WithRequiredClaim("exp"),
		jwt.WithRequiredClaim("sub"),
	)
	if err != nil {
		return "", err
	}
	if t.Subject() == "" {
		return "", errors.New("session without subject")
	}
	if !s.now().Before(t.Expiration()) { // jwx does not check an exp of 0 (its "unset")
		return "", errors.New("session expired")
	}
	return t.Subject(), nil
}

func (s *sessions) secureFor(r *http.Request) bool {
	switch s.secure {
	case "true":
		return true
	case "false":
		return false
	}
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
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

// userFromRequest returns the session's user id, or "" without a valid session.
func (s *sessions) userFromRequest(r *http.Request) string {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return ""
	}
	id, err := s.verify(c.Value)
	if err != nil {
		return ""
	}
	return id
}

// requireUser wraps a session route: without a valid session it answers
// 401 {error: unauthorized} (SPEC.md › Control plane).
func (s *sessions) requireUser(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := s.userFromRequest(r)
		if id == "" {
			writeError(w, proto.CodeUnauthorized)
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), userIDKey{}, id)))
	}
}

func userID(r *http.Request) string {
	id, _ := r.Context().Value(userIDKey{}).(string)
	return id
}
