package browser

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestDashboardBrowserHealth: in Chromium, the project page's delivery-health
// card shows the figures of the page load, then, with no reload, the
// subscribers and emits made after it (the card reads the owner's JSON
// route every 5 seconds).
func TestDashboardBrowserHealth(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	b := relaytest.NewBrowser(t, ts.Base)
	projectPath := b.SignUpWithProject("alice@example.com", "Health")
	publicKey, secretKey := b.Text("#raw-public-key"), b.Text("#raw-secret-key")

	b.Open(projectPath)
	for id, want := range map[string]string{"#health-connections": "0", "#health-minute-emits": "0", "#health-hour-deliveries": "0", "#health-minute-p99": "–"} {
		if got := b.Text(id); got != want {
			t.Fatalf("%s = %q on a fresh project, want %q", id, got, want)
		}
	}

	// After the page loaded: two subscribers, three emits they read.
	subs := []*relaytest.WS{ts.Subscribed(t, publicKey, "room"), ts.Subscribed(t, publicKey, "room")}
	emitter := ts.Client()
	for i := range 3 {
		r := emitter.Emit(secretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, i))
		if r.Status != http.StatusOK {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
		for _, s := range subs {
			s.Expect(fmt.Sprintf(`{"channel":"room","payload":%d,"seq":%d}`, i, int64(relaytest.Num(r.JSON, "seq"))))
		}
	}
	want := map[string]string{
		"#health-connections": "2", "#health-minute-emits": "3", "#health-hour-emits": "3",
		"#health-minute-deliveries": "6", "#health-hour-deliveries": "6", "#health-minute-dropped": "0",
	}
	relaytest.EventuallyNil(t, 15*time.Second, func() error {
		got := map[string]string{}
		same := true
		for id, w := range want {
			got[id] = b.Text(id)
			same = same && got[id] == w
		}
		if p99 := b.Text("#health-minute-p99"); !same || !strings.HasSuffix(p99, " ms") {
			return fmt.Errorf("health card without a reload: %v, p99 %q; want %v and a latency", got, p99, want)
		}
		return nil
	})
	if b.Path() != projectPath {
		t.Fatalf("the page moved to %s", b.Path())
	}
	b.Shot("health-refreshed")
}
