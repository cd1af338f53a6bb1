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
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.Dash(t)

		// Logged out: every page sends the browser to /login.
		for _, path := range []string{"/", "/projects/00000000-0000-4000-8000-000000000000", "/projects/x/usage", "/projects/x/delete"} {
			c.Get(path).ExpectRedirect(t, "/login")
		}
		c.Get("/projects").ExpectRedirect(t, "/")

		// Unknown paths keep the JSON 404 of the API; / takes GET only.
		r := ts.Client().Do("GET", "/nope", "")
		r.Expect(t, http.StatusNotFound, `{"error":"not_found"}`)
		ts.Client().Do("POST", "/", "").Expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)

		login := c.Get("/login")
		if login.Status != http.StatusOK || !strings.Contains(login.Body, `action="/login"`) {
			t.Fatalf("login page: %d\n%s", login.Status, login.Body)
		}
		h := login.Header
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
			if strings.Contains(login.Body, bad) {
				t.Errorf("login page contains %q", bad)
			}
		}
		scripts := regexp.MustCompile(`<script[^>]*>`).FindAllString(login.Body, -1)
		js := regexp.MustCompile(`^<script src="(/static/dashboard\.js\?v=[0-9a-f]+)" defer>$`).FindStringSubmatch(strings.Join(scripts, ""))
		if len(scripts) != 1 || js == nil || strings.Count(login.Body, "</script>") != 1 || !strings.Contains(login.Body, scripts[0]+"</script>") {
			t.Fatalf("scripts in the login page: %q, want one empty <script src=/static/dashboard.js?v=… defer>", scripts)
		}

		// The stylesheet: ours, versioned, cacheable.
		css := regexp.MustCompile(`href="(/static/dashboard\.css\?v=[0-9a-f]+)"`).FindStringSubmatch(login.Body)
		if css == nil {
			t.Fatalf("no stylesheet link in\n%s", login.Body)
		}
		// Each is versioned and cacheable, answers a conditional GET, and is
		// briefly cacheable under any other version. The script's CSP is the
		// page's: default-src 'self' covers scripts of this origin.
		for _, f := range []struct{ what, url, contentType, marker string }{
			{"stylesheet", css[1], "text/css; charset=utf-8", "svg.chart"},
			{"script", js[1], "text/javascript; charset=utf-8", "data-copy"},
		} {
			got := c.Get(f.url)
			if got.Status != http.StatusOK || got.Header.Get("Content-Type") != f.contentType ||
				got.Header.Get("Cache-Control") != "public, max-age=31536000, immutable" || !strings.Contains(got.Body, f.marker) {
				t.Fatalf("%s: %d %v", f.what, got.Status, got.Header)
			}
			if nm := c.Send("GET", f.url, "", http.Header{"If-None-Match": {got.Header.Get("ETag")}}); nm.Status != http.StatusNotModified {
				t.Fatalf("conditional GET of the %s: %d", f.what, nm.Status)
			}
			other, _, _ := strings.Cut(f.url, "?")
			if old := c.Get(other + "?v=0000"); old.Status != http.StatusOK || old.Header.Get("Cache-Control") != "public, max-age=300" {
				t.Fatalf("%s under another version: %d %v", f.what, old.Status, old.Header)
			}
		}
	})
}

func TestDashboardSignupAndLoginErrors(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		existing := ts.Dash(t)
		existing.Signup("carol@example.com")

		c := ts.Dash(t)
		form := func(email, password string) url.Values {
			return url.Values{"email": {email}, "password": {password}}
		}
		for _, tc := range []struct {
			name, page, email, password string
			status                      int
			says                        string
		}{
			{"signup without email", "/signup", "", relaytest.Password, 400, "Enter both an email address and a password"},
			{"signup without password", "/signup", "alice@example.com", "", 400, "Enter both an email address and a password"},
			{"signup short password", "/signup", "alice@example.com", "1234567", 400, "at least 8 characters"},
			{"signup email not allowed", "/signup", "mallory@example.com", relaytest.Password, 403, "not allowed to sign up"},
			{"signup email taken", "/signup", "Carol@example.com", relaytest.Password, 409, "already exists"},
			{"login without password", "/login", "carol@example.com", "", 400, "Enter both an email address and a password"},
			{"login wrong password", "/login", "carol@example.com", "wrong password", 401, "Wrong email or password"},
			{"login unknown email", "/login", "nobody@example.com", relaytest.Password, 401, "Wrong email or password"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c.T = t
				p := c.Submit(tc.page, tc.page, form(tc.email, tc.password))
				p.ExpectError(t, tc.status, tc.says)
				if tc.email != "" && !strings.Contains(p.Body, `value="`+tc.email+`"`) {
					t.Errorf("the email typed is not kept in the form")
				}
				if strings.Contains(p.Body, tc.password) && tc.password != "" {
					t.Errorf("the password is echoed in the page")
				}
				c.Get("/").ExpectRedirect(t, "/login") // still logged out
			})
		}
		c.T = t

		// CSRF: a signup or login without the pre-session token is refused
		// and creates nothing.
		c.Post("/signup", form("alice@example.com", relaytest.Password)).ExpectError(t, http.StatusForbidden, "CSRF check failed")
		c.Post("/login", form("carol@example.com", relaytest.Password)).ExpectError(t, http.StatusForbidden, "CSRF check failed")
		if _, err := ts.app.store.UserByEmail(context.Background(), "alice@example.com"); err == nil {
			t.Fatal("a signup without CSRF token created the account")
		}

		// The right password logs in; the dashboard shows who is logged in,
		// and /login then sends the user home.
		c.Submit("/login", "/login", form("carol@example.com", relaytest.Password)).ExpectRedirect(t, "/")
		home := c.Get("/")
		if home.Status != http.StatusOK || home.ByID("who") != "carol@example.com" {
			t.Fatalf("home after login: %d who=%q", home.Status, home.ByID("who"))
		}
		c.Get("/login").ExpectRedirect(t, "/")

		// The dashboard's session is the control plane's: same cookie.
		var api client = *ts.Client()
		api.HTTP.Jar = c.HTTP.Jar
		api.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, `{"projects":[]}`)
	})
}

