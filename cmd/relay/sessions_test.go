package main

// Black-box tests of sessions that end on the server (cmd/relay/OPERATING.md › Abuse limits
// › Sessions): a logged-out cookie replayed, "log out everywhere", the cap
// on a session's age from its iat, and how fast another node sees a logout.
// Each on SQLite and on PostgreSQL.

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// sessCookie is the service_session value a client's jar holds for ts.
func sessCookie(t testing.TB, ts *testServer, jar http.CookieJar) string {
	t.Helper()
	u, _ := url.Parse(ts.Base)
	for _, c := range jar.Cookies(u) {
		if c.Name == api.CookieName && c.Value != "" {
			return c.Value
		}
	}
	t.Fatal("no session cookie in the jar")
	return ""
}

// dashWithCookie is a fresh dashboard client holding service_session=value.
func (ts *testServer) dashWithCookie(t testing.TB, value string) *relaytest.Dash {
	c := ts.Dash(t)
	u, _ := url.Parse(ts.Base)
	c.HTTP.Jar.SetCookies(u, []*http.Cookie{{Name: api.CookieName, Value: value, Path: "/"}})
	return c
}

// sessRefused fails unless the cookie value is refused by the JSON API (401
// unauthorized) and the dashboard (a redirect to /login).
func sessRefused(t testing.TB, ts *testServer, value, what string) {
	t.Helper()
	c := ts.WithCookie(value).On(t)
	for _, rt := range []relaytest.Route{{Name: "list", Method: "GET", Path: "/api/projects"}, {Name: "create", Method: "POST", Path: "/api/projects", Body: `{"name":"Replayed"}`}} {
		r := c.Do(rt.Method, rt.Path, rt.Body)
		if r.Status != http.StatusUnauthorized {
			t.Fatalf("%s: %s %s with the cookie: %d %s", what, rt.Method, rt.Path, r.Status, r.Raw)
		}
		r.Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	}
	d := ts.dashWithCookie(t, value)
	d.Get("/").ExpectRedirect(t, "/login")
	d.Get("/projects/00000000-0000-4000-8000-000000000000").ExpectRedirect(t, "/login")
	if p := d.Get("/login"); p.Status != http.StatusOK {
		t.Fatalf("%s: /login with the cookie: %d (a refused session must see the login form)", what, p.Status)
	}
}

// sessAccepted fails unless the cookie value still works on both surfaces.
func sessAccepted(t testing.TB, ts *testServer, value, what string) {
	t.Helper()
	if r := ts.WithCookie(value).On(t).Do("GET", "/api/projects", ""); r.Status != http.StatusOK {
		t.Fatalf("%s: GET /api/projects: %d %s", what, r.Status, r.Raw)
	}
	if p := ts.dashWithCookie(t, value).Get("/"); p.Status != http.StatusOK {
		t.Fatalf("%s: dashboard /: %d", what, p.Status)
	}
}

// TestLogoutEndsSessionJSON: the attack measured on loopback: save the
// cookie, log out through the JSON API, replay it. It is refused at once,
// on the API and the dashboard; the user's other sessions live on. A cookie
// without a jti (minted by hand with the session secret) is ended too.
func TestLogoutEndsSessionJSON(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		secret := []byte("test-session-secret-0123456789abcdef")
		ts := startServer(t, dbURL, map[string]string{"SESSION_SECRET": string(secret)})
		c, aliceID := ts.SignupID(t, "alice@example.com")
		saved := sessCookie(t, ts, c.HTTP.Jar)
		other := ts.Client().On(t)
		other.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": aliceID, "email": "alice@example.com"}))
		otherCookie := sessCookie(t, ts, other.HTTP.Jar)
		sessAccepted(t, ts, saved, "before logout")

		c.Do("POST", "/api/auth/logout", "").Expect(t, http.StatusOK, `{"ok":true}`)
		sessRefused(t, ts, saved, "replayed after logout")
		// Logging out with the ended cookie again is still 200, and changes nothing.
		ts.WithCookie(saved).Do("POST", "/api/auth/logout", "").Expect(t, http.StatusOK, `{"ok":true}`)
		sessRefused(t, ts, saved, "after a second logout")

		// Only that session ended.
		sessAccepted(t, ts, otherCookie, "the user's other session")
		// A new login gets a new session that works.
		c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": aliceID, "email": "alice@example.com"}))
		fresh := sessCookie(t, ts, c.HTTP.Jar)
		if fresh == saved {
			t.Fatal("login handed out the ended cookie again")
		}
		sessAccepted(t, ts, fresh, "a new login")

		// A cookie with no jti, signed with the session secret: logout ends it too.
		now := time.Now().Unix()
		handMade := relaytest.HandJWT("HS256", secret, map[string]any{"sub": aliceID, "iat": now, "exp": now + 3600})
		sessAccepted(t, ts, handMade, "a hand-made cookie")
		ts.WithCookie(handMade).Do("POST", "/api/auth/logout", "").Expect(t, http.StatusOK, `{"ok":true}`)
		sessRefused(t, ts, handMade, "a hand-made cookie after its logout")
		sessAccepted(t, ts, fresh, "the session of the new login")
	})
}

