package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestDashboardBrowserKeyOverlap: in Chromium, rotating the secret key with
// "valid 5 more minutes" chosen shows the old key "valid until …" (both keys
// emit meanwhile), the keys' last use appears once a minute of the server's
// clock has passed, and after the window the old key shows "expired …" and
// is refused.
func TestDashboardBrowserKeyOverlap(t *testing.T) {
	t.Parallel()
	clock := newClock()
	ts := startServerAt(t, storetest.SQLiteURL(t), nil, clock.Now)
	b := relaytest.NewBrowser(t, ts.Base)
	emitter := ts.Client()
	emit := func(secret string) response { return emitter.Emit(secret, `{"channel":"c","payload":1}`) }

	projectPath := b.SignUpWithProject("alice@example.com", "Overlap")
	oldSecret := b.Text("#raw-secret-key")
	if r := emit(oldSecret); r.Status != http.StatusOK {
		t.Fatalf("emit: %d %s", r.Status, r.Raw)
	}
	used := clock.Now()
	b.Open(projectPath)
	if n := b.Count("#keys-table td.last-used"); n != 2 || b.Text("#keys-table tr.key td.last-used") != "never" {
		t.Fatalf("%d last-used cells, first %q; want 2, never (nothing written yet)", n, b.Text("#keys-table tr.key td.last-used"))
	}

	// Rotate with a 5-minute overlap chosen in the select.
	end := clock.Now().Add(5 * time.Minute).UTC().Format("2006-01-02 15:04:05 UTC")
	relaytest.BrowserRun(b, chromedp.Evaluate[chromedp.Void](`document.querySelector("#rotate-secret-overlap").value = "300"`))
	if got := relaytest.BrowserRun(b, chromedp.Evaluate[string](`document.querySelector("#rotate-secret-overlap").selectedOptions[0].textContent`)); got != "valid 5 more minutes" {
		t.Fatalf("chosen overlap %q", got)
	}
	b.Click("#rotate-secret")
	b.ExpectPage(http.StatusOK, "#notice", "previous secret key stays valid until "+end)
	newSecret := b.Text("#raw-secret-key")
	if n := b.Count("#keys-table tr.key.overlap"); n != 1 {
		t.Fatalf("%d keys in their overlap window, want 1", n)
	}
	if got := b.Text("#keys-table tr.key.overlap .badge"); got != "valid until "+end {
		t.Fatalf("overlap badge %q, want valid until %s", got, end)
	}
	b.Shot("secret-rotated-with-overlap")
	for _, k := range []string{oldSecret, newSecret} {
		if r := emit(k); r.Status != http.StatusOK {
			t.Fatalf("emit in the window: %d %s", r.Status, r.Raw)
		}
	}

	// A minute of the clock later the uses are written: the old key's row
	// shows the time of its last use.
	clock.Advance(time.Minute)
	want := used.UTC().Format("2006-01-02 15:04 UTC")
	relaytest.EventuallyNil(t, 5*time.Second, func() error {
		b.Open(projectPath)
		if got := b.Text("#keys-table tr.key.overlap td.last-used"); got != want {
			return fmt.Errorf("last used of the old secret key %q, want %q", got, want)
		}
		return nil
	})
	b.Shot("last-used")

	// After the window: expired, refused.
	clock.Advance(4 * time.Minute)
	emit(oldSecret).Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
	b.Open(projectPath)
	if b.Has("#keys-table tr.key.overlap") || b.Count("#keys-table tr.key.revoked") != 1 {
		t.Fatalf("after the window: %d overlap rows, %d revoked rows", b.Count("#keys-table tr.key.overlap"), b.Count("#keys-table tr.key.revoked"))
	}
	if got := b.Text("#keys-table tr.key.revoked .badge"); got != "expired "+end {
		t.Fatalf("expired badge %q, want expired %s", got, end)
	}
	b.Shot("old-key-expired")
}