// The dashboard shares the brute-force limits of the JSON routes: failed
// logins through either count against one budget.
func TestDashboardThrottle(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"LOGIN_ATTEMPTS_PER_MINUTE": "2", "SIGNUP_ATTEMPTS_PER_MINUTE": "2"})
		c := ts.Dash(t)
		wrong := url.Values{"email": {"carol@example.com"}, "password": {"wrong password"}}
		c.Submit("/login", "/login", wrong).ExpectError(t, http.StatusUnauthorized, "Wrong email or password")
		ts.Client().Do("POST", "/api/auth/login", `{"email":"carol@example.com","password":"wrong password"}`).
			Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		p := c.Submit("/login", "/login", wrong)
		p.ExpectError(t, http.StatusTooManyRequests, "Too many attempts. Wait")
		if ra, err := strconv.Atoi(p.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
			t.Fatalf("Retry-After %q", p.Header.Get("Retry-After"))
		}
		ts.Client().Do("POST", "/api/auth/login", `{"email":"carol@example.com","password":"wrong password"}`).
			Expect(t, http.StatusTooManyRequests, `{"error":"too_many_attempts"}`)

		// Signups per address: two that reach the password hash pass the
		// limit, the third is refused; one refused before the hash (an email
		// not allowed) does not count.
		c.Submit("/signup", "/signup", url.Values{"email": {"mallory@example.com"}, "password": {relaytest.Password}}).ExpectError(t, http.StatusForbidden, "not allowed")
		c.Signup("alice@example.com")
		ts.Dash(t).Signup("bob@example.com")
		other := ts.Dash(t)
		other.Submit("/signup", "/signup", url.Values{"email": {"carol@example.com"}, "password": {relaytest.Password}}).
			ExpectError(t, http.StatusTooManyRequests, "Too many attempts")
		if _, err := ts.app.store.UserByEmail(context.Background(), "carol@example.com"); err == nil {
			t.Fatal("a throttled signup created the account")
		}
	})
}

func TestDashboardLogout(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.Dash(t)
		c.Signup("alice@example.com")

		// Without the token: refused, still logged in.
		c.Post("/logout", url.Values{}).ExpectError(t, http.StatusForbidden, "CSRF check failed")
		if p := c.Get("/"); p.Status != http.StatusOK {
			t.Fatalf("a logout without token logged out: %d", p.Status)
		}

		c.Submit("/", "/logout", nil).ExpectRedirect(t, "/login?done=logged-out")
		c.Get("/").ExpectRedirect(t, "/login")
		if n := c.Get("/login?done=logged-out").NoticeText(); n != "You are logged out." {
			t.Fatalf("notice %q", n)
		}
		// Logging out again without a session is harmless.
		c.Post("/logout", url.Values{}).ExpectRedirect(t, "/login?done=logged-out")
	})
}

