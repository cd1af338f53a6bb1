package main

// The project setting of channel authorization (proto/PROTOCOL.md › Channel
// authorization): the JSON routes, the settings the actors load, the
// dashboard's section and `relay admin project authorization`, each on
// SQLite and on PostgreSQL. What a token does at the handshake and on the
// socket is tested with the connection plane.

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// cpAuthorization is the exact body of the authorization routes, without a JWKS URL.
func cpAuthorization(on bool, secret, previousUntil any) string {
	return relaytest.AuthorizationBody(on, secret, previousUntil, nil)
}

// TestAuthorizationSettingAPI: off with no secret until turned on; on makes
// the secret once; off keeps it; a rotation replaces it, the old one shown
// as valid until the end of the overlap while it lasts; every refusal with
// its exact body, changing nothing.
func TestAuthorizationSettingAPI(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		clock := newClock()
		ts := startServerAt(t, dbURL, nil, clock.Now)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, pb := relaytest.CreateChecked(alice, t, "Private", aliceID)
		q, _ := relaytest.CreateChecked(alice, t, "Other", aliceID)
		path := "/api/projects/" + p.ID + "/authorization"
		rotate := path + "/rotate-secret"
		off := cpAuthorization(false, nil, nil)

		alice.Do("GET", path, "").Expect(t, http.StatusOK, off)
		// Refusals before any secret exists: nothing made.
		for _, body := range []string{"", `{}`, `{"authorization":null}`, `{"on":true}`} {
			alice.Do("PATCH", path, body).Expect(t, http.StatusBadRequest, `{"error":"authorization_required"}`)
		}
		for _, body := range []string{`{"authorization":"true"}`, `{"authorization":1}`, `{"authorization":[true]}`, `[`, `true`} {
			alice.Do("PATCH", path, body).Expect(t, http.StatusBadRequest, `{"error":"invalid_json"}`)
		}
		alice.Send("PATCH", path, `{"authorization":true}`, "text/plain", nil).Expect(t, http.StatusUnsupportedMediaType, `{"error":"unsupported_media_type"}`)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, off)

		// On: the secret is made, random and long enough to sign with.
		on := alice.Do("PATCH", path, `{"authorization":true}`)
		secret := on.Str("secret")
		on.Expect(t, http.StatusOK, cpAuthorization(true, secret, nil))
		if len(secret) < 43 || strings.ContainsAny(secret, "+/=") {
			t.Fatalf("authorization secret %q: want 32 random bytes in base64url", secret)
		}
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpAuthorization(true, secret, nil))
		alice.Do("PATCH", path, `{"authorization":true}`).Expect(t, http.StatusOK, cpAuthorization(true, secret, nil))
		// Off keeps the secret; on again brings it back.
		alice.Do("PATCH", path, `{"authorization":false}`).Expect(t, http.StatusOK, cpAuthorization(false, secret, nil))
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpAuthorization(false, secret, nil))
		alice.Do("PATCH", path, `{"authorization":true}`).Expect(t, http.StatusOK, cpAuthorization(true, secret, nil))
		// Another project stays as it was.
		alice.Do("GET", "/api/projects/"+q.ID+"/authorization", "").Expect(t, http.StatusOK, off)

		// Rotation: refused overlaps, in the key rotation's words.
		for _, body := range []string{`{"overlapSeconds":-1}`, `{"overlapSeconds":86401}`, `{"overlapSeconds":1.5}`, `{"overlapSeconds":"60"}`, `{"overlapSeconds":true}`, `{"overlapSeconds":{}}`} {
			alice.Do("POST", rotate, body).Expect(t, http.StatusBadRequest, `{"error":"invalid_overlap"}`)
		}
		for _, body := range []string{`[`, `{"overlapSeconds":`, `"x"`} {
			alice.Do("POST", rotate, body).Expect(t, http.StatusBadRequest, `{"error":"invalid_json"}`)
		}
		alice.Send("POST", rotate, `{}`, "application/x-www-form-urlencoded", nil).Expect(t, http.StatusUnsupportedMediaType, `{"error":"unsupported_media_type"}`)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpAuthorization(true, secret, nil))

		// Without overlap (empty body, {}, 0, null): a new secret, no previous.
		seen := []string{secret}
		for _, body := range []string{"", `{}`, `{"overlapSeconds":0}`, `{"overlapSeconds":null}`} {
			r := alice.Do("POST", rotate, body)
			s := r.Str("secret")
			r.Expect(t, http.StatusOK, cpAuthorization(true, s, nil))
			if slices.Contains(seen, s) || len(s) < 43 {
				t.Fatalf("rotation %q made secret %q (seen %q)", body, s, seen)
			}
			seen = append(seen, s)
		}
		// With an overlap: the previous one is valid until now + overlap.
		prev := seen[len(seen)-1]
		until := clock.Now().UTC().Add(300 * time.Second).Format("2006-01-02T15:04:05.000Z")
		r := alice.Do("POST", rotate, `{"overlapSeconds":300}`)
		cur := r.Str("secret")
		r.Expect(t, http.StatusOK, cpAuthorization(true, cur, until))
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpAuthorization(true, cur, until))
		stored, err := ts.app.store.Project(context.Background(), p.ID)
		if err != nil || stored.AuthSecret != cur || stored.AuthSecretPrevious != prev {
			t.Fatalf("stored: %+v, %v", stored, err)
		}
		// Turning it off and on leaves the overlap as it is.
		alice.Do("PATCH", path, `{"authorization":false}`).Expect(t, http.StatusOK, cpAuthorization(false, cur, until))
		alice.Do("PATCH", path, `{"authorization":true}`).Expect(t, http.StatusOK, cpAuthorization(true, cur, until))
		// Once the overlap has ended, no previous secret is shown.
		clock.Advance(300 * time.Second)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpAuthorization(true, cur, nil))
		// The longest overlap is the key rotation's.
		r = alice.Do("POST", rotate, `{"overlapSeconds":86400}`)
		r.Expect(t, http.StatusOK, cpAuthorization(true, r.Str("secret"), clock.Now().UTC().Add(24*time.Hour).Format("2006-01-02T15:04:05.000Z")))

		// jwksUrl: alone or with authorization, trimmed; null or "" removes
		// it; a URL the webhook setting would refuse is invalid_jwks_url,
		// a non-string invalid_json, each changing nothing.
		cur = alice.Do("POST", rotate, "").Str("secret") // no overlap left to show
		seen = append(seen, cur)
		jwks := "https://example.com/.well-known/jwks.json"
		alice.Do("PATCH", path, `{"jwksUrl":" `+jwks+` "}`).Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, cur, nil, jwks))
		alice.Do("GET", path, "").Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, cur, nil, jwks))
		for _, bad := range []string{`"ftp://example.com/jwks"`, `"example.com/jwks"`, `"https://user:pw@example.com/jwks"`, `"https://"`, `"https://example.com/` + strings.Repeat("a", 2048) + `"`} {
			alice.Do("PATCH", path, `{"authorization":false,"jwksUrl":`+bad+`}`).Expect(t, http.StatusBadRequest, `{"error":"invalid_jwks_url"}`)
		}
		for _, bad := range []string{`1`, `true`, `["https://example.com"]`, `{}`} {
			alice.Do("PATCH", path, `{"jwksUrl":`+bad+`}`).Expect(t, http.StatusBadRequest, `{"error":"invalid_json"}`)
		}
		alice.Do("GET", path, "").Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, cur, nil, jwks))
		// http:// as the webhook URL allows it; with authorization in one change.
		alice.Do("PATCH", path, `{"authorization":false,"jwksUrl":"http://keys.example.com/jwks"}`).Expect(t, http.StatusOK, relaytest.AuthorizationBody(false, cur, nil, "http://keys.example.com/jwks"))
		alice.Do("PATCH", path, `{"authorization":true}`).Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, cur, nil, "http://keys.example.com/jwks"))
		r = alice.Do("POST", rotate, "")
		r.Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, r.Str("secret"), nil, "http://keys.example.com/jwks"))
		cur = r.Str("secret")
		seen = append(seen, cur)
		alice.Do("PATCH", path, `{"jwksUrl":null}`).Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, cur, nil, nil))
		alice.Do("PATCH", path, `{"jwksUrl":"`+jwks+`"}`).Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, cur, nil, jwks))
		alice.Do("PATCH", path, `{"jwksUrl":"  "}`).Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, cur, nil, nil))
		alice.Do("GET", "/api/projects/"+q.ID+"/authorization", "").Expect(t, http.StatusOK, off)

		// The secret is shown only by these routes.
		get := alice.Do("GET", "/api/projects/"+p.ID, "")
		get.Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": pb}))
		list := alice.Do("GET", "/api/projects", "")
		_, keys := relaytest.Keys(alice, t, p.ID)
		for _, body := range []string{get.Raw, list.Raw, keys} {
			for _, s := range append(seen, cur) {
				if strings.Contains(body, s) {
					t.Fatalf("an authorization secret leaks outside its routes: %s", body)
				}
			}
		}
	})
}

