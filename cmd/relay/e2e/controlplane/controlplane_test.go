package controlplane

// Black-box tests of the control plane (api/openapi.yaml) through real HTTP, each on
// SQLite and on PostgreSQL (storetest.EachDB). Shapes the product specification leaves open
// (routing and transport errors: not_found, method_not_allowed,
// unsupported_media_type, body_too_large) follow api/router.go and
// api/errors.go, our documented choices.

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// ---------------------------------------------------------------------------
// Auth: signup, login, logout, sessions.

func TestSignupCreatesUserAndSession(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		c := ts.Client()
		r := c.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`)
		id := r.Str("id")
		r.Expect(t, http.StatusCreated, relaytest.JSON(map[string]string{"id": id, "email": "alice@example.com"}))
		relaytest.IsUUID(t, "user id", id)
		relaytest.SessionCookieIn(t, r, false)

		// The cookie is the session: the same client reaches session routes.
		c.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, `{"projects":[]}`)

		// A second user gets another id.
		r = ts.Client().Do("POST", "/api/auth/signup", `{"email":"bob@example.com","password":"12345678"}`)
		r.Expect(t, http.StatusCreated, relaytest.JSON(map[string]string{"id": r.Str("id"), "email": "bob@example.com"}))
		if r.Str("id") == id {
			t.Fatalf("two users share id %s", id)
		}
	})
}

// TestSessionCookieSecure: COOKIE_SECURE=auto sets Secure only on HTTPS (or
// X-Forwarded-Proto: https); true always; false never. Signup and login alike.
func TestSessionCookieSecure(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		allow := "alice@example.com,bob@example.com,carol@example.com,dave@example.com"
		servers := map[string]*relaytest.Server{}
		for _, mode := range []string{"auto", "true", "false"} {
			servers[mode] = relaytest.Start(t, dbURL, map[string]string{"COOKIE_SECURE": mode, "ALLOWED_SIGNUP_EMAILS": allow})
		}
		https := map[string]string{"X-Forwarded-Proto": "https"}
		cases := []struct {
			mode, email string
			hdr         map[string]string
			secure      bool
		}{
			{"auto", "alice@example.com", nil, false},
			{"auto", "bob@example.com", https, true},
			{"true", "carol@example.com", nil, true},
			{"false", "dave@example.com", https, false},
		}
		for _, tc := range cases {
			ts := servers[tc.mode]
			creds := relaytest.JSON(map[string]string{"email": tc.email, "password": relaytest.Password})
			r := ts.Client().On(t).Send("POST", "/api/auth/signup", creds, "application/json", tc.hdr)
			r.Expect(t, http.StatusCreated, relaytest.JSON(map[string]string{"id": r.Str("id"), "email": tc.email}))
			relaytest.SessionCookieIn(t, r, tc.secure)
			r = ts.Client().On(t).Send("POST", "/api/auth/login", creds, "application/json", tc.hdr)
			r.Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": r.Str("id"), "email": tc.email}))
			relaytest.SessionCookieIn(t, r, tc.secure)
		}
		// auto: a plain-http request after an https one is again not Secure.
		r := servers["auto"].Client().On(t).Do("POST", "/api/auth/login", `{"email":"bob@example.com","password":"correct horse"}`)
		r.Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": r.Str("id"), "email": "bob@example.com"}))
		relaytest.SessionCookieIn(t, r, false)
	})
}

func TestSignupErrors(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		const required = `{"error":"email_and_password_required"}`
		cases := []struct {
			name, body string
			status     int
			want       string
		}{
			{"no body", "", 400, required},
			{"empty object", `{}`, 400, required},
			{"email only", `{"email":"alice@example.com"}`, 400, required},
			{"password only", `{"password":"correct horse"}`, 400, required},
			{"empty email", `{"email":"","password":"correct horse"}`, 400, required},
			{"blank email", `{"email":"   ","password":"correct horse"}`, 400, required},
			{"empty password", `{"email":"alice@example.com","password":""}`, 400, required},
			{"null fields", `{"email":null,"password":null}`, 400, required},
			{"7 characters", `{"email":"alice@example.com","password":"1234567"}`, 400, `{"error":"password_too_short"}`},
			{"7 multibyte characters", `{"email":"alice@example.com","password":"ééééééé"}`, 400, `{"error":"password_too_short"}`},
			{"1 character", `{"email":"alice@example.com","password":"x"}`, 400, `{"error":"password_too_short"}`},
			{"not on allowlist", `{"email":"mallory@example.com","password":"correct horse"}`, 403, `{"error":"email_not_allowed"}`},
			{"allowlisted plus suffix", `{"email":"alice@example.com.evil.test","password":"correct horse"}`, 403, `{"error":"email_not_allowed"}`},
			{"allowlisted local part only", `{"email":"alice","password":"correct horse"}`, 403, `{"error":"email_not_allowed"}`},
			{"allowlist as value", `{"email":"alice@example.com,bob@example.com","password":"correct horse"}`, 403, `{"error":"email_not_allowed"}`},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				r := ts.Client().On(t).Do("POST", "/api/auth/signup", tc.body)
				r.Expect(t, tc.status, tc.want)
				relaytest.NoSessionCookie(t, r)
			})
		}

		// Nothing above created an account: alice can still sign up, with a
		// password of exactly 8 characters and her address in another case
		// (the allowlist is case-insensitive).
		r := ts.Client().Do("POST", "/api/auth/signup", `{"email":"ALICE@Example.com","password":"12345678"}`)
		if r.Status != http.StatusCreated || !strings.EqualFold(r.Str("email"), "alice@example.com") {
			t.Fatalf("signup in upper case: %d %s", r.Status, r.Raw)
		}
		relaytest.IsUUID(t, "user id", r.Str("id"))
		relaytest.SessionCookieIn(t, r, false)

		// email_already_registered whatever the case.
		for _, email := range []string{"ALICE@Example.com", "alice@example.com", "Alice@EXAMPLE.COM"} {
			r := ts.Client().Do("POST", "/api/auth/signup", relaytest.JSON(map[string]string{"email": email, "password": "another password"}))
			r.Expect(t, http.StatusConflict, `{"error":"email_already_registered"}`)
			relaytest.NoSessionCookie(t, r)
		}
		// The first password still holds; the refused signups changed nothing.
		ts.Client().Do("POST", "/api/auth/login", `{"email":"ALICE@Example.com","password":"12345678"}`).Expect(t, http.StatusOK,
			relaytest.JSON(map[string]string{"id": r.Str("id"), "email": r.Str("email")}))
	})
}

// TestSignupClosedWithEmptyAllowlist: signup only for allowed emails, with an
// empty ALLOWED_SIGNUP_EMAILS (cmd/relay/README.md › Configuration: signup closed).
func TestSignupClosedWithEmptyAllowlist(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, map[string]string{"ALLOWED_SIGNUP_EMAILS": ""})
		for _, email := range []string{"alice@example.com", "bob@example.com", "anyone@anywhere.test"} {
			r := ts.Client().Do("POST", "/api/auth/signup", relaytest.JSON(map[string]string{"email": email, "password": relaytest.Password}))
			r.Expect(t, http.StatusForbidden, `{"error":"email_not_allowed"}`)
			relaytest.NoSessionCookie(t, r)
		}
		ts.Client().Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`).
			Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
	})
}