func TestDashboardCSRF(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		alice := ts.Dash(t)
		alice.Signup("alice@example.com")
		p := alice.Create("Original")
		page := "/projects/" + p.ID
		token := alice.Get(page).CSRF(t)

		bob := ts.Dash(t)
		bob.Signup("bob@example.com")
		bobToken := bob.Get("/").CSRF(t)

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
			{"no token", rename, ts.Base},
			{"empty token", with(""), ts.Base},
			{"wrong token", with(token[:len(token)-2] + "xx"), ts.Base},
			{"token of another session", with(bobToken), ts.Base},
			{"right token, other origin", with(token), "https://evil.example"},
			{"right token, null origin", with(token), "null"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				alice.T, alice.Origin = t, tc.origin
				alice.Post(page+"/rename", tc.form).ExpectError(t, http.StatusForbidden, "CSRF check failed")
				if n := dashProjectName(t, ts, p.ID); n != "Original" {
					t.Fatalf("refused form renamed the project to %q", n)
				}
			})
		}
		alice.T, alice.Origin = t, ts.Base

		// Every state-changing form is covered, not only rename.
		keys, _ := ts.app.store.Keys(context.Background(), p.ID)
		for _, path := range []string{
			"/projects", page + "/delete", page + "/keys/rotate", page + "/keys/" + keys[0].ID + "/revoke",
			page + "/client-emit-secret", page + "/client-emit-secret/regenerate", page + "/webhook",
			page + "/webhook/remove", page + "/webhook/secret", page + "/webhook/events", page + "/budget",
		} {
			form := url.Values{"confirm": {"yes"}, "keyType": {"secret"}, "url": {"https://example.com/h"}, "limit": {"5"}, "name": {"x"}}
			alice.Post(path, form).ExpectError(t, http.StatusForbidden, "CSRF check failed")
		}
		after, _ := ts.app.store.Keys(context.Background(), p.ID)
		if len(after) != 2 || !after[0].Active() || !after[1].Active() {
			t.Fatalf("refused forms changed keys: %+v", after)
		}
		if st := dashSettings(t, ts, p.ID); st.WebhookURL != "" || st.ChannelRateLimit != nil {
			t.Fatalf("refused forms changed settings: %+v", st)
		}
		if ps, _ := ts.app.store.ProjectsByOwner(context.Background(), mustUserID(t, ts, "alice@example.com")); len(ps) != 1 {
			t.Fatalf("refused forms changed projects: %d", len(ps))
		}

		// A request without Origin or Referer (not a browser) passes with the
		// token; a same-origin Referer is accepted too.
		alice.Origin = ""
		alice.Post(page+"/rename", with(token)).ExpectRedirect(t, page+"?done=renamed")
		alice.Send("POST", page+"/rename", url.Values{"name": {"Again"}, "csrf": {token}}.Encode(),
			http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Referer": {ts.Base + page}}).ExpectRedirect(t, page+"?done=renamed")
		if n := dashProjectName(t, ts, p.ID); n != "Again" {
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
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		alice := ts.Dash(t)
		alice.Signup("alice@example.com")
		p := alice.Create("Mine")
		page := "/projects/" + p.ID

		alice.Submit("/", "/projects", url.Values{"name": {"   "}}).ExpectError(t, http.StatusBadRequest, "Enter a project name")
		alice.Submit(page, page+"/rename", url.Values{"name": {""}}).ExpectError(t, http.StatusBadRequest, "Enter a project name")
		alice.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"master"}}).ExpectError(t, http.StatusBadRequest, "public or secret")
		alice.Submit(page, page+"/keys/00000000-0000-4000-8000-000000000000/revoke", nil).ExpectError(t, http.StatusNotFound, "Key not found")
		alice.Submit(page, page+"/keys/not-a-uuid/revoke", nil).ExpectError(t, http.StatusNotFound, "Key not found")
		alice.Submit(page, page+"/webhook/secret", url.Values{"confirm": {"yes"}}).ExpectError(t, http.StatusBadRequest, "no webhook URL")
		alice.Submit(page, page+"/webhook/events", url.Values{"channel": {"on"}}).ExpectError(t, http.StatusBadRequest, "no webhook URL")

		for _, bad := range []string{"", "example.com/hook", "ftp://example.com/hook", "javascript:alert(1)", "http://", "https://user:pw@example.com/h", "https://example.com/" + strings.Repeat("a", 2100)} {
			r := alice.Submit(page, page+"/webhook", url.Values{"url": {bad}})
			r.ExpectError(t, http.StatusBadRequest, "http:// or https://")
			if bad != "" && len(bad) < 100 && !strings.Contains(r.Body, `value="`+html.EscapeString(bad)+`"`) {
				t.Errorf("webhook URL %q not kept in the form", bad)
			}
		}
		for _, bad := range []string{"abc", "0", "-1", "1.5", "1e3", "1000000001", "99999999999999999999"} {
			alice.Submit(page, page+"/budget", url.Values{"limit": {bad}}).ExpectError(t, http.StatusBadRequest, "whole number of messages per minute")
		}
		if st := dashSettings(t, ts, p.ID); st.WebhookURL != "" || st.WebhookSecret != "" || st.ChannelRateLimit != nil {
			t.Fatalf("refused forms changed settings: %+v", st)
		}
		if n := dashProjectName(t, ts, p.ID); n != "Mine" {
			t.Fatalf("name %q", n)
		}

		// Unknown and malformed project ids: 404 page.
		for _, path := range []string{"/projects/00000000-0000-4000-8000-000000000000", "/projects/nope", "/projects/nope/usage"} {
			alice.Get(path).ExpectError(t, http.StatusNotFound, "Project not found")
		}

		// Someone else's project: 404 on every page and form, and nothing changes.
		bob := ts.Dash(t)
		bob.Signup("bob@example.com")
		for _, path := range []string{page, page + "/usage", page + "/delete", page + "/client-emit-secret/regenerate", page + "/webhook/secret"} {
			bob.Get(path).ExpectError(t, http.StatusNotFound, "Project not found")
		}
		keys, _ := ts.app.store.Keys(context.Background(), p.ID)
		for _, path := range []string{
			page + "/rename", page + "/delete", page + "/keys/rotate", page + "/keys/" + keys[0].ID + "/revoke",
			page + "/client-emit-secret", page + "/client-emit-secret/regenerate", page + "/webhook",
			page + "/webhook/remove", page + "/webhook/secret", page + "/webhook/events", page + "/budget",
		} {
			form := url.Values{"confirm": {"yes"}, "keyType": {"secret"}, "url": {"https://example.com/h"}, "limit": {"5"}, "name": {"Bob's"}}
			bob.Submit("/", path, form).ExpectError(t, http.StatusNotFound, "Project not found")
		}
		after, _ := ts.app.store.Keys(context.Background(), p.ID)
		if len(after) != 2 || !after[0].Active() || !after[1].Active() {
			t.Fatalf("bob changed alice's keys: %+v", after)
		}
		st := dashSettings(t, ts, p.ID)
		if n := dashProjectName(t, ts, p.ID); n != "Mine" || st.WebhookURL != "" || st.ChannelRateLimit != nil {
			t.Fatalf("bob changed alice's project: name %q settings %+v", n, st)
		}
		if ps, _ := ts.app.store.ProjectsByOwner(context.Background(), mustUserID(t, ts, "alice@example.com")); len(ps) != 1 {
			t.Fatal("bob deleted alice's project")
		}
		if strings.Contains(bob.Get("/").Body, p.ID) {
			t.Fatal("bob's project list shows alice's project")
		}
	})
}

