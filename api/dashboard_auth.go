package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/relayhq/relay/proto"
)

// Sign up, log in and log out: the same rules, store calls and session
// cookie as POST /api/auth/signup, /login and /logout.

func (d dashboard) handleSignupPage(w http.ResponseWriter, r *http.Request) {
	d.showAuth(w, r, "signup", http.StatusOK, "", "")
}

func (d dashboard) handleLoginPage(w http.ResponseWriter, r *http.Request) {
	d.showAuth(w, r, "login", http.StatusOK, "", "")
}

// showAuth renders the login or signup page; a signed-in user goes home.
func (d dashboard) showAuth(w http.ResponseWriter, r *http.Request, name string, status int, errMsg, email string) {
	if status == http.StatusOK {
		if _, ok := d.viewer(r); ok {
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
	}
	title := "Log in"
	if name == "signup" {
		title = "Sign up"
	}
	pg := d.page(r, nil, title)
	pg.CSRF = d.preSessionToken(w, r)
	pg.Error, pg.FormEmail = errMsg, email
	d.render(w, r, nil, status, name, pg)
}

// authForm reads and checks a logged-out form; ok is false when a page with
// the failure was already written.
func (d dashboard) authForm(w http.ResponseWriter, r *http.Request, name string) (email, password string, ok bool) {
	if pe, ok := d.readForm(w, r); !ok {
		d.showAuth(w, r, name, pe.status, pe.msg, "")
		return "", "", false
	}
	email = strings.TrimSpace(r.PostFormValue("email"))
	if !d.preSessionOK(r) {
		d.showAuth(w, r, name, errCSRF.status, errCSRF.msg, email)
		return "", "", false
	}
	return email, r.PostFormValue("password"), true
}

// throttled shows the 429 page of the brute-force limits, which the
// dashboard shares with the JSON routes (LOGIN_ATTEMPTS_PER_MINUTE,
// SIGNUP_ATTEMPTS_PER_MINUTE, and the cap on password hashes at once): one
// budget per address and email, whichever surface the attempts come through.
func (d dashboard) throttled(w http.ResponseWriter, r *http.Request, name, email string, retry int) {
	w.Header().Set("Retry-After", strconv.Itoa(retry))
	d.showAuth(w, r, name, http.StatusTooManyRequests,
		fmt.Sprintf("Too many attempts. Wait %d seconds, then try again.", retry), email)
}

// handleSignup counts like the JSON route (Server.signup).
func (d dashboard) handleSignup(w http.ResponseWriter, r *http.Request) {
	email, password, ok := d.authForm(w, r, "signup")
	if !ok {
		return
	}
	u, out, code, retry, err := d.signup(r, email, password)
	switch out {
	case signupThrottled:
		d.throttled(w, r, "signup", email, retry)
	case signupInvalid:
		pe := codeErr(code)
		d.showAuth(w, r, "signup", pe.status, pe.msg, email)
	case signupFailed:
		d.internal(w, r, nil, "sign up", err)
	case signupOK:
		d.startSession(w, r, u.ID, "/?done=welcome")
	}
}

// handleLogin counts like the JSON route: before the hash, given back when
// the attempt tested no password or the right one.
func (d dashboard) handleLogin(w http.ResponseWriter, r *http.Request) {
	email, password, ok := d.authForm(w, r, "login")
	if !ok {
		return
	}
	fail := func(c proto.Code) {
		pe := codeErr(c)
		d.showAuth(w, r, "login", pe.status, pe.msg, email)
	}
	if email == "" || password == "" {
		fail(proto.CodeEmailAndPasswordRequired)
		return
	}
	u, out, retry, err := d.login(r, email, password)
	switch out {
	case loginThrottled:
		d.throttled(w, r, "login", email, retry)
	case loginStoreFailed:
		d.internal(w, r, nil, "look up user", err)
	case loginRefused:
		fail(proto.CodeInvalidCredentials)
	case loginOK:
		d.startSession(w, r, u.ID, "/")
	}
}

func (d dashboard) startSession(w http.ResponseWriter, r *http.Request, userID, next string) {
	token, err := d.sessions.start(r.Context(), userID)
	if err != nil {
		d.internal(w, r, nil, "issue session", err)
		return
	}
	d.sessions.setCookie(w, r, token)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// handleLogout ends the session on the server and clears the cookie, so a
// copy of the cookie is refused from then on. Without a valid session there
// is nothing to protect, so it just clears the cookie; with one, the form's
// token must match, so another site cannot sign the user out.
func (d dashboard) handleLogout(w http.ResponseWriter, r *http.Request) {
	v, ok := d.viewer(r)
	if ok {
		if pe, ok := d.readForm(w, r); !ok {
			d.fail(w, r, v, pe)
			return
		}
		if !d.csrfOK(r, csrfSession, v.session) {
			d.fail(w, r, v, errCSRF)
			return
		}
		if err := d.sessions.end(r.Context(), v.sess); err != nil {
			d.internal(w, r, v, "end session", err)
			return
		}
	}
	d.sessions.clearCookie(w, r)
	http.Redirect(w, r, "/login?done=logged-out", http.StatusSeeOther)
}

// handleLogoutEverywhere ends every session of the user, in every browser
// (a new session epoch, session_state.go), this one included.
func (d dashboard) handleLogoutEverywhere(w http.ResponseWriter, r *http.Request, v *viewer) {
	if err := d.sessions.endAll(r.Context(), v.user.ID); err != nil {
		d.internal(w, r, v, "end all sessions", err)
		return
	}
	d.sessions.clearCookie(w, r)
	http.Redirect(w, r, "/login?done=logged-out-all", http.StatusSeeOther)
}