func TestLogin(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		_, aliceID := ts.SignupID(t, "alice@example.com")

		// A new browser logs in and gets a working session.
		c := ts.Client()
		c.Do("GET", "/api/projects", "").Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		r := c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`)
		r.Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": aliceID, "email": "alice@example.com"}))
		relaytest.SessionCookieIn(t, r, false)
		c.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, `{"projects":[]}`)

		// Unknown email and wrong password answer identically.
		wrong := ts.Client().Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"wrong horse"}`)
		wrong.Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		relaytest.NoSessionCookie(t, wrong)
		unknown := ts.Client().Do("POST", "/api/auth/login", `{"email":"nobody@example.com","password":"correct horse"}`)
		unknown.Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		relaytest.NoSessionCookie(t, unknown)
		if wrong.Raw != unknown.Raw || wrong.Status != unknown.Status {
			t.Fatalf("wrong password %d %q and unknown email %d %q differ", wrong.Status, wrong.Raw, unknown.Status, unknown.Raw)
		}
		// A password that differs only in case or by a suffix is wrong too.
		for _, pw := range []string{"Correct horse", "correct horse ", "correct hors"} {
			ts.Client().Do("POST", "/api/auth/login", relaytest.JSON(map[string]string{"email": "alice@example.com", "password": pw})).
				Expect(t, http.StatusUnauthorized, `{"error":"invalid_credentials"}`)
		}

		const required = `{"error":"email_and_password_required"}`
		for _, body := range []string{
			"", `{}`, `{"email":"alice@example.com"}`, `{"password":"correct horse"}`,
			`{"email":"","password":"correct horse"}`, `{"email":"  ","password":"correct horse"}`,
			`{"email":"alice@example.com","password":""}`,
		} {
			r := ts.Client().Do("POST", "/api/auth/login", body)
			if r.Status != http.StatusBadRequest {
				t.Fatalf("login %q: %d %s", body, r.Status, r.Raw)
			}
			r.Expect(t, http.StatusBadRequest, required)
			relaytest.NoSessionCookie(t, r)
		}
	})
}

func TestLogout(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		c, aliceID := ts.SignupID(t, "alice@example.com")
		c.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, `{"projects":[]}`)

		r := c.Do("POST", "/api/auth/logout", "")
		r.Expect(t, http.StatusOK, `{"ok":true}`)
		cs := relaytest.SessionCookies(t, r)
		if len(cs) != 1 {
			t.Fatalf("logout: want one Set-Cookie for %s, got %q", relaytest.SessionCookie, r.Header.Values("Set-Cookie"))
		}
		if ck := cs[0]; ck.Value != "" || !(ck.MaxAge < 0 || (!ck.Expires.IsZero() && ck.Expires.Before(time.Now()))) || ck.Path != "/" {
			t.Fatalf("logout does not clear the cookie (empty value, expired, Path=/): %q", ck.Raw)
		}

		// Later calls of the same browser are unauthorized.
		c.Do("GET", "/api/projects", "").Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		c.Do("POST", "/api/projects", `{"name":"After logout"}`).Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)

		// Logout always answers 200, with no session or a garbage one.
		ts.Client().Do("POST", "/api/auth/logout", "").Expect(t, http.StatusOK, `{"ok":true}`)
		ts.WithCookie("garbage").Do("POST", "/api/auth/logout", "").Expect(t, http.StatusOK, `{"ok":true}`)
		c.Do("POST", "/api/auth/logout", "").Expect(t, http.StatusOK, `{"ok":true}`)

		// Logging in again restores access.
		c.Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"id": aliceID, "email": "alice@example.com"}))
		c.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, `{"projects":[]}`)
	})
}

