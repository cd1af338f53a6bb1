package main

// Black-box tests of the dashboard pages over plain HTTP (a cookie jar,
// redirects not followed), each on SQLite and on PostgreSQL: every failure
// answers with its status and says what went wrong in the page, and a
// refused form changes nothing. dashboard_browser_test.go walks the same
// pages in a real browser.

import (
	"bytes"
	"context"
	"encoding/base64"
	"html"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// dashClient is one browser's worth of cookies; it does not follow redirects.
type dashClient struct {
	t      testing.TB
	ts     *testServer
	http   *http.Client
	origin string // Origin header sent with POSTs ("" sends none)
}

func (ts *testServer) dash(t testing.TB) *dashClient {
	jar, _ := cookiejar.New(nil)
	return &dashClient{t: t, ts: ts, origin: ts.base, http: &http.Client{
		Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// dashPage is an answer: status, headers and body.
type dashPage struct {
	status int
	header http.Header
	body   string
}

// send sends method path with body ("" for none) and header with the
// client's cookies, and reads the answer.
func (c *dashClient) send(method, path, body string, header http.Header) dashPage {
	c.t.Helper()
	r, err := relaytest.Do(c.http, method, c.ts.base+path, body, header)
	if err != nil {
		c.t.Fatal(err)
	}
	return dashPage{status: r.Status, header: r.Header, body: r.Raw}
}

func (c *dashClient) get(path string) dashPage {
	c.t.Helper()
	return c.send("GET", path, "", nil)
}

// post submits form as a browser would (urlencoded, with Origin).
func (c *dashClient) post(path string, form url.Values) dashPage {
	c.t.Helper()
	h := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	if c.origin != "" {
		h.Set("Origin", c.origin)
	}
	return c.send("POST", path, form.Encode(), h)
}

// submit posts form with the CSRF token of the page at from.
func (c *dashClient) submit(from, path string, form url.Values) dashPage {
	c.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf", c.get(from).csrf(c.t))
	return c.post(path, form)
}

var (
	dashCSRFRe   = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	dashErrorRe  = regexp.MustCompile(`id="error">([^<]*)<`)
	dashNoticeRe = regexp.MustCompile(`id="notice">([^<]*)<`)
)

func dashFind(re *regexp.Regexp, body string) string {
	m := re.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// dashByID returns the text of the element with id (no nested tags).
func (p dashPage) byID(id string) string {
	return dashFind(regexp.MustCompile(`id="`+regexp.QuoteMeta(id)+`"[^>]*>([^<]*)<`), p.body)
}

func (p dashPage) csrf(t testing.TB) string {
	t.Helper()
	tok := dashFind(dashCSRFRe, p.body)
	if tok == "" {
		t.Fatalf("no CSRF token in the page (status %d):\n%s", p.status, p.body)
	}
	return tok
}

func (p dashPage) errorText() string  { return dashFind(dashErrorRe, p.body) }
func (p dashPage) noticeText() string { return dashFind(dashNoticeRe, p.body) }

// expectError fails unless the page has status and an error mentioning want.
func (p dashPage) expectError(t testing.TB, status int, want string) {
	t.Helper()
	if p.status != status {
		t.Fatalf("status %d, want %d; page:\n%s", p.status, status, p.body)
	}
	if !strings.Contains(p.errorText(), want) {
		t.Fatalf("error %q, want it to say %q", p.errorText(), want)
	}
	if ct := p.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
}

// expectRedirect fails unless the answer is a 303 to location.
func (p dashPage) expectRedirect(t testing.TB, location string) {
	t.Helper()
	if p.status != http.StatusSeeOther || p.header.Get("Location") != location {
		t.Fatalf("got %d Location %q, want 303 to %q; body:\n%s", p.status, p.header.Get("Location"), location, p.body)
	}
}

// signup creates the account through the signup form; the client is then
// logged in.
func (c *dashClient) signup(email string) {
	c.t.Helper()
	c.submit("/signup", "/signup", url.Values{"email": {email}, "password": {cpPassword}}).expectRedirect(c.t, "/?done=welcome")
}

// dashProject is a project created through the dashboard, with its raw keys.
type dashProject struct {
	id, publicKey, secretKey string
}

// dashKeysShownRe is where a create or a rotation redirects: the project
// page, which shows the new raw keys once.
var dashKeysShownRe = regexp.MustCompile(`^/projects/([0-9a-f-]{36})\?done=keys-shown$`)

// shown follows the 303 that answers a create or a rotation to the project
// page, and returns that page (the one view that shows the raw keys).
func (c *dashClient) shown(r dashPage) dashPage {
	c.t.Helper()
	loc := r.header.Get("Location")
	if r.status != http.StatusSeeOther || !dashKeysShownRe.MatchString(loc) {
		c.t.Fatalf("got %d Location %q, want 303 to the project page; body:\n%s", r.status, loc, r.body)
	}
	p := c.get(loc)
	if p.status != http.StatusOK {
		c.t.Fatalf("GET %s after the redirect: %d\n%s", loc, p.status, p.body)
	}
	return p
}

func (c *dashClient) create(name string) dashProject {
	c.t.Helper()
	p := c.shown(c.submit("/", "/projects", url.Values{"name": {name}}))
	dp := dashProject{id: p.byID("project-id"), publicKey: p.byID("raw-public-key"), secretKey: p.byID("raw-secret-key")}
	if !cpUUIDRe.MatchString(dp.id) || !cpPublicKeyRe.MatchString(dp.publicKey) || !cpSecretKeyRe.MatchString(dp.secretKey) {
		c.t.Fatalf("created project page lacks id or raw keys: %+v", dp)
	}
	return dp
}

func dashSettings(t testing.TB, ts *testServer, projectID string) store.Settings {
	t.Helper()
	st, err := ts.app.store.Settings(context.Background(), projectID)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func dashProjectName(t testing.TB, ts *testServer, projectID string) string {
	t.Helper()
	p, err := ts.app.store.Project(context.Background(), projectID)
	if err != nil {
		t.Fatal(err)
	}
	return p.Name
}

func TestDashboardPagesAndHeaders(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.dash(t)

		// Logged out: every page sends the browser to /login.
		for _, path := range []string{"/", "/projects/00000000-0000-4000-8000-000000000000", "/projects/x/usage", "/projects/x/delete"} {
			c.get(path).expectRedirect(t, "/login")
		}
		c.get("/projects").expectRedirect(t, "/")

		// Unknown paths keep the JSON 404 of the API; / takes GET only.
		r := ts.client().do("GET", "/nope", "")
		r.expect(t, http.StatusNotFound, `{"error":"not_found"}`)
		ts.client().do("POST", "/", "").expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)

		login := c.get("/login")
		if login.status != http.StatusOK || !strings.Contains(login.body, `action="/login"`) {
			t.Fatalf("login page: %d\n%s", login.status, login.body)
		}
		h := login.header
		for k, want := range map[string]string{
			"Content-Type":            "text/html; charset=utf-8",
			"Cache-Control":           "no-store",
			"X-Content-Type-Options":  "nosniff",
			"X-Frame-Options":         "DENY",
			"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
		} {
			if h.Get(k) != want {
				t.Errorf("%s: %q, want %q", k, h.Get(k), want)
			}
		}
		// Nothing inline that the CSP would block: the one script is ours,
		// from a file.
		for _, bad := range []string{"<style", " style=", "javascript:"} {
			if strings.Contains(login.body, bad) {
				t.Errorf("login page contains %q", bad)
			}
		}
		scripts := regexp.MustCompile(`<script[^>]*>`).FindAllString(login.body, -1)
		js := regexp.MustCompile(`^<script src="(/static/dashboard\.js\?v=[0-9a-f]+)" defer>$`).FindStringSubmatch(strings.Join(scripts, ""))
		if len(scripts) != 1 || js == nil || strings.Count(login.body, "</script>") != 1 || !strings.Contains(login.body, scripts[0]+"</script>") {
			t.Fatalf("scripts in the login page: %q, want one empty <script src=/static/dashboard.js?v=… defer>", scripts)
		}

		// The stylesheet: ours, versioned, cacheable.
		css := regexp.MustCompile(`href="(/static/dashboard\.css\?v=[0-9a-f]+)"`).FindStringSubmatch(login.body)
		if css == nil {
			t.Fatalf("no stylesheet link in\n%s", login.body)
		}
		// Each is versioned and cacheable, answers a conditional GET, and is
		// briefly cacheable under any other version. The script's CSP is the
		// page's: default-src 'self' covers scripts of this origin.
		for _, f := range []struct{ what, url, contentType, marker string }{
			{"stylesheet", css[1], "text/css; charset=utf-8", "svg.chart"},
			{"script", js[1], "text/javascript; charset=utf-8", "data-copy"},
		} {
			got := c.get(f.url)
			if got.status != http.StatusOK || got.header.Get("Content-Type") != f.contentType ||
				got.header.Get("Cache-Control") != "public, max-age=31536000, immutable" || !strings.Contains(got.body, f.marker) {
				t.Fatalf("%s: %d %v", f.what, got.status, got.header)
			}
			if nm := c.send("GET", f.url, "", http.Header{"If-None-Match": {got.header.Get("ETag")}}); nm.status != http.StatusNotModified {
				t.Fatalf("conditional GET of the %s: %d", f.what, nm.status)
			}
			other, _, _ := strings.Cut(f.url, "?")
			if old := c.get(other + "?v=0000"); old.status != http.StatusOK || old.header.Get("Cache-Control") != "public, max-age=300" {
				t.Fatalf("%s under another version: %d %v", f.what, old.status, old.header)
			}
		}
	})
}

func TestDashboardSignupAndLoginErrors(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		existing := ts.dash(t)
		existing.signup("carol@example.com")

		c := ts.dash(t)
		form := func(email, password string) url.Values {
			return url.Values{"email": {email}, "password": {password}}
		}
		for _, tc := range []struct {
			name, page, email, password string
			status                      int
			says                        string
		}{
			{"signup without email", "/signup", "", cpPassword, 400, "Enter both an email address and a password"},
			{"signup without password", "/signup", "alice@example.com", "", 400, "Enter both an email address and a password"},
			{"signup short password", "/signup", "alice@example.com", "1234567", 400, "at least 8 characters"},
			{"signup email not allowed", "/signup", "mallory@example.com", cpPassword, 403, "not allowed to sign up"},
			{"signup email taken", "/signup", "Carol@example.com", cpPassword, 409, "already exists"},
			{"login without password", "/login", "carol@example.com", "", 400, "Enter both an email address and a password"},
			{"login wrong password", "/login", "carol@example.com", "wrong password", 401, "Wrong email or password"},
			{"login unknown email", "/login", "nobody@example.com", cpPassword, 401, "Wrong email or password"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c.t = t
				p := c.submit(tc.page, tc.page, form(tc.email, tc.password))
				p.expectError(t, tc.status, tc.says)
				if tc.email != "" && !strings.Contains(p.body, `value="`+tc.email+`"`) {
					t.Errorf("the email typed is not kept in the form")
				}
				if strings.Contains(p.body, tc.password) && tc.password != "" {
					t.Errorf("the password is echoed in the page")
				}
				c.get("/").expectRedirect(t, "/login") // still logged out
			})
		}
		c.t = t

		// CSRF: a signup or login without the pre-session token is refused
		// and creates nothing.
		c.post("/signup", form("alice@example.com", cpPassword)).expectError(t, http.StatusForbidden, "CSRF check failed")
		c.post("/login", form("carol@example.com", cpPassword)).expectError(t, http.StatusForbidden, "CSRF check failed")
		if _, err := ts.app.store.UserByEmail(context.Background(), "alice@example.com"); err == nil {
			t.Fatal("a signup without CSRF token created the account")
		}

		// The right password logs in; the dashboard shows who is logged in,
		// and /login then sends the user home.
		c.submit("/login", "/login", form("carol@example.com", cpPassword)).expectRedirect(t, "/")
		home := c.get("/")
		if home.status != http.StatusOK || home.byID("who") != "carol@example.com" {
			t.Fatalf("home after login: %d who=%q", home.status, home.byID("who"))
		}
		c.get("/login").expectRedirect(t, "/")

		// The dashboard's session is the control plane's: same cookie.
		var api client = *ts.client()
		api.http.Jar = c.http.Jar
		api.do("GET", "/api/projects", "").expect(t, http.StatusOK, `{"projects":[]}`)
	})
}

