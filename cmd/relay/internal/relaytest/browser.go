package relaytest

// A real headless Chromium (chromedp) for the browser-facing parts: the
// dashboard, /demo and the browser client. Chromium is Debian's package
// (/usr/bin/chromium, installed by .ci/run when absent). Its absence fails
// the test: it never skips.

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
)

const chromiumPath = "/usr/bin/chromium"

// screenshotsEnv names a directory that keeps the screenshots after the
// test, a directory per test in it (by default they go to the test's temp
// dir, removed at its end).
const screenshotsEnv = "RELAY_TEST_SCREENSHOTS"

// Browser is one headless Chromium tab pointed at a test server.
type Browser struct {
	T      *testing.T
	Ctx    context.Context // the tab; each step runs under its own timeout
	base   string
	shots  string // screenshot directory
	n      int    // screenshots taken
	status int64  // HTTP status of the last page loaded
}

// NewBrowser starts a headless Chromium, ended when t ends, with one tab
// pointed at the relay at base.
func NewBrowser(t *testing.T, base string) *Browser {
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

	b := &Browser{T: t, Ctx: ctx, base: base, shots: filepath.Join(t.TempDir(), "screenshots")}
	if dir := os.Getenv(screenshotsEnv); dir != "" {
		// Kept after the test, to look at; a directory per test, as
		// tests run in parallel.
		b.shots = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
	}
	if err := os.MkdirAll(b.shots, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshots: %s", b.shots)
	return b
}

// BrowserRun runs one action of the tab under a timeout.
func BrowserRun[T any](b *Browser, a chromedp.Action[T]) T {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 15*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.T.Fatalf("browser on %s: %v", b.LastPath(), err)
	}
	return v
}

// Load runs steps that make the tab load a page, waits for it and keeps its
// status.
func (b *Browser) Load(steps ...chromedp.Action[chromedp.Void]) {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 15*time.Second)
	defer cancel()
	res, err := chromedp.RunResponse(ctx, steps...)
	if err != nil {
		b.T.Fatalf("browser on %s: no page loaded: %v", b.LastPath(), err)
	}
	b.status = res.Status
}

// Open loads path.
func (b *Browser) Open(path string) { b.T.Helper(); b.Load(chromedp.Navigate(b.base + path)) }

// Click clicks sel (a link or a submit button) and waits for the next page.
func (b *Browser) Click(sel string) { b.T.Helper(); b.Load(chromedp.Click(chromedp.CSS(sel))) }

// Fill replaces the value of the input sel, typing the new one.
func (b *Browser) Fill(sel, value string) {
	b.T.Helper()
	BrowserRun(b, chromedp.Steps(
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).value = ""`, sel)),
		chromedp.SendKeys(chromedp.CSS(sel), value),
	))
}

// Text is the trimmed text of the first element sel matches.
func (b *Browser) Text(sel string) string {
	b.T.Helper()
	return strings.TrimSpace(BrowserRun(b, chromedp.Text(chromedp.CSS(sel))))
}

// Count is how many elements of the current page sel matches.
func (b *Browser) Count(sel string) int {
	b.T.Helper()
	return BrowserRun(b, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
}

// Has reports whether sel matches an element of the current page.
func (b *Browser) Has(sel string) bool { b.T.Helper(); return b.Count(sel) > 0 }

// Path is the current page's path on the relay.
func (b *Browser) Path() string {
	b.T.Helper()
	return strings.TrimPrefix(BrowserRun(b, chromedp.Location()), b.base)
}

// LastPath is Path for error messages: it never fails the test.
func (b *Browser) LastPath() string {
	ctx, cancel := context.WithTimeout(b.Ctx, 2*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	return strings.TrimPrefix(loc, b.base)
}

// ExpectPage checks the last page's status and, if sel is set, that the
// page shows sel with text containing want.
func (b *Browser) ExpectPage(status int, sel, want string) {
	b.T.Helper()
	if b.status != int64(status) {
		b.T.Fatalf("page %s answered %d, want %d", b.Path(), b.status, status)
	}
	if sel != "" {
		if got := b.Text(sel); !strings.Contains(got, want) {
			b.T.Fatalf("%s on %s says %q, want %q", sel, b.Path(), got, want)
		}
	}
}

// Visible reports whether sel is rendered (not hidden, not in a closed
// <details>, not display: none).
func (b *Browser) Visible(sel string) bool {
	b.T.Helper()
	return BrowserRun(b, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.checkVisibility(); })()`, sel)))
}

// GrantClipboard lets the pages of the test server write and read the
// clipboard, and has the tab behave as focused (the clipboard API needs
// both, and a headless tab has no focus of its own).
func (b *Browser) GrantClipboard() {
	b.T.Helper()
	for _, name := range []string{"clipboard-read", "clipboard-write"} {
		p := cdpbrowser.SetPermissionParams{Permission: &cdpbrowser.PermissionDescriptor{Name: name, AllowWithoutSanitization: true},
			Setting: cdpbrowser.PermissionSettingGranted, Origin: b.base}
		if _, err := chromedp.CallBrowser(b.Ctx, cdpbrowser.SetPermission, p); err != nil {
			b.T.Fatalf("grant %s: %v", name, err)
		}
	}
	if _, err := chromedp.Call(b.Ctx, emulation.SetFocusEmulationEnabled, emulation.SetFocusEmulationEnabledParams{Enabled: true}); err != nil {
		b.T.Fatalf("focus emulation: %v", err)
	}
}

