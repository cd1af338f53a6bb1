package relaytest

// Checks of the control-plane API's exact shapes, shared by the suites
// that use it (api/openapi.yaml is the reference).

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"
)

// JSON renders v as JSON, for building exact expected bodies.
func JSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// SignupID signs up email on a fresh client and returns it with the user id.
func (s *Server) SignupID(t testing.TB, email string) (*Client, string) {
	t.Helper()
	c := s.Client().On(t)
	r := c.Do("POST", "/api/auth/signup", JSON(map[string]string{"email": email, "password": Password}))
	r.Expect(t, http.StatusCreated, JSON(map[string]string{"id": r.Str("id"), "email": email}))
	IsUUID(t, "user id", r.Str("id"))
	return c, r.Str("id")
}

// IsUUID fails the test unless s, what it names, is a UUID.
func IsUUID(t testing.TB, what, s string) {
	t.Helper()
	if !UUIDRe.MatchString(s) {
		t.Fatalf("%s %q is not a UUID", what, s)
	}
}

// IsTime fails the test unless v, what it names, is an RFC 3339 timestamp
// string, and returns its time.
func IsTime(t testing.TB, what string, v any) time.Time {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("%s %v is not a timestamp string", what, v)
	}
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("%s %q is not an RFC 3339 timestamp: %v", what, s, err)
	}
	return tm
}

// SessionCookies returns the service_session cookies an answer sets.
func SessionCookies(t testing.TB, r Response) []*http.Cookie {
	t.Helper()
	var out []*http.Cookie
	for _, line := range r.Header.Values("Set-Cookie") {
		c, err := http.ParseSetCookie(line)
		if err != nil {
			t.Fatalf("bad Set-Cookie %q: %v", line, err)
		}
		if c.Name == SessionCookie {
			out = append(out, c)
		}
	}
	return out
}

// SessionCookieIn returns the one service_session cookie an answer sets and
// checks the cookie's attributes (httpOnly, SameSite=Lax, Path=/, 7 days).
func SessionCookieIn(t testing.TB, r Response, wantSecure bool) *http.Cookie {
	t.Helper()
	cs := SessionCookies(t, r)
	if len(cs) != 1 {
		t.Fatalf("want exactly one %s cookie, got %d: %q", SessionCookie, len(cs), r.Header.Values("Set-Cookie"))
	}
	c := cs[0]
	if c.Value == "" {
		t.Fatalf("session cookie is empty: %q", c.Raw)
	}
	if !c.HttpOnly {
		t.Errorf("session cookie not HttpOnly: %q", c.Raw)
	}
	if c.SameSite != http.SameSiteLaxMode {
		t.Errorf("session cookie SameSite %v, want Lax: %q", c.SameSite, c.Raw)
	}
	if c.Path != "/" {
		t.Errorf("session cookie Path %q, want /: %q", c.Path, c.Raw)
	}
	if c.Secure != wantSecure {
		t.Errorf("session cookie Secure=%v, want %v: %q", c.Secure, wantSecure, c.Raw)
	}
	// Lifetime 7 days, on the cookie and in the JWT.
	const week = 7 * 24 * time.Hour
	switch {
	case c.MaxAge > 0:
		if c.MaxAge != int(week/time.Second) {
			t.Errorf("session cookie Max-Age %d, want %d", c.MaxAge, int(week/time.Second))
		}
	case !c.Expires.IsZero():
		if d := time.Until(c.Expires); d < week-time.Minute || d > week+time.Minute {
			t.Errorf("session cookie expires in %v, want 7 days", d)
		}
	default:
		t.Errorf("session cookie is a browser-session cookie, want a 7-day lifetime: %q", c.Raw)
	}
	parts := strings.Split(c.Value, ".")
	if len(parts) != 3 {
		t.Fatalf("session cookie is not a JWS compact JWT: %q", c.Value)
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	var claims struct {
		Exp int64  `json:"exp"`
		Sub string `json:"sub"`
	}
	for i, v := range []any{&hdr, &claims} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil || json.Unmarshal(b, v) != nil {
			t.Fatalf("session JWT part %d is not base64url JSON: %q", i, parts[i])
		}
	}
	if hdr.Alg != "HS256" {
		t.Errorf("session JWT alg %q, want HS256", hdr.Alg)
	}
	if d := time.Until(time.Unix(claims.Exp, 0)); d < week-time.Minute || d > week+time.Minute {
		t.Errorf("session JWT expires in %v, want 7 days", d)
	}
	return c
}

