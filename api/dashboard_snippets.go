package api

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/relayhq/relay/store"
)

// The code snippets of the project page: subscribe from a browser, emit with
// curl, emit from a Go backend, with this server's address and the project's
// keys filled in. A raw key is known only on the one view after it was
// created or rotated (dashboard_newkeys.go); otherwise the snippet carries a
// placeholder and the page says which key goes there.

// snippet is one code block with its copy button.
type snippet struct {
	ID, Title, Text string
}

// The placeholders of keys whose raw value the page does not know.
const (
	publicKeyPlaceholder = "<your public key>"
	secretKeyPlaceholder = "<your secret key>"
)

// snippetChannel is the channel the snippets use: the /demo page's default,
// so that a curl from the page shows up on a board joined there.
const snippetChannel = "demo"

// requestOrigin is the address this request reached, as a browser would
// write it: https when viaHTTPS (the session cookie's Secure flag asks the
// same), and the host the proxy forwarded (as sameOrigin reads it) or else
// Host. A value that is not a plain host[:port] is ignored.
func requestOrigin(r *http.Request) string {
	scheme := "http"
	if viaHTTPS(r) {
		scheme = "https"
	}
	host := r.Host
	if fwd := forwardedHost(r); plainHost(fwd) {
		host = fwd
	}
	if !plainHost(host) {
		host = "localhost"
	}
	return scheme + "://" + host
}

// plainHost reports whether h is a host with an optional port and nothing
// else (no user, path, query or spaces).
func plainHost(h string) bool {
	if h == "" || strings.ContainsAny(h, "/?#@\\ \t'\"`<>") {
		return false
	}
	u, err := url.Parse("http://" + h)
	return err == nil && u.Host == h && u.User == nil && u.Path == "" && u.RawQuery == ""
}

// fillSnippets fills pv.Snippets and pv.KeyHint for the project's keys: the raw
// ones in pv.NewKeys, else placeholders.
func (pv *projectView) fillSnippets(origin string, keys []store.APIKey, now time.Time) {
	public, secret := publicKeyPlaceholder, secretKeyPlaceholder
	for _, k := range pv.NewKeys {
		switch k.Type {
		case "public":
			public = k.Raw
		case "secret":
			secret = k.Raw
		}
	}
	// Which keys the placeholders stand for: the active key of each type
	// (not one in its overlap window), named by its visible prefix.
	var hints []string
	for _, t := range []struct{ typ, value, placeholder string }{
		{"public", public, publicKeyPlaceholder}, {"secret", secret, secretKeyPlaceholder},
	} {
		if t.value != t.placeholder {
			continue
		}
		hint := t.placeholder + ": your " + t.typ + " key"
		for _, k := range keys {
			if k.KeyType == t.typ && k.ValidAt(now) && k.ExpiresAt == nil {
				hint += " (" + strings.TrimRight(k.KeyPrefix, "*") + "…)"
				break
			}
		}
		hints = append(hints, hint)
	}
	if len(hints) > 0 {
		pv.KeyHint = "Relay shows raw keys only once, right after they are created or rotated, so the snippets have placeholders: " +
			strings.Join(hints, "; ") + ". Rotate a key if you no longer have it."
	}

	js := strconv.Quote // Go's quoting of these ASCII strings is valid JavaScript
	pv.Snippets = []snippet{
		{
			ID: "snippet-browser", Title: "Subscribe in a browser",
			Text: `// client.js and client.d.ts are served at ` + origin + `/client.js and /client.d.ts:
// save them beside your page (api/web/README.md).
import { Relay } from "./client.js";

const relay = new Relay({ url: ` + js(origin) + `, publicKey: ` + js(public) + ` });
relay.subscribe(` + js(snippetChannel) + `, {
  onMessage: (m) => console.log(m.seq, m.payload),
});
`,
		},
		{
			ID: "snippet-curl", Title: "Emit with curl (secret key: server side only)",
			Text: `curl -X POST ` + shellQuote(origin+"/emit") + ` \
  -H ` + shellQuote("Authorization: Bearer "+secret) + ` \
  -H 'Content-Type: application/json' \
  -d '{"channel":"` + snippetChannel + `","payload":{"text":"hello"}}'
`,
		},
		{
			ID: "snippet-go", Title: "Emit from a Go backend (github.com/relayhq/relay/api/backend)",
			Text: `package main

import (
	"context"
	"fmt"
	"log"

	"github.com/relayhq/relay/api/backend"
)

func main() {
	res, err := backend.Emit(context.Background(), nil, ` + strconv.Quote(origin+"/emit") + `,
		` + strconv.Quote(secret) + `, ` + strconv.Quote(snippetChannel) + `, map[string]any{"text": "hello"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("seq", res.Seq, "delivered to", res.Delivered, "of", res.SubscriberCount)
}
`,
		},
	}
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
