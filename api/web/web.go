// Package web serves the browser reference client (/client.js), its
// TypeScript types (/client.d.ts) and the demo page (/demo) from embedded
// files, with ETags. The same client.js and client.d.ts, with package.json,
// are the npm package @relayhq/client.
package web

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"net/http"
)

//go:embed client.js client.d.ts demo.html demo.js demo.css
var files embed.FS

type asset struct {
	body        []byte
	etag        string
	contentType string
	// public: any origin may read the file (Access-Control-Allow-Origin: *).
	public bool
}

func load(name, contentType string) asset {
	b, err := files.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time
	}
	sum := sha256.Sum256(b)
	return asset{body: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`, contentType: contentType}
}

// shared is load for a file any origin may read. client.js and client.d.ts
// are public: the same bytes for everyone, no cookie, key or session read or
// set, nothing in them about the relay or its projects. A page on another
// origin imports client.js as an ES module (import { Relay } from
// "https://relay.example/client.js"), and a browser fetches module scripts
// in CORS mode: without Access-Control-Allow-Origin the import fails. The
// wildcard lets no one read anything they could not download with curl,
// and it never goes with credentials (browsers refuse * with them), so the
// dashboard's session cookie is not involved. Every other route keeps no
// CORS header at all.
func shared(name, contentType string) asset {
	a := load(name, contentType)
	a.public = true
	return a
}

// Routes registers GET /client.js, /client.d.ts, /demo, /demo.js and
// /demo.css. The types go out as text/plain: TypeScript has no registered
// media type, tools go by the file name, and a browser shows the file
// rather than download it (nosniff keeps it from ever running as a script).
// client.js and client.d.ts may be read from any origin (see shared); the
// demo's files may not.
func Routes(mux *http.ServeMux) {
	for path, a := range map[string]asset{
		"GET /client.js":   shared("client.js", "text/javascript; charset=utf-8"),
		"GET /client.d.ts": shared("client.d.ts", "text/plain; charset=utf-8"),
		"GET /demo":        load("demo.html", "text/html; charset=utf-8"),
		"GET /demo.js":     load("demo.js", "text/javascript; charset=utf-8"),
		"GET /demo.css":    load("demo.css", "text/css; charset=utf-8"),
	} {
		mux.Handle(path, a)
	}
}

// ServeHTTP answers with the file, or 304 when the browser has this version.
func (a asset) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	if a.public {
		// On the 304 too: a revalidation is a CORS request like the first fetch.
		h.Set("Access-Control-Allow-Origin", "*")
	}
	h.Set("ETag", a.etag)
	h.Set("Cache-Control", "no-cache") // revalidate each time: cheap with the ETag
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", a.contentType)
	w.Write(a.body)
}