// The dashboard shares the brute-force limits of the JSON routes: failed
// logins through either count against one budget.
func TestDashboardThrottle(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "2", "SIGNUP_ATTEMPTS_PER_MINUTE": "2"})
		c := ts.dash(t)
		wrong := url.Values{"email": {"carol@example.com"}, "password": {"wrong password"}}
		c.submit("/login", "/login", wrong).expectError(t, http.StatusUnauthorized, "Wrong email or password")
		ts.client().do("POST", "/api/auth/login", `{"email":"carol@example.com","password":"wrong password"}`).
			expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		p := c.submit("/login", "/login", wrong)
		p.expectError(t, http.StatusTooManyRequests, "Too many attempts. Wait")
		if ra, err := strconv.Atoi(p.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
			t.Fatalf("Retry-After %q", p.header.Get("Retry-After"))
		}
		ts.client().do("POST", "/api/auth/login", `{"email":"carol@example.com","password":"wrong password"}`).
			expect(t, http.StatusTooManyRequests, `{"error":"too_many_attempts"}`)

		// Signups per address: two that reach the password hash pass the
		// limit, the third is refused; one refused before the hash (an email
		// not allowed) does not count.
		c.submit("/signup", "/signup", url.Values{"email": {"mallory@example.com"}, "password": {cpPassword}}).expectError(t, http.StatusForbidden, "not allowed")
		c.signup("alice@example.com")
		ts.dash(t).signup("bob@example.com")
		other := ts.dash(t)
		other.submit("/signup", "/signup", url.Values{"email": {"carol@example.com"}, "password": {cpPassword}}).
			expectError(t, http.StatusTooManyRequests, "Too many attempts")
		if _, err := ts.app.store.UserByEmail(context.Background(), "carol@example.com"); err == nil {
			t.Fatal("a throttled signup created the account")
		}
	})
}

