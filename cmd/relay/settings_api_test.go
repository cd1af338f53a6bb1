package main

// A project's settings and usage through the JSON API (GET and PATCH
// …/settings, GET …/usage) and `relay admin` (list-users, show-user,
// list-projects, show-project, list-keys, project settings, project usage),
// on SQLite and on PostgreSQL: every refusal with its exact body, the round
// trip with the dashboard, and the change reaching running nodes.

import (
	"context"
	"encoding/json"
	"fmt"
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

// cpSettings is the exact body of GET …/settings; history is the
// retention in seconds (none: 0).
func cpSettings(projectID string, webhookURL any, channel, presence bool, limit any, clientEmit bool, history ...int) string {
	base := "/api/projects/" + projectID
	retention := 0
	if len(history) > 0 {
		retention = history[0]
	}
	return relaytest.JSON(map[string]any{
		"webhookUrl":              webhookURL,
		"webhookEvents":           map[string]bool{"channel": channel, "presence": presence},
		"channelRateLimit":        limit,
		"historyRetentionSeconds": retention,
		"clientEmit":              map[string]bool{"secretSet": clientEmit},
		"links": map[string]string{"authorization": base + "/authorization", "clientEmitSecret": base + "/client-emit-secret",
			"webhookSecret": base + "/webhook-secret", "usage": base + "/usage"},
	})
}

// TestSettingsAPI: GET and PATCH …/settings: the defaults; every refusal
// with its exact body, changing nothing (a change of several settings is
// all or none); a round trip, the same on the dashboard's page and in the
// store; changes made in the dashboard shown by the API; the running project
// applies the new budget.
func TestSettingsAPI(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Hooks")
		q := c.Create("Other")
		var alice client = *ts.Client()
		alice.HTTP.Jar = c.HTTP.Jar
		alice.T = t
		path := "/api/projects/" + p.ID + "/settings"
		defaults := cpSettings(p.ID, nil, false, false, nil, false)

		alice.Do("GET", path, "").Expect(t, http.StatusOK, defaults)
		ts.Client().Do("GET", path, "").Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		ts.Client().Do("PATCH", path, `{"channelRateLimit":5}`).Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		bob, _ := ts.SignupID(t, "bob@example.com")
		bob.Do("GET", path, "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		bob.Do("PATCH", path, `{"channelRateLimit":5}`).Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		for _, bad := range []string{"00000000-0000-0000-0000-000000000000", "not-a-uuid"} {
			alice.Do("GET", "/api/projects/"+bad+"/settings", "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
			alice.Do("PATCH", "/api/projects/"+bad+"/settings", `{"channelRateLimit":5}`).Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		}
		alice.Do("PUT", path, `{}`).Expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)

		// Refusals, each changing nothing.
		refused := func(body string, status int, want string) {
			t.Helper()
			alice.Do("PATCH", path, body).Expect(t, status, want)
		}
		for _, body := range []string{"", `{}`, `{"webhookEvents":null}`, `{"webhookEvents":{}}`, `{"webhook":"https://example.com"}`} {
			refused(body, http.StatusBadRequest, `{"error":"setting_required"}`)
		}
		for _, body := range []string{`[`, `true`, `{"webhookUrl":1}`, `{"webhookUrl":["https://example.com"]}`, `{"webhookEvents":true}`,
			`{"webhookEvents":{"channel":"on"}}`, `{"webhookEvents":{"presence":1}}`} {
			refused(body, http.StatusBadRequest, `{"error":"invalid_json"}`)
		}
		for _, u := range []string{"ftp://example.com/h", "example.com/h", "https://user:pw@example.com/h", "https://", "https://example.com/" + strings.Repeat("a", 2048)} {
			refused(relaytest.JSON(map[string]string{"webhookUrl": u}), http.StatusBadRequest, `{"error":"invalid_webhook_url"}`)
		}
		for _, v := range []string{`0`, `-1`, `1000000001`, `1.5`, `1e3`, `"25"`, `true`, `{}`, `[]`} {
			refused(`{"channelRateLimit":`+v+`}`, http.StatusBadRequest, `{"error":"invalid_channel_rate_limit"}`)
		}
		refused(`{"webhookEvents":{"channel":true}}`, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		// All or none: a good URL with a bad budget, or a bad URL with a good one, saves neither.
		refused(`{"webhookUrl":"https://hooks.example.com/a","channelRateLimit":0}`, http.StatusBadRequest, `{"error":"invalid_channel_rate_limit"}`)
		refused(`{"webhookUrl":"ftp://hooks.example.com/a","channelRateLimit":5}`, http.StatusBadRequest, `{"error":"invalid_webhook_url"}`)
		alice.Send("PATCH", path, `{"channelRateLimit":5}`, "text/plain", nil).Expect(t, http.StatusUnsupportedMediaType, `{"error":"unsupported_media_type"}`)
		big := ts.Client() // a body refused before it is read ends its connection
		big.HTTP.Jar = c.HTTP.Jar
		big.Do("PATCH", path, `{"channelRateLimit":5,"x":"`+strings.Repeat("a", 70<<10)+`"}`).Expect(t, http.StatusRequestEntityTooLarge, `{"error":"body_too_large","max_bytes":65536}`)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, defaults)
		if st := dashSettings(t, ts, p.ID); st.WebhookURL != "" || st.ChannelRateLimit != nil {
			t.Fatalf("refusals saved settings: %+v", st)
		}

		// The round trip: several at once, trimmed, a signing secret made.
		const hook = "https://hooks.example.com/relay"
		want := cpSettings(p.ID, hook, false, true, 25, false)
		alice.Do("PATCH", path, `{"webhookUrl":" `+hook+` ","webhookEvents":{"presence":true},"channelRateLimit":25}`).Expect(t, http.StatusOK, want)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, want)
		st := dashSettings(t, ts, p.ID)
		secret := st.WebhookSecret
		if st.WebhookURL != hook || len(secret) < 40 || st.WebhookChannelEvents || !st.WebhookPresenceEvents || *st.ChannelRateLimit != 25 {
			t.Fatalf("stored after the PATCH: %+v", st)
		}
		// The dashboard shows the same.
		view := c.Get("/projects/" + p.ID)
		if view.ByID("webhook-current") != hook || view.ByID("webhook-secret") != secret || view.ByID("budget-current") != "25" ||
			strings.Contains(view.Body, `id="webhook-channel-events" checked`) || !strings.Contains(view.Body, `id="webhook-presence-events" checked`) {
			t.Fatalf("the dashboard after the PATCH: url %q budget %q\n%s", view.ByID("webhook-current"), view.ByID("budget-current"), view.Body)
		}
		if strings.Contains(alice.Do("GET", path, "").Raw, secret) {
			t.Fatal("the webhook signing secret is in the settings")
		}
		// The running project applies the budget (the emit answers with it).
		emitLimit := func() float64 {
			r := ts.Client().Emit(p.SecretKey, `{"channel":"budget`+strconv.FormatInt(time.Now().UnixNano(), 36)+`","payload":1}`)
			rl, _ := r.JSON["rate_limit"].(map[string]any)
			n, _ := rl["limit"].(float64)
			return n
		}
		if n := emitLimit(); n != 25 {
			t.Fatalf("the channel budget after the PATCH: %v, want 25", n)
		}

		// One at a time: the others stay.
		alice.Do("PATCH", path, `{"webhookEvents":{"channel":true}}`).Expect(t, http.StatusOK, cpSettings(p.ID, hook, true, true, 25, false))
		alice.Do("PATCH", path, `{"webhookEvents":{"presence":false}}`).Expect(t, http.StatusOK, cpSettings(p.ID, hook, true, false, 25, false))
		alice.Do("PATCH", path, `{"channelRateLimit":7}`).Expect(t, http.StatusOK, cpSettings(p.ID, hook, true, false, 7, false))
		relaytest.EventuallyNil(t, 2*time.Second, func() error {
			if n := emitLimit(); n != 7 {
				return fmt.Errorf("the channel budget after the PATCH: %v, want 7", n)
			}
			return nil
		})
		alice.Do("PATCH", path, `{"webhookUrl":"http://hooks.example.com:8080/v2?x=1"}`).Expect(t, http.StatusOK, cpSettings(p.ID, "http://hooks.example.com:8080/v2?x=1", true, false, 7, false))
		if got := dashSettings(t, ts, p.ID).WebhookSecret; got != secret {
			t.Fatal("changing the URL changed the signing secret")
		}
		alice.Do("PATCH", path, `{"channelRateLimit":null}`).Expect(t, http.StatusOK, cpSettings(p.ID, "http://hooks.example.com:8080/v2?x=1", true, false, nil, false))
		if c.Get("/projects/"+p.ID).ByID("budget-default") == "" {
			t.Fatal("the dashboard shows an override after null")
		}
		// Removing the URL and choosing events in one change is refused whole.
		refused(`{"webhookUrl":null,"webhookEvents":{"presence":true}}`, http.StatusBadRequest, `{"error":"webhook_url_required"}`)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpSettings(p.ID, "http://hooks.example.com:8080/v2?x=1", true, false, nil, false))

		// Changes made in the dashboard: the API shows them.
		page := "/projects/" + p.ID
		c.Submit(page, page+"/budget", url.Values{"limit": {"12"}}).ExpectRedirect(t, page+"?done=budget-saved")
		c.Submit(page, page+"/webhook/events", url.Values{"presence": {"on"}}).ExpectRedirect(t, page+"?done=webhook-events")
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpSettings(p.ID, "http://hooks.example.com:8080/v2?x=1", false, true, 12, false))
		c.Submit(page, page+"/client-emit-secret", nil).ExpectRedirect(t, page+"?done=ces-generated")
		c.Submit(page, page+"/webhook/remove", nil).ExpectRedirect(t, page+"?done=webhook-removed")
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpSettings(p.ID, nil, false, false, 12, true))
		// The dashboard refuses what the API refuses, in words.
		c.Submit(page, page+"/webhook", url.Values{"url": {"ftp://x"}}).ExpectError(t, http.StatusBadRequest, "The webhook URL must be an absolute http:// or https:// URL")
		c.Submit(page, page+"/budget", url.Values{"limit": {"0"}}).ExpectError(t, http.StatusBadRequest, "The channel budget must be a whole number")
		c.Submit(page, page+"/webhook/events", url.Values{"channel": {"on"}}).ExpectError(t, http.StatusBadRequest, "This project has no webhook URL")

		// Removal through the API: null or "" (the secret and events go too).
		for _, removal := range []string{`null`, `"  "`} {
			alice.Do("PATCH", path, `{"webhookUrl":"`+hook+`","webhookEvents":{"channel":true,"presence":true}}`).Expect(t, http.StatusOK, cpSettings(p.ID, hook, true, true, 12, true))
			alice.Do("PATCH", path, `{"webhookUrl":`+removal+`}`).Expect(t, http.StatusOK, cpSettings(p.ID, nil, false, false, 12, true))
			if st := dashSettings(t, ts, p.ID); st.WebhookURL != "" || st.WebhookSecret != "" || st.WebhookChannelEvents || st.WebhookPresenceEvents {
				t.Fatalf("stored after removal %s: %+v", removal, st)
			}
		}
		// The other project is untouched.
		alice.Do("GET", "/api/projects/"+q.ID+"/settings", "").Expect(t, http.StatusOK, cpSettings(q.ID, nil, false, false, nil, false))
	})
}