// Copies clicks the copy button sel and checks that it says "Copied" and put
// want on the clipboard.
func (b *Browser) Copies(sel, want string) {
	b.T.Helper()
	if !b.Visible(sel) {
		b.T.Fatalf("copy button %s is not shown on %s", sel, b.Path())
	}
	BrowserRun(b, chromedp.Evaluate[chromedp.Void](`navigator.clipboard.writeText("(nothing copied yet)")`, chromedp.EvalAwaitPromise))
	BrowserRun(b, chromedp.Click(chromedp.CSS(sel)))
	BrowserRun(b, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector(%q).textContent === "Copied"`, sel), chromedp.WithPollingTimeout(5*time.Second)))
	if got := BrowserRun(b, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise)); got != want {
		b.T.Fatalf("%s copied %q, want %q", sel, got, want)
	}
}

// SignUpWithProject signs up as email, creates a project called name and
// returns its page's path, on the one view that shows its raw keys.
func (b *Browser) SignUpWithProject(email, name string) (projectPath string) {
	b.T.Helper()
	b.Open("/signup")
	b.Fill("#email", email)
	b.Fill("#password", "correct horse battery")
	b.Click("#submit")
	b.Fill("#name", name)
	b.Click("#create")
	b.ExpectPage(http.StatusOK, "#notice", "shown only once")
	return "/projects/" + b.Text("#project-id")
}

// Shot saves a full-page screenshot named after the step.
func (b *Browser) Shot(step string) {
	b.T.Helper()
	png := BrowserRun(b, chromedp.FullScreenshot(100))
	b.n++
	name := filepath.Join(b.shots, fmt.Sprintf("%02d-%s.png", b.n, step))
	if err := os.WriteFile(name, png, 0o644); err != nil {
		b.T.Fatal(err)
	}
}

// Tab is one tab running the client, logging what it sees into window.log.
type Tab struct {
	B   *Browser
	Ctx context.Context
}

// NewTab opens another tab of the browser, closed when t ends.
func (b *Browser) NewTab(t *testing.T) *Tab {
	ctx, cancel := chromedp.NewContext(b.Ctx)
	t.Cleanup(cancel)
	// The first Run opens the tab, and cancelling its context would close
	// it: run it without a timeout.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`1`)); err != nil {
		t.Fatalf("open tab: %v", err)
	}
	return &Tab{B: b, Ctx: ctx}
}

// Run runs one action in the tab, within 15 s.
func (p *Tab) Run(action chromedp.Action[chromedp.Void]) {
	p.B.T.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, 15*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, action); err != nil {
		p.B.T.Fatalf("tab: %v", err)
	}
}

// Start loads base/demo (same origin, the service's CSP) and starts a client
// subscribed to channel with presence as clientID.
func (p *Tab) Start(base, publicKey, channel, clientID string, options string) {
	p.B.T.Helper()
	p.Run(chromedp.Navigate(base + "/demo"))
	p.Run(chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`
		window.log = [];
		import("/client.js").then(({ Relay }) => {
			window.relay = new Relay({ url: location.origin, publicKey: %q, ...%s });
			relay.on("state", (s) => log.push("state:" + s));
			relay.on("error", (e) => log.push("error:" + e.code));
			relay.subscribe(%q, {
				presence: true, clientId: %q,
				onMessage: (m) => log.push("msg:" + m.seq + ":" + JSON.stringify(m.payload) + (m.replay ? ":replay" : "") +
					(m.clientId ? ":from:" + m.clientId + ":" + m.type : "")),
				onPresence: (e) => log.push("presence:" + e.event + ":" + e.members.join(",")),
				onGap: (g) => log.push("gap:" + g.since),
			});
		});`, publicKey, options, channel, clientID)))
}

// Eval runs js in the page.
func (p *Tab) Eval(js string) {
	p.B.T.Helper()
	p.Run(chromedp.Evaluate[chromedp.Void](js))
}

// Check evaluates a boolean expression in the page.
func (p *Tab) Check(js string) bool {
	p.B.T.Helper()
	ctx, cancel := context.WithTimeout(p.Ctx, 5*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
	if err != nil {
		p.B.T.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// WaitForPrefix waits for a log line starting with prefix after position
// from, and returns the position after it.
func (p *Tab) WaitForPrefix(from int, prefix string) int {
	p.B.T.Helper()
	after := 0
	EventuallyNil(p.B.T, 15*time.Second, func() error {
		log := p.Log()
		for i := from; i < len(log); i++ {
			if strings.HasPrefix(log[i], prefix) {
				after = i + 1
				return nil
			}
		}
		return fmt.Errorf("waiting for %q… after %d; log: %q", prefix, from, log)
	})
	return after
}

// Count is how many log lines from position from on start with prefix.
func (p *Tab) Count(from int, prefix string) int {
	n := 0
	for _, l := range p.Log()[from:] {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// Log is what the page's client has logged so far (window.log).
func (p *Tab) Log() []string {
	ctx, cancel := context.WithTimeout(p.Ctx, 5*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.log || []`))
	if err != nil {
		p.B.T.Fatalf("read log: %v", err)
	}
	return v
}

// WaitFor waits until the log holds want (in order, not necessarily adjacent)
// after position from, and returns the position after the last match.
func (p *Tab) WaitFor(from int, want ...string) int {
	p.B.T.Helper()
	after := 0
	EventuallyNil(p.B.T, 15*time.Second, func() error {
		log := p.Log()
		i, pos := 0, from
		for ; pos < len(log) && i < len(want); pos++ {
			if log[pos] == want[i] {
				i++
			}
		}
		if i == len(want) {
			after = pos
			return nil
		}
		return fmt.Errorf("waiting for %q after %d; log: %q", want, from, log)
	})
	return after
}