// TestAuthorizationSettingsLoader: the settings the project actors load
// carry the setting and the secrets a token may be signed with: the current
// one, and the previous one until its overlap ends.
func TestAuthorizationSettingsLoader(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		st := storetest.Open(t, dbURL)
		u, err := st.CreateUser(ctx, "a@example.com", "h")
		if err != nil {
			t.Fatal(err)
		}
		p, err := st.CreateProject(ctx, u.ID, "demo", 0)
		if err != nil {
			t.Fatal(err)
		}
		clock := newClock()
		load := settingsLoader(st, clock.Now)
		s, err := load(ctx, p.ID)
		if err != nil || s.Authz.On || s.Authz.Secrets != nil || !s.Authz.PreviousUntil.IsZero() {
			t.Fatalf("a project that never turned it on: %+v, %v", s, err)
		}
		if _, err := st.SetAuthorization(ctx, p.ID, true, "one"); err != nil {
			t.Fatal(err)
		}
		if s, _ = load(ctx, p.ID); !s.Authz.On || !slices.Equal(s.Authz.Secrets, []string{"one"}) || !s.Authz.PreviousUntil.IsZero() {
			t.Fatalf("on: %+v", s)
		}
		until := clock.Now().UTC().Add(time.Minute).Truncate(time.Microsecond)
		if _, err := st.RotateAuthSecret(ctx, p.ID, "two", until); err != nil {
			t.Fatal(err)
		}
		if s, _ = load(ctx, p.ID); !slices.Equal(s.Authz.Secrets, []string{"two", "one"}) || !s.Authz.PreviousUntil.Equal(until) {
			t.Fatalf("in the overlap: %+v", s)
		}
		clock.Advance(time.Minute)
		if s, _ = load(ctx, p.ID); !slices.Equal(s.Authz.Secrets, []string{"two"}) || !s.Authz.PreviousUntil.IsZero() {
			t.Fatalf("after the overlap: %+v", s)
		}
		if _, err := st.SetAuthorization(ctx, p.ID, false, ""); err != nil {
			t.Fatal(err)
		}
		if s, _ = load(ctx, p.ID); s.Authz.On || !slices.Equal(s.Authz.Secrets, []string{"two"}) || s.Authz.JWKSURL != "" {
			t.Fatalf("off: %+v", s)
		}
		// The JWKS URL, and its removal.
		if _, err := st.SetAuthJWKSURL(ctx, p.ID, "https://example.com/jwks"); err != nil {
			t.Fatal(err)
		}
		if s, _ = load(ctx, p.ID); s.Authz.JWKSURL != "https://example.com/jwks" || !slices.Equal(s.Authz.Secrets, []string{"two"}) {
			t.Fatalf("with a JWKS URL: %+v", s)
		}
		if _, err := st.SetAuthJWKSURL(ctx, p.ID, ""); err != nil {
			t.Fatal(err)
		}
		if s, _ = load(ctx, p.ID); s.Authz.JWKSURL != "" {
			t.Fatalf("JWKS URL removed: %+v", s)
		}
		if _, err := st.SetAuthJWKSURL(ctx, "00000000-0000-0000-0000-000000000000", "https://example.com/jwks"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("no such project: %v", err)
		}
	})
}

