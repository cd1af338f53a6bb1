package api

// The dashboard: server-rendered HTML pages under / for project owners
// (api/README.md › Dashboard): the account, project, key and settings
// operations of the control plane (the settings and usage also through
// …/settings and …/usage: settings_api.go). It works without JavaScript and under the CSP that
// securityHeaders sets (no inline script or style: one stylesheet and one
// small script of ours, which only adds copy buttons).
//
// Every POST carries a CSRF token (dashboard_csrf.go); pages answer with the
// status a JSON route would have for the same failure, and say in words what
// went wrong.

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/dashboard.css
var dashboardCSS []byte

//go:embed static/dashboard.js
var dashboardJS []byte

// contentVersion is a content hash put in a static file's URL, so it can be
// cached for a long time and still change with each build that changes it.
func contentVersion(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

var (
	cssVersion = contentVersion(dashboardCSS)
	jsVersion  = contentVersion(dashboardJS)
)

const (
	cssPath = "/static/dashboard.css"
	jsPath  = "/static/dashboard.js"
)

// pages are parsed once: each page file with the shared layout and the
// sections (*.part.html) pages include.
var pages = func() map[string]*template.Template {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" || strings.HasSuffix(base, ".part") {
			continue
		}
		t := template.Must(template.New(base).ParseFS(templateFS, "templates/layout.html", n))
		out[base] = template.Must(t.ParseFS(templateFS, "templates/*.part.html"))
	}
	return out
}()

// dashboard serves the HTML pages. It holds no state beyond a request.
type dashboard struct {
	*Server
}

func (d dashboard) routes(mux *http.ServeMux) {
	auth := d.authed
	mux.Handle("/{$}", methods{http.MethodGet: auth(d.handleHome)})
	mux.Handle(cssPath, methods{http.MethodGet: staticFile("dashboard.css", "text/css; charset=utf-8", cssVersion, dashboardCSS)})
	mux.Handle(jsPath, methods{http.MethodGet: staticFile("dashboard.js", "text/javascript; charset=utf-8", jsVersion, dashboardJS)})
	mux.Handle("/signup", methods{http.MethodGet: d.handleSignupPage, http.MethodPost: d.handleSignup})
	mux.Handle("/login", methods{http.MethodGet: d.handleLoginPage, http.MethodPost: d.handleLogin})
	mux.Handle("/logout", methods{http.MethodPost: d.handleLogout})
	mux.Handle("/logout-everywhere", methods{http.MethodPost: auth(d.handleLogoutEverywhere)})
	mux.Handle("/projects", methods{http.MethodGet: d.handleProjectsRedirect, http.MethodPost: auth(d.handleCreate)})
	mux.Handle("/projects/{projectId}", methods{http.MethodGet: auth(d.handleProject)})
	mux.Handle("/projects/{projectId}/rename", methods{http.MethodPost: auth(d.handleRename)})
	mux.Handle("/projects/{projectId}/delete", methods{http.MethodGet: auth(d.handleDelete), http.MethodPost: auth(d.handleDelete)})
	mux.Handle("/projects/{projectId}/keys/rotate", methods{http.MethodPost: auth(d.handleRotate)})
	mux.Handle("/projects/{projectId}/keys/{keyId}/revoke", methods{http.MethodPost: auth(d.handleRevoke)})
	mux.Handle("/projects/{projectId}/client-emit-secret", methods{http.MethodPost: auth(d.handleGenerateClientEmitSecret)})
	mux.Handle("/projects/{projectId}/client-emit-secret/regenerate", methods{
		http.MethodGet: auth(d.handleRegenerateClientEmitSecret), http.MethodPost: auth(d.handleRegenerateClientEmitSecret),
	})
	mux.Handle("/projects/{projectId}/webhook", methods{http.MethodPost: auth(d.handleSetWebhook)})
	mux.Handle("/projects/{projectId}/webhook/remove", methods{http.MethodPost: auth(d.handleRemoveWebhook)})
	mux.Handle("/projects/{projectId}/webhook/events", methods{http.MethodPost: auth(d.handleWebhookEvents)})
	mux.Handle("/projects/{projectId}/webhook/test", methods{http.MethodPost: auth(d.handleWebhookTestForm)})
	mux.Handle("/projects/{projectId}/webhook/secret", methods{
		http.MethodGet: auth(d.handleRegenerateWebhookSecret), http.MethodPost: auth(d.handleRegenerateWebhookSecret),
	})
	mux.Handle("/projects/{projectId}/budget", methods{http.MethodPost: auth(d.handleBudget)})
	mux.Handle("/projects/{projectId}/history", methods{http.MethodPost: auth(d.handleHistory)})
	mux.Handle("/projects/{projectId}/authorization/on", methods{
		http.MethodGet: auth(d.handleAuthorizationOn), http.MethodPost: auth(d.handleAuthorizationOn),
	})
	mux.Handle("/projects/{projectId}/authorization/off", methods{
		http.MethodGet: auth(d.handleAuthorizationOff), http.MethodPost: auth(d.handleAuthorizationOff),
	})
	mux.Handle("/projects/{projectId}/authorization/rotate-secret", methods{http.MethodPost: auth(d.handleRotateAuthSecret)})
	mux.Handle("/projects/{projectId}/authorization/jwks-url", methods{http.MethodPost: auth(d.handleSetJWKSURL)})
	mux.Handle("/projects/{projectId}/usage", methods{http.MethodGet: auth(d.handleUsage)})
}