func TestDashboardLogout(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.dash(t)
		c.signup("alice@example.com")

		// Without the token: refused, still logged in.
		c.post("/logout", url.Values{}).expectError(t, http.StatusForbidden, "CSRF check failed")
		if p := c.get("/"); p.status != http.StatusOK {
			t.Fatalf("a logout without token logged out: %d", p.status)
		}

		c.submit("/", "/logout", nil).expectRedirect(t, "/login?done=logged-out")
		c.get("/").expectRedirect(t, "/login")
		if n := c.get("/login?done=logged-out").noticeText(); n != "You are logged out." {
			t.Fatalf("notice %q", n)
		}
		// Logging out again without a session is harmless.
		c.post("/logout", url.Values{}).expectRedirect(t, "/login?done=logged-out")
	})
}

func TestDashboardCSRF(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		alice := ts.dash(t)
		alice.signup("alice@example.com")
		p := alice.create("Original")
		page := "/projects/" + p.id
		token := alice.get(page).csrf(t)

		bob := ts.dash(t)
		bob.signup("bob@example.com")
		bobToken := bob.get("/").csrf(t)

		rename := url.Values{"name": {"Renamed"}}
		with := func(tok string) url.Values {
			f := url.Values{"name": {"Renamed"}}
			if tok != "" {
				f.Set("csrf", tok)
			}
			return f
		}
		for _, tc := range []struct {
			name   string
			form   url.Values
			origin string
		}{
			{"no token", rename, ts.base},
			{"empty token", with(""), ts.base},
			{"wrong token", with(token[:len(token)-2] + "xx"), ts.base},
			{"token of another session", with(bobToken), ts.base},
			{"right token, other origin", with(token), "https://evil.example"},
			{"right token, null origin", with(token), "null"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				alice.t, alice.origin = t, tc.origin
				alice.post(page+"/rename", tc.form).expectError(t, http.StatusForbidden, "CSRF check failed")
				if n := dashProjectName(t, ts, p.id); n != "Original" {
					t.Fatalf("refused form renamed the project to %q", n)
				}
			})
		}
		alice.t, alice.origin = t, ts.base

		// Every state-changing form is covered, not only rename.
		keys, _ := ts.app.store.Keys(context.Background(), p.id)
		for _, path := range []string{
			"/projects", page + "/delete", page + "/keys/rotate", page + "/keys/" + keys[0].ID + "/revoke",
			page + "/client-emit-secret", page + "/client-emit-secret/regenerate", page + "/webhook",
			page + "/webhook/remove", page + "/webhook/secret", page + "/webhook/events", page + "/budget",
		} {
			form := url.Values{"confirm": {"yes"}, "keyType": {"secret"}, "url": {"https://example.com/h"}, "limit": {"5"}, "name": {"x"}}
			alice.post(path, form).expectError(t, http.StatusForbidden, "CSRF check failed")
		}
		after, _ := ts.app.store.Keys(context.Background(), p.id)
		if len(after) != 2 || !after[0].Active() || !after[1].Active() {
			t.Fatalf("refused forms changed keys: %+v", after)
		}
		if st := dashSettings(t, ts, p.id); st.WebhookURL != "" || st.ChannelRateLimit != nil {
			t.Fatalf("refused forms changed settings: %+v", st)
		}
		if ps, _ := ts.app.store.ProjectsByOwner(context.Background(), mustUserID(t, ts, "alice@example.com")); len(ps) != 1 {
			t.Fatalf("refused forms changed projects: %d", len(ps))
		}

		// A request without Origin or Referer (not a browser) passes with the
		// token; a same-origin Referer is accepted too.
		alice.origin = ""
		alice.post(page+"/rename", with(token)).expectRedirect(t, page+"?done=renamed")
		alice.send("POST", page+"/rename", url.Values{"name": {"Again"}, "csrf": {token}}.Encode(),
			http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Referer": {ts.base + page}}).expectRedirect(t, page+"?done=renamed")
		if n := dashProjectName(t, ts, p.id); n != "Again" {
			t.Fatalf("name %q", n)
		}
	})
}

