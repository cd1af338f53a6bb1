package main

// The dashboard in a real headless Chromium (chromedp), walked as a new user
// would: sign up, create a project, copy its keys (the copy buttons put them
// on the clipboard), read the code snippets, reload without creating a second
// project, follow the link to /demo, reveal the client-emit secret, rotate a key, set a webhook,
// set a channel budget that the emit endpoint then enforces, read the usage
// table and chart, log out; and what must not work: a form without its CSRF
// token, another user opening the project. A screenshot per step is saved
// under the test's temp dir (its path is logged).
//
// Chromium is Debian's package (/usr/bin/chromium, installed by .ci/run when
// absent). Its absence fails the test: it never skips.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

func TestDashboardBrowser(t *testing.T) {
	t.Parallel()
	start := time.Now()
	// A long rollup period: the usage rows this test writes stay exactly its own.
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"USAGE_ROLLUP_SECONDS": "3600"})
	b := relaytest.NewBrowser(t, ts.Base)
	emitter := ts.Client()
	ctx := context.Background()

	// 1. A new visitor lands on the login page and signs up.
	b.Open("/")
	if p := b.Path(); p != "/login" {
		t.Fatalf("logged-out visitor at %s, want /login", p)
	}
	b.Shot("login")
	b.Click(`a[href="/signup"]`)
	// (A too short password never leaves the browser: the field says
	// minlength=8. An address off the allowlist reaches the server.)
	b.Fill("#email", "mallory@example.com")
	b.Fill("#password", "correct horse battery")
	b.Click("#submit")
	b.ExpectPage(http.StatusForbidden, "#error", "not allowed to sign up")
	b.Shot("signup-error")
	b.Fill("#email", "alice@example.com")
	b.Fill("#password", "correct horse battery")
	b.Click("#submit")
	b.ExpectPage(http.StatusOK, "#notice", "Your account is ready")
	if who := b.Text("#who"); who != "alice@example.com" {
		t.Fatalf("signed in as %q", who)
	}
	b.Shot("signed-up")

	// 2. Create a project: the form redirects to the project page, which
	// shows both raw keys, once, with buttons that copy them.
	b.Click("#create")
	b.ExpectPage(http.StatusBadRequest, "#error", "Enter a project name")
	b.Fill("#name", "Browser demo")
	b.Click("#create")
	b.ExpectPage(http.StatusOK, "#notice", "Project created. Copy both keys now")
	projectID := b.Text("#project-id")
	publicKey, secretKey := b.Text("#raw-public-key"), b.Text("#raw-secret-key")
	if !relaytest.UUIDRe.MatchString(projectID) || !relaytest.PublicKeyRe.MatchString(publicKey) || !relaytest.SecretKeyRe.MatchString(secretKey) {
		t.Fatalf("created project: id %q keys %q %q", projectID, publicKey, secretKey)
	}
	projectPath := "/projects/" + projectID
	if p := b.Path(); p != projectPath+"?done=keys-shown" {
		t.Fatalf("after create the browser is at %s, want the project page", p)
	}
	b.GrantClipboard()
	b.Copies("#copy-raw-secret-key", secretKey)
	b.Copies("#copy-raw-public-key", publicKey)
	b.Copies("#copy-project-id", projectID)
	// The snippets carry this server's address, the project's keys and
	// channel; each has its copy button.
	for sel, want := range map[string][]string{
		"#snippet-browser": {`new Relay({ url: "` + ts.Base + `", publicKey: "` + publicKey + `" })`, `relay.subscribe("demo"`},
		"#snippet-curl":    {"curl -X POST '" + ts.Base + "/emit'", "'Authorization: Bearer " + secretKey + "'", `{"channel":"demo","payload":{"text":"hello"}}`},
		"#snippet-go":      {`"github.com/relayhq/relay/api/backend"`, `"` + ts.Base + `/emit"`, `"` + secretKey + `", "demo"`},
	} {
		got := relaytest.BrowserRun(b, chromedp.TextContent(chromedp.CSS(sel)))
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Fatalf("%s lacks %q:\n%s", sel, w, got)
			}
		}
	}
	curlSnippet := relaytest.BrowserRun(b, chromedp.TextContent(chromedp.CSS("#snippet-curl")))
	b.Copies("#copy-snippet-curl", curlSnippet)
	b.Shot("project-created")
	// Reload the page that showed the keys: they are gone (the snippets
	// have placeholders), and no second project was created.
	b.Load(chromedp.Reload())
	b.ExpectPage(http.StatusOK, "#notice", "shown only once")
	if b.Has("#new-keys") || b.Has("#raw-secret-key") || strings.Contains(b.Text("#snippet-curl"), secretKey) {
		t.Fatal("the reload shows the raw keys again")
	}
	if got := b.Text("#snippet-curl"); !strings.Contains(got, "Bearer <your secret key>") || !strings.Contains(b.Text("#key-hint"), secretKey[:12]+"…") {
		t.Fatalf("snippet after reload %q, hint %q", got, b.Text("#key-hint"))
	}
	b.Shot("project-reloaded")
	b.Open("/")
	if n := b.Count(`#projects a[href^="/projects/"]`); n != 1 {
		t.Fatalf("%d projects listed after the reload, want 1", n)
	}
	if ps, err := ts.app.store.ProjectsByOwner(ctx, mustUserID(t, ts, "alice@example.com")); err != nil || len(ps) != 1 {
		t.Fatalf("%d projects stored after the reload, want 1 (%v)", len(ps), err)
	}

	// The project page links to the demo.
	b.Open(projectPath)
	b.Click("#demo-link")
	b.ExpectPage(http.StatusOK, "h1", "Demo")
	if p := b.Path(); p != "/demo" || !b.Has("#client-emit #emit") {
		t.Fatalf("the demo link led to %s", p)
	}
	emit := func(secret, channel string) response {
		return emitter.Emit(secret, `{"channel":"`+channel+`","payload":{"n":1}}`)
	}
	if r := emit(secretKey, "hello"); r.Status != http.StatusOK {
		t.Fatalf("emit with the copied secret key: %d %s", r.Status, r.Raw)
	}
	b.Open(projectPath)
	if b.Has("#raw-secret-key") || b.Has("#new-keys") {
		t.Fatal("the raw keys are shown again on a later visit")
	}

	// The client-emit secret: generated, then masked until revealed.
	b.Open(projectPath)
	b.Click("#generate-client-emit")
	b.ExpectPage(http.StatusOK, "#notice", "Client-emit secret generated")
	cesStored, err := ts.app.store.Project(ctx, projectID)
	if err != nil || cesStored.ClientEmitSecret == "" {
		t.Fatalf("client-emit secret stored %q, %v", cesStored.ClientEmitSecret, err)
	}
	if b.Visible("#client-emit-secret") || b.Visible("#copy-client-emit-secret") || !b.Visible("#reveal-client-emit") {
		t.Fatal("the client-emit secret is shown before it is revealed")
	}
	b.Shot("client-emit-masked")
	relaytest.BrowserRun(b, chromedp.Click(chromedp.CSS("#reveal-client-emit"))) // opens the <details>: no page loads
	if !b.Visible("#client-emit-secret") || b.Text("#client-emit-secret") != cesStored.ClientEmitSecret {
		t.Fatalf("revealed client-emit secret %q, want %q", b.Text("#client-emit-secret"), cesStored.ClientEmitSecret)
	}
	b.Copies("#copy-client-emit-secret", cesStored.ClientEmitSecret)
	b.Shot("client-emit-revealed")

	// 3. Rotate the secret key: the new one is shown once, the old one fails.
	b.Click("#rotate-secret")
	b.ExpectPage(http.StatusOK, "#notice", "previous secret key is revoked")
	newSecret := b.Text("#raw-secret-key")
	if !relaytest.SecretKeyRe.MatchString(newSecret) || newSecret == secretKey || b.Has("#raw-public-key") {
		t.Fatalf("rotation showed %q", newSecret)
	}
	if n := b.Count("#keys-table tr.key.revoked"); n != 1 {
		t.Fatalf("%d revoked keys listed, want 1", n)
	}
	b.Shot("secret-rotated")
	emit(secretKey, "hello").Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
	if r := emit(newSecret, "hello"); r.Status != http.StatusOK {
		t.Fatalf("emit with the new secret key: %d %s", r.Status, r.Raw)
	}

	// 4. Webhook: a bad URL is refused with a message, a good one gets a secret.
	b.Open(projectPath)
	b.Fill("#webhook-url", "ftp://hooks.example.com/relay")
	b.Click("#save-webhook")
	b.ExpectPage(http.StatusBadRequest, "#error", "http:// or https://")
	b.Shot("webhook-error")
	b.Fill("#webhook-url", "https://hooks.example.com/relay")
	b.Click("#save-webhook")
	b.ExpectPage(http.StatusOK, "#notice", "Webhook URL saved")
	hookSecret := b.Text("#webhook-secret")
	b.Copies("#copy-webhook-secret", hookSecret)
	st, err := ts.app.store.Settings(ctx, projectID)
	if err != nil {
		t.Fatal(err)
	}
	if st.WebhookURL != "https://hooks.example.com/relay" || hookSecret == "" || st.WebhookSecret != hookSecret {
		t.Fatalf("webhook stored %+v, shown secret %q", st, hookSecret)
	}
	b.Shot("webhook-set")
	// The presence events only: the box stays ticked, the channel one not.
	relaytest.BrowserRun(b, chromedp.Click(chromedp.CSS("#webhook-presence-events"))) // ticks it: no page loads
	b.Click("#save-webhook-events")
	b.ExpectPage(http.StatusOK, "#notice", "Webhook events saved")
	if !b.Has("#webhook-presence-events:checked") || b.Has("#webhook-channel-events:checked") {
		t.Fatal("the event boxes do not show presence only after saving it")
	}
	b.Shot("webhook-events")
	if st, err = ts.app.store.Settings(ctx, projectID); err != nil || st.WebhookChannelEvents || !st.WebhookPresenceEvents {
		t.Fatalf("webhook events stored %+v, %v", st, err)
	}

	// 5. Channel budget override of 2: the third emit on a channel is refused.
	b.Fill("#budget-limit", "two")
	b.Click("#save-budget")
	b.ExpectPage(http.StatusBadRequest, "#error", "whole number")
	b.Fill("#budget-limit", "2")
	b.Click("#save-budget")
	b.ExpectPage(http.StatusOK, "#budget-current", "2")
	b.Shot("budget-set")
	// The project actor reloads its settings in the background: wait until
	// an emit reports the new budget, each probe on a channel of its own.
	probes := 0
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		r := emit(newSecret, fmt.Sprintf("probe-%d", probes))
		probes++
		if lim, _ := r.JSON["rate_limit"].(map[string]any); r.Status == http.StatusOK && relaytest.Num(lim, "limit") == 2 {
			return nil
		}
		return fmt.Errorf("the emit endpoint does not apply the budget of 2: %d %s", r.Status, r.Raw)
	})
	for i := 1; i <= 3; i++ {
		r := emit(newSecret, "budgeted")
		lim, _ := r.JSON["rate_limit"].(map[string]any)
		if i < 3 && (r.Status != http.StatusOK || relaytest.Num(lim, "limit") != 2) {
			t.Fatalf("emit %d under the budget: %d %s", i, r.Status, r.Raw)
		}
		if i == 3 && (r.Status != http.StatusTooManyRequests || r.Str("error") != "channel_rate_limited" || relaytest.Num(lim, "limit") != 2 || relaytest.Num(lim, "remaining") != 0) {
			t.Fatalf("third emit: %d %s, want 429 channel_rate_limited with rate_limit.limit 2", r.Status, r.Raw)
		}
	}

	// 6. CSRF: the rename form without its token is refused and renames nothing.
	b.Open(projectPath)
	relaytest.BrowserRun(b, chromedp.Evaluate[chromedp.Void](`document.querySelector("#rename-form input[name=csrf]").remove()`))
	b.Fill("#rename-name", "Hijacked")
	b.Click("#save-name")
	b.ExpectPage(http.StatusForbidden, "#error", "CSRF check failed")
	b.Shot("csrf-refused")
	if p, err := ts.app.store.Project(ctx, projectID); err != nil || p.Name != "Browser demo" {
		t.Fatalf("after a refused rename: %q %v", p.Name, err)
	}
	b.Open(projectPath)
	b.Fill("#rename-name", "Browser demo (renamed)")
	b.Click("#save-name")
	b.ExpectPage(http.StatusOK, "#project-name", "Browser demo (renamed)")

	// 7. Usage: rows of known counts (the rollup itself is tested elsewhere)
	// in the table and as one bar per day in each panel of the chart.
	today := time.Now().UTC()
	day := func(n int) string { return today.AddDate(0, 0, -n).Format(time.DateOnly) }
	rows := []store.Usage{
		{ProjectID: projectID, Day: day(6), ConnectionCount: 4, MessageCount: 120, PeakConcurrentConnections: 3},
		{ProjectID: projectID, Day: day(3), ConnectionCount: 9, MessageCount: 2048, PeakConcurrentConnections: 5},
		{ProjectID: projectID, Day: day(1), ConnectionCount: 1, MessageCount: 7, PeakConcurrentConnections: 1},
	}
	for _, u := range rows {
		if err := ts.app.store.AddUsage(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	b.Click("#usage-link")
	b.ExpectPage(http.StatusOK, "", "")
	table := relaytest.BrowserRun(b, chromedp.Evaluate[[][]string](`[...document.querySelectorAll("#usage-table tbody tr")].map(tr => [...tr.cells].map(td => td.textContent.trim()))`))
	want := [][]string{
		{day(1), "1", "7", "1", "0", "0", "0", "0", "0", "0", "–"},
		{day(3), "9", "2,048", "5", "0", "0", "0", "0", "0", "0", "–"},
		{day(6), "4", "120", "3", "0", "0", "0", "0", "0", "0", "–"},
	}
	if fmt.Sprint(table) != fmt.Sprint(want) {
		t.Fatalf("usage table %v, want %v", table, want)
	}
	for _, series := range []struct {
		class string
		want  []string
	}{
		{"bar-messages", []string{day(6) + "=120", day(3) + "=2048", day(1) + "=7"}},
		{"bar-connections", []string{day(6) + "=4", day(3) + "=9", day(1) + "=1"}},
	} {
		bars := relaytest.BrowserRun(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#usage-chart rect.`+series.class+`")].map(r => r.dataset.day + "=" + r.dataset.value)`))
		if fmt.Sprint(bars) != fmt.Sprint(series.want) {
			t.Fatalf("%s bars %v, want %v", series.class, bars, series.want)
		}
	}
	// The chart is drawn: the tallest bar of each panel has its full height.
	heights := relaytest.BrowserRun(b, chromedp.Evaluate[[]float64](`[...document.querySelectorAll("#usage-chart rect.bar")].map(r => r.getBoundingClientRect().height)`))
	if len(heights) != 6 || heights[1] < 0.8*120 || heights[4] < 0.8*120 {
		t.Fatalf("bar heights on screen %v", heights)
	}
	b.Shot("usage")

	// 8. Delete a second project, through the confirmation step.
	b.Open("/")
	b.Fill("#name", "Temporary")
	b.Click("#create")
	b.ExpectPage(http.StatusOK, "#raw-public-key", "pk_live_")
	tempID := b.Text("#project-id")
	b.Click("#delete-project")
	b.ExpectPage(http.StatusOK, "h1", "Delete project")
	b.Shot("delete-confirm")
	b.Click("#confirm")
	b.ExpectPage(http.StatusOK, "#notice", "Project deleted")
	if b.Has(`a[href="/projects/`+tempID+`"]`) || !b.Has(`a[href="`+projectPath+`"]`) {
		t.Fatal("project list after delete is wrong")
	}

	// 9. Log out: the pages send the browser back to the login page.
	b.Click("#logout")
	b.ExpectPage(http.StatusOK, "#notice", "You are logged out")
	b.Open(projectPath)
	if p := b.Path(); p != "/login" {
		t.Fatalf("after logout the project page is at %s, want /login", p)
	}
	b.Shot("logged-out")

	// 10. Another user cannot open the project.
	b.Click(`a[href="/signup"]`)
	b.Fill("#email", "bob@example.com")
	b.Fill("#password", "correct horse battery")
	b.Click("#submit")
	b.Open(projectPath)
	b.ExpectPage(http.StatusNotFound, "#error", "Project not found")
	b.Shot("other-user-404")
	b.Open(projectPath + "/usage")
	b.ExpectPage(http.StatusNotFound, "#error", "Project not found")

	t.Logf("browser walk took %v", time.Since(start).Round(time.Millisecond))
}