// NoSessionCookie fails the test if r sets a session cookie.
func NoSessionCookie(t testing.TB, r Response) {
	t.Helper()
	if cs := SessionCookies(t, r); len(cs) != 0 {
		t.Fatalf("response sets a session cookie, want none: %q", r.Header.Values("Set-Cookie"))
	}
}

// HandJWT builds a JWS compact token by hand: alg "none" gets no signature,
// anything else an HMAC-SHA256 with key (whatever alg the header claims).
func HandJWT(alg string, key []byte, claims map[string]any) string {
	enc := base64.RawURLEncoding
	in := enc.EncodeToString([]byte(JSON(map[string]string{"alg": alg, "typ": "JWT"}))) + "." +
		enc.EncodeToString([]byte(JSON(claims)))
	if alg == "none" {
		return in + "."
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(in))
	return in + "." + enc.EncodeToString(m.Sum(nil))
}

// CreateChecked creates a project and checks the exact 201 body (api/openapi.yaml).
func CreateChecked(c *Client, t testing.TB, name, ownerID string) (Project, map[string]any) {
	t.Helper()
	r := c.On(t).Do("POST", "/api/projects", JSON(map[string]string{"name": name}))
	pb, _ := r.JSON["project"].(map[string]any)
	want := map[string]any{
		"project": map[string]any{"id": r.Str("project", "id"), "name": name, "ownerUserId": ownerID, "createdAt": pb["createdAt"]},
		"keys":    map[string]any{"publicKey": r.Str("keys", "publicKey"), "secretKey": r.Str("keys", "secretKey")},
	}
	r.Expect(t, http.StatusCreated, JSON(want))
	IsUUID(t, "project id", r.Str("project", "id"))
	IsTime(t, "project createdAt", pb["createdAt"])
	p := Project{ID: r.Str("project", "id"), PublicKey: r.Str("keys", "publicKey"), SecretKey: r.Str("keys", "secretKey")}
	if !PublicKeyRe.MatchString(p.PublicKey) {
		t.Fatalf("public key %q: want pk_live_ and ≥ 22 base64url characters", p.PublicKey)
	}
	if !SecretKeyRe.MatchString(p.SecretKey) {
		t.Fatalf("secret key %q: want sk_live_ and ≥ 22 base64url characters", p.SecretKey)
	}
	return p, pb
}

// Keys lists a project's keys (200) and checks every entry's shape.
func Keys(c *Client, t testing.TB, projectID string) (keys []map[string]any, raw string) {
	t.Helper()
	r := c.On(t).Do("GET", "/api/projects/"+projectID+"/keys", "")
	if r.Status != http.StatusOK {
		t.Fatalf("list keys: %d %s", r.Status, r.Raw)
	}
	var body struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &body); err != nil || body.Keys == nil {
		t.Fatalf("list keys body %s: want {keys: [...]}", r.Raw)
	}
	if len(r.JSON) != 1 {
		t.Fatalf("list keys body %s: want only the keys field", r.Raw)
	}
	for _, k := range body.Keys {
		var fields []string
		for f := range k {
			fields = append(fields, f)
		}
		sort.Strings(fields)
		if got := strings.Join(fields, ","); got != "createdAt,expiresAt,id,keyPrefix,keyType,lastUsedAt,revokedAt" {
			t.Fatalf("key fields %s, want createdAt,expiresAt,id,keyPrefix,keyType,lastUsedAt,revokedAt: %v", got, k)
		}
		id, _ := k["id"].(string)
		IsUUID(t, "key id", id)
		IsTime(t, "key createdAt", k["createdAt"])
		if k["revokedAt"] != nil {
			IsTime(t, "key revokedAt", k["revokedAt"])
		}
		typ, _ := k["keyType"].(string)
		if typ != "public" && typ != "secret" {
			t.Fatalf("keyType %v", k["keyType"])
		}
	}
	return body.Keys, r.Raw
}