func mustUserID(t testing.TB, ts *testServer, email string) string {
	t.Helper()
	u, err := ts.app.store.UserByEmail(context.Background(), email)
	if err != nil {
		t.Fatal(err)
	}
	return u.ID
}

func TestDashboardProjectErrors(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		alice := ts.dash(t)
		alice.signup("alice@example.com")
		p := alice.create("Mine")
		page := "/projects/" + p.id

		alice.submit("/", "/projects", url.Values{"name": {"   "}}).expectError(t, http.StatusBadRequest, "Enter a project name")
		alice.submit(page, page+"/rename", url.Values{"name": {""}}).expectError(t, http.StatusBadRequest, "Enter a project name")
		alice.submit(page, page+"/keys/rotate", url.Values{"keyType": {"master"}}).expectError(t, http.StatusBadRequest, "public or secret")
		alice.submit(page, page+"/keys/00000000-0000-4000-8000-000000000000/revoke", nil).expectError(t, http.StatusNotFound, "Key not found")
		alice.submit(page, page+"/keys/not-a-uuid/revoke", nil).expectError(t, http.StatusNotFound, "Key not found")
		alice.submit(page, page+"/webhook/secret", url.Values{"confirm": {"yes"}}).expectError(t, http.StatusBadRequest, "no webhook URL")
		alice.submit(page, page+"/webhook/events", url.Values{"channel": {"on"}}).expectError(t, http.StatusBadRequest, "no webhook URL")

		for _, bad := range []string{"", "example.com/hook", "ftp://example.com/hook", "javascript:alert(1)", "http://", "https://user:pw@example.com/h", "https://example.com/" + strings.Repeat("a", 2100)} {
			r := alice.submit(page, page+"/webhook", url.Values{"url": {bad}})
			r.expectError(t, http.StatusBadRequest, "http:// or https://")
			if bad != "" && len(bad) < 100 && !strings.Contains(r.body, `value="`+html.EscapeString(bad)+`"`) {
				t.Errorf("webhook URL %q not kept in the form", bad)
			}
		}
		for _, bad := range []string{"abc", "0", "-1", "1.5", "1e3", "1000000001", "99999999999999999999"} {
			alice.submit(page, page+"/budget", url.Values{"limit": {bad}}).expectError(t, http.StatusBadRequest, "whole number of messages per minute")
		}
		if st := dashSettings(t, ts, p.id); st.WebhookURL != "" || st.WebhookSecret != "" || st.ChannelRateLimit != nil {
			t.Fatalf("refused forms changed settings: %+v", st)
		}
		if n := dashProjectName(t, ts, p.id); n != "Mine" {
			t.Fatalf("name %q", n)
		}

		// Unknown and malformed project ids: 404 page.
		for _, path := range []string{"/projects/00000000-0000-4000-8000-000000000000", "/projects/nope", "/projects/nope/usage"} {
			alice.get(path).expectError(t, http.StatusNotFound, "Project not found")
		}

		// Someone else's project: 404 on every page and form, and nothing changes.
		bob := ts.dash(t)
		bob.signup("bob@example.com")
		for _, path := range []string{page, page + "/usage", page + "/delete", page + "/client-emit-secret/regenerate", page + "/webhook/secret"} {
			bob.get(path).expectError(t, http.StatusNotFound, "Project not found")
		}
		keys, _ := ts.app.store.Keys(context.Background(), p.id)
		for _, path := range []string{
			page + "/rename", page + "/delete", page + "/keys/rotate", page + "/keys/" + keys[0].ID + "/revoke",
			page + "/client-emit-secret", page + "/client-emit-secret/regenerate", page + "/webhook",
			page + "/webhook/remove", page + "/webhook/secret", page + "/webhook/events", page + "/budget",
		} {
			form := url.Values{"confirm": {"yes"}, "keyType": {"secret"}, "url": {"https://example.com/h"}, "limit": {"5"}, "name": {"Bob's"}}
			bob.submit("/", path, form).expectError(t, http.StatusNotFound, "Project not found")
		}
		after, _ := ts.app.store.Keys(context.Background(), p.id)
		if len(after) != 2 || !after[0].Active() || !after[1].Active() {
			t.Fatalf("bob changed alice's keys: %+v", after)
		}
		st := dashSettings(t, ts, p.id)
		if n := dashProjectName(t, ts, p.id); n != "Mine" || st.WebhookURL != "" || st.ChannelRateLimit != nil {
			t.Fatalf("bob changed alice's project: name %q settings %+v", n, st)
		}
		if ps, _ := ts.app.store.ProjectsByOwner(context.Background(), mustUserID(t, ts, "alice@example.com")); len(ps) != 1 {
			t.Fatal("bob deleted alice's project")
		}
		if strings.Contains(bob.get("/").body, p.id) {
			t.Fatal("bob's project list shows alice's project")
		}
	})
}