// TestProjectRoutesRequireSession: every /api/projects route answers 401
// {error: unauthorized} without a valid session, whatever the cookie holds,
// and changes nothing.
func TestProjectRoutesRequireSession(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		secret := []byte("test-session-secret-0123456789abcdef")
		ts := relaytest.Start(t, dbURL, map[string]string{"SESSION_SECRET": string(secret)})
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Mine", aliceID)
		keys, _ := relaytest.Keys(alice, t, p.ID)
		before := relaytest.Snapshot(alice, t, p.ID)

		// The real session token, for tampering.
		login := ts.Client().Do("POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`)
		real := relaytest.SessionCookieIn(t, login, false).Value
		parts := strings.Split(real, ".")
		otherPayload := base64.RawURLEncoding.EncodeToString([]byte(relaytest.JSON(map[string]any{
			"sub": "00000000-0000-4000-8000-000000000000", "exp": time.Now().Add(time.Hour).Unix(),
		})))
		sig := []byte(parts[2])
		mid := len(sig) / 2
		if sig[mid] == 'A' {
			sig[mid] = 'B'
		} else {
			sig[mid] = 'A'
		}
		now := time.Now().Unix()

		// Positive control: a token built by hand as documented (HS256) works,
		// so the forgeries below fail for the reason they name.
		good := relaytest.HandJWT("HS256", secret, map[string]any{"sub": aliceID, "iat": now, "exp": now + 3600})
		r := ts.WithCookie(good).Do("GET", "/api/projects", "")
		if r.Status != http.StatusOK || !strings.Contains(r.Raw, p.ID) {
			t.Fatalf("hand-made HS256 session: %d %s", r.Status, r.Raw)
		}

		cookies := []struct{ name, value string }{
			{"no cookie", ""},
			{"garbage", "garbage.not.jwt"},
			{"random text", "deadbeef"},
			{"payload swapped", parts[0] + "." + otherPayload + "." + parts[2]},
			{"signature altered", parts[0] + "." + parts[1] + "." + string(sig)},
			{"signature stripped", parts[0] + "." + parts[1] + "."},
			{"alg none", relaytest.HandJWT("none", nil, map[string]any{"sub": aliceID, "iat": now, "exp": now + 3600})},
			{"wrong key", relaytest.HandJWT("HS256", []byte("not-the-session-secret"), map[string]any{"sub": aliceID, "iat": now, "exp": now + 3600})},
			{"expired", relaytest.HandJWT("HS256", secret, map[string]any{"sub": aliceID, "iat": now - 7200, "exp": now - 3600})},
			{"no exp", relaytest.HandJWT("HS256", secret, map[string]any{"sub": aliceID, "iat": now})},
			{"no sub", relaytest.HandJWT("HS256", secret, map[string]any{"iat": now, "exp": now + 3600})},
			// Right key, HMAC-SHA256 signature, but the header names another algorithm.
			{"header RS256", relaytest.HandJWT("RS256", secret, map[string]any{"sub": aliceID, "iat": now, "exp": now + 3600})},
			{"header HS512", relaytest.HandJWT("HS512", secret, map[string]any{"sub": aliceID, "iat": now, "exp": now + 3600})},
			{"exp zero", relaytest.HandJWT("HS256", secret, map[string]any{"sub": aliceID, "iat": now, "exp": 0})},
		}
		routes := append([]relaytest.Route{
			{Name: "list", Method: "GET", Path: "/api/projects"},
			{Name: "create", Method: "POST", Path: "/api/projects", Body: `{"name":"Sneaky"}`},
		}, relaytest.ProjectRoutes(p.ID, keys[0]["id"].(string))...)
		for _, ck := range cookies {
			t.Run(ck.name, func(t *testing.T) {
				c := ts.Client()
				if ck.value != "" {
					c = ts.WithCookie(ck.value)
				}
				c = c.On(t)
				for _, rt := range routes {
					r := c.Do(rt.Method, rt.Path, rt.Body)
					if r.Status != http.StatusUnauthorized {
						t.Errorf("%s %s: %d %s", rt.Method, rt.Path, r.Status, r.Raw)
						continue
					}
					r.Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
				}
			})
		}
		if after := relaytest.Snapshot(alice, t, p.ID); after != before {
			t.Fatalf("unauthorized calls changed the project:\nbefore %s\nafter  %s", before, after)
		}
		alice.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"projects": []any{map[string]any{
			"id": p.ID, "name": "Mine", "ownerUserId": aliceID, "createdAt": alice.Do("GET", "/api/projects/"+p.ID, "").Str("project", "createdAt"),
		}}}))
	})
}

// ---------------------------------------------------------------------------
// Projects.

func TestProjectsCreateAndList(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		alice.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, `{"projects":[]}`)

		p1, b1 := relaytest.CreateChecked(alice, t, "First", aliceID)
		p2, b2 := relaytest.CreateChecked(alice, t, "Projet été 🚀", aliceID)
		seen := map[string]bool{}
		for _, k := range []string{p1.PublicKey, p1.SecretKey, p2.PublicKey, p2.SecretKey} {
			rnd := k[len("pk_live_"):]
			if seen[rnd] {
				t.Fatalf("random part %q repeats across keys", rnd)
			}
			seen[rnd] = true
		}
		if p1.ID == p2.ID {
			t.Fatalf("two projects share id %s", p1.ID)
		}

		// The list holds exactly the caller's projects, shaped {id,name,ownerUserId,createdAt}.
		expectProjects := func(t *testing.T, c *relaytest.Client, want ...map[string]any) {
			t.Helper()
			r := c.On(t).Do("GET", "/api/projects", "")
			if r.Status != http.StatusOK {
				t.Fatalf("list: %d %s", r.Status, r.Raw)
			}
			got, _ := r.JSON["projects"].([]any)
			byID := map[string]any{}
			for _, g := range got {
				m, _ := g.(map[string]any)
				byID[m["id"].(string)] = g
			}
			ordered := make([]any, 0, len(want))
			for _, w := range want {
				if g, ok := byID[w["id"].(string)]; ok {
					ordered = append(ordered, g)
				}
			}
			if len(ordered) != len(got) {
				ordered = got // not the same set: show it as is
			}
			r.Raw = relaytest.JSON(map[string]any{"projects": ordered})
			wantAny := make([]any, len(want))
			for i, w := range want {
				wantAny[i] = w
			}
			r.Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"projects": wantAny}))
		}
		expectProjects(t, alice, b1, b2)

		// name_required: missing, empty, whitespace; nothing created.
		for _, body := range []string{"", `{}`, `{"name":""}`, `{"name":"   "}`, `{"name":"\t\n"}`, `{"name":null}`, `{"other":"x"}`} {
			alice.Do("POST", "/api/projects", body).Expect(t, http.StatusBadRequest, `{"error":"name_required"}`)
		}
		expectProjects(t, alice, b1, b2)

		// Another user sees only their own.
		bob, bobID := ts.SignupID(t, "bob@example.com")
		bob.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, `{"projects":[]}`)
		_, b3 := relaytest.CreateChecked(bob, t, "First", bobID)
		expectProjects(t, bob, b3)
		expectProjects(t, alice, b1, b2)
	})
}

