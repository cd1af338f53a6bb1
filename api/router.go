package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/relayhq/relay/proto"
)

// methods maps HTTP methods to handlers for one path, so that a known path with
// the wrong method answers 405 in JSON (net/http's own 405 is plain text).
type methods map[string]http.HandlerFunc

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h, ok := m[r.Method]; ok {
		h(w, r)
		return
	}
	if h, ok := m[http.MethodGet]; ok && r.Method == http.MethodHead {
		h(w, r)
		return
	}
	allow := make([]string, 0, len(m))
	for k := range m {
		allow = append(allow, k)
	}
	sort.Strings(allow)
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, proto.CodeMethodNotAllowed)
}

func notFound(w http.ResponseWriter, _ *http.Request) { writeError(w, proto.CodeNotFound) }

// cleanPaths answers 404 not_found for a path that net/http's ServeMux would
// redirect to its cleaned form (an empty, "." or ".." segment, as in
// /api/projects/x/keys//revoke): no route has such a path, and an API client
// should get the JSON 404 rather than a bare 301 or 307 to another route.
func cleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			if p := r.URL.EscapedPath(); p != cleanPath(p) {
				notFound(w, r)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// cleanPath is ServeMux's: path.Clean keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// Body caps. Control-plane bodies are a few short strings; emit bodies may hold
// a full 128 KiB message plus JSON overhead, and anything larger is refused
// before it is read in full.
const (
	maxControlBody = 64 << 10
	maxEmitBody    = 1 << 20
)

var (
	errBodyTooLarge = errors.New("body too large")
	errContentType  = errors.New("content type is not JSON")
	errBadJSON      = errors.New("body is not valid JSON")
)

// readBody reads at most limit bytes of the request body.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errBodyTooLarge
	}
	return body, err
}

// emitBodies recycles POST /emit bodies: an emit keeps nothing of its body
// (the decoder copies the channel and compacts the payload into new bytes).
var emitBodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody: a buffer grown by a rare large body is left to the GC.
const maxPooledBody = 64 << 10

// readPooledBody is readBody into a buffer from emitBodies; give it back with
// putPooledBody once nothing refers to its bytes.
func readPooledBody(w http.ResponseWriter, r *http.Request, limit int64) (*bytes.Buffer, error) {
	buf := emitBodies.Get().(*bytes.Buffer)
	buf.Reset()
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf.Grow(int(r.ContentLength) + 1) // +1: ReadFrom's final read finds EOF without growing
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		err = errBodyTooLarge
	}
	return buf, err
}

func putPooledBody(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBody {
		emitBodies.Put(buf)
	}
}

// decodeControl decodes a control-plane JSON body into v. An empty body counts
// as {}. A non-empty body must be declared JSON: besides being honest, this
// keeps cross-site forms (text/plain, urlencoded) from reaching cookie routes.
func decodeControl(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := readBody(w, r, maxControlBody)
	if err != nil {
		return err
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if !isJSONContentType(r.Header.Get("Content-Type")) {
		return errContentType
	}
	if err := json.Unmarshal(body, v); err != nil {
		return errBadJSON
	}
	return nil
}

// readSecretKeyBody reads the JSON body of a secret-key route (revoke, batch
// emit) of at most limit bytes, answering body_too_large or invalid_json
// itself when it cannot (ok false). Like /emit, these routes read the body as
// JSON whatever its Content-Type says (curl -d declares a form): their
// bodies are JSON by definition, and their callers hold a secret key, which
// no cross-site form can carry, so the check /api/* makes buys nothing here.
func readSecretKeyBody(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, ok bool) {
	body, err := readBody(w, r, limit)
	switch {
	case errors.Is(err, errBodyTooLarge):
		writeError(w, proto.CodeBodyTooLarge, "max_bytes", limit)
	case err != nil:
		writeError(w, proto.CodeInvalidJSON)
	default:
		return body, true
	}
	return nil, false
}

func isJSONContentType(ct string) bool {
	if strings.EqualFold(ct, "application/json") { // the usual header, without a parse
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// writeDecodeError answers a decodeControl failure.
func writeDecodeError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errBodyTooLarge):
		writeError(w, proto.CodeBodyTooLarge, "max_bytes", maxControlBody)
	case errors.Is(err, errContentType):
		writeError(w, proto.CodeUnsupportedMediaType)
	default:
		writeError(w, proto.CodeInvalidJSON)
	}
}

// viaHTTPS reports whether the browser reached us over HTTPS: a TLS
// connection, or a reverse proxy's X-Forwarded-Proto (its first hop) says so.
func viaHTTPS(r *http.Request) bool {
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return r.TLS != nil || strings.EqualFold(strings.TrimSpace(proto), "https")
}

// forwardedHost is the host a reverse proxy says the browser asked for
// (X-Forwarded-Host, its first hop), "" when it says none.
func forwardedHost(r *http.Request) string {
	fwd, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Host"), ",")
	return strings.TrimSpace(fwd)
}
