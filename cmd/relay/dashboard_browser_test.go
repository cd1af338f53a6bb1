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
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

const chromiumPath = "/usr/bin/chromium"

// screenshotsEnv names a directory that keeps the screenshots after the test
// (by default they go to the test's temp dir, removed at its end).
const screenshotsEnv = "RELAY_TEST_SCREENSHOTS"

// browser is one headless Chromium tab pointed at a test server.
type browser struct {
	t      *testing.T
	ctx    context.Context // the tab; each step runs under its own timeout
	base   string
	shots  string // screenshot directory
	n      int    // screenshots taken
	status int64  // HTTP status of the last page loaded
}

func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("Chromium is required for the dashboard browser tests and is not at %s (%v): "+
			"install Debian's package with `apt-get install -y chromium` (.ci/run does this when it is absent)", chromiumPath, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1200, 900),
	)
	// Chromium has been seen to exit as it starts, once, with nothing in its
	// output but the usual dbus complaints: a start that fails is tried
	// again with a fresh profile, twice at most. What the tests check starts
	// once it runs.
	var ctx context.Context
	for attempt := 1; ctx == nil; attempt++ {
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
			append(opts, chromedp.UserDataDir(filepath.Join(t.TempDir(), "chromium-profile")))...)
		tab, cancelTab := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
		// The first Do starts the browser; it must not run under a
		// timeout, which would end the browser with it.
		started := make(chan error, 1)
		go func() { started <- chromedp.Do(tab) }()
		select {
		case err := <-started:
			if err == nil {
				ctx = tab
				t.Cleanup(func() { cancelTab(); cancelAlloc() })
				continue
			}
			cancelTab()
			cancelAlloc()
			if attempt == 3 {
				t.Fatalf("start Chromium (%d attempts): %v", attempt, err)
			}
			t.Logf("Chromium exited as it started (attempt %d); starting it again: %v", attempt, err)
		case <-time.After(30 * time.Second):
			cancelTab()
			cancelAlloc()
			t.Fatal("Chromium did not start within 30s")
		}
	}

	b := &browser{t: t, ctx: ctx, base: base, shots: filepath.Join(t.TempDir(), "screenshots")}
	if dir := os.Getenv(screenshotsEnv); dir != "" {
		b.shots = dir // kept after the test, to look at
	}
	if err := os.MkdirAll(b.shots, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshots: %s", b.shots)
	return b
}

// browserRun runs one action of the tab under a timeout.
func browserRun[T any](b *browser, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("browser on %s: %v", b.lastPath(), err)
	}
	return v
}

// load runs steps that make the tab load a page, waits for it and keeps its
// status.
func (b *browser) load(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	res, err := chromedp.RunResponse(ctx, steps...)
	if err != nil {
		b.t.Fatalf("browser on %s: no page loaded: %v", b.lastPath(), err)
	}
	b.status = res.Status
}

// open loads path.
func (b *browser) open(path string) { b.t.Helper(); b.load(chromedp.Navigate(b.base + path)) }

// click clicks sel (a link or a submit button) and waits for the next page.
func (b *browser) click(sel string) { b.t.Helper(); b.load(chromedp.Click(chromedp.CSS(sel))) }

// fill replaces the value of the input sel, typing the new one.
func (b *browser) fill(sel, value string) {
	b.t.Helper()
	browserRun(b, chromedp.Steps(
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).value = ""`, sel)),
		chromedp.SendKeys(chromedp.CSS(sel), value),
	))
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	return strings.TrimSpace(browserRun(b, chromedp.Text(chromedp.CSS(sel))))
}

func (b *browser) count(sel string) int {
	b.t.Helper()
	return browserRun(b, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
}

// has reports whether sel matches an element of the current page.
func (b *browser) has(sel string) bool { b.t.Helper(); return b.count(sel) > 0 }

func (b *browser) path() string {
	b.t.Helper()
	return strings.TrimPrefix(browserRun(b, chromedp.Location()), b.base)
}

// lastPath is path() for error messages: it never fails the test.
func (b *browser) lastPath() string {
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	return strings.TrimPrefix(loc, b.base)
}

// expectPage checks the last page's status and, if sel is set, that the
// page shows sel with text containing want.
func (b *browser) expectPage(status int, sel, want string) {
	b.t.Helper()
	if b.status != int64(status) {
		b.t.Fatalf("page %s answered %d, want %d", b.path(), b.status, status)
	}
	if sel != "" {
		if got := b.text(sel); !strings.Contains(got, want) {
			b.t.Fatalf("%s on %s says %q, want %q", sel, b.path(), got, want)
		}
	}
}

// visible reports whether sel is rendered (not hidden, not in a closed
// <details>, not display: none).
func (b *browser) visible(sel string) bool {
	b.t.Helper()
	return browserRun(b, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.checkVisibility(); })()`, sel)))
}

