package browser

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestClientJSCrossOrigin: a page on another origin (another loopback port)
// imports the relay's /client.js as an ES module in real headless Chromium,
// subscribes through it and gets an emit; it can fetch /client.d.ts, and
// cannot read /demo.js (no CORS header there: only the client's two files
// are shared with every origin). The response headers are checked too.
func TestClientJSCrossOrigin(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	for _, path := range []string{"/client.js", "/client.d.ts"} {
		req, _ := http.NewRequest("GET", ts.Base+path, nil)
		req.Header.Set("Origin", "http://127.0.0.1:1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.Header.Get("Access-Control-Allow-Origin") != "*" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("GET %s: Access-Control-Allow-Origin %q, X-Content-Type-Options %q", path, res.Header.Get("Access-Control-Allow-Origin"), res.Header.Get("X-Content-Type-Options"))
		}
	}
	for _, path := range []string{"/demo.js", "/demo", "/healthz", "/api/projects", "/login"} {
		res, err := http.Get(ts.Base + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if v := res.Header.Values("Access-Control-Allow-Origin"); len(v) != 0 {
			t.Fatalf("GET %s: Access-Control-Allow-Origin %q, want none", path, v)
		}
	}

	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("elsewhere")
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<!doctype html><title>another origin</title><p>a page that is not the relay's</p>`)
	}))
	t.Cleanup(site.Close)
	if strings.TrimPrefix(site.URL, "http://") == ts.Addr() {
		t.Fatal("the page and the relay share an origin")
	}

	b := relaytest.NewBrowser(t, site.URL)
	pg := b.NewTab(t)
	pg.Run(chromedp.Navigate(site.URL + "/"))
	pg.Eval(fmt.Sprintf(`
		window.log = [];
		import(%q).then(({ Relay }) => {
			log.push("imported");
			window.relay = new Relay({ url: %q, publicKey: %q });
			relay.on("state", (s) => log.push("state:" + s));
			relay.subscribe("room", { onMessage: (m) => log.push("msg:" + JSON.stringify(m.payload)) })
				.ready.then(() => log.push("ready"));
		}, (e) => log.push("importfail:" + e));
		fetch(%q).then((r) => r.text()).then((s) => log.push("dts:" + s.includes("export class Relay")), (e) => log.push("dtsfail"));
		fetch(%q).then(() => log.push("demojs:read"), () => log.push("demojs:refused"));`,
		ts.Base+"/client.js", ts.Base, p.PublicKey, ts.Base+"/client.d.ts", ts.Base+"/demo.js"))
	at := pg.WaitFor(0, "imported", "state:open", "ready")
	owner.Emit(p.SecretKey, `{"channel":"room","payload":{"from":"curl"}}`)
	pg.WaitFor(at, `msg:{"from":"curl"}`)
	pg.WaitFor(0, "dts:true")
	pg.WaitFor(0, "demojs:refused")
}