func TestDashboardSettings(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.dash(t)
		c.signup("alice@example.com")
		p := c.create("Hooks")
		page := "/projects/" + p.id
		view := c.get(page)
		if view.byID("no-webhook") == "" || view.byID("budget-default") == "" {
			t.Fatalf("new project shows a webhook or budget:\n%s", view.body)
		}

		// Set: a secret is generated and shown.
		c.submit(page, page+"/webhook", url.Values{"url": {" https://hooks.example.com/relay "}}).expectRedirect(t, page+"?done=webhook-saved")
		st := dashSettings(t, ts, p.id)
		if st.WebhookURL != "https://hooks.example.com/relay" || len(st.WebhookSecret) < 40 {
			t.Fatalf("settings after set: %+v", st)
		}
		view = c.get(page + "?done=webhook-saved")
		if view.byID("webhook-secret") != st.WebhookSecret || view.byID("webhook-current") != st.WebhookURL || !strings.Contains(view.noticeText(), "Webhook URL saved") {
			t.Fatalf("page after set: secret %q url %q notice %q", view.byID("webhook-secret"), view.byID("webhook-current"), view.noticeText())
		}
		secret := st.WebhookSecret

		// Budget: saved beside the webhook, which stays.
		c.submit(page, page+"/budget", url.Values{"limit": {" 25 "}}).expectRedirect(t, page+"?done=budget-saved")
		st = dashSettings(t, ts, p.id)
		if st.ChannelRateLimit == nil || *st.ChannelRateLimit != 25 || st.WebhookSecret != secret {
			t.Fatalf("settings after budget: %+v", st)
		}
		if got := c.get(page).byID("budget-current"); got != "25" {
			t.Fatalf("budget shown %q", got)
		}

		// Change the URL: the secret and the budget stay.
		c.submit(page, page+"/webhook", url.Values{"url": {"http://hooks.example.com:8080/v2?x=1"}}).expectRedirect(t, page+"?done=webhook-saved")
		st = dashSettings(t, ts, p.id)
		if st.WebhookURL != "http://hooks.example.com:8080/v2?x=1" || st.WebhookSecret != secret || *st.ChannelRateLimit != 25 {
			t.Fatalf("settings after change: %+v", st)
		}

		// Regenerate the secret: GET and an unconfirmed POST only ask.
		confirm := c.get(page + "/webhook/secret")
		if confirm.status != http.StatusOK || !strings.Contains(confirm.body, `name="confirm" value="yes"`) {
			t.Fatalf("confirmation page: %d\n%s", confirm.status, confirm.body)
		}
		if r := c.submit(page, page+"/webhook/secret", nil); r.status != http.StatusOK || !strings.Contains(r.body, "Regenerate the webhook signing secret?") {
			t.Fatalf("unconfirmed POST: %d", r.status)
		}
		if dashSettings(t, ts, p.id).WebhookSecret != secret {
			t.Fatal("an unconfirmed POST regenerated the secret")
		}
		c.submit(page+"/webhook/secret", page+"/webhook/secret", url.Values{"confirm": {"yes"}}).expectRedirect(t, page+"?done=webhook-secret")
		st = dashSettings(t, ts, p.id)
		if st.WebhookSecret == secret || len(st.WebhookSecret) < 40 || st.WebhookURL == "" || *st.ChannelRateLimit != 25 {
			t.Fatalf("settings after regenerate: %+v", st)
		}

		// Events beyond connect and disconnect: off until chosen; each box on its own.
		events := func(channel, presence bool) {
			t.Helper()
			body := c.get(page).body
			if strings.Contains(body, `id="webhook-channel-events" checked`) != channel || strings.Contains(body, `id="webhook-presence-events" checked`) != presence {
				t.Fatalf("page shows event boxes other than channel %v presence %v", channel, presence)
			}
			if st := dashSettings(t, ts, p.id); st.WebhookChannelEvents != channel || st.WebhookPresenceEvents != presence {
				t.Fatalf("stored events %+v, want channel %v presence %v", st, channel, presence)
			}
		}
		events(false, false)
		c.submit(page, page+"/webhook/events", url.Values{"presence": {"on"}}).expectRedirect(t, page+"?done=webhook-events")
		events(false, true)
		c.submit(page, page+"/webhook/events", url.Values{"channel": {"on"}, "presence": {"on"}}).expectRedirect(t, page+"?done=webhook-events")
		events(true, true)
		if !strings.Contains(c.get(page+"?done=webhook-events").noticeText(), "Webhook events saved") {
			t.Fatal("no notice after saving the events")
		}

		// Remove: URL, secret and the event choice go, the budget stays.
		c.submit(page, page+"/webhook/remove", nil).expectRedirect(t, page+"?done=webhook-removed")
		st = dashSettings(t, ts, p.id)
		if st.WebhookURL != "" || st.WebhookSecret != "" || st.WebhookChannelEvents || st.WebhookPresenceEvents ||
			st.ChannelRateLimit == nil || *st.ChannelRateLimit != 25 {
			t.Fatalf("settings after remove: %+v", st)
		}
		// Setting a URL again generates a fresh secret.
		c.submit(page, page+"/webhook", url.Values{"url": {"https://hooks.example.com/relay"}}).expectRedirect(t, page+"?done=webhook-saved")
		if st = dashSettings(t, ts, p.id); st.WebhookSecret == "" || st.WebhookSecret == secret {
			t.Fatalf("secret after setting again: %+v", st)
		}

		// Empty budget clears the override.
		c.submit(page, page+"/budget", url.Values{"limit": {""}}).expectRedirect(t, page+"?done=budget-cleared")
		if st = dashSettings(t, ts, p.id); st.ChannelRateLimit != nil || st.WebhookURL == "" {
			t.Fatalf("settings after clearing the budget: %+v", st)
		}

		// Client-emit secret: generated on request, the same the API returns,
		// regenerated only after confirmation.
		if c.get(page).byID("no-client-emit") == "" {
			t.Fatal("a new project shows a client-emit secret")
		}
		c.submit(page, page+"/client-emit-secret", nil).expectRedirect(t, page+"?done=ces-generated")
		shown := c.get(page).byID("client-emit-secret")
		var api client = *ts.client()
		api.http.Jar = c.http.Jar
		api.do("PATCH", "/api/projects/"+p.id+"/client-emit-secret", "").expect(t, http.StatusOK, cpJSON(map[string]string{"clientEmitSecret": shown}))
		if r := c.submit(page, page+"/client-emit-secret/regenerate", nil); r.status != http.StatusOK || c.get(page).byID("client-emit-secret") != shown {
			t.Fatalf("unconfirmed regenerate: %d", r.status)
		}
		c.submit(page, page+"/client-emit-secret/regenerate", url.Values{"confirm": {"yes"}}).expectRedirect(t, page+"?done=ces-regenerated")
		if again := c.get(page).byID("client-emit-secret"); again == shown || again == "" {
			t.Fatalf("client-emit secret after regenerate: %q", again)
		}
	})
}