// grantClipboard lets the pages of the test server write and read the
// clipboard, and has the tab behave as focused (the clipboard API needs
// both, and a headless tab has no focus of its own).
func (b *browser) grantClipboard() {
	b.t.Helper()
	for _, name := range []string{"clipboard-read", "clipboard-write"} {
		p := cdpbrowser.SetPermissionParams{Permission: &cdpbrowser.PermissionDescriptor{Name: name, AllowWithoutSanitization: true},
			Setting: cdpbrowser.PermissionSettingGranted, Origin: b.base}
		if _, err := chromedp.CallBrowser(b.ctx, cdpbrowser.SetPermission, p); err != nil {
			b.t.Fatalf("grant %s: %v", name, err)
		}
	}
	if _, err := chromedp.Call(b.ctx, emulation.SetFocusEmulationEnabled, emulation.SetFocusEmulationEnabledParams{Enabled: true}); err != nil {
		b.t.Fatalf("focus emulation: %v", err)
	}
}

// copies clicks the copy button sel and checks that it says "Copied" and put
// want on the clipboard.
func (b *browser) copies(sel, want string) {
	b.t.Helper()
	if !b.visible(sel) {
		b.t.Fatalf("copy button %s is not shown on %s", sel, b.path())
	}
	browserRun(b, chromedp.Evaluate[chromedp.Void](`navigator.clipboard.writeText("(nothing copied yet)")`, chromedp.EvalAwaitPromise))
	browserRun(b, chromedp.Click(chromedp.CSS(sel)))
	browserRun(b, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector(%q).textContent === "Copied"`, sel), chromedp.WithPollingTimeout(5*time.Second)))
	if got := browserRun(b, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise)); got != want {
		b.t.Fatalf("%s copied %q, want %q", sel, got, want)
	}
}

// signUpWithProject signs up as email, creates a project called name and
// returns its page's path, on the one view that shows its raw keys.
func (b *browser) signUpWithProject(email, name string) (projectPath string) {
	b.t.Helper()
	b.open("/signup")
	b.fill("#email", email)
	b.fill("#password", "correct horse battery")
	b.click("#submit")
	b.fill("#name", name)
	b.click("#create")
	b.expectPage(http.StatusOK, "#notice", "shown only once")
	return "/projects/" + b.text("#project-id")
}

// shot saves a full-page screenshot named after the step.
func (b *browser) shot(step string) {
	b.t.Helper()
	png := browserRun(b, chromedp.FullScreenshot(100))
	b.n++
	name := filepath.Join(b.shots, fmt.Sprintf("%02d-%s.png", b.n, step))
	if err := os.WriteFile(name, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func TestDashboardBrowser(t *testing.T) {
	start := time.Now()
	// A long rollup period: the usage rows this test writes stay exactly its own.
	ts := startServer(t, storetest.SQLiteURL(t), map[string]string{"USAGE_ROLLUP_SECONDS": "3600"})
	b := newBrowser(t, ts.Base)
	emitter := ts.Client()
	ctx := context.Background()

	// 1. A new visitor lands on the login page and signs up.
	b.open("/")
	if p := b.path(); p != "/login" {
		t.Fatalf("logged-out visitor at %s, want /login", p)
	}
	b.shot("login")
	b.click(`a[href="/signup"]`)
	// (A too short password never leaves the browser: the field says
	// minlength=8. An address off the allowlist reaches the server.)
	b.fill("#email", "mallory@example.com")
	b.fill("#password", "correct horse battery")
	b.click("#submit")
	b.expectPage(http.StatusForbidden, "#error", "not allowed to sign up")
	b.shot("signup-error")
	b.fill("#email", "alice@example.com")
	b.fill("#password", "correct horse battery")
	b.click("#submit")
	b.expectPage(http.StatusOK, "#notice", "Your account is ready")
	if who := b.text("#who"); who != "alice@example.com" {
		t.Fatalf("signed in as %q", who)
	}
	b.shot("signed-up")

	// 2. Create a project: the form redirects to the project page, which
	// shows both raw keys, once, with buttons that copy them.
	b.click("#create")
	b.expectPage(http.StatusBadRequest, "#error", "Enter a project name")
	b.fill("#name", "Browser demo")
	b.click("#create")
	b.expectPage(http.StatusOK, "#notice", "Project created. Copy both keys now")
	projectID := b.text("#project-id")
	publicKey, secretKey := b.text("#raw-public-key"), b.text("#raw-secret-key")
	if !relaytest.UUIDRe.MatchString(projectID) || !relaytest.PublicKeyRe.MatchString(publicKey) || !relaytest.SecretKeyRe.MatchString(secretKey) {
		t.Fatalf("created project: id %q keys %q %q", projectID, publicKey, secretKey)
	}
	projectPath := "/projects/" + projectID
	if p := b.path(); p != projectPath+"?done=keys-shown" {
		t.Fatalf("after create the browser is at %s, want the project page", p)
	}
	b.grantClipboard()
	b.copies("#copy-raw-secret-key", secretKey)
	b.copies("#copy-raw-public-key", publicKey)
	b.copies("#copy-project-id", projectID)
	// The snippets carry this server's address, the project's keys and
	// channel; each has its copy button.
	for sel, want := range map[string][]string{
		"#snippet-browser": {`new Relay({ url: "` + ts.Base + `", publicKey: "` + publicKey + `" })`, `relay.subscribe("demo"`},
		"#snippet-curl":    {"curl -X POST '" + ts.Base + "/emit'", "'Authorization: Bearer " + secretKey + "'", `{"channel":"demo","payload":{"text":"hello"}}`},
		"#snippet-go":      {`"github.com/relayhq/relay/api/backend"`, `"` + ts.Base + `/emit"`, `"` + secretKey + `", "demo"`},
	} {
		got := browserRun(b, chromedp.TextContent(chromedp.CSS(sel)))
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Fatalf("%s lacks %q:\n%s", sel, w, got)
			}
		}
	}
	curlSnippet := browserRun(b, chromedp.TextContent(chromedp.CSS("#snippet-curl")))
	b.copies("#copy-snippet-curl", curlSnippet)
	b.shot("project-created")
	// Reload the page that showed the keys: they are gone (the snippets
	// have placeholders), and no second project was created.
	b.load(chromedp.Reload())
	b.expectPage(http.StatusOK, "#notice", "shown only once")
	if b.has("#new-keys") || b.has("#raw-secret-key") || strings.Contains(b.text("#snippet-curl"), secretKey) {
		t.Fatal("the reload shows the raw keys again")
	}
	if got := b.text("#snippet-curl"); !strings.Contains(got, "Bearer <your secret key>") || !strings.Contains(b.text("#key-hint"), secretKey[:12]+"…") {
		t.Fatalf("snippet after reload %q, hint %q", got, b.text("#key-hint"))
	}
	b.shot("project-reloaded")
	b.open("/")
	if n := b.count(`#projects a[href^="/projects/"]`); n != 1 {
		t.Fatalf("%d projects listed after the reload, want 1", n)
	}
	if ps, err := ts.app.store.ProjectsByOwner(ctx, mustUserID(t, ts, "alice@example.com")); err != nil || len(ps) != 1 {
		t.Fatalf("%d projects stored after the reload, want 1 (%v)", len(ps), err)
	}

	// The project page links to the demo.
	b.open(projectPath)
	b.click("#demo-link")
	b.expectPage(http.StatusOK, "h1", "Demo")
	if p := b.path(); p != "/demo" || !b.has("#client-emit #emit") {
		t.Fatalf("the demo link led to %s", p)
	}
	emit := func(secret, channel string) response {
		return emitter.Emit(secret, `{"channel":"`+channel+`","payload":{"n":1}}`)
	}
	if r := emit(secretKey, "hello"); r.Status != http.StatusOK {
		t.Fatalf("emit with the copied secret key: %d %s", r.Status, r.Raw)
	}
	b.open(projectPath)
	if b.has("#raw-secret-key") || b.has("#new-keys") {
		t.Fatal("the raw keys are shown again on a later visit")
	}

	// The client-emit secret: generated, then masked until revealed.
	b.open(projectPath)
	b.click("#generate-client-emit")
	b.expectPage(http.StatusOK, "#notice", "Client-emit secret generated")
	cesStored, err := ts.app.store.Project(ctx, projectID)
	if err != nil || cesStored.ClientEmitSecret == "" {
		t.Fatalf("client-emit secret stored %q, %v", cesStored.ClientEmitSecret, err)
	}
	if b.visible("#client-emit-secret") || b.visible("#copy-client-emit-secret") || !b.visible("#reveal-client-emit") {
		t.Fatal("the client-emit secret is shown before it is revealed")
	}
	b.shot("client-emit-masked")
	browserRun(b, chromedp.Click(chromedp.CSS("#reveal-client-emit"))) // opens the <details>: no page loads
	if !b.visible("#client-emit-secret") || b.text("#client-emit-secret") != cesStored.ClientEmitSecret {
		t.Fatalf("revealed client-emit secret %q, want %q", b.text("#client-emit-secret"), cesStored.ClientEmitSecret)
	}
	b.copies("#copy-client-emit-secret", cesStored.ClientEmitSecret)
	b.shot("client-emit-revealed")

	// 3. Rotate the secret key: the new one is shown once, the old one fails.
	b.click("#rotate-secret")
	b.expectPage(http.StatusOK, "#notice", "previous secret key is revoked")
	newSecret := b.text("#raw-secret-key")
	if !relaytest.SecretKeyRe.MatchString(newSecret) || newSecret == secretKey || b.has("#raw-public-key") {
		t.Fatalf("rotation showed %q", newSecret)
	}
	if n := b.count("#keys-table tr.key.revoked"); n != 1 {
		t.Fatalf("%d revoked keys listed, want 1", n)
	}
	b.shot("secret-rotated")
	emit(secretKey, "hello").Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
	if r := emit(newSecret, "hello"); r.Status != http.StatusOK {
		t.Fatalf("emit with the new secret key: %d %s", r.Status, r.Raw)
	}

	// 4. Webhook: a bad URL is refused with a message, a good one gets a secret.
	b.open(projectPath)
	b.fill("#webhook-url", "ftp://hooks.example.com/relay")
	b.click("#save-webhook")
	b.expectPage(http.StatusBadRequest, "#error", "http:// or https://")
	b.shot("webhook-error")
	b.fill("#webhook-url", "https://hooks.example.com/relay")
	b.click("#save-webhook")
	b.expectPage(http.StatusOK, "#notice", "Webhook URL saved")
	hookSecret := b.text("#webhook-secret")
	b.copies("#copy-webhook-secret", hookSecret)
	st, err := ts.app.store.Settings(ctx, projectID)
	if err != nil {
		t.Fatal(err)
	}
	if st.WebhookURL != "https://hooks.example.com/relay" || hookSecret == "" || st.WebhookSecret != hookSecret {
		t.Fatalf("webhook stored %+v, shown secret %q", st, hookSecret)
	}
	b.shot("webhook-set")
	// The presence events only: the box stays ticked, the channel one not.
	browserRun(b, chromedp.Click(chromedp.CSS("#webhook-presence-events"))) // ticks it: no page loads
	b.click("#save-webhook-events")
	b.expectPage(http.StatusOK, "#notice", "Webhook events saved")
	if !b.has("#webhook-presence-events:checked") || b.has("#webhook-channel-events:checked") {
		t.Fatal("the event boxes do not show presence only after saving it")
	}
	b.shot("webhook-events")
	if st, err = ts.app.store.Settings(ctx, projectID); err != nil || st.WebhookChannelEvents || !st.WebhookPresenceEvents {
		t.Fatalf("webhook events stored %+v, %v", st, err)
	}

	// 5. Channel budget override of 2: the third emit on a channel is refused.
	b.fill("#budget-limit", "two")
	b.click("#save-budget")
	b.expectPage(http.StatusBadRequest, "#error", "whole number")
	b.fill("#budget-limit", "2")
	b.click("#save-budget")
	b.expectPage(http.StatusOK, "#budget-current", "2")
	b.shot("budget-set")
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
	b.open(projectPath)
	browserRun(b, chromedp.Evaluate[chromedp.Void](`document.querySelector("#rename-form input[name=csrf]").remove()`))
	b.fill("#rename-name", "Hijacked")
	b.click("#save-name")
	b.expectPage(http.StatusForbidden, "#error", "CSRF check failed")
	b.shot("csrf-refused")
	if p, err := ts.app.store.Project(ctx, projectID); err != nil || p.Name != "Browser demo" {
		t.Fatalf("after a refused rename: %q %v", p.Name, err)
	}
	b.open(projectPath)
	b.fill("#rename-name", "Browser demo (renamed)")
	b.click("#save-name")
	b.expectPage(http.StatusOK, "#project-name", "Browser demo (renamed)")

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
	b.click("#usage-link")
	b.expectPage(http.StatusOK, "", "")
	table := browserRun(b, chromedp.Evaluate[[][]string](`[...document.querySelectorAll("#usage-table tbody tr")].map(tr => [...tr.cells].map(td => td.textContent.trim()))`))
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
		bars := browserRun(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#usage-chart rect.`+series.class+`")].map(r => r.dataset.day + "=" + r.dataset.value)`))
		if fmt.Sprint(bars) != fmt.Sprint(series.want) {
			t.Fatalf("%s bars %v, want %v", series.class, bars, series.want)
		}
	}
	// The chart is drawn: the tallest bar of each panel has its full height.
	heights := browserRun(b, chromedp.Evaluate[[]float64](`[...document.querySelectorAll("#usage-chart rect.bar")].map(r => r.getBoundingClientRect().height)`))
	if len(heights) != 6 || heights[1] < 0.8*120 || heights[4] < 0.8*120 {
		t.Fatalf("bar heights on screen %v", heights)
	}
	b.shot("usage")

	// 8. Delete a second project, through the confirmation step.
	b.open("/")
	b.fill("#name", "Temporary")
	b.click("#create")
	b.expectPage(http.StatusOK, "#raw-public-key", "pk_live_")
	tempID := b.text("#project-id")
	b.click("#delete-project")
	b.expectPage(http.StatusOK, "h1", "Delete project")
	b.shot("delete-confirm")
	b.click("#confirm")
	b.expectPage(http.StatusOK, "#notice", "Project deleted")
	if b.has(`a[href="/projects/`+tempID+`"]`) || !b.has(`a[href="`+projectPath+`"]`) {
		t.Fatal("project list after delete is wrong")
	}

	// 9. Log out: the pages send the browser back to the login page.
	b.click("#logout")
	b.expectPage(http.StatusOK, "#notice", "You are logged out")
	b.open(projectPath)
	if p := b.path(); p != "/login" {
		t.Fatalf("after logout the project page is at %s, want /login", p)
	}
	b.shot("logged-out")

	// 10. Another user cannot open the project.
	b.click(`a[href="/signup"]`)
	b.fill("#email", "bob@example.com")
	b.fill("#password", "correct horse battery")
	b.click("#submit")
	b.open(projectPath)
	b.expectPage(http.StatusNotFound, "#error", "Project not found")
	b.shot("other-user-404")
	b.open(projectPath + "/usage")
	b.expectPage(http.StatusNotFound, "#error", "Project not found")

	t.Logf("browser walk took %v", time.Since(start).Round(time.Millisecond))
}