func TestDashboardSettings(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Hooks")
		page := "/projects/" + p.ID
		view := c.Get(page)
		if view.ByID("no-webhook") == "" || view.ByID("budget-default") == "" {
			t.Fatalf("new project shows a webhook or budget:\n%s", view.Body)
		}

		// Set: a secret is generated and shown.
		c.Submit(page, page+"/webhook", url.Values{"url": {" https://hooks.example.com/relay "}}).ExpectRedirect(t, page+"?done=webhook-saved")
		st := dashSettings(t, ts, p.ID)
		if st.WebhookURL != "https://hooks.example.com/relay" || len(st.WebhookSecret) < 40 {
			t.Fatalf("settings after set: %+v", st)
		}
		view = c.Get(page + "?done=webhook-saved")
		if view.ByID("webhook-secret") != st.WebhookSecret || view.ByID("webhook-current") != st.WebhookURL || !strings.Contains(view.NoticeText(), "Webhook URL saved") {
			t.Fatalf("page after set: secret %q url %q notice %q", view.ByID("webhook-secret"), view.ByID("webhook-current"), view.NoticeText())
		}
		secret := st.WebhookSecret

		// Budget: saved beside the webhook, which stays.
		c.Submit(page, page+"/budget", url.Values{"limit": {" 25 "}}).ExpectRedirect(t, page+"?done=budget-saved")
		st = dashSettings(t, ts, p.ID)
		if st.ChannelRateLimit == nil || *st.ChannelRateLimit != 25 || st.WebhookSecret != secret {
			t.Fatalf("settings after budget: %+v", st)
		}
		if got := c.Get(page).ByID("budget-current"); got != "25" {
			t.Fatalf("budget shown %q", got)
		}

		// Change the URL: the secret and the budget stay.
		c.Submit(page, page+"/webhook", url.Values{"url": {"http://hooks.example.com:8080/v2?x=1"}}).ExpectRedirect(t, page+"?done=webhook-saved")
		st = dashSettings(t, ts, p.ID)
		if st.WebhookURL != "http://hooks.example.com:8080/v2?x=1" || st.WebhookSecret != secret || *st.ChannelRateLimit != 25 {
			t.Fatalf("settings after change: %+v", st)
		}

		// Regenerate the secret: GET and an unconfirmed POST only ask.
		confirm := c.Get(page + "/webhook/secret")
		if confirm.Status != http.StatusOK || !strings.Contains(confirm.Body, `name="confirm" value="yes"`) {
			t.Fatalf("confirmation page: %d\n%s", confirm.Status, confirm.Body)
		}
		if r := c.Submit(page, page+"/webhook/secret", nil); r.Status != http.StatusOK || !strings.Contains(r.Body, "Regenerate the webhook signing secret?") {
			t.Fatalf("unconfirmed POST: %d", r.Status)
		}
		if dashSettings(t, ts, p.ID).WebhookSecret != secret {
			t.Fatal("an unconfirmed POST regenerated the secret")
		}
		c.Submit(page+"/webhook/secret", page+"/webhook/secret", url.Values{"confirm": {"yes"}}).ExpectRedirect(t, page+"?done=webhook-secret")
		st = dashSettings(t, ts, p.ID)
		if st.WebhookSecret == secret || len(st.WebhookSecret) < 40 || st.WebhookURL == "" || *st.ChannelRateLimit != 25 {
			t.Fatalf("settings after regenerate: %+v", st)
		}

		// Events beyond connect and disconnect: off until chosen; each box on its own.
		events := func(channel, presence bool) {
			t.Helper()
			body := c.Get(page).Body
			if strings.Contains(body, `id="webhook-channel-events" checked`) != channel || strings.Contains(body, `id="webhook-presence-events" checked`) != presence {
				t.Fatalf("page shows event boxes other than channel %v presence %v", channel, presence)
			}
			if st := dashSettings(t, ts, p.ID); st.WebhookChannelEvents != channel || st.WebhookPresenceEvents != presence {
				t.Fatalf("stored events %+v, want channel %v presence %v", st, channel, presence)
			}
		}
		events(false, false)
		c.Submit(page, page+"/webhook/events", url.Values{"presence": {"on"}}).ExpectRedirect(t, page+"?done=webhook-events")
		events(false, true)
		c.Submit(page, page+"/webhook/events", url.Values{"channel": {"on"}, "presence": {"on"}}).ExpectRedirect(t, page+"?done=webhook-events")
		events(true, true)
		if !strings.Contains(c.Get(page+"?done=webhook-events").NoticeText(), "Webhook events saved") {
			t.Fatal("no notice after saving the events")
		}

		// Remove: URL, secret and the event choice go, the budget stays.
		c.Submit(page, page+"/webhook/remove", nil).ExpectRedirect(t, page+"?done=webhook-removed")
		st = dashSettings(t, ts, p.ID)
		if st.WebhookURL != "" || st.WebhookSecret != "" || st.WebhookChannelEvents || st.WebhookPresenceEvents ||
			st.ChannelRateLimit == nil || *st.ChannelRateLimit != 25 {
			t.Fatalf("settings after remove: %+v", st)
		}
		// Setting a URL again generates a fresh secret.
		c.Submit(page, page+"/webhook", url.Values{"url": {"https://hooks.example.com/relay"}}).ExpectRedirect(t, page+"?done=webhook-saved")
		if st = dashSettings(t, ts, p.ID); st.WebhookSecret == "" || st.WebhookSecret == secret {
			t.Fatalf("secret after setting again: %+v", st)
		}

		// Empty budget clears the override.
		c.Submit(page, page+"/budget", url.Values{"limit": {""}}).ExpectRedirect(t, page+"?done=budget-cleared")
		if st = dashSettings(t, ts, p.ID); st.ChannelRateLimit != nil || st.WebhookURL == "" {
			t.Fatalf("settings after clearing the budget: %+v", st)
		}

		// Client-emit secret: generated on request, the same the API returns,
		// regenerated only after confirmation.
		if c.Get(page).ByID("no-client-emit") == "" {
			t.Fatal("a new project shows a client-emit secret")
		}
		c.Submit(page, page+"/client-emit-secret", nil).ExpectRedirect(t, page+"?done=ces-generated")
		shown := c.Get(page).ByID("client-emit-secret")
		var api client = *ts.Client()
		api.HTTP.Jar = c.HTTP.Jar
		api.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", "").Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"clientEmitSecret": shown}))
		if r := c.Submit(page, page+"/client-emit-secret/regenerate", nil); r.Status != http.StatusOK || c.Get(page).ByID("client-emit-secret") != shown {
			t.Fatalf("unconfirmed regenerate: %d", r.Status)
		}
		c.Submit(page, page+"/client-emit-secret/regenerate", url.Values{"confirm": {"yes"}}).ExpectRedirect(t, page+"?done=ces-regenerated")
		if again := c.Get(page).ByID("client-emit-secret"); again == shown || again == "" {
			t.Fatalf("client-emit secret after regenerate: %q", again)
		}
	})
}

