package relaytest

import (
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Owner is a signed-up account's session on a running relay, as one
// browser holds it: an HTTP client with the session cookie.
type Owner struct {
	t    testing.TB
	base string
	hc   *http.Client
}

// Project is a created project and its raw keys.
type Project struct {
	ID, PublicKey, SecretKey string
}

// Signup creates the account email (password "correct horse") on the relay
// at base and returns its session.
func Signup(t testing.TB, base, email string) *Owner {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	o := &Owner{t: t, base: base, hc: &http.Client{Jar: jar, Timeout: 10 * time.Second}}
	if r := o.Do("POST", "/api/auth/signup", `{"email":"`+email+`","password":"correct horse"}`); r.Status != http.StatusCreated {
		t.Fatalf("signup %s: %d %s", email, r.Status, r.Raw)
	}
	return o
}

// Do sends a JSON request to the relay's path in the owner's session.
func (o *Owner) Do(method, path, body string) Response {
	o.t.Helper()
	r, err := Do(o.hc, method, o.base+path, body, http.Header{"Content-Type": {"application/json"}})
	if err != nil {
		o.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// CreateProject creates a project named name.
func (o *Owner) CreateProject(name string) Project {
	o.t.Helper()
	r := o.Do("POST", "/api/projects", `{"name":"`+name+`"}`)
	project, _ := r.JSON["project"].(map[string]any)
	keys, _ := r.JSON["keys"].(map[string]any)
	p := Project{}
	p.ID, _ = project["id"].(string)
	p.PublicKey, _ = keys["publicKey"].(string)
	p.SecretKey, _ = keys["secretKey"].(string)
	if r.Status != http.StatusCreated || p.ID == "" || p.PublicKey == "" || p.SecretKey == "" {
		o.t.Fatalf("create project: %d %s", r.Status, r.Raw)
	}
	return p
}

// WSURL is the WebSocket address of the relay at base for publicKey.
func WSURL(base, publicKey string) string {
	return "ws://" + strings.TrimPrefix(base, "http://") + "/ws?publicKey=" + url.QueryEscape(publicKey)
}

// Emit posts body to the relay's /emit with secretKey. It returns errors
// rather than failing a test, so it also serves off the test's goroutine.
// An emit not answered in 10 s is an error.
func Emit(base, secretKey, body string) (Response, error) {
	return Do(emitClient, "POST", base+"/emit", body, http.Header{"Authorization": {"Bearer " + secretKey}, "Content-Type": {"application/json"}})
}

var emitClient = &http.Client{Timeout: 10 * time.Second}