func TestProjectGetAndRename(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, pb := relaytest.CreateChecked(alice, t, "Original", aliceID)
		other, ob := relaytest.CreateChecked(alice, t, "Other", aliceID)

		// GET: exactly the project create returned; never the client-emit secret.
		secret := alice.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", "")
		secret.Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"clientEmitSecret": secret.Str("clientEmitSecret")}))
		alice.Do("GET", "/api/projects/"+p.ID, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": pb}))
		_, keysBefore := relaytest.Keys(alice, t, p.ID)

		// PATCH renames: 200 {project: {id, name}}; id, owner, createdAt and keys untouched.
		alice.Do("PATCH", "/api/projects/"+p.ID, `{"name":"Renamed"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": map[string]string{"id": p.ID, "name": "Renamed"}}))
		renamed := map[string]any{"id": p.ID, "name": "Renamed", "ownerUserId": aliceID, "createdAt": pb["createdAt"]}
		alice.Do("GET", "/api/projects/"+p.ID, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": renamed}))
		if _, keysAfter := relaytest.Keys(alice, t, p.ID); keysAfter != keysBefore {
			t.Fatalf("rename changed the keys:\nbefore %s\nafter  %s", keysBefore, keysAfter)
		}
		// Renaming to the same name is fine; the other project is untouched.
		alice.Do("PATCH", "/api/projects/"+p.ID, `{"name":"Renamed"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": map[string]string{"id": p.ID, "name": "Renamed"}}))
		alice.Do("GET", "/api/projects/"+other.ID, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": ob}))

		// name_required on rename, and the name stays.
		for _, body := range []string{"", `{}`, `{"name":""}`, `{"name":"  "}`, `{"name":"\t"}`, `{"name":null}`} {
			alice.Do("PATCH", "/api/projects/"+p.ID, body).Expect(t, http.StatusBadRequest, `{"error":"name_required"}`)
		}
		alice.Do("GET", "/api/projects/"+p.ID, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": renamed}))
		if _, keysAfter := relaytest.Keys(alice, t, p.ID); keysAfter != keysBefore {
			t.Fatalf("refused renames changed the keys")
		}
	})
}

// TestOtherUsersProjectIsNotFound: every per-project route answers 404
// project_not_found for a project someone else owns, and changes nothing.
func TestOtherUsersProjectIsNotFound(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, pb := relaytest.CreateChecked(alice, t, "Alice's", aliceID)
		secret := alice.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", "").Str("clientEmitSecret")
		keys, _ := relaytest.Keys(alice, t, p.ID)
		before := relaytest.Snapshot(alice, t, p.ID)

		bob, bobID := ts.SignupID(t, "bob@example.com")
		q, qb := relaytest.CreateChecked(bob, t, "Bob's", bobID)
		routes := append(relaytest.ProjectRoutes(p.ID, keys[0]["id"].(string)),
			relaytest.Route{Name: "revoke other key", Method: "POST", Path: "/api/projects/" + p.ID + "/keys/" + keys[1]["id"].(string) + "/revoke"})
		for _, rt := range routes {
			t.Run(rt.Name, func(t *testing.T) {
				bob.On(t).Do(rt.Method, rt.Path, rt.Body).Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
			})
		}
		// Alice's key id under Bob's own project is not Bob's key.
		bob.Do("POST", "/api/projects/"+q.ID+"/keys/"+keys[0]["id"].(string)+"/revoke", "").
			Expect(t, http.StatusNotFound, `{"error":"key_not_found"}`)

		if after := relaytest.Snapshot(alice, t, p.ID); after != before {
			t.Fatalf("another user's calls changed the project:\nbefore %s\nafter  %s", before, after)
		}
		alice.Do("GET", "/api/projects/"+p.ID, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": pb}))
		alice.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"clientEmitSecret": secret}))
		bob.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"projects": []any{qb}}))
	})
}

// TestMalformedProjectID: ids that are not a project's answer 404
// project_not_found on every per-project route (never 400 or 500).
func TestMalformedProjectID(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Real", aliceID)
		keys, _ := relaytest.Keys(alice, t, p.ID)
		before := relaytest.Snapshot(alice, t, p.ID)

		ids := []string{
			"not-a-uuid",
			"123",
			p.ID + "0",
			p.ID[:35],
			strings.ReplaceAll(p.ID, "-", ""),
			"00000000-0000-0000-0000-000000000000",
			"zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
			url.PathEscape("' OR '1'='1"),
			url.PathEscape(p.ID + "' OR owner_user_id <> '"),
		}
		for _, id := range ids {
			t.Run(id, func(t *testing.T) {
				c := alice.On(t)
				for _, rt := range relaytest.ProjectRoutes(id, keys[0]["id"].(string)) {
					r := c.Do(rt.Method, rt.Path, rt.Body)
					if r.Status != http.StatusNotFound {
						t.Errorf("%s %s: %d %s", rt.Method, rt.Path, r.Status, r.Raw)
						continue
					}
					r.Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
				}
			})
		}
		if after := relaytest.Snapshot(alice, t, p.ID); after != before {
			t.Fatalf("calls on malformed ids changed the project")
		}
	})
}

// TestIDsAreCaseInsensitive: ids are UUIDs, whose hex digits are "case
// insensitive on input" (RFC 4122 §3). Whatever the store, an upper-case
// spelling names the same project and key, and answers carry the canonical
// lower-case id.
func TestIDsAreCaseInsensitive(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, pb := relaytest.CreateChecked(alice, t, "Cased", aliceID)
		keys, _ := relaytest.Keys(alice, t, p.ID)
		upper := strings.ToUpper(p.ID)

		alice.Do("GET", "/api/projects/"+upper, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": pb}))
		alice.Do("PATCH", "/api/projects/"+upper, `{"name":"Renamed"}`).
			Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": map[string]string{"id": p.ID, "name": "Renamed"}}))
		alice.Do("POST", "/api/projects/"+p.ID+"/keys/"+strings.ToUpper(keys[0]["id"].(string))+"/revoke", "").
			Expect(t, http.StatusOK, `{"ok":true}`)
		after, raw := relaytest.Keys(alice, t, p.ID)
		if got := relaytest.KeyByID(after, keys[0]["id"].(string)); got == nil || got["revokedAt"] == nil {
			t.Fatalf("revoke by upper-case key id did not revoke: %s", raw)
		}
	})
}

// ---------------------------------------------------------------------------
// Keys.

func TestKeysListIsMasked(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, pb := relaytest.CreateChecked(alice, t, "Keys", aliceID)
		keys, raw := relaytest.Keys(alice, t, p.ID)
		if len(keys) != 2 {
			t.Fatalf("want 2 keys, got %s", raw)
		}
		for _, typ := range []string{"public", "secret"} {
			if n := len(relaytest.ActiveKeys(keys, typ)); n != 1 {
				t.Fatalf("want one active %s key, got %d: %s", typ, n, raw)
			}
		}
		for _, k := range keys {
			if k["revokedAt"] != nil {
				t.Fatalf("new key revokedAt %v, want null", k["revokedAt"])
			}
			if kt, pt := relaytest.IsTime(t, "key createdAt", k["createdAt"]), relaytest.IsTime(t, "project createdAt", pb["createdAt"]); kt.Before(pt.Add(-time.Second)) {
				t.Fatalf("key createdAt %v before project createdAt %v", kt, pt)
			}
			rawKey, prefix := p.PublicKey, "pk_live_"
			if k["keyType"] == "secret" {
				rawKey, prefix = p.SecretKey, "sk_live_"
			}
			relaytest.CheckMasked(t, k["keyPrefix"].(string), rawKey, prefix)
		}
		for _, rawKey := range []string{p.PublicKey, p.SecretKey, p.PublicKey[len("pk_live_"):], p.SecretKey[len("sk_live_"):]} {
			if strings.Contains(raw, rawKey) {
				t.Fatalf("key list shows a raw key: %s", raw)
			}
		}
		if strings.Contains(raw, `"raw"`) {
			t.Fatalf("key list has a raw field: %s", raw)
		}
	})
}