func TestDashboardKeysRenameDelete(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.dash(t)
		c.signup("alice@example.com")
		p := c.create("Keys")
		page := "/projects/" + p.id
		emitter := ts.client()
		emitOK := func(secret string) {
			t.Helper()
			if r := emitter.emit(secret, `{"channel":"c","payload":1}`); r.status != http.StatusOK {
				t.Fatalf("emit: %d %s", r.status, r.raw)
			}
		}
		emitRefused := func(secret string) {
			t.Helper()
			emitter.emit(secret, `{"channel":"c","payload":1}`).expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		}
		emitOK(p.secretKey)

		// Later views show masked keys only.
		view := c.get(page)
		if strings.Contains(view.body, p.secretKey) || strings.Contains(view.body, p.publicKey) || view.byID("new-keys") != "" {
			t.Fatal("the project page shows a raw key again")
		}
		for _, raw := range []string{p.publicKey, p.secretKey} {
			if !strings.Contains(view.body, "<code>"+raw[:12]+"************</code>") {
				t.Fatalf("masked key %s… not listed", raw[:12])
			}
		}

		// Rotate the secret key: the new raw key is on the answer page only;
		// the old one fails at once.
		rot := c.shown(c.submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}}))
		newSecret := rot.byID("raw-secret-key")
		if rot.status != http.StatusOK || !cpSecretKeyRe.MatchString(newSecret) || newSecret == p.secretKey || rot.byID("raw-public-key") != "" {
			t.Fatalf("rotation page: %d new %q", rot.status, newSecret)
		}
		if !strings.Contains(rot.noticeText(), "shown only once") {
			t.Fatalf("rotation notice %q", rot.noticeText())
		}
		emitRefused(p.secretKey)
		emitOK(newSecret)
		if n := strings.Count(c.get(page).body, `class="key revoked"`); n != 1 {
			t.Fatalf("%d revoked keys listed, want 1", n)
		}

		// Revoke the new secret key from its row.
		keys, _ := ts.app.store.Keys(context.Background(), p.id)
		var active string
		for _, k := range keys {
			if k.KeyType == "secret" && k.Active() {
				active = k.ID
			}
		}
		c.submit(page, page+"/keys/"+active+"/revoke", nil).expectRedirect(t, page+"?done=key-revoked")
		emitRefused(newSecret)
		view = c.get(page + "?done=key-revoked")
		if n := strings.Count(view.body, `class="key revoked"`); n != 2 || !strings.Contains(view.noticeText(), "Key revoked") {
			t.Fatalf("after revoke: %d revoked keys, notice %q", n, view.noticeText())
		}
		last := c.shown(c.submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}})).byID("raw-secret-key")
		emitOK(last)

		// Rename.
		c.submit(page, page+"/rename", url.Values{"name": {"  Renamed <b>  "}}).expectRedirect(t, page+"?done=renamed")
		if got := c.get(page).byID("project-name"); got != "Renamed <b>" {
			t.Fatalf("name shown %q", got)
		}
		if !strings.Contains(c.get("/").body, "Renamed &lt;b&gt;") {
			t.Fatal("the list does not show the new name, escaped")
		}

		// Delete: asks first, then deletes; the keys stop working.
		if r := c.get(page + "/delete"); r.status != http.StatusOK || !strings.Contains(r.body, "cannot be undone") {
			t.Fatalf("delete confirmation: %d", r.status)
		}
		if r := c.submit(page, page+"/delete", nil); r.status != http.StatusOK || !strings.Contains(r.body, "cannot be undone") {
			t.Fatalf("unconfirmed delete: %d", r.status)
		}
		emitOK(last)
		c.submit(page, page+"/delete", url.Values{"confirm": {"yes"}}).expectRedirect(t, "/?done=deleted")
		home := c.get("/?done=deleted")
		if strings.Contains(home.body, p.id) || home.byID("no-projects") == "" || !strings.Contains(home.noticeText(), "deleted") {
			t.Fatalf("home after delete:\n%s", home.body)
		}
		emitRefused(last)
		c.get(page).expectError(t, http.StatusNotFound, "Project not found")
	})
}

