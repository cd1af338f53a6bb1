package browser

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestDemoBrowserClientEmit: /demo in Chromium looks like the dashboard, and
// its client-emit box emits with a token minted as a backend would: the
// message reaches a WebSocket subscriber of the channel and the board of the
// same page, and the page shows the seq; a token the server refuses shows the
// refusal's code.
func TestDemoBrowserClientEmit(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	if secret == "" {
		t.Fatal("no client-emit secret")
	}
	sub := ts.DialWS(p.PublicKey)
	sub.Send(`{"action":"subscribe","channel":"demo"}`)
	sub.Expect(`{"action":"subscribe","channel":"demo","ok":true}`)

	b := relaytest.NewBrowser(t, ts.Base)
	b.Open("/demo")
	b.ExpectPage(http.StatusOK, "h1", "Demo")
	// The dashboard's look: its header bar, font and cards.
	style := relaytest.BrowserRun(b, chromedp.Evaluate[[]string](`[
		getComputedStyle(document.querySelector("header.top")).backgroundColor,
		getComputedStyle(document.body).fontFamily,
		getComputedStyle(document.querySelector("#client-emit")).borderRadius,
		getComputedStyle(document.querySelector("#emit-send")).backgroundColor]`))
	if style[0] != "rgb(17, 24, 39)" || !strings.HasPrefix(style[1], "system-ui") || style[2] != "8px" || style[3] != "rgb(37, 99, 235)" {
		t.Fatalf("demo styles %q: not the dashboard's", style)
	}
	if got := b.Text("#curl"); !strings.Contains(got, "curl -X POST "+ts.Base+"/emit") {
		t.Fatalf("curl line %q", got)
	}

	// Join the board as a viewer.
	b.Fill("#key", p.PublicKey)
	b.Fill("#name", "viewer")
	relaytest.BrowserRun(b, chromedp.Click(chromedp.CSS("#join-button"))) // the page stays: no load
	relaytest.BrowserRun(b, chromedp.Poll[bool](`document.querySelector("#state").textContent === "open"`, chromedp.WithPollingTimeout(10*time.Second)))
	b.Shot("demo-joined")

	// Paste a token: the channel and type come from its claims.
	tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "demo", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b.Fill("#emit-channel", "elsewhere")
	b.Fill("#emit-token", tok)
	if got := relaytest.BrowserRun(b, chromedp.Evaluate[[]string](`[document.querySelector("#emit-channel").value, document.querySelector("#emit-type").value]`)); fmt.Sprint(got) != "[demo chat]" {
		t.Fatalf("channel and type after pasting the token: %q", got)
	}
	b.Fill("#emit-message", `{"text":"hi from the box"}`)
	relaytest.BrowserRun(b, chromedp.Click(chromedp.CSS("#emit-send")))
	relaytest.BrowserRun(b, chromedp.Poll[bool](`document.querySelector("#emit-result").textContent.startsWith("Emitted") || document.querySelector("#emit-result").textContent.startsWith("Refused")`,
		chromedp.WithPollingTimeout(15*time.Second)))
	res := b.Text("#emit-result")
	var shownSeq uint64
	if _, err := fmt.Sscanf(res, "Emitted as ann on demo: seq %d.", &shownSeq); err != nil {
		t.Fatalf("emit result %q", res)
	}

	// The subscriber gets it (after ann's presence, if it comes first).
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, ok := sub.Next(time.Until(deadline))
		if !ok || f.Closed || f.Err != nil {
			t.Fatalf("no client-emitted message at the subscriber: %+v", f)
		}
		var m map[string]any
		json.Unmarshal([]byte(f.Text), &m)
		if m["type"] == "presence" {
			continue
		}
		want := fmt.Sprintf(`{"channel":"demo","clientId":"ann","payload":{"text":"hi from the box"},"seq":%d,"type":"chat"}`, shownSeq)
		if got, _ := json.Marshal(m); string(got) != want {
			t.Fatalf("subscriber got %s, want %s", got, want)
		}
		break
	}
	// So does the board of the page, which joined as someone else and sees
	// the box's connection in the channel's presence as ann.
	relaytest.BrowserRun(b, chromedp.Poll[bool](fmt.Sprintf(`[...document.querySelectorAll("#messages li")].some((li) => li.textContent === %q)`,
		fmt.Sprintf(`#%d ann (chat): {"text":"hi from the box"}`, shownSeq)), chromedp.WithPollingTimeout(5*time.Second)))
	if got := b.Text("#members"); got != "ann" {
		t.Fatalf("the board's members %q, want ann", got)
	}
	b.Shot("demo-client-emitted")

	// A token signed with another secret: refused, and the page says why.
	forged, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: "not the project's secret", ProjectID: p.ID, Channel: "demo", ClientID: "ann", Types: []string{"chat"}, TTL: time.Minute})
	b.Fill("#emit-token", forged)
	relaytest.BrowserRun(b, chromedp.Click(chromedp.CSS("#emit-send")))
	relaytest.BrowserRun(b, chromedp.Poll[bool](`document.querySelector("#emit-result").textContent.startsWith("Refused")`, chromedp.WithPollingTimeout(10*time.Second)))
	if got := b.Text("#emit-result"); got != "Refused: invalid_emit_token" {
		t.Fatalf("forged token: %q", got)
	}
	if !b.Has("#emit-result.flash.error") {
		t.Fatal("the refusal is not shown as an error")
	}
	b.Shot("demo-client-emit-refused")
}