func TestDashboardKeysRenameDelete(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Keys")
		page := "/projects/" + p.ID
		emitter := ts.Client()
		emitOK := func(secret string) {
			t.Helper()
			if r := emitter.Emit(secret, `{"channel":"c","payload":1}`); r.Status != http.StatusOK {
				t.Fatalf("emit: %d %s", r.Status, r.Raw)
			}
		}
		emitRefused := func(secret string) {
			t.Helper()
			emitter.Emit(secret, `{"channel":"c","payload":1}`).Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		}
		emitOK(p.SecretKey)

		// Later views show masked keys only.
		view := c.Get(page)
		if strings.Contains(view.Body, p.SecretKey) || strings.Contains(view.Body, p.PublicKey) || view.ByID("new-keys") != "" {
			t.Fatal("the project page shows a raw key again")
		}
		for _, raw := range []string{p.PublicKey, p.SecretKey} {
			if !strings.Contains(view.Body, "<code>"+raw[:12]+"************</code>") {
				t.Fatalf("masked key %s… not listed", raw[:12])
			}
		}

		// Rotate the secret key: the new raw key is on the answer page only;
		// the old one fails at once.
		rot := c.Shown(c.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}}))
		newSecret := rot.ByID("raw-secret-key")
		if rot.Status != http.StatusOK || !relaytest.SecretKeyRe.MatchString(newSecret) || newSecret == p.SecretKey || rot.ByID("raw-public-key") != "" {
			t.Fatalf("rotation page: %d new %q", rot.Status, newSecret)
		}
		if !strings.Contains(rot.NoticeText(), "shown only once") {
			t.Fatalf("rotation notice %q", rot.NoticeText())
		}
		emitRefused(p.SecretKey)
		emitOK(newSecret)
		if n := strings.Count(c.Get(page).Body, `class="key revoked"`); n != 1 {
			t.Fatalf("%d revoked keys listed, want 1", n)
		}

		// Revoke the new secret key from its row.
		keys, _ := ts.app.store.Keys(context.Background(), p.ID)
		var active string
		for _, k := range keys {
			if k.KeyType == "secret" && k.Active() {
				active = k.ID
			}
		}
		c.Submit(page, page+"/keys/"+active+"/revoke", nil).ExpectRedirect(t, page+"?done=key-revoked")
		emitRefused(newSecret)
		view = c.Get(page + "?done=key-revoked")
		if n := strings.Count(view.Body, `class="key revoked"`); n != 2 || !strings.Contains(view.NoticeText(), "Key revoked") {
			t.Fatalf("after revoke: %d revoked keys, notice %q", n, view.NoticeText())
		}
		last := c.Shown(c.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}})).ByID("raw-secret-key")
		emitOK(last)

		// Rename.
		c.Submit(page, page+"/rename", url.Values{"name": {"  Renamed <b>  "}}).ExpectRedirect(t, page+"?done=renamed")
		if got := c.Get(page).ByID("project-name"); got != "Renamed <b>" {
			t.Fatalf("name shown %q", got)
		}
		if !strings.Contains(c.Get("/").Body, "Renamed &lt;b&gt;") {
			t.Fatal("the list does not show the new name, escaped")
		}

		// Delete: asks first, then deletes; the keys stop working.
		if r := c.Get(page + "/delete"); r.Status != http.StatusOK || !strings.Contains(r.Body, "cannot be undone") {
			t.Fatalf("delete confirmation: %d", r.Status)
		}
		if r := c.Submit(page, page+"/delete", nil); r.Status != http.StatusOK || !strings.Contains(r.Body, "cannot be undone") {
			t.Fatalf("unconfirmed delete: %d", r.Status)
		}
		emitOK(last)
		c.Submit(page, page+"/delete", url.Values{"confirm": {"yes"}}).ExpectRedirect(t, "/?done=deleted")
		home := c.Get("/?done=deleted")
		if strings.Contains(home.Body, p.ID) || home.ByID("no-projects") == "" || !strings.Contains(home.NoticeText(), "deleted") {
			t.Fatalf("home after delete:\n%s", home.Body)
		}
		emitRefused(last)
		c.Get(page).ExpectError(t, http.StatusNotFound, "Project not found")
	})
}