// TestHistoryRetentionSetting: historyRetentionSeconds through PATCH
// …/settings (0 to HISTORY_MAX_RETENTION_SECONDS, every refusal with its
// exact body, saving nothing), the dashboard's form and its refusal in
// words, and the value the settings loader hands the actors.
func TestHistoryRetentionSetting(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"HISTORY_MAX_RETENTION_SECONDS": "3600"})
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("History")
		var alice client = *ts.Client()
		alice.HTTP.Jar = c.HTTP.Jar
		alice.T = t
		path := "/api/projects/" + p.ID + "/settings"
		for _, v := range []string{`-1`, `3601`, `1.5`, `"60"`, `null`, `true`, `{}`} {
			alice.Do("PATCH", path, `{"historyRetentionSeconds":`+v+`}`).Expect(t, http.StatusBadRequest, `{"error":"invalid_history_retention"}`)
		}
		alice.Do("PATCH", path, `{"channelRateLimit":5,"historyRetentionSeconds":-1}`).Expect(t, http.StatusBadRequest, `{"error":"invalid_history_retention"}`)
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpSettings(p.ID, nil, false, false, nil, false))
		alice.Do("PATCH", path, `{"historyRetentionSeconds":3600}`).Expect(t, http.StatusOK, cpSettings(p.ID, nil, false, false, nil, false, 3600))
		if st := dashSettings(t, ts, p.ID); st.HistoryRetentionSeconds != 3600 {
			t.Fatalf("stored: %+v", st)
		}
		s, err := settingsLoader(ts.app.store, time.Now)(t.Context(), p.ID)
		if err != nil || s.HistoryRetention != time.Hour {
			t.Fatalf("the settings loader: %v %v", s.HistoryRetention, err)
		}
		page := "/projects/" + p.ID
		if got := c.Get(page).ByID("history-current"); got != "3600" {
			t.Fatalf("the dashboard shows %q", got)
		}
		// The size stored now, and the cap (HISTORY_MAX_BYTES_PER_PROJECT).
		view := c.Get(page)
		if got := view.ByID("history-size"); got != "0 B" || !strings.Contains(view.Body, "of at most 1.0 GiB") {
			t.Fatalf("history size %q with nothing stored", got)
		}
		stored := []store.HistoryMessage{{ProjectID: p.ID, Channel: "room", Seq: 1, Message: strings.Repeat("x", 1500), CreatedAt: time.Now()},
			{ProjectID: p.ID, Channel: "room", Seq: 2, Message: strings.Repeat("y", 1572), CreatedAt: time.Now()}}
		if _, err := ts.app.store.AppendHistory(t.Context(), stored); err != nil {
			t.Fatal(err)
		}
		if got := c.Get(page).ByID("history-size"); got != "3.0 KiB" {
			t.Fatalf("history size %q with 3 072 bytes stored", got)
		}
		c.Submit(page, page+"/history", url.Values{"seconds": {"3601"}}).ExpectError(t, http.StatusBadRequest, "The history retention must be a whole number of seconds")
		c.Submit(page, page+"/history", url.Values{"seconds": {"abc"}}).ExpectError(t, http.StatusBadRequest, "The history retention must be a whole number of seconds")
		c.Submit(page, page+"/history", url.Values{"seconds": {"120"}}).ExpectRedirect(t, page+"?done=history-saved")
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpSettings(p.ID, nil, false, false, nil, false, 120))
		c.Submit(page, page+"/history", url.Values{"seconds": {""}}).ExpectRedirect(t, page+"?done=history-off")
		alice.Do("GET", path, "").Expect(t, http.StatusOK, cpSettings(p.ID, nil, false, false, nil, false))
		if c.Get(page).ByID("history-off") == "" {
			t.Fatal("the dashboard shows history on after it was turned off")
		}
	})
}