// view is what every template gets: the layout's fields, then the fields of
// the page being shown (unused ones stay empty).
type view struct {
	Title  string
	Email  string // the signed-in user; "" on logged-out pages
	CSRF   string // the token every form carries
	CSS    string
	JS     string
	Error  string
	Notice string

	FormEmail string // login and signup: the email typed, kept after an error
	NewName   string // home: the name typed, kept after an error

	Projects []projectRow
	Project  *projectView
	Confirm  *confirmView
	Usage    *usageView
	Health   *healthView // the project page's live figures
}

type projectRow struct {
	ID, Name, Created string
}

// pageErr is a failure shown in the page, with its HTTP status.
type pageErr struct {
	status int
	msg    string
}

// codeMessages says in words what each control-plane code means.
var codeMessages = map[proto.Code]string{
	proto.CodeEmailAndPasswordRequired: "Enter both an email address and a password.",
	proto.CodePasswordTooShort:         "The password must be at least 8 characters long.",
	proto.CodeEmailNotAllowed:          "This email address is not allowed to sign up here. Ask the operator to add it to ALLOWED_SIGNUP_EMAILS.",
	proto.CodeEmailAlreadyRegistered:   "An account with this email address already exists. Log in instead.",
	proto.CodeInvalidCredentials:       "Wrong email or password.",
	proto.CodeNameRequired:             "Enter a project name.",
	proto.CodeTooManyProjects:          "You have reached the number of projects an account may have (MAX_PROJECTS_PER_USER). Delete one to create another.",
	proto.CodeProjectNotFound:          "Project not found. It may have been deleted, or it belongs to another account.",
	proto.CodeKeyNotFound:              "Key not found in this project.",
	proto.CodeInvalidKeyType:           "Choose which key to rotate: public or secret.",
	proto.CodeInvalidOverlap:           "The overlap must be a whole number of seconds from 0 (revoke the old key at once) to 86400 (24 hours).",
	proto.CodeInvalidJWKSURL:           "The JWKS URL must be an absolute http:// or https:// URL (for example https://example.com/.well-known/jwks.json), without user name or password, or empty to remove it.",
	proto.CodeInvalidWebhookURL:        "The webhook URL must be an absolute http:// or https:// URL (for example https://example.com/hooks/relay), without user name or password.",
	proto.CodeWebhookURLRequired:       "This project has no webhook URL: set one first.",
	proto.CodeWebhookQueueFull:         "The webhook queue of this project is full: its receiver is not keeping up. Try again later.",
	proto.CodeUnavailable:              "This cannot be done right now (the server is shutting down, or its database does not answer). Try again in a moment.",
	proto.CodeInvalidChannelRateLimit:  "The channel budget must be a whole number of messages per minute from 1 to 1000000000, or empty to use the server default.",
	proto.CodeInvalidHistoryRetention:  "The history retention must be a whole number of seconds from 0 (no history) to the server's cap (HISTORY_MAX_RETENTION_SECONDS), or empty for none.",
}