func TestDashboardUsage(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"USAGE_ROLLUP_SECONDS": "3600"})
		c := ts.dash(t)
		c.signup("alice@example.com")
		p := c.create("Counted")
		page := "/projects/" + p.id + "/usage"

		empty := c.get(page)
		if empty.status != http.StatusOK || empty.byID("no-usage") == "" || strings.Contains(empty.body, "<svg") {
			t.Fatalf("usage page without rows: %d\n%s", empty.status, empty.body)
		}

		ctx := context.Background()
		today := time.Now().UTC()
		day := func(n int) string { return today.AddDate(0, 0, -n).Format(time.DateOnly) }
		rows := []store.Usage{
			{ProjectID: p.id, Day: day(1), ConnectionCount: 12, MessageCount: 3400, PeakConcurrentConnections: 7,
				Deliveries: 40000, Dropped: 3, SlowConsumersClosed: 1, ChannelRateLimited: 2, ClientEmitRateLimited: 5, LatencyP99Ms: 12.288},
			{ProjectID: p.id, Day: day(4), ConnectionCount: 0, MessageCount: 5, PeakConcurrentConnections: 0, ProjectRateLimited: 1234, LatencyP99Ms: 1.536},
			{ProjectID: p.id, Day: day(29), ConnectionCount: 2, MessageCount: 1234567, PeakConcurrentConnections: 2},
			{ProjectID: p.id, Day: day(30), ConnectionCount: 99, MessageCount: 99, PeakConcurrentConnections: 99}, // outside the 30 days
		}
		for _, u := range rows {
			if err := ts.app.store.AddUsage(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		view := c.get(page)
		if view.status != http.StatusOK {
			t.Fatalf("usage page: %d", view.status)
		}
		want := []string{
			day(1) + "|12|3,400|7|40,000|3|1|2|0|5|12 ms",
			day(4) + "|0|5|0|0|0|0|0|1,234|0|1.54 ms",
			day(29) + "|2|1,234,567|2|0|0|0|0|0|0|–",
		}
		rowRe := regexp.MustCompile(`<tr data-day="([^"]+)"><td>[^<]*</td>` + strings.Repeat(`<td[^>]*>([^<]*)</td>`, 10) + `</tr>`)
		var got []string
		for _, m := range rowRe.FindAllStringSubmatch(view.body, -1) {
			got = append(got, strings.Join(m[1:], "|"))
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("usage rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if !strings.Contains(view.body, "<td>14</td><td>1,237,972</td><td>7 ") {
			t.Fatal("totals row missing or wrong")
		}
		// The chart: one bar per day with data in each panel, carrying its value.
		for _, series := range []struct {
			class string
			value func(store.Usage) int64
		}{
			{"bar-messages", func(u store.Usage) int64 { return u.MessageCount }},
			{"bar-connections", func(u store.Usage) int64 { return u.ConnectionCount }},
		} {
			bars := regexp.MustCompile(`<rect class="bar `+series.class+`"[^>]*data-day="([^"]+)" data-value="(\d+)"`).FindAllStringSubmatch(view.body, -1)
			if len(bars) != 3 {
				t.Fatalf("%d %s bars, want 3", len(bars), series.class)
			}
			for i, u := range []store.Usage{rows[2], rows[1], rows[0]} { // oldest first, left to right
				if bars[i][1] != u.Day || bars[i][2] != strconv.FormatInt(series.value(u), 10) {
					t.Fatalf("%s bar %d: %v, want %s=%d", series.class, i, bars[i][1:], u.Day, series.value(u))
				}
			}
		}
		if strings.Contains(view.body, " style=") || strings.Contains(view.body, "<style") {
			t.Fatal("inline styles in the usage page: the CSP blocks them")
		}
	})
}

// dashNewKeysCookie returns the sealed-keys cookie a page sets.
func dashNewKeysCookie(t testing.TB, p dashPage) *http.Cookie {
	t.Helper()
	for _, line := range p.header.Values("Set-Cookie") {
		c, err := http.ParseSetCookie(line)
		if err == nil && c.Name == "relay_new_keys" {
			return c
		}
	}
	t.Fatalf("no relay_new_keys cookie set; Set-Cookie %q", p.header.Values("Set-Cookie"))
	return nil
}

