package relaytest

import (
	"html"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The shapes of what the relay makes: ids, keys.
var (
	UUIDRe      = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	PublicKeyRe = regexp.MustCompile(`^pk_live_[A-Za-z0-9_-]{22,}$`) // ≥ 22 base64url chars: ≥ 128 random bits
	SecretKeyRe = regexp.MustCompile(`^sk_live_[A-Za-z0-9_-]{22,}$`)
)

// Password is the password every account the harness signs up has.
const Password = "correct horse"

// Dash is one browser's worth of cookies; it does not follow redirects.
type Dash struct {
	T      testing.TB
	Server *Server
	HTTP   *http.Client
	Origin string // Origin header sent with POSTs ("" sends none)
}

// Dash is a fresh dashboard client of the server, reporting to t.
func (s *Server) Dash(t testing.TB) *Dash {
	jar, _ := cookiejar.New(nil)
	return &Dash{T: t, Server: s, Origin: s.Base, HTTP: &http.Client{
		Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Page is an answer: status, headers and body.
type Page struct {
	Status int
	Header http.Header
	Body   string
}

// Send sends method path with body ("" for none) and header with the
// client's cookies, and reads the answer.
func (c *Dash) Send(method, path, body string, header http.Header) Page {
	c.T.Helper()
	r, err := Do(c.HTTP, method, c.Server.Base+path, body, header)
	if err != nil {
		c.T.Fatal(err)
	}
	return Page{Status: r.Status, Header: r.Header, Body: r.Raw}
}

// Get GETs path.
func (c *Dash) Get(path string) Page {
	c.T.Helper()
	return c.Send("GET", path, "", nil)
}

// Post submits form as a browser would (urlencoded, with Origin).
func (c *Dash) Post(path string, form url.Values) Page {
	c.T.Helper()
	p, err := c.TryPost(path, form)
	if err != nil {
		c.T.Fatal(err)
	}
	return p
}

// TryPost is Post returning its error instead of failing the test, for use
// off the test's goroutine.
func (c *Dash) TryPost(path string, form url.Values) (Page, error) {
	h := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	if c.Origin != "" {
		h.Set("Origin", c.Origin)
	}
	r, err := Do(c.HTTP, "POST", c.Server.Base+path, form.Encode(), h)
	return Page{Status: r.Status, Header: r.Header, Body: r.Raw}, err
}

// Submit posts form with the CSRF token of the page at from.
func (c *Dash) Submit(from, path string, form url.Values) Page {
	c.T.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf", c.Get(from).CSRF(c.T))
	return c.Post(path, form)
}

var (
	csrfRe   = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	errorRe  = regexp.MustCompile(`id="error">([^<]*)<`)
	noticeRe = regexp.MustCompile(`id="notice">([^<]*)<`)
)

// FindText is the first group re finds in body, HTML-unescaped ("" for none).
func FindText(re *regexp.Regexp, body string) string {
	m := re.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// ByID returns the text of the element with id (no nested tags).
func (p Page) ByID(id string) string {
	return FindText(regexp.MustCompile(`id="`+regexp.QuoteMeta(id)+`"[^>]*>([^<]*)<`), p.Body)
}

// CSRF is the page's CSRF token; a page without one fails the test.
func (p Page) CSRF(t testing.TB) string {
	t.Helper()
	tok := FindText(csrfRe, p.Body)
	if tok == "" {
		t.Fatalf("no CSRF token in the page (status %d):\n%s", p.Status, p.Body)
	}
	return tok
}

// ErrorText and NoticeText are the page's error and notice ("" for none).
func (p Page) ErrorText() string  { return FindText(errorRe, p.Body) }
func (p Page) NoticeText() string { return FindText(noticeRe, p.Body) }

// ExpectError fails unless the page has status and an error mentioning want.
func (p Page) ExpectError(t testing.TB, status int, want string) {
	t.Helper()
	if p.Status != status {
		t.Fatalf("status %d, want %d; page:\n%s", p.Status, status, p.Body)
	}
	if !strings.Contains(p.ErrorText(), want) {
		t.Fatalf("error %q, want it to say %q", p.ErrorText(), want)
	}
	if ct := p.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
}

// ExpectRedirect fails unless the answer is a 303 to location.
func (p Page) ExpectRedirect(t testing.TB, location string) {
	t.Helper()
	if p.Status != http.StatusSeeOther || p.Header.Get("Location") != location {
		t.Fatalf("got %d Location %q, want 303 to %q; body:\n%s", p.Status, p.Header.Get("Location"), location, p.Body)
	}
}

// Signup creates the account through the signup form; the client is then
// logged in.
func (c *Dash) Signup(email string) {
	c.T.Helper()
	c.Submit("/signup", "/signup", url.Values{"email": {email}, "password": {Password}}).ExpectRedirect(c.T, "/?done=welcome")
}

// KeysShownRe is where a create or a rotation redirects: the project
// page, which shows the new raw keys once.
var KeysShownRe = regexp.MustCompile(`^/projects/([0-9a-f-]{36})\?done=keys-shown$`)

// Shown follows the 303 that answers a create or a rotation to the project
// page, and returns that page (the one view that shows the raw keys).
func (c *Dash) Shown(r Page) Page {
	c.T.Helper()
	loc := r.Header.Get("Location")
	if r.Status != http.StatusSeeOther || !KeysShownRe.MatchString(loc) {
		c.T.Fatalf("got %d Location %q, want 303 to the project page; body:\n%s", r.Status, loc, r.Body)
	}
	p := c.Get(loc)
	if p.Status != http.StatusOK {
		c.T.Fatalf("GET %s after the redirect: %d\n%s", loc, p.Status, p.Body)
	}
	return p
}

// Create creates a project through the dashboard's form and reads its raw
// keys off the page that shows them once.
func (c *Dash) Create(name string) Project {
	c.T.Helper()
	p := c.Shown(c.Submit("/", "/projects", url.Values{"name": {name}}))
	dp := Project{ID: p.ByID("project-id"), PublicKey: p.ByID("raw-public-key"), SecretKey: p.ByID("raw-secret-key")}
	if !UUIDRe.MatchString(dp.ID) || !PublicKeyRe.MatchString(dp.PublicKey) || !SecretKeyRe.MatchString(dp.SecretKey) {
		c.T.Fatalf("created project page lacks id or raw keys: %+v", dp)
	}
	return dp
}