func TestKeyRotate(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Rotating", aliceID)
		initial, _ := relaytest.Keys(alice, t, p.ID)
		oldPublic, oldSecret := relaytest.ActiveKeys(initial, "public")[0], relaytest.ActiveKeys(initial, "secret")[0]

		rotate := func(typ string) map[string]any {
			t.Helper()
			r := alice.Do("POST", "/api/projects/"+p.ID+"/keys", relaytest.JSON(map[string]string{"keyType": typ}))
			k, _ := r.JSON["key"].(map[string]any)
			r.Expect(t, http.StatusCreated, relaytest.JSON(map[string]any{"key": map[string]any{
				"id": k["id"], "keyType": typ, "keyPrefix": k["keyPrefix"], "raw": k["raw"],
			}}))
			id, _ := k["id"].(string)
			relaytest.IsUUID(t, "key id", id)
			re, prefix := relaytest.PublicKeyRe, "pk_live_"
			if typ == "secret" {
				re, prefix = relaytest.SecretKeyRe, "sk_live_"
			}
			if !re.MatchString(k["raw"].(string)) {
				t.Fatalf("rotated %s key %q: want %s and ≥ 22 base64url characters", typ, k["raw"], prefix)
			}
			relaytest.CheckMasked(t, k["keyPrefix"].(string), k["raw"].(string), prefix)
			return k
		}

		// Rotate public: the old public key is revoked, the secret untouched.
		newPublic := rotate("public")
		if newPublic["raw"] == p.PublicKey {
			t.Fatalf("rotation returned the old key")
		}
		keys, raw := relaytest.Keys(alice, t, p.ID)
		if len(keys) != 3 {
			t.Fatalf("after rotating public: want 3 keys, got %s", raw)
		}
		if got := relaytest.KeyByID(keys, oldPublic["id"].(string)); got == nil || got["revokedAt"] == nil {
			t.Fatalf("old public key not revoked: %s", raw)
		}
		firstRevokedAt := relaytest.KeyByID(keys, oldPublic["id"].(string))["revokedAt"]
		if got := relaytest.KeyByID(keys, newPublic["id"].(string)); got == nil || got["revokedAt"] != nil || got["keyPrefix"] != newPublic["keyPrefix"] || got["keyType"] != "public" {
			t.Fatalf("new public key not listed as active: %s", raw)
		}
		if got := relaytest.KeyByID(keys, oldSecret["id"].(string)); relaytest.JSON(got) != relaytest.JSON(oldSecret) {
			t.Fatalf("rotating public changed the secret key: %v, was %v", got, oldSecret)
		}
		if strings.Contains(raw, newPublic["raw"].(string)) {
			t.Fatalf("key list shows the rotated raw key")
		}

		// Rotate secret: the old secret is revoked.
		newSecret := rotate("secret")
		if newSecret["raw"] == p.SecretKey {
			t.Fatalf("rotation returned the old key")
		}
		keys, raw = relaytest.Keys(alice, t, p.ID)
		if len(keys) != 4 {
			t.Fatalf("after rotating secret: want 4 keys, got %s", raw)
		}
		if got := relaytest.KeyByID(keys, oldSecret["id"].(string)); got == nil || got["revokedAt"] == nil {
			t.Fatalf("old secret key not revoked: %s", raw)
		}

		// Rotating again revokes the key the last rotation issued; one active key per type.
		third := rotate("public")
		keys, raw = relaytest.Keys(alice, t, p.ID)
		if got := relaytest.KeyByID(keys, newPublic["id"].(string)); got == nil || got["revokedAt"] == nil {
			t.Fatalf("second-generation public key not revoked: %s", raw)
		}
		for typ, wantID := range map[string]any{"public": third["id"], "secret": newSecret["id"]} {
			if act := relaytest.ActiveKeys(keys, typ); len(act) != 1 || act[0]["id"] != wantID {
				t.Fatalf("active %s keys %v, want only %v", typ, act, wantID)
			}
		}
		// A revoked key keeps its first revocation time.
		if got := relaytest.KeyByID(keys, oldPublic["id"].(string)); got == nil || got["revokedAt"] != firstRevokedAt {
			t.Fatalf("old public key revocation %v, want it kept at %v", got, firstRevokedAt)
		}

		// invalid_key_type, and nothing rotated.
		_, before := relaytest.Keys(alice, t, p.ID)
		for _, body := range []string{"", `{}`, `{"keyType":""}`, `{"keyType":"Public"}`, `{"keyType":"SECRET"}`, `{"keyType":"admin"}`, `{"keyType":null}`, `{"type":"public"}`} {
			alice.Do("POST", "/api/projects/"+p.ID+"/keys", body).Expect(t, http.StatusBadRequest, `{"error":"invalid_key_type"}`)
		}
		if _, after := relaytest.Keys(alice, t, p.ID); after != before {
			t.Fatalf("refused rotations changed the keys")
		}
	})
}