// TestLogoutWithTheStoreFailing: POST /api/auth/logout is always 200 and
// clears the cookie, even when the session's end cannot be stored; this node
// refuses the session meanwhile, and the failure is logged. (It used to
// answer 500 and keep the cookie.)
func TestLogoutWithTheStoreFailing(t *testing.T) {
	t.Parallel()
	dbURL := storetest.SQLiteURL(t)
	ts := startServer(t, dbURL, nil)
	c, _ := ts.SignupID(t, "alice@example.com")
	saved := sessCookie(t, ts, c.HTTP.Jar)
	st, err := store.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.DB().ExecContext(context.Background(), "ALTER TABLE session_revocations RENAME TO session_revocations_gone"); err != nil {
		t.Fatal(err)
	}
	r := c.Do("POST", "/api/auth/logout", "")
	r.Expect(t, http.StatusOK, `{"ok":true}`)
	if ck := r.Header.Get("Set-Cookie"); !strings.HasPrefix(ck, api.CookieName+"=;") || !strings.Contains(ck, "Max-Age=0") {
		t.Fatalf("Set-Cookie %q, want the cookie cleared", ck)
	}
	sessRefused(t, ts, saved, "on this node after a logout the store did not take")
	if !strings.Contains(ts.Logs.String(), "the session's end was not stored") {
		t.Fatalf("the failure is not logged:\n%s", ts.Logs)
	}
}

// TestLogoutEndsSessionDashboard: the same through the dashboard's POST
// /logout: the saved cookie is refused afterwards on both surfaces.
func TestLogoutEndsSessionDashboard(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		saved := sessCookie(t, ts, c.HTTP.Jar)
		sessAccepted(t, ts, saved, "before logout")

		c.Submit("/", "/logout", nil).ExpectRedirect(t, "/login?done=logged-out")
		sessRefused(t, ts, saved, "replayed after the dashboard's logout")
		// The replayed cookie cannot be used to log out again with a page's
		// token either: there is no session left to protect.
		ts.dashWithCookie(t, saved).Post("/logout", url.Values{}).ExpectRedirect(t, "/login?done=logged-out")

		// Logging in again through the form works.
		c.Submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {relaytest.Password}}).ExpectRedirect(t, "/")
		if p := c.Get("/"); p.Status != http.StatusOK {
			t.Fatalf("after logging in again: %d", p.Status)
		}
	})
}

// TestLogoutEverywhere: the dashboard's "Log out everywhere" (a CSRF-checked
// form on the projects page) ends every session of the user: this browser,
// another browser on the dashboard, a JSON client, and a cookie minted by
// hand; another user's session lives on, and a login right afterwards works.
func TestLogoutEverywhere(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		secret := []byte("test-session-secret-0123456789abcdef")
		ts := startServer(t, dbURL, map[string]string{"SESSION_SECRET": string(secret)})
		a := ts.Dash(t)
		a.Signup("alice@example.com")
		aliceID := mustUserID(t, ts, "alice@example.com")
		b := ts.Dash(t) // a second browser
		b.Submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {relaytest.Password}}).ExpectRedirect(t, "/")
		jc := ts.Client().On(t) // a JSON client
		jc.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": aliceID, "email": "alice@example.com"}))
		now := time.Now().Unix()
		handMade := relaytest.HandJWT("HS256", secret, map[string]any{"sub": aliceID, "iat": now, "exp": now + 3600})
		bob := ts.Dash(t)
		bob.Signup("bob@example.com")
		cookies := map[string]string{
			"this browser":      sessCookie(t, ts, a.HTTP.Jar),
			"another browser":   sessCookie(t, ts, b.HTTP.Jar),
			"a JSON client":     sessCookie(t, ts, jc.HTTP.Jar),
			"a hand-made token": handMade,
		}
		for what, v := range cookies {
			sessAccepted(t, ts, v, what+", before")
		}

		home := a.Get("/")
		if !strings.Contains(home.Body, `action="/logout-everywhere"`) || home.ByID("logout-everywhere") != "Log out everywhere" {
			t.Fatalf("the projects page has no log-out-everywhere button:\n%s", home.Body)
		}
		// Without the page's token, or from another site: refused, nothing ends.
		a.Post("/logout-everywhere", url.Values{}).ExpectError(t, http.StatusForbidden, "CSRF check failed")
		forged := ts.Dash(t)
		forged.Origin = "https://evil.example"
		u, _ := url.Parse(ts.Base)
		forged.HTTP.Jar.SetCookies(u, []*http.Cookie{{Name: api.CookieName, Value: cookies["another browser"], Path: "/"}})
		forged.Post("/logout-everywhere", url.Values{"csrf": {home.CSRF(t)}}).ExpectError(t, http.StatusForbidden, "CSRF check failed")
		for what, v := range cookies {
			sessAccepted(t, ts, v, what+", after refused forms")
		}

		a.Submit("/", "/logout-everywhere", nil).ExpectRedirect(t, "/login?done=logged-out-all")
		if n := a.Get("/login?done=logged-out-all").NoticeText(); !strings.Contains(n, "logged out everywhere") {
			t.Fatalf("notice %q", n)
		}
		for what, v := range cookies {
			sessRefused(t, ts, v, what+", after log out everywhere")
		}
		sessAccepted(t, ts, sessCookie(t, ts, bob.HTTP.Jar), "another user's session")

		// A login in the same second works: the cut is by epoch, not by time.
		jc.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": aliceID, "email": "alice@example.com"}))
		sessAccepted(t, ts, sessCookie(t, ts, jc.HTTP.Jar), "a login after log out everywhere")
		a.Submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {relaytest.Password}}).ExpectRedirect(t, "/")
		sessAccepted(t, ts, sessCookie(t, ts, a.HTTP.Jar), "a dashboard login after log out everywhere")
		for what, v := range cookies {
			sessRefused(t, ts, v, what+", after logging in again")
		}
	})
}