// KeyByID is the listed key with id (nil: none).
func KeyByID(keys []map[string]any, id string) map[string]any {
	for _, k := range keys {
		if k["id"] == id {
			return k
		}
	}
	return nil
}

// ActiveKeys are the listed keys of keyType not revoked.
func ActiveKeys(keys []map[string]any, keyType string) []map[string]any {
	var out []map[string]any
	for _, k := range keys {
		if k["keyType"] == keyType && k["revokedAt"] == nil {
			out = append(out, k)
		}
	}
	return out
}

// CheckMasked checks that keyPrefix is a masked form of raw: leading
// characters of raw followed by masking characters, hiding most of it.
func CheckMasked(t testing.TB, keyPrefix, raw, typePrefix string) {
	t.Helper()
	if keyPrefix == raw {
		t.Fatalf("keyPrefix equals the raw key %q", raw)
	}
	if !strings.HasPrefix(keyPrefix, typePrefix) {
		t.Fatalf("keyPrefix %q does not start with %s", keyPrefix, typePrefix)
	}
	isB64 := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
	}
	i := strings.IndexFunc(keyPrefix[len(typePrefix):], func(r rune) bool { return !isB64(r) })
	if i < 0 {
		t.Fatalf("keyPrefix %q has no masking characters", keyPrefix)
	}
	visible, mask := keyPrefix[:len(typePrefix)+i], keyPrefix[len(typePrefix)+i:]
	if strings.IndexFunc(mask, isB64) >= 0 {
		t.Fatalf("keyPrefix %q: key characters after the mask", keyPrefix)
	}
	if !strings.HasPrefix(raw, visible) {
		t.Fatalf("keyPrefix %q does not show the leading characters of %q", keyPrefix, raw)
	}
	if hidden := len(raw) - len(visible); hidden < 16 {
		t.Fatalf("keyPrefix %q hides only %d characters of the key", keyPrefix, hidden)
	}
}

// Route is one control-plane request.
type Route struct {
	Name, Method, Path, Body string
}

// ProjectRoutes is every per-project route, with bodies that would succeed
// for the owner.
func ProjectRoutes(projectID, keyID string) []Route {
	base := "/api/projects/" + projectID
	return []Route{
		{"get", "GET", base, ""},
		{"rename", "PATCH", base, `{"name":"Renamed"}`},
		{"delete", "DELETE", base, ""},
		{"list keys", "GET", base + "/keys", ""},
		{"rotate public", "POST", base + "/keys", `{"keyType":"public"}`},
		{"rotate secret", "POST", base + "/keys", `{"keyType":"secret"}`},
		{"revoke", "POST", base + "/keys/" + keyID + "/revoke", ""},
		{"client-emit-secret", "PATCH", base + "/client-emit-secret", `{}`},
		{"client-emit-secret regenerate", "PATCH", base + "/client-emit-secret", `{"regenerate":true}`},
		{"authorization", "GET", base + "/authorization", ""},
		{"authorization on", "PATCH", base + "/authorization", `{"authorization":true}`},
		{"authorization off", "PATCH", base + "/authorization", `{"authorization":false}`},
		{"authorization rotate-secret", "POST", base + "/authorization/rotate-secret", `{"overlapSeconds":60}`},
	}
}

// Snapshot is what an owner sees of a project, to prove nothing changed.
func Snapshot(c *Client, t testing.TB, projectID string) string {
	t.Helper()
	cc := c.On(t)
	get := cc.Do("GET", "/api/projects/"+projectID, "")
	if get.Status != http.StatusOK {
		t.Fatalf("get project: %d %s", get.Status, get.Raw)
	}
	_, keys := Keys(cc, t, projectID)
	authz := cc.Do("GET", "/api/projects/"+projectID+"/authorization", "")
	if authz.Status != http.StatusOK {
		t.Fatalf("get authorization: %d %s", authz.Status, authz.Raw)
	}
	return get.Raw + keys + authz.Raw
}