func TestKeyRevoke(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "One", aliceID)
		other, _ := relaytest.CreateChecked(alice, t, "Two", aliceID)
		keys, _ := relaytest.Keys(alice, t, p.ID)
		otherKeys, otherBefore := relaytest.Keys(alice, t, other.ID)
		pub, sec := relaytest.ActiveKeys(keys, "public")[0], relaytest.ActiveKeys(keys, "secret")[0]

		alice.Do("POST", "/api/projects/"+p.ID+"/keys/"+pub["id"].(string)+"/revoke", "").Expect(t, http.StatusOK, `{"ok":true}`)
		keys, raw := relaytest.Keys(alice, t, p.ID)
		if got := relaytest.KeyByID(keys, pub["id"].(string)); got == nil || got["revokedAt"] == nil {
			t.Fatalf("revoked key still active: %s", raw)
		}
		if got := relaytest.KeyByID(keys, sec["id"].(string)); relaytest.JSON(got) != relaytest.JSON(sec) {
			t.Fatalf("revoking the public key changed the secret key: %s", raw)
		}
		if len(keys) != 2 {
			t.Fatalf("revoke must not issue a key: %s", raw)
		}

		alice.Do("POST", "/api/projects/"+p.ID+"/keys/"+sec["id"].(string)+"/revoke", "").Expect(t, http.StatusOK, `{"ok":true}`)
		keys, raw = relaytest.Keys(alice, t, p.ID)
		if len(relaytest.ActiveKeys(keys, "public"))+len(relaytest.ActiveKeys(keys, "secret")) != 0 {
			t.Fatalf("both keys should be revoked: %s", raw)
		}

		// key_not_found: unknown id, malformed id, a key of another project of the same user.
		for _, id := range []string{
			"00000000-0000-0000-0000-000000000000",
			"5b0c1a4e-8d2f-4e7a-9c3b-2f6d8e1a0b7c",
			"nope",
			pub["id"].(string) + "x",
			strings.ToUpper(strings.ReplaceAll(pub["id"].(string), "-", "")),
			url.PathEscape("' OR '1'='1"),
			otherKeys[0]["id"].(string),
			otherKeys[1]["id"].(string),
		} {
			alice.Do("POST", "/api/projects/"+p.ID+"/keys/"+id+"/revoke", "").Expect(t, http.StatusNotFound, `{"error":"key_not_found"}`)
		}
		if _, after := relaytest.Keys(alice, t, other.ID); after != otherBefore {
			t.Fatalf("revoking through the wrong project changed its keys:\nbefore %s\nafter  %s", otherBefore, after)
		}
	})
}

func TestClientEmitSecret(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, pb := relaytest.CreateChecked(alice, t, "Emitting", aliceID)
		q, _ := relaytest.CreateChecked(alice, t, "Other", aliceID)
		path := "/api/projects/" + p.ID + "/client-emit-secret"

		secretOf := func(r relaytest.Response) string {
			t.Helper()
			s := r.Str("clientEmitSecret")
			r.Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"clientEmitSecret": s}))
			if len(s) < 16 {
				t.Fatalf("client-emit secret %q is too short to sign with", s)
			}
			return s
		}

		// First call generates; later calls without regenerate return it unchanged.
		s1 := secretOf(alice.Do("PATCH", path, ""))
		for _, body := range []string{"", `{}`, `{"regenerate":false}`, `{"regenerate":null}`} {
			if s := secretOf(alice.Do("PATCH", path, body)); s != s1 {
				t.Fatalf("body %q changed the secret: %q → %q", body, s1, s)
			}
		}
		// regenerate: true issues a new one, which then sticks.
		s2 := secretOf(alice.Do("PATCH", path, `{"regenerate":true}`))
		if s2 == s1 {
			t.Fatalf("regenerate returned the old secret")
		}
		if s := secretOf(alice.Do("PATCH", path, `{}`)); s != s2 {
			t.Fatalf("after regenerate: %q, want %q", s, s2)
		}
		s3 := secretOf(alice.Do("PATCH", path, `{"regenerate":true}`))
		if s3 == s2 || s3 == s1 {
			t.Fatalf("second regenerate repeated a secret")
		}
		// Each project has its own; a first call with regenerate also generates.
		if s := secretOf(alice.Do("PATCH", "/api/projects/"+q.ID+"/client-emit-secret", `{"regenerate":true}`)); s == s3 || s == s1 || s == s2 {
			t.Fatalf("two projects share a client-emit secret")
		}
		// The secret is returned only by this route.
		get := alice.Do("GET", "/api/projects/"+p.ID, "")
		get.Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": pb}))
		list := alice.Do("GET", "/api/projects", "")
		_, keys := relaytest.Keys(alice, t, p.ID)
		for _, body := range []string{get.Raw, list.Raw, keys} {
			if strings.Contains(body, s3) {
				t.Fatalf("the client-emit secret leaks outside its route: %s", body)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Generic HTTP behavior.

// TestMalformedRequestBodies: bad JSON, JSON of the wrong type, non-JSON
// content types and oversize bodies get JSON errors (never 500, never HTML)
// on every route that reads a body, and change nothing.
func TestMalformedRequestBodies(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Stable", aliceID)
		alice.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", "")
		before := relaytest.Snapshot(alice, t, p.ID)
		anon := ts.Client()

		routes := []struct {
			name      string
			c         *relaytest.Client
			method    string
			path      string
			valid     string
			wrongType []string
		}{
			{"signup", anon, "POST", "/api/auth/signup", `{"email":"bob@example.com","password":"correct horse"}`,
				[]string{`{"email":5,"password":"correct horse"}`, `{"email":"bob@example.com","password":12345678}`, `{"email":["bob@example.com"],"password":"correct horse"}`}},
			{"login", anon, "POST", "/api/auth/login", `{"email":"alice@example.com","password":"correct horse"}`,
				[]string{`{"email":"alice@example.com","password":true}`, `{"email":{},"password":"correct horse"}`}},
			{"create project", alice, "POST", "/api/projects", `{"name":"New"}`,
				[]string{`{"name":5}`, `{"name":{"x":1}}`, `{"name":["New"]}`, `"New"`, `5`, `true`}},
			{"rename project", alice, "PATCH", "/api/projects/" + p.ID, `{"name":"Renamed"}`,
				[]string{`{"name":5}`, `{"name":false}`, `"Renamed"`}},
			{"rotate key", alice, "POST", "/api/projects/" + p.ID + "/keys", `{"keyType":"public"}`,
				[]string{`"public"`, `42`}},
			{"client-emit-secret", alice, "PATCH", "/api/projects/" + p.ID + "/client-emit-secret", `{"regenerate":true}`,
				[]string{`{"regenerate":"yes"}`, `{"regenerate":1}`, `"regenerate"`}},
			{"authorization", alice, "PATCH", "/api/projects/" + p.ID + "/authorization", `{"authorization":true}`,
				[]string{`{"authorization":"yes"}`, `{"authorization":1}`, `true`}},
			{"authorization rotate-secret", alice, "POST", "/api/projects/" + p.ID + "/authorization/rotate-secret", `{"overlapSeconds":60}`,
				[]string{`"rotate"`, `60`}},
		}
		malformed := []string{`{"name":`, `{bad json}`, `<html><body>hi</body></html>`, `{"name":"x"}}`, `{"name":"x",}`, `{'name':'x'}`, "\x00\x01", `{"name":"x"`}
		oversize := `{"name":"` + strings.Repeat("a", 70000) + `"}`
		for _, rt := range routes {
			t.Run(rt.name, func(t *testing.T) {
				c := rt.c.On(t)
				for _, body := range malformed {
					r := c.Do(rt.method, rt.path, body)
					if r.Status != http.StatusBadRequest {
						t.Errorf("malformed %q: %d %s", body, r.Status, r.Raw)
						continue
					}
					r.Expect(t, http.StatusBadRequest, `{"error":"invalid_json"}`)
				}
				for _, body := range append([]string{`[]`, `[{"name":"x"}]`}, rt.wrongType...) {
					r := c.Do(rt.method, rt.path, body)
					if r.Status != http.StatusBadRequest {
						t.Errorf("wrong type %q: %d %s", body, r.Status, r.Raw)
						continue
					}
					r.Expect(t, http.StatusBadRequest, `{"error":"invalid_json"}`)
				}
				for _, ct := range []string{"text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx", "json"} {
					r := c.Send(rt.method, rt.path, rt.valid, ct, nil)
					if r.Status != http.StatusUnsupportedMediaType {
						t.Errorf("Content-Type %q: %d %s", ct, r.Status, r.Raw)
						continue
					}
					r.Expect(t, http.StatusUnsupportedMediaType, `{"error":"unsupported_media_type"}`)
				}
				r := c.Do(rt.method, rt.path, oversize)
				r.Expect(t, http.StatusRequestEntityTooLarge, `{"error":"body_too_large","max_bytes":65536}`)
				r = c.Send(rt.method, rt.path, oversize, "text/plain", nil)
				r.Expect(t, http.StatusRequestEntityTooLarge, `{"error":"body_too_large","max_bytes":65536}`)
			})
		}

		// None of that changed anything: no user, no project, no key, no secret.
		if after := relaytest.Snapshot(alice, t, p.ID); after != before {
			t.Fatalf("refused requests changed the project:\nbefore %s\nafter  %s", before, after)
		}
		list := alice.Do("GET", "/api/projects", "")
		if ps, _ := list.JSON["projects"].([]any); len(ps) != 1 {
			t.Fatalf("refused requests created projects: %s", list.Raw)
		}
		bob := ts.Client().Do("POST", "/api/auth/signup", `{"email":"bob@example.com","password":"correct horse"}`)
		bob.Expect(t, http.StatusCreated, relaytest.JSON(map[string]string{"id": bob.Str("id"), "email": "bob@example.com"}))

		// JSON media types with parameters or a +json suffix are JSON; a body
		// of exactly 64 KiB is within the cap.
		for _, ct := range []string{"application/json; charset=utf-8", "Application/JSON", "application/merge-patch+json"} {
			r := alice.Send("PATCH", "/api/projects/"+p.ID, `{"name":"Typed"}`, ct, nil)
			r.Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": map[string]string{"id": p.ID, "name": "Typed"}}))
		}
		name := strings.Repeat("b", 65536-len(`{"name":""}`))
		r := alice.Do("PATCH", "/api/projects/"+p.ID, `{"name":"`+name+`"}`)
		r.Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": map[string]string{"id": p.ID, "name": name}}))
	})
}