// TestDashboardNewKeysOnce: creating a project and rotating a key answer 303
// (Post/Redirect/Get). The raw keys ride in a short-lived cookie sealed to
// the session, which the next GET of the project page opens (on any node),
// shows once and clears: a reload shows no key and creates nothing. The
// cookie opens for no other session, project or time, nor once tampered.
func TestDashboardNewKeysOnce(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		nodeA := startServerAt(t, dbURL, nil, clock.Now)
		nodeB := startServerAt(t, dbURL, nil, clock.Now) // behind the same load balancer
		c := nodeA.dash(t)
		c.signup("alice@example.com")
		emitter := nodeA.client()

		created := c.submit("/", "/projects", url.Values{"name": {"Once"}})
		m := dashKeysShownRe.FindStringSubmatch(created.header.Get("Location"))
		if created.status != http.StatusSeeOther || m == nil {
			t.Fatalf("create: %d Location %q, want 303 to the project page", created.status, created.header.Get("Location"))
		}
		page, shownAt := "/projects/"+m[1], m[0]
		if created.header.Get("Cache-Control") != "no-store" || strings.Contains(created.body, "_live_") {
			t.Fatalf("the redirect is cacheable or carries a key: %v\n%s", created.header, created.body)
		}
		ck := dashNewKeysCookie(t, created)
		if ck.Path != page || ck.MaxAge != 120 || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Secure {
			t.Fatalf("sealed keys cookie %+v: want Path=%s Max-Age=120 HttpOnly SameSite=Strict, not Secure over http", ck, page)
		}
		if sealed, err := base64.RawURLEncoding.DecodeString(ck.Value); err != nil || bytes.Contains(sealed, []byte("_live_")) {
			t.Fatalf("the cookie is not sealed: %v %q", err, sealed)
		}

		// The GET, answered by the other node: the keys, once, with the notice.
		b := nodeB.dash(t)
		b.http.Jar = c.http.Jar // one browser: the cookie jar does not tell ports apart
		view := b.get(shownAt)
		pk, sk := view.byID("raw-public-key"), view.byID("raw-secret-key")
		if view.status != http.StatusOK || !cpPublicKeyRe.MatchString(pk) || !cpSecretKeyRe.MatchString(sk) {
			t.Fatalf("project page after create: %d keys %q %q\n%s", view.status, pk, sk, view.body)
		}
		if n := view.noticeText(); !strings.HasPrefix(n, "Project created. Copy both keys now") {
			t.Fatalf("notice %q", n)
		}
		if cl := dashNewKeysCookie(t, view); cl.MaxAge >= 0 || cl.Path != page || cl.Value != "" {
			t.Fatalf("the page does not clear the cookie: %+v", cl)
		}
		// The snippets carry this server's address and the keys.
		for id, want := range map[string][]string{
			"snippet-browser": {`url: "` + nodeB.base + `"`, `publicKey: "` + pk + `"`, `relay.subscribe("demo"`},
			"snippet-curl":    {"curl -X POST '" + nodeB.base + "/emit'", "'Authorization: Bearer " + sk + "'", `"channel":"demo"`},
			"snippet-go":      {`backend.Emit(context.Background(), nil, "` + nodeB.base + `/emit",`, `"` + sk + `", "demo"`},
		} {
			for _, w := range want {
				if got := view.byID(id); !strings.Contains(got, w) {
					t.Errorf("%s lacks %q:\n%s", id, w, got)
				}
			}
		}
		if view.byID("key-hint") != "" {
			t.Error("a key hint beside both raw keys")
		}
		if r := emitter.emit(sk, `{"channel":"c","payload":1}`); r.status != http.StatusOK {
			t.Fatalf("emit with the key shown: %d %s", r.status, r.raw)
		}

		// Reload: no key, no second project; the notice says why.
		again := c.get(shownAt)
		if again.status != http.StatusOK || strings.Contains(again.body, pk) || strings.Contains(again.body, sk) || again.byID("new-keys") != "" {
			t.Fatalf("the reload shows a raw key again: %d", again.status)
		}
		if !strings.Contains(again.noticeText(), "shown only once") || len(again.header.Values("Set-Cookie")) != 0 {
			t.Fatalf("reload: notice %q, Set-Cookie %q", again.noticeText(), again.header.Values("Set-Cookie"))
		}
		if hint := again.byID("key-hint"); !strings.Contains(hint, "<your public key>: your public key ("+pk[:12]+"…)") ||
			!strings.Contains(hint, "<your secret key>: your secret key ("+sk[:12]+"…)") {
			t.Fatalf("key hint %q", hint)
		}
		if !strings.Contains(again.byID("snippet-curl"), "Bearer <your secret key>") || !strings.Contains(again.byID("snippet-browser"), `publicKey: "<your public key>"`) {
			t.Fatalf("snippets without the raw keys:\n%s\n%s", again.byID("snippet-curl"), again.byID("snippet-browser"))
		}
		if ps, _ := nodeA.app.store.ProjectsByOwner(context.Background(), mustUserID(t, nodeA, "alice@example.com")); len(ps) != 1 {
			t.Fatalf("%d projects after the reload, want 1", len(ps))
		}

		// Rotate: the same way, with the new key only.
		two := c.create("Two")
		u, _ := url.Parse(nodeA.base + page)
		rot := c.submit(page, page+"/keys/rotate", url.Values{"keyType": {"public"}})
		rot.expectRedirect(t, shownAt)
		value := dashNewKeysCookie(t, rot).Value
		withCookie := func(c *dashClient, path, v string) dashPage {
			t.Helper()
			return c.send("GET", path, "", http.Header{"Cookie": {"relay_new_keys=" + v}})
		}
		// Another session of the same user cannot open it...
		other := nodeA.dash(t)
		other.submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {cpPassword}}).expectRedirect(t, "/")
		if p := withCookie(other, page, value); p.status != http.StatusOK || p.byID("new-keys") != "" || strings.Contains(p.body, "raw-public-key") {
			t.Fatalf("another session opened the sealed keys: %d", p.status)
		}
		// ...nor does another project's page.
		if p := withCookie(c, "/projects/"+two.id, value); p.status != http.StatusOK || p.byID("new-keys") != "" {
			t.Fatalf("another project's page opened the sealed keys: %d", p.status)
		}
		view = c.get(shownAt)
		newPK := view.byID("raw-public-key")
		if !cpPublicKeyRe.MatchString(newPK) || newPK == pk || view.byID("raw-secret-key") != "" ||
			!strings.Contains(view.noticeText(), "New public key issued") {
			t.Fatalf("after rotate: public %q, secret %q, notice %q", newPK, view.byID("raw-secret-key"), view.noticeText())
		}
		if !strings.Contains(view.byID("snippet-browser"), `publicKey: "`+newPK+`"`) || !strings.Contains(view.byID("snippet-curl"), "Bearer <your secret key>") ||
			!strings.Contains(view.byID("key-hint"), "<your secret key>") || strings.Contains(view.byID("key-hint"), "<your public key>") {
			t.Fatalf("snippets after a public key rotation:\n%s\n%s\n%s", view.byID("snippet-browser"), view.byID("snippet-curl"), view.byID("key-hint"))
		}

		// Tampered: shown nothing, cleared.
		c.submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}}).expectRedirect(t, shownAt)
		for _, ck := range c.http.Jar.Cookies(u) {
			if ck.Name == "relay_new_keys" {
				flipped := []byte(ck.Value)
				flipped[len(flipped)/2] ^= 1
				c.http.Jar.SetCookies(u, []*http.Cookie{{Name: ck.Name, Value: string(flipped), Path: page}})
			}
		}
		if p := c.get(shownAt); p.status != http.StatusOK || p.byID("new-keys") != "" {
			t.Fatalf("a tampered cookie showed keys: %d", p.status)
		}

		// Expired on the server's clock, whatever the browser keeps.
		c.submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}}).expectRedirect(t, shownAt)
		clock.Advance(121 * time.Second)
		if p := c.get(shownAt); p.status != http.StatusOK || p.byID("new-keys") != "" {
			t.Fatalf("an expired cookie showed keys: %d", p.status)
		}
		if p := c.get(shownAt); len(p.header.Values("Set-Cookie")) != 0 {
			t.Fatalf("the cookie was not cleared: %q", p.header.Values("Set-Cookie"))
		}
	})
}