// usageDay is one row of GET …/usage, as the store holds it.
func usageDay(u store.Usage) map[string]any {
	m := usageCounts(u)
	m["day"] = u.Day
	return m
}

func usageCounts(u store.Usage) map[string]any {
	var p99 any
	if u.LatencyP99Ms > 0 {
		p99 = u.LatencyP99Ms
	}
	return map[string]any{
		"connections": u.ConnectionCount, "messages": u.MessageCount, "peakConcurrentConnections": u.PeakConcurrentConnections,
		"deliveries": u.Deliveries, "dropped": u.Dropped, "slowConsumersClosed": u.SlowConsumersClosed,
		"channelRateLimited": u.ChannelRateLimited, "projectRateLimited": u.ProjectRateLimited,
		"clientEmitRateLimited": u.ClientEmitRateLimited, "latencyP99Ms": p99, "historyBytes": u.HistoryBytes,
	}
}

// TestUsageAPI: GET …/usage answers the rows the dashboard's usage page
// shows (the last 30 UTC days by default), with their total; from and to
// choose other days; every refusal with its exact body.
func TestUsageAPI(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, map[string]string{"USAGE_ROLLUP_SECONDS": "3600"})
		c := ts.Dash(t)
		c.Signup("alice@example.com")
		p := c.Create("Counted")
		var alice client = *ts.Client()
		alice.HTTP.Jar = c.HTTP.Jar
		alice.T = t
		path := "/api/projects/" + p.ID + "/usage"
		today := time.Now().UTC()
		day := func(n int) string { return today.AddDate(0, 0, -n).Format(time.DateOnly) }
		body := func(from, to string, rows []store.Usage) string {
			days := []any{}
			var total store.Usage
			for _, u := range rows {
				days = append(days, usageDay(u))
				total.Merge(u)
			}
			return relaytest.JSON(map[string]any{"projectId": p.ID, "from": from, "to": to, "days": days, "total": usageCounts(total)})
		}
		alice.Do("GET", path, "").Expect(t, http.StatusOK, body(day(29), day(0), nil))

		ctx := context.Background()
		rows := []store.Usage{
			{ProjectID: p.ID, Day: day(30), ConnectionCount: 99, MessageCount: 99, PeakConcurrentConnections: 99}, // outside the 30 days
			{ProjectID: p.ID, Day: day(29), ConnectionCount: 2, MessageCount: 1234567, PeakConcurrentConnections: 2},
			{ProjectID: p.ID, Day: day(4), ConnectionCount: 0, MessageCount: 5, PeakConcurrentConnections: 0, ProjectRateLimited: 1234, LatencyP99Ms: 1.536,
				HistoryBytes: 5 << 20},
			{ProjectID: p.ID, Day: day(1), ConnectionCount: 12, MessageCount: 3400, PeakConcurrentConnections: 7,
				Deliveries: 40000, Dropped: 3, SlowConsumersClosed: 1, ChannelRateLimited: 2, ClientEmitRateLimited: 5, LatencyP99Ms: 12.288},
		}
		for _, u := range rows {
			if err := ts.app.store.AddUsage(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		r := alice.Do("GET", path, "")
		r.Expect(t, http.StatusOK, body(day(29), day(0), rows[1:]))

		// The dashboard's page shows the same rows (newest first there).
		page := c.Get("/projects/" + p.ID + "/usage")
		rowRe := regexp.MustCompile(`<tr data-day="([^"]+)"><td>[^<]*</td>` + strings.Repeat(`<td[^>]*>([^<]*)</td>`, 10) + `</tr>`)
		var shown []string
		for _, m := range rowRe.FindAllStringSubmatch(page.Body, -1) {
			shown = append(shown, strings.ReplaceAll(strings.Join(m[1:], "|"), ",", ""))
		}
		var fromAPI []string
		var days []map[string]any
		if err := json.Unmarshal([]byte(relaytest.JSON(r.JSON["days"])), &days); err != nil {
			t.Fatal(err)
		}
		for i := len(days) - 1; i >= 0; i-- {
			d := days[i]
			p99 := "–"
			if ms, ok := d["latencyP99Ms"].(float64); ok {
				p99 = strconv.FormatFloat(ms, 'f', 0, 64) + " ms"
				if ms < 10 {
					p99 = strconv.FormatFloat(ms, 'f', 2, 64) + " ms"
				}
			}
			cells := []string{d["day"].(string)}
			for _, k := range []string{"connections", "messages", "peakConcurrentConnections", "deliveries", "dropped", "slowConsumersClosed",
				"channelRateLimited", "projectRateLimited", "clientEmitRateLimited"} {
				cells = append(cells, strconv.FormatFloat(d[k].(float64), 'f', 0, 64))
			}
			fromAPI = append(fromAPI, strings.Join(append(cells, p99), "|"))
		}
		if len(shown) != 3 || strings.Join(shown, "\n") != strings.Join(fromAPI, "\n") {
			t.Fatalf("the dashboard shows\n%s\nthe API answers\n%s", strings.Join(shown, "\n"), strings.Join(fromAPI, "\n"))
		}

		// A range: from and to included, either alone.
		alice.Do("GET", path+"?from="+day(30)+"&to="+day(4), "").Expect(t, http.StatusOK, body(day(30), day(4), rows[:3]))
		alice.Do("GET", path+"?from="+day(4), "").Expect(t, http.StatusOK, body(day(4), day(0), rows[2:]))
		alice.Do("GET", path+"?to="+day(2), "").Expect(t, http.StatusOK, body(today.AddDate(0, 0, -31).Format(time.DateOnly), day(2), rows[:3]))
		alice.Do("GET", path+"?from="+day(1)+"&to="+day(1), "").Expect(t, http.StatusOK, body(day(1), day(1), rows[3:]))
		alice.Do("GET", path+"?from="+day(3)+"&to="+day(2), "").Expect(t, http.StatusOK, body(day(3), day(2), nil))

		// Refusals.
		for _, tc := range []struct{ query, param string }{
			{"from=yesterday", "from"}, {"from=2026-1-05", "from"}, {"from=2026-02-30", "from"}, {"to=2026-13-01", "to"}, {"to=", ""},
			{"from=" + day(1) + "&to=" + day(2), "from"}, {"to=x&from=y", "to"},
		} {
			r := alice.Do("GET", path+"?"+tc.query, "")
			if tc.param == "" { // empty is the default
				r.Expect(t, http.StatusOK, body(day(29), day(0), rows[1:]))
				continue
			}
			r.Expect(t, http.StatusBadRequest, relaytest.JSON(map[string]string{"error": "invalid_query", "param": tc.param}))
		}
		ts.Client().Do("GET", path, "").Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
		bob, _ := ts.SignupID(t, "bob@example.com")
		bob.Do("GET", path, "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		alice.Do("GET", "/api/projects/00000000-0000-0000-0000-000000000000/usage", "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		alice.Do("POST", path, "").Expect(t, http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`)

		// relay admin project usage prints the same.
		out := adminOK(t, dbURL, "project", "usage", "--project", p.ID)
		if got, want := relaytest.Canonical(out), relaytest.Canonical(r.JSON); got != want {
			t.Fatalf("relay admin project usage printed\n%s\nwant\n%s", got, want)
		}
		out = adminOK(t, dbURL, "project", "usage", "--project", p.ID, "--from", day(30), "--to", day(4))
		var exp any
		json.Unmarshal([]byte(body(day(30), day(4), rows[:3])), &exp)
		if relaytest.Canonical(out) != relaytest.Canonical(exp) {
			t.Fatalf("relay admin project usage --from --to printed %s", relaytest.Canonical(out))
		}
		adminFails(t, dbURL, 1, "--from and --to must be days", "project", "usage", "--project", p.ID, "--from", "x")
		adminFails(t, dbURL, 1, "project_not_found", "project", "usage", "--project", "00000000-0000-0000-0000-000000000000")
	})
}

// TestAdminListsAndSettings: list-users, show-user, list-projects,
// show-project, list-keys and project settings print the control plane's
// bodies, without secrets; project settings changes as PATCH …/settings
// does, with its refusals.
func TestAdminListsAndSettings(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		if v := adminOK(t, dbURL, "list-users"); relaytest.Canonical(v) != `{"users":[]}` {
			t.Fatalf("list-users on an empty store: %v", v)
		}
		if v := adminOK(t, dbURL, "list-projects"); relaytest.Canonical(v) != `{"projects":[]}` {
			t.Fatalf("list-projects on an empty store: %v", v)
		}
		dana := adminOK(t, dbURL, "create-user", "--email", "dana@example.com", "--password", "correct horse")
		erin := adminOK(t, dbURL, "create-user", "--email", "erin@example.com", "--password", "correct horse")
		p1 := adminOK(t, dbURL, "create-project", "--email", "dana@example.com", "--name", "one")
		p2 := adminOK(t, dbURL, "create-project", "--email", "erin@example.com", "--name", "two")
		p3 := adminOK(t, dbURL, "create-project", "--email", "dana@example.com", "--name", "three")
		proj := func(v map[string]any) map[string]any { return v["project"].(map[string]any) }
		pid := proj(p1)["id"].(string)
		secretKey := p1["keys"].(map[string]any)["secretKey"].(string)

		users := adminOK(t, dbURL, "list-users")
		list, _ := users["users"].([]any)
		if len(list) != 2 || keysOf(list[0]) != "createdAt,email,id,projects" {
			t.Fatalf("list-users: %v", users)
		}
		for i, want := range []struct {
			u map[string]any
			n float64
		}{{dana, 2}, {erin, 1}} {
			got := list[i].(map[string]any)
			if got["id"] != want.u["id"] || got["email"] != want.u["email"] || got["projects"] != want.n {
				t.Fatalf("list-users row %d: %v", i, got)
			}
			relaytest.IsTime(t, "createdAt", got["createdAt"])
		}
		v := adminOK(t, dbURL, "show-user", "--email", " DANA@example.com ")
		if keysOf(v) != "projects,user" || v["user"].(map[string]any)["id"] != dana["id"] || v["user"].(map[string]any)["projects"] != 2.0 ||
			relaytest.Canonical(v["projects"]) != relaytest.Canonical([]any{proj(p1), proj(p3)}) {
			t.Fatalf("show-user: %v", v)
		}
		adminFails(t, dbURL, 1, "no user with this email", "show-user", "--email", "nobody@example.com")
		if v := adminOK(t, dbURL, "list-projects"); relaytest.Canonical(v["projects"]) != relaytest.Canonical([]any{proj(p1), proj(p2), proj(p3)}) {
			t.Fatalf("list-projects: %v", v)
		}
		if v := adminOK(t, dbURL, "list-projects", "--email", "erin@example.com"); relaytest.Canonical(v["projects"]) != relaytest.Canonical([]any{proj(p2)}) {
			t.Fatalf("list-projects --email: %v", v)
		}
		adminFails(t, dbURL, 1, "no user with this email", "list-projects", "--email", "nobody@example.com")

		// Keys: masked, with a status.
		adminOK(t, dbURL, "rotate-key", "--project", pid, "--type", "public")
		keys := adminOK(t, dbURL, "list-keys", "--project", pid)
		kl, _ := keys["keys"].([]any)
		statuses := map[string]int{}
		for _, k := range kl {
			m := k.(map[string]any)
			if keysOf(m) != "createdAt,expiresAt,id,keyPrefix,keyType,lastUsedAt,revokedAt,status" || !strings.Contains(m["keyPrefix"].(string), "*") {
				t.Fatalf("list-keys row: %v", m)
			}
			statuses[m["keyType"].(string)+" "+m["status"].(string)]++
		}
		if len(kl) != 3 || statuses["public active"] != 1 || statuses["public revoked"] != 1 || statuses["secret active"] != 1 {
			t.Fatalf("list-keys: %v", keys)
		}
		if strings.Contains(relaytest.Canonical(keys), secretKey) {
			t.Fatal("list-keys shows a raw key")
		}
		adminFails(t, dbURL, 1, "project_not_found", "list-keys", "--project", "00000000-0000-0000-0000-000000000000")

		// project settings: shown, changed, refused as the API refuses.
		settings := func(args ...string) map[string]any {
			t.Helper()
			return adminOK(t, dbURL, append([]string{"project", "settings", "--project", pid}, args...)...)
		}
		expectSettings := func(got map[string]any, want string) {
			t.Helper()
			var w any
			json.Unmarshal([]byte(want), &w)
			if relaytest.Canonical(got) != relaytest.Canonical(w) {
				t.Fatalf("project settings printed %s, want %s", relaytest.Canonical(got), relaytest.Canonical(w))
			}
		}
		expectSettings(settings(), cpSettings(pid, nil, false, false, nil, false))
		expectSettings(settings("--webhook-url", " https://hooks.example.com/a ", "--webhook-presence-events", "on", "--channel-rate-limit", "30"),
			cpSettings(pid, "https://hooks.example.com/a", false, true, 30, false))
		expectSettings(settings("--webhook-channel-events", "on", "--webhook-presence-events", "off"), cpSettings(pid, "https://hooks.example.com/a", true, false, 30, false))
		adminFails(t, dbURL, 1, "invalid_webhook_url", "project", "settings", "--project", pid, "--webhook-url", "ftp://x", "--channel-rate-limit", "5")
		adminFails(t, dbURL, 1, "invalid_channel_rate_limit", "project", "settings", "--project", pid, "--channel-rate-limit", "0")
		adminFails(t, dbURL, 1, "invalid_history_retention", "project", "settings", "--project", pid, "--history-retention", "604801")
		expectSettings(settings("--history-retention", "86400"), cpSettings(pid, "https://hooks.example.com/a", true, false, 30, false, 86400))
		expectSettings(settings("--history-retention", "0"), cpSettings(pid, "https://hooks.example.com/a", true, false, 30, false))
		adminFails(t, dbURL, 1, "invalid_channel_rate_limit", "project", "settings", "--project", pid, "--channel-rate-limit", "1000000001")
		adminFails(t, dbURL, 1, "webhook_url_required", "project", "settings", "--project", pid, "--webhook-url", "", "--webhook-channel-events", "on")
		adminFails(t, dbURL, 1, "project_not_found", "project", "settings", "--project", "nope", "--channel-rate-limit", "5")
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--channel-rate-limit", "5"}, "--project is required"},
			{[]string{"--project", pid, "--webhook-channel-events", "yes"}, `--webhook-channel-events must be on or off, not "yes"`},
			{[]string{"--project", pid, "--webhook-presence-events", ""}, `--webhook-presence-events must be on or off, not ""`},
			{[]string{"--project", pid, "--channel-rate-limit", "1.5"}, `--channel-rate-limit must be a whole number or default, not "1.5"`},
			{[]string{"--project", pid, "--history-retention", "1h"}, `--history-retention must be a whole number of seconds, not "1h"`},
			{[]string{"--project", pid, "extra"}, "unexpected argument"},
		} {
			adminFails(t, dbURL, 2, tc.want, append([]string{"project", "settings"}, tc.args...)...)
		}
		expectSettings(settings(), cpSettings(pid, "https://hooks.example.com/a", true, false, 30, false))
		expectSettings(settings("--channel-rate-limit", "default"), cpSettings(pid, "https://hooks.example.com/a", true, false, nil, false))

		// show-project: the project, its owner, settings, authorization and
		// keys, without a secret.
		adminOK(t, dbURL, "project", "authorization", "--project", pid, "--on")
		show := adminOK(t, dbURL, "show-project", "--project", pid)
		if keysOf(show) != "authorization,keys,ownerEmail,project,settings" || relaytest.Canonical(show["project"]) != relaytest.Canonical(proj(p1)) ||
			show["ownerEmail"] != "dana@example.com" || relaytest.Canonical(show["keys"]) != relaytest.Canonical(adminOK(t, dbURL, "list-keys", "--project", pid)["keys"]) ||
			relaytest.Canonical(show["authorization"]) != `{"authorization":true,"jwksUrl":null,"secretSet":true}` {
			t.Fatalf("show-project: %v", show)
		}
		expectSettings(show["settings"].(map[string]any), cpSettings(pid, "https://hooks.example.com/a", true, false, nil, false))
		st, err := store.Open(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		stored, _ := st.Project(context.Background(), pid)
		stSettings, _ := st.Settings(context.Background(), pid)
		for _, secret := range []string{stored.AuthSecret, stSettings.WebhookSecret, secretKey} {
			if secret == "" || strings.Contains(relaytest.Canonical(show), secret) {
				t.Fatalf("show-project shows a secret (or none was set): %q", secret)
			}
		}
		adminFails(t, dbURL, 1, "project_not_found", "show-project", "--project", "00000000-0000-0000-0000-000000000000")
		adminFails(t, dbURL, 2, "--email is required", "show-user")
		adminFails(t, dbURL, 2, "--project is required", "show-project")
		adminFails(t, dbURL, 2, "--project is required", "list-keys")

		// --webhook-url "" removes the webhook, its secret and events.
		expectSettings(settings("--webhook-url", ""), cpSettings(pid, nil, false, false, nil, false))
		if s, _ := st.Settings(context.Background(), pid); s.WebhookSecret != "" {
			t.Fatalf("the signing secret stayed: %+v", s)
		}

		// A relay on the same store answers the same.
		settings("--channel-rate-limit", "44", "--webhook-url", "https://hooks.example.com/b")
		ts := startServer(t, dbURL, nil)
		c := ts.Client()
		c.Do("POST", "/api/auth/login", `{"email":"dana@example.com","password":"correct horse"}`).Expect(t, http.StatusOK, relaytest.JSON(dana))
		c.Do("GET", "/api/projects/"+pid+"/settings", "").Expect(t, http.StatusOK, cpSettings(pid, "https://hooks.example.com/b", false, false, 44, false))
	})
}

// TestAdminSettingsReachRunningNodes: settings changed with `relay admin
// project settings` (another process, writing the store only) reach the
// running project on every node on the same store within about a second:
// the key change the store records with them makes each node reload them.
func TestAdminSettingsReachRunningNodes(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		adminOK(t, dbURL, "create-user", "--email", "dana@example.com", "--password", "correct horse")
		p := adminOK(t, dbURL, "create-project", "--email", "dana@example.com", "--name", "demo")
		pid := p["project"].(map[string]any)["id"].(string)
		secret := p["keys"].(map[string]any)["secretKey"].(string)
		env := map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:0", "EMIT_RATE_LIMIT_PER_MINUTE": "600"}
		nodes := []*testServer{startServer(t, dbURL, env), startServer(t, dbURL, env)}
		// project is what a node's running project actor has loaded.
		type loaded struct {
			ChannelRateLimit int      `json:"channelRateLimit"`
			Webhook          bool     `json:"webhookConfigured"`
			WebhookEvents    []string `json:"webhookEvents"`
		}
		project := func(ts *testServer) (loaded, error) {
			status, body := relaytest.GetText(t, ts.Debug+"/debug/actors?project="+pid)
			var v struct {
				Projects []loaded `json:"projects"`
			}
			if err := json.Unmarshal([]byte(body), &v); err != nil || status != 200 || len(v.Projects) != 1 {
				return loaded{}, fmt.Errorf("/debug/actors?project: %d %s", status, body)
			}
			if v.Projects[0].WebhookEvents == nil {
				v.Projects[0].WebhookEvents = []string{}
			}
			return v.Projects[0], nil
		}
		for i, ts := range nodes {
			if r := ts.Client().Emit(secret, `{"channel":"c","payload":1}`); r.Status != http.StatusOK {
				t.Fatalf("node %d: emit: %d %s", i, r.Status, r.Raw)
			}
			if got, err := project(ts); err != nil || got.ChannelRateLimit != 600 || got.Webhook || len(got.WebhookEvents) != 0 {
				t.Fatalf("node %d before: %+v, %v", i, got, err)
			}
		}
		reached := func(want loaded) {
			t.Helper()
			done := time.Now()
			for i, ts := range nodes {
				relaytest.EventuallyNil(t, time.Until(done.Add(2*time.Second)), func() error {
					got, err := project(ts)
					if err != nil {
						return err
					}
					if relaytest.Canonical(got) != relaytest.Canonical(want) {
						return fmt.Errorf("node %d runs %+v 2 s after the command, want %+v", i, got, want)
					}
					return nil
				})
			}
		}
		adminOK(t, dbURL, "project", "settings", "--project", pid, "--channel-rate-limit", "3",
			"--webhook-url", "https://hooks.example.com/r", "--webhook-presence-events", "on")
		reached(loaded{ChannelRateLimit: 3, Webhook: true, WebhookEvents: []string{"presence"}})
		for i, ts := range nodes {
			r := ts.Client().Emit(secret, `{"channel":"fresh","payload":1}`)
			if rl, _ := r.JSON["rate_limit"].(map[string]any); r.Status != http.StatusOK || rl["limit"] != 3.0 {
				t.Fatalf("node %d: emit after the change: %d %s", i, r.Status, r.Raw)
			}
		}
		adminOK(t, dbURL, "project", "settings", "--project", pid, "--channel-rate-limit", "default", "--webhook-url", "")
		reached(loaded{ChannelRateLimit: 600, WebhookEvents: []string{}})
	})
}