func TestDashboardUsage(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"USAGE_ROLLUP_SECONDS": "3600"})
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Counted")
		page := "/projects/" + p.ID + "/usage"

		empty := c.Get(page)
		if empty.Status != http.StatusOK || empty.ByID("no-usage") == "" || strings.Contains(empty.Body, "<svg") {
			t.Fatalf("usage page without rows: %d\n%s", empty.Status, empty.Body)
		}

		ctx := context.Background()
		today := time.Now().UTC()
		day := func(n int) string { return today.AddDate(0, 0, -n).Format(time.DateOnly) }
		rows := []store.Usage{
			{ProjectID: p.ID, Day: day(1), ConnectionCount: 12, MessageCount: 3400, PeakConcurrentConnections: 7,
				Deliveries: 40000, Dropped: 3, SlowConsumersClosed: 1, ChannelRateLimited: 2, ClientEmitRateLimited: 5, LatencyP99Ms: 12.288},
			{ProjectID: p.ID, Day: day(4), ConnectionCount: 0, MessageCount: 5, PeakConcurrentConnections: 0, ProjectRateLimited: 1234, LatencyP99Ms: 1.536},
			{ProjectID: p.ID, Day: day(29), ConnectionCount: 2, MessageCount: 1234567, PeakConcurrentConnections: 2},
			{ProjectID: p.ID, Day: day(30), ConnectionCount: 99, MessageCount: 99, PeakConcurrentConnections: 99}, // outside the 30 days
		}
		for _, u := range rows {
			if err := ts.app.store.AddUsage(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		view := c.Get(page)
		if view.Status != http.StatusOK {
			t.Fatalf("usage page: %d", view.Status)
		}
		want := []string{
			day(1) + "|12|3,400|7|40,000|3|1|2|0|5|12 ms",
			day(4) + "|0|5|0|0|0|0|0|1,234|0|1.54 ms",
			day(29) + "|2|1,234,567|2|0|0|0|0|0|0|–",
		}
		rowRe := regexp.MustCompile(`<tr data-day="([^"]+)"><td>[^<]*</td>` + strings.Repeat(`<td[^>]*>([^<]*)</td>`, 10) + `</tr>`)
		var got []string
		for _, m := range rowRe.FindAllStringSubmatch(view.Body, -1) {
			got = append(got, strings.Join(m[1:], "|"))
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("usage rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if !strings.Contains(view.Body, "<td>14</td><td>1,237,972</td><td>7 ") {
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
			bars := regexp.MustCompile(`<rect class="bar `+series.class+`"[^>]*data-day="([^"]+)" data-value="(\d+)"`).FindAllStringSubmatch(view.Body, -1)
			if len(bars) != 3 {
				t.Fatalf("%d %s bars, want 3", len(bars), series.class)
			}
			for i, u := range []store.Usage{rows[2], rows[1], rows[0]} { // oldest first, left to right
				if bars[i][1] != u.Day || bars[i][2] != strconv.FormatInt(series.value(u), 10) {
					t.Fatalf("%s bar %d: %v, want %s=%d", series.class, i, bars[i][1:], u.Day, series.value(u))
				}
			}
		}
		if strings.Contains(view.Body, " style=") || strings.Contains(view.Body, "<style") {
			t.Fatal("inline styles in the usage page: the CSP blocks them")
		}
	})
}