// TestAdminProjectAuthorization: `relay admin project authorization` prints
// what the API answers, on and off, rotates with an overlap, refuses a bad
// command line before opening the store, and a change reaches a relay
// running on the same store.
func TestAdminProjectAuthorization(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		adminOK(t, dbURL, "create-user", "--email", "dana@example.com", "--password", "correct horse")
		p := adminOK(t, dbURL, "create-project", "--email", "dana@example.com", "--name", "demo")
		pid := p["project"].(map[string]any)["id"].(string)
		show := func(args ...string) map[string]any {
			t.Helper()
			v := adminOK(t, dbURL, append([]string{"project", "authorization", "--project", pid}, args...)...)
			if keysOf(v) != "authorization,jwksUrl,previousSecretExpiresAt,privateChannels,secret" {
				t.Fatalf("printed %v", v)
			}
			return v
		}
		if v := show(); v["authorization"] != false || v["secret"] != nil || v["previousSecretExpiresAt"] != nil {
			t.Fatalf("a new project: %v", v)
		}
		v := show("--on")
		secret, _ := v["secret"].(string)
		if v["authorization"] != true || len(secret) < 43 || v["previousSecretExpiresAt"] != nil {
			t.Fatalf("--on: %v", v)
		}
		if v := show("--off"); v["authorization"] != false || v["secret"] != secret {
			t.Fatalf("--off: %v", v)
		}
		v = show("--rotate-secret", "--overlap", "60")
		until, _ := time.Parse(time.RFC3339, v["previousSecretExpiresAt"].(string))
		if v["authorization"] != false || v["secret"] == secret || v["secret"] == nil || time.Until(until) < 50*time.Second || time.Until(until) > 70*time.Second {
			t.Fatalf("--rotate-secret --overlap 60: %v", v)
		}
		current := v["secret"].(string)
		if v := show(); v["secret"] != current || v["previousSecretExpiresAt"] == nil {
			t.Fatalf("after the rotation: %v", v)
		}
		if v := show("--rotate-secret"); v["secret"] == current || v["previousSecretExpiresAt"] != nil {
			t.Fatalf("--rotate-secret: %v", v)
		}

		// --jwks-url: alone, with --on or --off; "" removes it; a bad URL is the API's refusal.
		if v := show("--jwks-url", "https://example.com/jwks"); v["jwksUrl"] != "https://example.com/jwks" || v["authorization"] != false {
			t.Fatalf("--jwks-url: %v", v)
		}
		if v := show("--on", "--jwks-url", "https://example.com/other"); v["jwksUrl"] != "https://example.com/other" || v["authorization"] != true {
			t.Fatalf("--on --jwks-url: %v", v)
		}
		if v := show("--off", "--jwks-url", ""); v["jwksUrl"] != nil || v["authorization"] != false {
			t.Fatalf("--off --jwks-url '': %v", v)
		}
		adminFails(t, dbURL, 1, "invalid_jwks_url", "project", "authorization", "--project", pid, "--jwks-url", "ftp://example.com/jwks")
		adminFails(t, dbURL, 2, "--jwks-url and --private-channels exclude --rotate-secret", "project", "authorization", "--project", pid, "--rotate-secret", "--jwks-url", "https://example.com/jwks")
		show("--jwks-url", "https://example.com/jwks")

		// --private-channels: set (sorted), a bad one is the API's refusal, "" removes them.
		if v := show("--private-channels", "vault,team-*"); relaytest.Canonical(v["privateChannels"]) != `["team-*","vault"]` || v["jwksUrl"] != "https://example.com/jwks" {
			t.Fatalf("--private-channels: %v", v)
		}
		adminFails(t, dbURL, 1, "invalid_private_channels", "project", "authorization", "--project", pid, "--private-channels", "bad channel")
		adminFails(t, dbURL, 2, "exclude --rotate-secret", "project", "authorization", "--project", pid, "--rotate-secret", "--private-channels", "vault")
		if v := show("--private-channels", ""); relaytest.Canonical(v["privateChannels"]) != `[]` {
			t.Fatalf("--private-channels '': %v", v)
		}

		// A relay on the same store answers the same.
		v = show("--on")
		ts := startServer(t, dbURL, nil)
		c := ts.Client()
		c.Do("POST", "/api/auth/login", `{"email":"dana@example.com","password":"correct horse"}`).Expect(t, http.StatusOK,
			relaytest.JSON(map[string]string{"id": p["project"].(map[string]any)["ownerUserId"].(string), "email": "dana@example.com"}))
		c.Do("GET", "/api/projects/"+pid+"/authorization", "").Expect(t, http.StatusOK, relaytest.AuthorizationBody(true, v["secret"], nil, "https://example.com/jwks"))

		adminFails(t, dbURL, 1, "project_not_found", "project", "authorization", "--project", "00000000-0000-0000-0000-000000000000", "--on")
		adminFails(t, dbURL, 1, "project_not_found", "project", "authorization", "--project", "nope")
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--on"}, "--project is required"},
			{[]string{"--project", pid, "--on", "--off"}, "exclude each other"},
			{[]string{"--project", pid, "--on", "--rotate-secret"}, "exclude each other"},
			{[]string{"--project", pid, "--on", "--overlap", "5"}, "--overlap goes with --rotate-secret"},
			{[]string{"--project", pid, "--rotate-secret", "--overlap", "86401"}, "--overlap must be from 0 to 86400 seconds"},
			{[]string{"--project", pid, "--rotate-secret", "--overlap", "-1"}, "--overlap must be from 0 to 86400 seconds"},
			{[]string{"--project", pid, "--rotate-secret", "--overlap", "1m"}, "invalid value"},
			{[]string{"--project", pid, "extra"}, "unexpected argument"},
		} {
			adminFails(t, dbURL, 2, tc.want, append([]string{"project", "authorization"}, tc.args...)...)
		}
		adminFails(t, dbURL, 2, `unknown admin command "project"`, "project", "--project", pid)
		if v := show(); v["authorization"] != true {
			t.Fatalf("refused command lines changed the setting: %v", v)
		}
	})
}

