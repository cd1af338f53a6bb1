// Package web serves the browser reference client (/client.js), its
// TypeScript types (/client.d.ts) and the demo page (/demo) from embedded
// files, with ETags.
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
}

func load(name, contentType string) asset {
	b, err := files.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time
	}
	sum := sha256.Sum256(b)
	return asset{body: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`, contentType: contentType}
}

// Routes registers GET /client.js, /client.d.ts, /demo, /demo.js and
// /demo.css. The types go out as text/plain: TypeScript has no registered
// media type, tools go by the file name, and a browser shows the file
// rather than download it (nosniff keeps it from ever running as a script).
func Routes(mux *http.ServeMux) {
	for path, a := range map[string]asset{
		"GET /client.js":   load("client.js", "text/javascript; charset=utf-8"),
		"GET /client.d.ts": load("client.d.ts", "text/plain; charset=utf-8"),
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
	h.Set("ETag", a.etag)
	h.Set("Cache-Control", "no-cache") // revalidate each time: cheap with the ETag
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", a.contentType)
	w.Write(a.body)
}