func TestUnknownRoutesAndMethods(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Routes", aliceID)
		keys, _ := relaytest.Keys(alice, t, p.ID)
		kid := keys[0]["id"].(string)
		anon := ts.Client()

		notFound := []struct{ method, path string }{
			{"GET", "/api/nope"},
			{"GET", "/api/"},
			{"GET", "/api"},
			{"POST", "/api/auth/unknown"},
			{"GET", "/api/auth"},
			{"POST", "/api/project"},
			{"GET", "/api/projects/" + p.ID + "/nope"},
			{"GET", "/api/projects/" + p.ID + "/authorization/nope"},
			{"GET", "/api/projects/" + p.ID + "/keys/" + kid},
			{"POST", "/api/projects/" + p.ID + "/keys/" + kid + "/unrevoke"},
			{"GET", "/api/projects/" + p.ID + "/keys/" + kid + "/revoke/extra"},
			{"GET", "/api/v2/projects"},
			{"GET", "/definitely-not-a-page"},
			{"POST", "/some/deep/path.txt"},
			{"GET", "/.env"},
			{"GET", "/readyz/store"},
			{"GET", "/readyz/traffic/extra"},
		}
		for _, c := range []*relaytest.Client{anon, alice} {
			for _, rt := range notFound {
				r := c.Do(rt.method, rt.path, "")
				if r.Status != http.StatusNotFound {
					t.Errorf("%s %s: %d %s", rt.method, rt.path, r.Status, r.Raw)
					continue
				}
				r.Expect(t, http.StatusNotFound, `{"error":"not_found"}`)
			}
		}

		base := "/api/projects/" + p.ID
		wrongMethod := []struct {
			method, path string
			allow        []string
		}{
			{"GET", "/api/auth/signup", []string{"POST"}},
			{"PUT", "/api/auth/signup", []string{"POST"}},
			{"GET", "/api/auth/login", []string{"POST"}},
			{"DELETE", "/api/auth/login", []string{"POST"}},
			{"GET", "/api/auth/logout", []string{"POST"}},
			{"PUT", "/api/projects", []string{"GET", "POST"}},
			{"DELETE", "/api/projects", []string{"GET", "POST"}},
			{"POST", base, []string{"GET", "PATCH", "DELETE"}},
			{"PUT", base, []string{"GET", "PATCH", "DELETE"}},
			{"PATCH", base + "/keys", []string{"GET", "POST"}},
			{"DELETE", base + "/keys", []string{"GET", "POST"}},
			{"GET", base + "/keys/" + kid + "/revoke", []string{"POST"}},
			{"DELETE", base + "/keys/" + kid + "/revoke", []string{"POST"}},
			{"GET", base + "/client-emit-secret", []string{"PATCH"}},
			{"POST", base + "/client-emit-secret", []string{"PATCH"}},
			{"POST", base + "/authorization", []string{"GET", "PATCH"}},
			{"DELETE", base + "/authorization", []string{"GET", "PATCH"}},
			{"GET", base + "/authorization/rotate-secret", []string{"POST"}},
			{"PATCH", base + "/authorization/rotate-secret", []string{"POST"}},
			{"POST", "/healthz", []string{"GET"}},
			{"DELETE", "/readyz", []string{"GET"}},
			{"POST", "/readyz/traffic", []string{"GET"}},
		}
		for _, c := range []*relaytest.Client{anon, alice} {
			for _, rt := range wrongMethod {
				r := c.Do(rt.method, rt.path, "")
				if r.Status != http.StatusMethodNotAllowed {
					t.Errorf("%s %s: %d %s", rt.method, rt.path, r.Status, r.Raw)
					continue
				}
				r.Expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)
				allow := map[string]bool{}
				for _, m := range strings.Split(r.Header.Get("Allow"), ",") {
					allow[strings.TrimSpace(m)] = true
				}
				for _, m := range rt.allow {
					if !allow[m] {
						t.Errorf("%s %s: Allow %q lacks %s", rt.method, rt.path, r.Header.Get("Allow"), m)
					}
				}
				if allow[rt.method] {
					t.Errorf("%s %s: Allow %q lists the refused method", rt.method, rt.path, r.Header.Get("Allow"))
				}
			}
		}
		// Nothing above touched the project.
		alice.Do("GET", base, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": map[string]any{
			"id": p.ID, "name": "Routes", "ownerUserId": aliceID, "createdAt": alice.Do("GET", base, "").Str("project", "createdAt"),
		}}))
	})
}