// TestSessionAgeCappedByIat: a session lives at most 7 days from its iat,
// whatever its exp says. Cookies forged with the session secret: a 6-day-old
// one with a far exp works, an 8-day-old one with a far exp and one without
// iat are refused.
func TestSessionAgeCappedByIat(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		secret := []byte("test-session-secret-0123456789abcdef")
		ts := startServer(t, dbURL, map[string]string{"SESSION_SECRET": string(secret)})
		_, aliceID := ts.SignupID(t, "alice@example.com")
		now := time.Now()
		day := int64(24 * time.Hour / time.Second)
		far := now.Unix() + 365*day
		jwt := func(claims map[string]any) string { return relaytest.HandJWT("HS256", secret, claims) }

		sessAccepted(t, ts, jwt(map[string]any{"sub": aliceID, "iat": now.Unix() - 6*day, "exp": far}), "iat 6 days ago, exp in a year")
		sessRefused(t, ts, jwt(map[string]any{"sub": aliceID, "iat": now.Unix() - 8*day, "exp": far}), "iat 8 days ago, exp in a year")
		sessRefused(t, ts, jwt(map[string]any{"sub": aliceID, "iat": now.Unix() - 7*day - 5, "exp": far}), "iat 7 days and 5 s ago, exp in a year")
		sessRefused(t, ts, jwt(map[string]any{"sub": aliceID, "exp": far}), "no iat, exp in a year")
		sessRefused(t, ts, jwt(map[string]any{"sub": aliceID, "iat": 0, "exp": far}), "iat 0, exp in a year")
	})
}

// TestLogoutReachesOtherNodes: two nodes on one database. A logout or a log
// out everywhere on one is refused there at once, and on the other once its
// cache (10 s) has run out.
func TestLogoutReachesOtherNodes(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		nodeA := startServerAt(t, dbURL, nil, clock.Now)
		nodeB := startServerAt(t, dbURL, nil, clock.Now)
		c, _ := nodeA.SignupID(t, "alice@example.com")
		saved := sessCookie(t, nodeA, c.HTTP.Jar)
		sessAccepted(t, nodeB, saved, "node B, before logout") // B now caches it as live
		c.Do("POST", "/api/auth/logout", "").Expect(t, http.StatusOK, `{"ok":true}`)
		sessRefused(t, nodeA, saved, "node A, at once")
		clock.Advance(11 * time.Second)
		sessRefused(t, nodeB, saved, "node B, after 11 s")

		// Log out everywhere on B reaches A the same way.
		d := nodeB.Dash(t)
		d.Submit("/login", "/login", url.Values{"email": {"alice@example.com"}, "password": {relaytest.Password}}).ExpectRedirect(t, "/")
		second := sessCookie(t, nodeB, d.HTTP.Jar)
		sessAccepted(t, nodeA, second, "node A, before log out everywhere")
		d.Submit("/", "/logout-everywhere", nil).ExpectRedirect(t, "/login?done=logged-out-all")
		sessRefused(t, nodeB, second, "node B, at once")
		clock.Advance(11 * time.Second)
		sessRefused(t, nodeA, second, "node A, after 11 s")
	})
}