// dashNewKeysCookie returns the sealed-keys cookie a page sets.
func dashNewKeysCookie(t testing.TB, p relaytest.Page) *http.Cookie {
	t.Helper()
	for _, line := range p.Header.Values("Set-Cookie") {
		c, err := http.ParseSetCookie(line)
		if err == nil && c.Name == "relay_new_keys" {
			return c
		}
	}
	t.Fatalf("no relay_new_keys cookie set; Set-Cookie %q", p.Header.Values("Set-Cookie"))
	return nil
}

// TestDashboardNewKeysOnce: creating a project and rotating a key answer 303
// (Post/Redirect/Get). The raw keys ride in a short-lived cookie sealed to
// the session, which the next GET of the project page opens (on any node),
// shows once and clears: a reload shows no key and creates nothing. The
// cookie opens for no other session, project or time, nor once tampered.
func TestDashboardNewKeysOnce(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		nodeA := startServerAt(t, dbURL, nil, clock.Now)
		nodeB := startServerAt(t, dbURL, nil, clock.Now) // behind the same load balancer
		c := nodeA.Dash(t)
		c.Signup("alice@example.com")
		emitter := nodeA.Client()

		created := c.Submit("/", "/projects", url.Values{"name": {"Once"}})
		m := relaytest.KeysShownRe.FindStringSubmatch(created.Header.Get("Location"))
		if created.Status != http.StatusSeeOther || m == nil {
			t.Fatalf("create: %d Location %q, want 303 to the project page", created.Status, created.Header.Get("Location"))
		}
		page, shownAt := "/projects/"+m[1], m[0]
		if created.Header.Get("Cache-Control") != "no-store" || strings.Contains(created.Body, "_live_") {
			t.Fatalf("the redirect is cacheable or carries a key: %v\n%s", created.Header, created.Body)
		}
		ck := dashNewKeysCookie(t, created)
		if ck.Path != page || ck.MaxAge != 120 || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Secure {
			t.Fatalf("sealed keys cookie %+v: want Path=%s Max-Age=120 HttpOnly SameSite=Strict, not Secure over http", ck, page)
		}
		if sealed, err := base64.RawURLEncoding.DecodeString(ck.Value); err != nil || bytes.Contains(sealed, []byte("_live_")) {
			t.Fatalf("the cookie is not sealed: %v %q", err, sealed)
		}

		// The GET, answered by the other node: the keys, once, with the notice.
		b := nodeB.Dash(t)
		b.HTTP.Jar = c.HTTP.Jar // one browser: the cookie jar does not tell ports apart
		view := b.Get(shownAt)
		pk, sk := view.ByID("raw-public-key"), view.ByID("raw-secret-key")
		if view.Status != http.StatusOK || !relaytest.PublicKeyRe.MatchString(pk) || !relaytest.SecretKeyRe.MatchString(sk) {
			t.Fatalf("project page after create: %d keys %q %q\n%s", view.Status, pk, sk, view.Body)
		}
		if n := view.NoticeText(); !strings.HasPrefix(n, "Project created. Copy both keys now") {
			t.Fatalf("notice %q", n)
		}
		if cl := dashNewKeysCookie(t, view); cl.MaxAge >= 0 || cl.Path != page || cl.Value != "" {
			t.Fatalf("the page does not clear the cookie: %+v", cl)
		}
		// The snippets carry this server's address and the keys.
		for id, want := range map[string][]string{
			"snippet-browser": {`url: "` + nodeB.Base + `"`, `publicKey: "` + pk + `"`, `relay.subscribe("demo"`},
			"snippet-curl":    {"curl -X POST '" + nodeB.Base + "/emit'", "'Authorization: Bearer " + sk + "'", `"channel":"demo"`},
			"snippet-go":      {`backend.Emit(context.Background(), nil, "` + nodeB.Base + `/emit",`, `"` + sk + `", "demo"`},
		} {
			for _, w := range want {
				if got := view.ByID(id); !strings.Contains(got, w) {
					t.Errorf("%s lacks %q:\n%s", id, w, got)
				}
			}
		}
		if view.ByID("key-hint") != "" {
			t.Error("a key hint beside both raw keys")
		}
		if r := emitter.Emit(sk, `{"channel":"c","payload":1}`); r.Status != http.StatusOK {
			t.Fatalf("emit with the key shown: %d %s", r.Status, r.Raw)
		}

		// Reload: no key, no second project; the notice says why.
		again := c.Get(shownAt)
		if again.Status != http.StatusOK || strings.Contains(again.Body, pk) || strings.Contains(again.Body, sk) || again.ByID("new-keys") != "" {
			t.Fatalf("the reload shows a raw key again: %d", again.Status)
		}
		if !strings.Contains(again.NoticeText(), "shown only once") || len(again.Header.Values("Set-Cookie")) != 0 {
			t.Fatalf("reload: notice %q, Set-Cookie %q", again.NoticeText(), again.Header.Values("Set-Cookie"))
		}
		if hint := again.ByID("key-hint"); !strings.Contains(hint, "<your public key>: your public key ("+pk[:12]+"…)") ||
			!strings.Contains(hint, "<your secret key>: your secret key ("+sk[:12]+"…)") {
			t.Fatalf("key hint %q", hint)
		}
		if !strings.Contains(again.ByID("snippet-curl"), "Bearer <your secret key>") || !strings.Contains(again.ByID("snippet-browser"), `publicKey: "<your public key>"`) {
			t.Fatalf("snippets without the raw keys:\n%s\n%s", again.ByID("snippet-curl"), again.ByID("snippet-browser"))
		}
		if ps, _ := nodeA.app.store.ProjectsByOwner(context.Background(), mustUserID(t, nodeA, "alice@example.com")); len(ps) != 1 {
			t.Fatalf("%d projects after the reload, want 1", len(ps))
		}

		// Rotate: the same way, with the new key only.
		two := c.Create("Two")
		u, _ := url.Parse(nodeA.Base + page)
		rot := c.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"public"}})
		rot.ExpectRedirect(t, shownAt)
		value := dashNewKeysCookie(t, rot).Value
		withCookie := func(c *relaytest.Dash, path, v string) relaytest.Page {
			t.Helper()
			return c.Send("GET", path, "", http.Header{"Cookie": {"relay_new_keys=" + v}})
		}
		// Another session of the same user cannot open it...
		other := nodeA.Dash(t)
		other.Submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {relaytest.Password}}).ExpectRedirect(t, "/")
		if p := withCookie(other, page, value); p.Status != http.StatusOK || p.ByID("new-keys") != "" || strings.Contains(p.Body, "raw-public-key") {
			t.Fatalf("another session opened the sealed keys: %d", p.Status)
		}
		// ...nor does another project's page.
		if p := withCookie(c, "/projects/"+two.ID, value); p.Status != http.StatusOK || p.ByID("new-keys") != "" {
			t.Fatalf("another project's page opened the sealed keys: %d", p.Status)
		}
		view = c.Get(shownAt)
		newPK := view.ByID("raw-public-key")
		if !relaytest.PublicKeyRe.MatchString(newPK) || newPK == pk || view.ByID("raw-secret-key") != "" ||
			!strings.Contains(view.NoticeText(), "New public key issued") {
			t.Fatalf("after rotate: public %q, secret %q, notice %q", newPK, view.ByID("raw-secret-key"), view.NoticeText())
		}
		if !strings.Contains(view.ByID("snippet-browser"), `publicKey: "`+newPK+`"`) || !strings.Contains(view.ByID("snippet-curl"), "Bearer <your secret key>") ||
			!strings.Contains(view.ByID("key-hint"), "<your secret key>") || strings.Contains(view.ByID("key-hint"), "<your public key>") {
			t.Fatalf("snippets after a public key rotation:\n%s\n%s\n%s", view.ByID("snippet-browser"), view.ByID("snippet-curl"), view.ByID("key-hint"))
		}

		// Tampered: shown nothing, cleared.
		c.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}}).ExpectRedirect(t, shownAt)
		for _, ck := range c.HTTP.Jar.Cookies(u) {
			if ck.Name == "relay_new_keys" {
				flipped := []byte(ck.Value)
				flipped[len(flipped)/2] ^= 1
				c.HTTP.Jar.SetCookies(u, []*http.Cookie{{Name: ck.Name, Value: string(flipped), Path: page}})
			}
		}
		if p := c.Get(shownAt); p.Status != http.StatusOK || p.ByID("new-keys") != "" {
			t.Fatalf("a tampered cookie showed keys: %d", p.Status)
		}

		// Expired on the server's clock, whatever the browser keeps.
		c.Submit(page, page+"/keys/rotate", url.Values{"keyType": {"secret"}}).ExpectRedirect(t, shownAt)
		clock.Advance(121 * time.Second)
		if p := c.Get(shownAt); p.Status != http.StatusOK || p.ByID("new-keys") != "" {
			t.Fatalf("an expired cookie showed keys: %d", p.Status)
		}
		if p := c.Get(shownAt); len(p.Header.Values("Set-Cookie")) != 0 {
			t.Fatalf("the cookie was not cleared: %q", p.Header.Values("Set-Cookie"))
		}
	})
}
