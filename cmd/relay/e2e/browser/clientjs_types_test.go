package browser

// The browser client's types (api/web/client.d.ts) against the client itself
// (api/web/client.js), by name: tsc checks that the declarations hold
// together (make test runs api/web/typecheck/check.sh), this checks that they
// declare what the script has, so a method renamed or added on one side and
// not the other fails go test even where tsc is not installed.

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func readWebFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../../../api/web/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// block returns the text from the line starting with start to the first line
// that is exactly end.
func block(t *testing.T, src, start, end string) string {
	t.Helper()
	i := strings.Index(src, "\n"+start)
	if i < 0 {
		t.Fatalf("no %q", start)
	}
	rest := src[i+1:]
	j := strings.Index(rest, "\n"+end+"\n")
	if j < 0 {
		t.Fatalf("no end %q after %q", end, start)
	}
	return rest[:j]
}

func names(re *regexp.Regexp, src string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(src, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return out
}

func TestClientTypesMatchClientJS(t *testing.T) {
	t.Parallel()
	js, dts := readWebFile(t, "client.js"), readWebFile(t, "client.d.ts")

	// The same values exported.
	jsExports := names(regexp.MustCompile(`(?m)^export (?:class|function|const) (\w+)`), js)
	dtsExports := names(regexp.MustCompile(`(?m)^export (?:class|function|const) (\w+)`), dts)
	if !slices.Equal(jsExports, dtsExports) {
		t.Errorf("client.js exports %v, client.d.ts declares %v", jsExports, dtsExports)
	}

	// Every method declared on Relay is a method of the class; every method
	// of the class is declared or listed here as internal.
	internal := []string{"abandon", "connect", "dispatch", "emitEvent", "failPending", "onClose", "open", "refresh", "refuse",
		"restart", "scheduleRefresh", "seen", "send", "sendSubscribe", "setState", "startHeartbeat", "stopHeartbeat", "takePending"}
	jsClass := block(t, js, "export class Relay {", "}")
	dtsClass := block(t, dts, "export class Relay {", "}")
	jsMethods := names(regexp.MustCompile(`(?m)^  (\w+)\([^)]*\) \{`), jsClass)
	dtsMethods := names(regexp.MustCompile(`(?m)^  (\w+)(?:<[^>]*>)?\(`), dtsClass)
	for _, m := range dtsMethods {
		if !slices.Contains(jsMethods, m) {
			t.Errorf("client.d.ts declares Relay.%s, which client.js does not have", m)
		}
	}
	for _, m := range jsMethods {
		if !slices.Contains(dtsMethods, m) && !slices.Contains(internal, m) {
			t.Errorf("client.js has Relay.%s: declare it in client.d.ts or list it here as internal", m)
		}
	}
	// The declared properties are set by the constructor (or setState).
	for _, p := range names(regexp.MustCompile(`(?m)^  readonly (\w+):`), dtsClass) {
		if !strings.Contains(jsClass, "this."+p+" = ") {
			t.Errorf("client.d.ts declares Relay.%s, which client.js never sets", p)
		}
	}
	// The events of on() are the listener sets of the class.
	dtsEvents := names(regexp.MustCompile(`on\(event: "(\w+)"`), dtsClass)
	jsEvents := names(regexp.MustCompile(`(\w+): new Set\(\)`), jsClass)
	if !slices.Equal(dtsEvents, jsEvents) {
		t.Errorf("on() events: client.d.ts %v, client.js %v", dtsEvents, jsEvents)
	}
	// The subscription's fields are the keys of the object subscribe builds
	// (ready is set on it after), less the internal handlers; its handlers
	// are the ones dispatch calls.
	subscribe := block(t, js, "  subscribe(channel, opts = {}) {", "  }")
	dtsSub := block(t, dts, "export interface Subscription<P = unknown> {", "}")
	for _, f := range names(regexp.MustCompile(`(?m)^  (?:readonly )?(\w+)[(:]`), dtsSub) {
		if !regexp.MustCompile(`(?m)^      ` + f + `[,:]|sub\.` + f + ` = `).MatchString(subscribe) {
			t.Errorf("client.d.ts declares Subscription.%s, which subscribe() does not set", f)
		}
	}
	jsHandlers := names(regexp.MustCompile(`handlers\.(on\w+)\?\.`), js)
	dtsHandlers := names(regexp.MustCompile(`(?m)^  (on\w+)\?:`), block(t, dts, "export interface SubscribeOptions<P = unknown> {", "}"))
	if !slices.Equal(jsHandlers, dtsHandlers) {
		t.Errorf("subscribe handlers: client.js calls %v, client.d.ts declares %v", jsHandlers, dtsHandlers)
	}
	// The options and their defaults.
	defaults := block(t, js, "const DEFAULTS = {", "};")
	for _, o := range names(regexp.MustCompile(`(?m)^  (\w+): `), defaults) {
		if !regexp.MustCompile(`(?m)^  ` + o + `\?: `).MatchString(dts) {
			t.Errorf("client.js has the option %s, client.d.ts does not declare it", o)
		}
	}
	// The error codes listed are those of proto/PROTOCOL.md's socket table.
	protocol, err := os.ReadFile("../../../../proto/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	table := block(t, string(protocol), "## Errors on the socket", "## Close codes")
	docCodes := names(regexp.MustCompile("`([a-z_]+)`"), table)
	dtsCodes := names(regexp.MustCompile(`\| "([a-z_]+)"`), block(t, dts, "export type ErrorCode =", "  | \"token_unavailable\";")+"\n  | \"token_unavailable\"")
	docCodes = slices.DeleteFunc(docCodes, func(c string) bool {
		return c == "channel" || c == "action" || c == "since" || c == "presence" || c == "clientId"
	})
	// Channel authorization's socket errors (its own table), the refused
	// refresh's invalid_token, and the client's own token_unavailable.
	authz := block(t, string(protocol), "## Channel authorization (opt-in per project)", "## POST /emit")
	i := strings.Index(authz, "| error (on the socket")
	if i < 0 {
		t.Fatal("no table of socket errors under Channel authorization")
	}
	authzTable, _, _ := strings.Cut(authz[i:], "\n\n")
	docCodes = append(docCodes, names(regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|"), authzTable)...) // the first column
	if !strings.Contains(authz, "answered `{\"error\":\"invalid_token\"}`") {
		t.Error("proto/PROTOCOL.md no longer answers a refused refresh with invalid_token")
	}
	docCodes = append(docCodes, "invalid_token", "token_unavailable")
	slices.Sort(docCodes)
	if !slices.Equal(docCodes, dtsCodes) {
		t.Errorf("error codes: proto/PROTOCOL.md %v, client.d.ts %v", docCodes, dtsCodes)
	}
}

func TestClientTypesServed(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	res, err := http.Get(ts.Base + "/client.d.ts")
	if err != nil {
		t.Fatal(err)
	}
	body := new(strings.Builder)
	_, err = io.Copy(body, res.Body)
	res.Body.Close()
	etag := res.Header.Get("ETag")
	if err != nil || res.StatusCode != 200 || etag == "" || res.Header.Get("Content-Type") != "text/plain; charset=utf-8" ||
		res.Header.Get("Cache-Control") != "no-cache" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("/client.d.ts: %d %v, headers %v", res.StatusCode, err, res.Header)
	}
	if body.String() != readWebFile(t, "client.d.ts") {
		t.Fatal("/client.d.ts is not api/web/client.d.ts")
	}
	expectNotModified(t, ts.Base+"/client.d.ts", etag)
	// client.js points Deno at it.
	if _, js := relaytest.GetText(t, ts.Base+"/client.js"); !strings.HasPrefix(js, `// @ts-self-types="./client.d.ts"`) {
		t.Fatal("/client.js does not start with its @ts-self-types line")
	}
}
