package api

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
)

// CSRF protection of the dashboard's forms, in two layers:
//
//  1. A token in a hidden field of every form: HMAC-SHA256, keyed with the
//     session key, of what the browser already holds. For a signed-in user
//     that is the session cookie (so the token changes at each login and
//     dies with the session); for the logged-out forms (login, signup) it
//     is a random pre-session cookie, so that another site cannot log a
//     victim into an account of its choosing either. Another origin can
//     neither read the page nor the cookie, so it cannot forge the field.
//  2. When the browser says where a POST comes from (Origin, else Referer),
//     it must be this host. This stops a forged POST even where a token
//     leaked, and costs nothing for real browsers.
//
// The session cookie is SameSite=Lax as well, which alone already keeps
// cross-site POSTs from carrying it in current browsers.

// csrfField is the hidden form field's name.
const csrfField = "csrf"

// preSessionCookie binds the token of the logged-out forms.
const preSessionCookie = "relay_csrf"

type csrfBinding string

const (
	csrfSession    csrfBinding = "session"
	csrfPreSession csrfBinding = "pre-session"
)

// csrfToken is the token for forms bound to value (a cookie's value).
func (d dashboard) csrfToken(kind csrfBinding, value string) string {
	m := hmac.New(sha256.New, d.sessions.key)
	m.Write([]byte("relay dashboard csrf\x00" + string(kind) + "\x00" + value))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrfOK checks a parsed POST: the origin, then the token (constant time).
func (d dashboard) csrfOK(r *http.Request, kind csrfBinding, value string) bool {
	if !sameOrigin(r) || value == "" {
		return false
	}
	got := r.PostFormValue(csrfField)
	want := d.csrfToken(kind, value)
	return hmac.Equal([]byte(got), []byte(want))
}

// sameOrigin accepts a request whose Origin (or, without one, Referer) names
// this host, and one that carries neither (non-browser clients; the token
// still applies). "This host" is the Host header, or the X-Forwarded-Host a
// reverse proxy sets when it rewrites Host: a cross-site form cannot set
// that header, so trusting it gives a forger nothing.
func sameOrigin(r *http.Request) bool {
	src := r.Header.Get("Origin")
	if src == "" {
		src = r.Header.Get("Referer")
		if src == "" {
			return true
		}
	}
	if src == "null" {
		return false // sandboxed or privacy-redirected origins: never ours
	}
	u, err := url.Parse(src)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	fwd := forwardedHost(r)
	return fwd != "" && strings.EqualFold(u.Host, fwd)
}

// preSessionToken returns the token for the logged-out forms, setting the
// pre-session cookie first when the browser has none.
func (d dashboard) preSessionToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(preSessionCookie); err == nil && len(c.Value) >= 32 {
		return d.csrfToken(csrfPreSession, c.Value)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	value := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name: preSessionCookie, Value: value, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: d.sessions.secureFor(r),
	})
	return d.csrfToken(csrfPreSession, value)
}

// preSessionOK checks a logged-out form's POST.
func (d dashboard) preSessionOK(r *http.Request) bool {
	c, err := r.Cookie(preSessionCookie)
	if err != nil {
		return false
	}
	return d.csrfOK(r, csrfPreSession, c.Value)
}