func TestHealthAndSecurityHeaders(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		c := ts.Client()
		healthz := c.Do("GET", "/healthz", "")
		healthz.Expect(t, http.StatusOK, `{"status":"ok"}`)
		readyz := c.Do("GET", "/readyz", "")
		readyz.Expect(t, http.StatusOK, `{"status":"ok"}`)
		traffic := c.Do("GET", "/readyz/traffic", "")
		traffic.Expect(t, http.StatusOK, `{"status":"ok"}`)

		signup := c.Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`)
		signup.Expect(t, http.StatusCreated, relaytest.JSON(map[string]string{"id": signup.Str("id"), "email": "alice@example.com"}))
		type named struct {
			name string
			r    relaytest.Response
		}
		responses := []named{
			{"healthz", healthz},
			{"readyz", readyz},
			{"readyz/traffic", traffic},
			{"signup 201", signup},
			{"list 200", c.Do("GET", "/api/projects", "")},
			{"create 201", c.Do("POST", "/api/projects", `{"name":"x"}`)},
			{"invalid_json 400", c.Do("POST", "/api/projects", `{`)},
			{"project_not_found 404", c.Do("GET", "/api/projects/00000000-0000-0000-0000-000000000000", "")},
			{"unsupported_media_type 415", c.Send("POST", "/api/projects", `{"name":"x"}`, "text/plain", nil)},
			{"not_found 404 api", c.Do("GET", "/api/nope", "")},
			{"not_found 404 page", c.Do("GET", "/nope", "")},
			{"method_not_allowed 405", c.Do("PUT", "/healthz", "")},
			{"logout 200", c.Do("POST", "/api/auth/logout", "")},
			{"unauthorized 401", c.Do("GET", "/api/projects", "")},
			{"invalid_credentials 401", ts.Client().Do("POST", "/api/auth/login", `{"email":"x@example.com","password":"whatever1"}`)},
		}
		for _, n := range responses {
			name, r := n.name, n.r
			if r.Status >= 500 {
				t.Errorf("%s: %d %s", name, r.Status, r.Raw)
			}
			if got := r.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("%s: X-Content-Type-Options %q, want nosniff", name, got)
			}
			csp := r.Header.Get("Content-Security-Policy")
			if !strings.Contains(csp, "frame-ancestors") {
				t.Errorf("%s: Content-Security-Policy %q lacks frame-ancestors", name, csp)
			}
			if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("%s: Content-Type %q, want JSON", name, ct)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Concurrent requests: a double click or two dashboard tabs.

// TestConcurrentSignupsSameEmail: one account, the other attempts 409.
func TestConcurrentSignupsSameEmail(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		created := 0
		for _, r := range ts.Client().Parallel(t, 4, "POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`) {
			switch r.Status {
			case http.StatusCreated:
				created++
			default:
				r.Expect(t, http.StatusConflict, `{"error":"email_already_registered"}`)
			}
		}
		if created != 1 {
			t.Fatalf("%d concurrent signups succeeded, want 1", created)
		}
	})
}

// TestConcurrentRotationsLeaveOneActiveKey: however rotations interleave,
// each revokes the active key of its type, so exactly one key per type stays
// active and every other key a rotation returned is revoked (README.md ›
// Endpoints: rotation revokes the old key; a key rotated away must not keep working).
func TestConcurrentRotationsLeaveOneActiveKey(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Busy", aliceID)
		for round := 0; round < 3; round++ {
			issued := map[string]bool{}
			for _, r := range alice.Parallel(t, 8, "POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public"}`) {
				if r.Status != http.StatusCreated {
					t.Fatalf("rotate: %d %s", r.Status, r.Raw)
				}
				issued[r.Str("key", "id")] = true
			}
			keys, raw := relaytest.Keys(alice, t, p.ID)
			active := relaytest.ActiveKeys(keys, "public")
			if len(active) != 1 {
				t.Fatalf("round %d: %d active public keys after 8 concurrent rotations, want 1: %s", round, len(active), raw)
			}
			if !issued[active[0]["id"].(string)] {
				t.Fatalf("round %d: the active public key is not one of the rotations' keys", round)
			}
			if len(relaytest.ActiveKeys(keys, "secret")) != 1 {
				t.Fatalf("round %d: rotating public keys changed the secret keys: %s", round, raw)
			}
		}
	})
}

// TestConcurrentFirstClientEmitSecret: concurrent first calls all return the
// one secret that is kept; a caller must never get a secret that the next
// call does not return (it could sign only tokens that never verify).
func TestConcurrentFirstClientEmitSecret(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		for round := 0; round < 3; round++ {
			p, _ := relaytest.CreateChecked(alice, t, "Fresh", aliceID)
			path := "/api/projects/" + p.ID + "/client-emit-secret"
			got := map[string]bool{}
			for _, r := range alice.Parallel(t, 8, "PATCH", path, `{}`) {
				r.Expect(t, http.StatusOK, relaytest.JSON(map[string]string{"clientEmitSecret": r.Str("clientEmitSecret")}))
				got[r.Str("clientEmitSecret")] = true
			}
			kept := alice.Do("PATCH", path, `{}`).Str("clientEmitSecret")
			if len(got) != 1 || !got[kept] {
				t.Fatalf("round %d: 8 concurrent first calls returned %d different secrets; the kept one among them: %v", round, len(got), got[kept])
			}
		}
	})
}
