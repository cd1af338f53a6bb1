package browser

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestBrowserClientResume: with resume: true the browser client keeps each
// channel's last seq in localStorage, and a later page load subscribes with
// since = that seq: what was emitted while no page was open comes replayed,
// each message once, with no gap and nothing the first page already had. A
// page without resume starts afresh; subscribe's since starts from a seq by
// hand.
func TestBrowserClientResume(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("resume")
	b := relaytest.NewBrowser(t, ts.Base)
	emit := func(payload string) int64 {
		t.Helper()
		r := owner.Emit(p.SecretKey, `{"channel":"feed","payload":"`+payload+`"}`)
		if r.Status != 200 {
			t.Fatalf("emit: %s", r.Raw)
		}
		return int64(relaytest.Num(r.JSON, "seq"))
	}
	msgs := func(pg *relaytest.Tab, from, to int) []string {
		var out []string
		for _, l := range pg.Log()[from:to] {
			if strings.HasPrefix(l, "msg:") || strings.HasPrefix(l, "gap:") {
				out = append(out, l)
			}
		}
		return out
	}

	pg := b.NewTab(t)
	pg.Start(ts.Base, p.PublicKey, "feed", "dan", "{resume: true}")
	at := pg.WaitFor(0, "state:open", "presence:sync:")
	one, two := emit("one"), emit("two")
	at = pg.WaitFor(at, fmt.Sprintf(`msg:%d:"one"`, one), fmt.Sprintf(`msg:%d:"two"`, two))

	// The page is left (pagehide writes what the client has not yet
	// stored); two emits while no page is open; the page comes back.
	pg.Run(chromedp.Navigate(ts.Base + "/healthz"))
	three, four := emit("three"), emit("four")
	pg.Start(ts.Base, p.PublicKey, "feed", "dan", "{resume: true}")
	want := []string{fmt.Sprintf(`msg:%d:"three":replay`, three), fmt.Sprintf(`msg:%d:"four":replay`, four)}
	end := pg.WaitFor(0, want...)
	five := emit("five")
	end = pg.WaitFor(end, fmt.Sprintf(`msg:%d:"five"`, five))
	if got := msgs(pg, 0, end); strings.Join(got, "\n") != strings.Join(append(want, fmt.Sprintf(`msg:%d:"five"`, five)), "\n") {
		t.Fatalf("after the page came back: %q, want %q then five", got, want)
	}
	// Subscribing again on the same page (new handlers) starts where the
	// subscription it replaces is, even right after a message (its seq not
	// yet written): nothing it delivered comes again.
	pg.Eval(`relay.subscribe("feed", { presence: true, clientId: "dan", onMessage: (m) => {
		log.push("b:" + m.seq + (m.replay ? ":replay" : ""));
		if (m.payload === "resubscribe") relay.subscribe("feed", { presence: true, clientId: "dan", onMessage: (x) => log.push("again:" + x.seq + (x.replay ? ":replay" : "")) });
	} })`)
	relaytest.Eventually(t, 5*time.Second, func() bool { return pg.Check(`relay.subs.get("feed").acked === true`) }, "the new subscription acked")
	resub := emit("resubscribe")
	end = pg.WaitFor(end, fmt.Sprintf("b:%d", resub))
	relaytest.Eventually(t, 5*time.Second, func() bool { return pg.Check(`relay.subs.get("feed").acked === true`) }, "the third subscription acked")
	after := emit("after")
	end = pg.WaitFor(end, fmt.Sprintf("again:%d", after))
	if n := pg.Count(0, "again:"); n != 1 {
		t.Fatalf("after subscribing again: %q, want the message after it alone", pg.Log())
	}
	five = after
	key := fmt.Sprintf("relay:%s:feed", p.PublicKey)
	relaytest.Eventually(t, 5*time.Second, func() bool {
		return pg.Check(fmt.Sprintf(`localStorage.getItem(%q) === %q`, key, fmt.Sprint(five)))
	}, "localStorage holds the last seq")

	// Without resume: nothing stored is used, nothing replayed.
	fresh := b.NewTab(t)
	fresh.Start(ts.Base, p.PublicKey, "feed", "eve", "{}")
	fat := fresh.WaitFor(0, "state:open", "presence:sync:dan")
	six := emit("six")
	fat = fresh.WaitFor(fat, fmt.Sprintf(`msg:%d:"six"`, six))
	if got := msgs(fresh, 0, fat); len(got) != 1 {
		t.Fatalf("a page without resume got %q, want six alone", got)
	}

	// since by hand, on the same relay: what came after it, replayed.
	fresh.Eval(fmt.Sprintf(`relay.subscribe("feed", { since: %d, onMessage: (m) => log.push("again:" + m.seq + (m.replay ? ":replay" : "")) })`, four))
	fresh.WaitFor(fat, fmt.Sprintf("again:%d:replay", five), fmt.Sprintf("again:%d:replay", six))
}