func codeErr(c proto.Code) pageErr { return pageErr{status: statusOf[c], msg: codeMessages[c]} }

// Failures without a control-plane code (the dashboard's own forms).
var (
	errCSRF = pageErr{http.StatusForbidden, "This form could not be accepted: it has expired or did not come from this dashboard " +
		"(CSRF check failed). Nothing was changed. Go back, reload the page and try again."}
	errBadForm        = pageErr{http.StatusBadRequest, "The form could not be read. Reload the page and try again."}
	errFormTooLarge   = pageErr{http.StatusRequestEntityTooLarge, "The form is too large."}
	errInternal       = pageErr{http.StatusInternalServerError, "Something went wrong on our side. Try again in a moment."}
	errLoggedOutAgain = pageErr{http.StatusForbidden, "Your session ended. Log in again."}
)

// refusalPage is how a refused project operation (projects.go) is shown;
// refused is false for any other error.
func refusalPage(err error) (pe pageErr, refused bool) {
	var coded *proto.Error
	switch {
	case errors.As(err, &coded):
		return codeErr(coded.Code), true
	}
	return pageErr{}, false
}

// notices are the confirmations shown after a redirect (?done=...). Only
// these fixed texts can appear, whatever the query says.
var notices = map[string]string{
	"welcome":           "Your account is ready. Create a project to get its keys.",
	"logged-out":        "You are logged out.",
	"logged-out-all":    "You are logged out everywhere: every session of this account has ended, in every browser.",
	"deleted":           "Project deleted, with its keys and usage.",
	"renamed":           "Project renamed.",
	"key-revoked":       "Key revoked. It stopped working immediately.",
	"keys-shown":        "New keys are shown only once, on the first view after they were created or rotated, and cannot be shown again. If you did not copy one, rotate that key to get a new one.",
	"ces-generated":     "Client-emit secret generated.",
	"ces-regenerated":   "New client-emit secret generated. Tokens signed with the old one stopped working.",
	"webhook-saved":     "Webhook URL saved. Each connect and disconnect is now sent there, signed with the secret below.",
	"webhook-removed":   "Webhook removed, with its signing secret. No more webhooks are sent.",
	"webhook-secret":    "New webhook signing secret generated. Update your receiver: the old secret no longer matches.",
	"webhook-events":    "Webhook events saved.",
	"webhook-test":      "Test event queued. Its delivery shows in Recent webhook deliveries below (reload the page to follow it).",
	"budget-saved":      "Channel budget saved. The emit endpoint applies it within a moment.",
	"budget-cleared":    "Channel budget override removed: the server default applies.",
	"history-saved":     "Channel history saved. New messages of every channel are kept in the store that long, and each emit is answered once its message is stored.",
	"history-off":       "Channel history is off: new messages are kept only in the replay buffer. Messages stored before are deleted by the retention sweep.",
	"auth-on":           "Channel authorization is on. Sign connection and subscribe tokens with the authorization secret below.",
	"auth-off":          "Channel authorization is off: tokens are ignored, private- channels and presence are open as before. The secret is kept.",
	"auth-rotated":      "New authorization secret made. Tokens signed with the previous one stopped working now.",
	"auth-overlap":      "New authorization secret made. Tokens signed with the previous one are accepted until the time shown below, then stop working.",
	"auth-jwks-saved":   "JWKS URL saved. Tokens signed RS256, ES256 or EdDSA with a key of that set (named by its kid) are accepted beside those signed with the secret.",
	"auth-jwks-removed": "JWKS URL removed. Only tokens signed with the authorization secret are accepted.",
}

// viewer is the signed-in user of a request.
type viewer struct {
	user    store.User
	session string  // the session cookie's value, to which the CSRF token is bound
	sess    session // the same, verified: what logout ends
}

type pageHandler func(w http.ResponseWriter, r *http.Request, v *viewer)