// TestDashboardAuthorization: the project page's "Channel authorization":
// off with no secret on a new project; turning it on or off asks first; the
// secret shown is the API's; a rotation with an overlap shows until when the
// old one stays valid; a refused overlap changes nothing.
func TestDashboardAuthorization(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Private")
		page := "/projects/" + p.ID
		var api client = *ts.Client()
		api.HTTP.Jar = c.HTTP.Jar
		apiPath := "/api/projects/" + p.ID + "/authorization"

		view := c.Get(page)
		if view.ByID("authorization-state") != "off" || view.ByID("no-authorization-secret") == "" || view.ByID("authorization-secret") != "" ||
			!strings.Contains(view.Body, `href="/projects/`+p.ID+`/authorization/on"`) || strings.Contains(view.Body, "rotate-authorization") {
			t.Fatalf("a new project's authorization section:\n%s", view.Body)
		}

		// On: GET and an unconfirmed POST only ask.
		if r := c.Get(page + "/authorization/on"); r.Status != http.StatusOK || !strings.Contains(r.Body, `name="confirm" value="yes"`) {
			t.Fatalf("confirmation page: %d\n%s", r.Status, r.Body)
		}
		if r := c.Submit(page, page+"/authorization/on", nil); r.Status != http.StatusOK || !strings.Contains(r.Body, "Turn on channel authorization?") {
			t.Fatalf("unconfirmed POST: %d", r.Status)
		}
		api.Do("GET", apiPath, "").Expect(t, http.StatusOK, cpAuthorization(false, nil, nil))
		c.Submit(page, page+"/authorization/on", url.Values{"confirm": {"yes"}}).ExpectRedirect(t, page+"?done=auth-on")
		view = c.Get(page + "?done=auth-on")
		secret := view.ByID("authorization-secret")
		if view.ByID("authorization-state") != "on" || len(secret) < 43 || !strings.Contains(view.NoticeText(), "Channel authorization is on") {
			t.Fatalf("after turning on: state %q secret %q notice %q", view.ByID("authorization-state"), secret, view.NoticeText())
		}
		api.Do("GET", apiPath, "").Expect(t, http.StatusOK, cpAuthorization(true, secret, nil))

		// Rotate: a refused overlap changes nothing; one with an overlap shows its end.
		for _, bad := range []string{"-1", "86401", "abc", "1.5"} {
			c.Submit(page, page+"/authorization/rotate-secret", url.Values{"overlapSeconds": {bad}}).ExpectError(t, http.StatusBadRequest, "whole number of seconds")
		}
		if got := c.Get(page).ByID("authorization-secret"); got != secret {
			t.Fatalf("refused rotations changed the secret: %q", got)
		}
		c.Submit(page, page+"/authorization/rotate-secret", url.Values{"overlapSeconds": {"3600"}}).ExpectRedirect(t, page+"?done=auth-overlap")
		view = c.Get(page + "?done=auth-overlap")
		rotated := view.ByID("authorization-secret")
		if rotated == secret || rotated == "" || !strings.HasPrefix(view.ByID("authorization-previous-until"), "previous secret valid until ") ||
			!strings.Contains(view.NoticeText(), "accepted until") {
			t.Fatalf("after a rotation with overlap: secret %q until %q notice %q", rotated, view.ByID("authorization-previous-until"), view.NoticeText())
		}
		r := api.Do("GET", apiPath, "")
		r.Expect(t, http.StatusOK, cpAuthorization(true, rotated, r.JSON["previousSecretExpiresAt"]))
		if r.JSON["previousSecretExpiresAt"] == nil {
			t.Fatalf("the API shows no previous secret: %s", r.Raw)
		}
		c.Submit(page, page+"/authorization/rotate-secret", url.Values{"overlapSeconds": {"0"}}).ExpectRedirect(t, page+"?done=auth-rotated")
		view = c.Get(page)
		if again := view.ByID("authorization-secret"); again == rotated || again == "" || view.ByID("authorization-previous-until") != "" {
			t.Fatalf("after a rotation without overlap: %q, until %q", again, view.ByID("authorization-previous-until"))
		}
		rotated = view.ByID("authorization-secret")

		// Off: asks first, keeps the secret.
		if r := c.Submit(page, page+"/authorization/off", nil); r.Status != http.StatusOK || !strings.Contains(r.Body, "Turn off channel authorization?") {
			t.Fatalf("unconfirmed off: %d", r.Status)
		}
		c.Submit(page, page+"/authorization/off", url.Values{"confirm": {"yes"}}).ExpectRedirect(t, page+"?done=auth-off")
		view = c.Get(page)
		if view.ByID("authorization-state") != "off" || view.ByID("authorization-secret") != rotated {
			t.Fatalf("after turning off: state %q secret %q", view.ByID("authorization-state"), view.ByID("authorization-secret"))
		}
		api.Do("GET", apiPath, "").Expect(t, http.StatusOK, cpAuthorization(false, rotated, nil))

		// The JWKS URL: set, shown, refused as the API refuses it (the input
		// kept), removed with an empty field.
		if view.ByID("jwks-url-current") != "" || !strings.Contains(view.Body, `action="/projects/`+p.ID+`/authorization/jwks-url"`) {
			t.Fatalf("the JWKS URL form:\n%s", view.Body)
		}
		jwksPath := page + "/authorization/jwks-url"
		c.Submit(page, jwksPath, url.Values{"url": {"https://example.com/jwks.json"}}).ExpectRedirect(t, page+"?done=auth-jwks-saved")
		view = c.Get(page + "?done=auth-jwks-saved")
		if view.ByID("jwks-url-current") != "https://example.com/jwks.json" || !strings.Contains(view.NoticeText(), "JWKS URL saved") ||
			!strings.Contains(view.Body, `value="https://example.com/jwks.json"`) {
			t.Fatalf("after setting the JWKS URL: %q, notice %q", view.ByID("jwks-url-current"), view.NoticeText())
		}
		api.Do("GET", apiPath, "").Expect(t, http.StatusOK, relaytest.AuthorizationBody(false, rotated, nil, "https://example.com/jwks.json"))
		refusedPage := c.Submit(page, jwksPath, url.Values{"url": {"ftp://example.com/keys"}})
		refusedPage.ExpectError(t, http.StatusBadRequest, "The JWKS URL must be an absolute http:// or https:// URL")
		if !strings.Contains(refusedPage.Body, `value="ftp://example.com/keys"`) {
			t.Fatalf("the refused input is not kept:\n%s", refusedPage.Body)
		}
		api.Do("GET", apiPath, "").Expect(t, http.StatusOK, relaytest.AuthorizationBody(false, rotated, nil, "https://example.com/jwks.json"))
		c.Submit(page, jwksPath, url.Values{"url": {""}}).ExpectRedirect(t, page+"?done=auth-jwks-removed")
		if view = c.Get(page + "?done=auth-jwks-removed"); view.ByID("jwks-url-current") != "" || !strings.Contains(view.NoticeText(), "JWKS URL removed") {
			t.Fatalf("after removing the JWKS URL: %q, notice %q", view.ByID("jwks-url-current"), view.NoticeText())
		}
		api.Do("GET", apiPath, "").Expect(t, http.StatusOK, cpAuthorization(false, rotated, nil))

		// CSRF and someone else's project: refused, nothing changes.
		for _, path := range []string{page + "/authorization/on", page + "/authorization/off", page + "/authorization/rotate-secret", jwksPath} {
			c.Post(path, url.Values{"confirm": {"yes"}, "overlapSeconds": {"0"}}).ExpectError(t, http.StatusForbidden, "CSRF check failed")
		}
		bob := ts.Dash(t)
		bob.Signup("bob@example.com")
		for _, path := range []string{page + "/authorization/on", page + "/authorization/off"} {
			bob.Get(path).ExpectError(t, http.StatusNotFound, "Project not found")
		}
		for _, path := range []string{page + "/authorization/on", page + "/authorization/off", page + "/authorization/rotate-secret", jwksPath} {
			bob.Submit("/", path, url.Values{"confirm": {"yes"}, "overlapSeconds": {"0"}}).ExpectError(t, http.StatusNotFound, "Project not found")
		}
		api.Do("GET", apiPath, "").Expect(t, http.StatusOK, cpAuthorization(false, rotated, nil))
	})
}