// authed wraps a page for signed-in users: without a session it redirects to
// /login; a POST must also pass the CSRF check before anything else happens.
func (d dashboard) authed(h pageHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, ok := d.viewer(r)
		if !ok {
			if r.Method == http.MethodPost {
				d.render(w, r, nil, errLoggedOutAgain.status, "error", &view{Title: "Logged out", Error: errLoggedOutAgain.msg})
				return
			}
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost {
			if pe, ok := d.readForm(w, r); !ok {
				d.fail(w, r, v, pe)
				return
			}
			if !d.csrfOK(r, csrfSession, v.session) {
				d.fail(w, r, v, errCSRF)
				return
			}
		}
		h(w, r, v)
	}
}

// viewer returns the request's signed-in user, if the session is valid, has
// not been ended on the server, and the account still exists.
func (d dashboard) viewer(r *http.Request) (*viewer, bool) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return nil, false
	}
	sess, ok, err := d.sessions.check(r.Context(), c.Value)
	if err != nil {
		d.log.Error("check session", "err", err)
	}
	if !ok {
		return nil, false
	}
	u, err := d.store.UserByID(r.Context(), sess.userID)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			d.log.Error("load session user", "err", err)
		}
		return nil, false
	}
	return &viewer{user: u, session: c.Value, sess: sess}, true
}

// maxFormBody caps dashboard form bodies; every form holds a few short fields.
const maxFormBody = 64 << 10

// readForm parses an urlencoded POST body of bounded size.
func (d dashboard) readForm(w http.ResponseWriter, r *http.Request) (pageErr, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBody)
	if err := r.ParseForm(); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return errFormTooLarge, false
		}
		return errBadForm, false
	}
	return pageErr{}, true
}

// page returns the layout fields for a page shown to v (nil: logged out).
func (d dashboard) page(r *http.Request, v *viewer, title string) *view {
	pg := &view{Title: title, Notice: notices[r.URL.Query().Get("done")]}
	if v != nil {
		pg.Email = v.user.Email
		pg.CSRF = d.csrfToken(csrfSession, v.session)
	}
	return pg
}

// render executes a page into a buffer first, so a template failure is a
// clean 500, and writes it with status. HTML pages may hold raw keys and
// secrets: never stored by caches.
func (d dashboard) render(w http.ResponseWriter, r *http.Request, v *viewer, status int, name string, pg *view) {
	pg.CSS = cssPath + "?v=" + cssVersion
	pg.JS = jsPath + "?v=" + jsVersion
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", pg); err != nil {
		d.log.Error("render dashboard page", "page", name, "err", err)
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, errInternal.msg, http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// fail shows an error page for v with the error's status.
func (d dashboard) fail(w http.ResponseWriter, r *http.Request, v *viewer, pe pageErr) {
	pg := d.page(r, v, http.StatusText(pe.status))
	pg.Error = pe.msg
	d.render(w, r, v, pe.status, "error", pg)
}

// internal logs our own fault and shows a 500 page without its cause.
func (d dashboard) internal(w http.ResponseWriter, r *http.Request, v *viewer, msg string, err error) {
	d.log.Error(msg, "err", err)
	d.fail(w, r, v, errInternal)
}

// staticFile serves one embedded file of the dashboard (its stylesheet,
// its script): immutable under the URL with its version, briefly cached
// under any other.
func staticFile(name, contentType, version string, body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", contentType)
		h.Set("ETag", `"`+version+`"`)
		if r.URL.Query().Get("v") == version {
			h.Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			h.Set("Cache-Control", "public, max-age=300")
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(body))
	}
}

func (d dashboard) handleHome(w http.ResponseWriter, r *http.Request, v *viewer) {
	d.showHome(w, r, v, http.StatusOK, "", "")
}

func (d dashboard) showHome(w http.ResponseWriter, r *http.Request, v *viewer, status int, errMsg, newName string) {
	ps, err := d.store.ProjectsByOwner(r.Context(), v.user.ID)
	if err != nil {
		d.internal(w, r, v, "list projects", err)
		return
	}
	pg := d.page(r, v, "Projects")
	pg.Error, pg.NewName = errMsg, newName
	for _, p := range ps {
		pg.Projects = append(pg.Projects, projectRow{ID: p.ID, Name: p.Name, Created: showTime(p.CreatedAt)})
	}
	d.render(w, r, v, status, "home", pg)
}

func (d dashboard) handleProjectsRedirect(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// showTime is how the dashboard prints a moment.
func showTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") }

// showSeconds is showTime to the second: the end of an overlap window.
func showSeconds(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }
