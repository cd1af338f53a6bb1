package actors

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// Tokens signed with a project's own keys (proto/PROTOCOL.md › Channel
// authorization): RS256, ES256 or EdDSA, verified against the JWKS at the
// project's URL. One process-wide jwk.Cache fetches each URL in use, keeps
// the set, and refreshes it in the background; a token whose kid the set
// does not have makes it fetch the set again at once (a key rotation), at
// most once per jwksRefreshEvery per URL. The fetches go through
// Config.JWKSClient: in the server, the webhook client that refuses
// loopback, private and link-local addresses (cmd/relay).

// JWKS bounds.
const (
	// JWKSMaxBody bounds a JWKS answer (the wiring's getter refuses a bigger one).
	JWKSMaxBody = 64 << 10
	// jwksRefreshEvery: a URL is fetched again (a kid it does not have, or
	// the last fetch failed) at most this often.
	jwksRefreshEvery = 5 * time.Second
	// jwksIdle: a URL no token asked for this long leaves the cache (and
	// its background refresh stops).
	jwksIdle = time.Hour
	// jwksMaxURLs bounds the URLs held at once; a token of a URL past it
	// is refused (and logged) until one leaves.
	jwksMaxURLs = 10_000
	// jwksRefreshesPerEntry: after this many forced refreshes a URL gets a
	// fresh cache entry. Each jwk.Cache fetch schedules the entry's next
	// background fetch, so forced refreshes add background fetches that
	// only end with the entry: starting a new one keeps them bounded.
	jwksRefreshesPerEntry = 8
	// jwksWait bounds how long a token waits for a fetch.
	jwksWait     = 5 * time.Second
	jwksLogEvery = time.Minute
)

// Why a JWKS key is not found (logged; the token is invalid_token).
var (
	errJWKSUnavailable = errors.New("JWKS not available")
	errJWKSFull        = errors.New("too many JWKS URLs in use")
	errNoJWKSClient    = errors.New("no JWKS client configured")
	errNoKey           = errors.New("no key in the JWKS for the token's kid and alg")
)

// jwksCache is the process-wide cache of the projects' key sets.
type jwksCache struct {
	client jwk.HTTPClient // nil: no fetches, every such token refused
	log    *slog.Logger
	now    func() time.Time

	start  sync.Once // the jwk.Cache and its goroutines, at the first use
	ctx    context.Context
	cancel context.CancelFunc
	cache  *jwk.Cache

	mu        sync.Mutex
	urls      map[string]*jwksURL
	lastSweep time.Time
	lastLog   time.Time // of the failures not of one URL in use (background refreshes, a full cache)
	closed    bool
}

// jwksURL is what the cache knows of one URL in use. Guarded by jwksCache.mu.
type jwksURL struct {
	key        string // its jwk.Cache entry: the URL, #relay-gen-N
	gen        int
	refreshes  int           // forced refreshes of this entry
	lastFetch  time.Time     // the last fetch a token started
	refreshing chan struct{} // closed when the refresh under way ends; nil: none
	lastUse    time.Time
	lastLog    time.Time // failures are logged at most once per jwksLogEvery
}

func newJWKSCache(client jwk.HTTPClient, log *slog.Logger, now func() time.Time) *jwksCache {
	return &jwksCache{client: client, log: log, now: now, urls: map[string]*jwksURL{}}
}

// close stops the background refreshes; a cache never used started none
// (and starts none after).
func (c *jwksCache) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.start.Do(func() {}) // waits for an init under way
	if c.cancel != nil {
		c.cancel()
	}
}

// errSink logs the background refreshes' failures (rate-limited per URL).
type jwksErrSink struct{ c *jwksCache }

func (s jwksErrSink) Error(err error) { s.c.failed("", err) }

func (c *jwksCache) init() {
	c.start.Do(func() {
		c.ctx, c.cancel = context.WithCancel(context.Background())
		c.cache = jwk.NewCache(c.ctx, jwk.WithErrSink(jwksErrSink{c}))
	})
}

// genMark names an entry's generation in its key, as a URL fragment: the
// client does not send it.
const genMark = "#relay-gen-"

// register makes (or renews) raw's entry, keyed by its generation.
func (c *jwksCache) register(raw string, gen int) (string, error) {
	key := fmt.Sprintf("%s%s%d", raw, genMark, gen)
	if err := c.cache.Register(key, jwk.WithHTTPClient(c.client)); err != nil {
		return "", err
	}
	return key, nil
}

// entry returns raw's entry, registering the URL at its first use; it
// drops the URLs that went unused for jwksIdle (at most once a minute).
func (c *jwksCache) entry(raw string) (*jwksURL, string, error) {
	c.init()
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.cache == nil { // closed (before its first use: no cache)
		return nil, "", errJWKSUnavailable
	}
	if now.Sub(c.lastSweep) >= time.Minute {
		c.lastSweep = now
		for u, e := range c.urls {
			if now.Sub(e.lastUse) >= jwksIdle && e.refreshing == nil {
				_ = c.cache.Unregister(e.key)
				delete(c.urls, u)
			}
		}
	}
	e, ok := c.urls[raw]
	if !ok {
		if len(c.urls) >= jwksMaxURLs {
			return nil, "", errJWKSFull
		}
		key, err := c.register(raw, 0)
		if err != nil {
			return nil, "", err
		}
		e = &jwksURL{key: key, lastFetch: now} // the first Get fetches
		c.urls[raw] = e
	}
	e.lastUse = now
	return e, e.key, nil
}

// failed logs a failure to fetch or read raw's set, at most once per
// jwksLogEvery per URL; the failures not of one URL in use (raw "": a
// background refresh, whose error names its URL; a full cache) at most
// once per jwksLogEvery together.
func (c *jwksCache) failed(raw string, err error) {
	now := c.now()
	c.mu.Lock()
	last := &c.lastLog
	if e := c.urls[raw]; e != nil {
		last = &e.lastLog
	}
	if !last.IsZero() && now.Sub(*last) < jwksLogEvery {
		c.mu.Unlock()
		return
	}
	*last = now
	c.mu.Unlock()
	if raw == "" {
		c.log.Warn("JWKS refresh failed", "err", err)
		return
	}
	c.log.Warn("JWKS fetch failed: tokens signed with its keys are refused", "url", logURL(raw), "err", err)
}

// logURL is u without its query (which may carry a credential).
func logURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Scheme + "://" + u.Host + u.Path
}

// set returns raw's key set, fetching it if the cache has none.
func (c *jwksCache) set(ctx context.Context, raw string) (jwk.Set, *jwksURL, error) {
	e, key, err := c.entry(raw)
	if err != nil {
		return nil, nil, err
	}
	s, err := c.cache.Get(ctx, key)
	if err == nil && s == nil {
		err = errJWKSUnavailable // a first fetch that failed leaves no set
	}
	return s, e, err
}

// refresh fetches raw's set again, unless a fetch started less than
// jwksRefreshEvery ago (ok false); a token that finds a refresh under way
// waits for it.
func (c *jwksCache) refresh(ctx context.Context, raw string, e *jwksURL) (jwk.Set, bool, error) {
	c.mu.Lock()
	if ch := e.refreshing; ch != nil {
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		s, _, err := c.set(ctx, raw)
		return s, true, err
	}
	now := c.now()
	if now.Sub(e.lastFetch) < jwksRefreshEvery || c.urls[raw] != e {
		c.mu.Unlock()
		return nil, false, nil
	}
	done := make(chan struct{})
	e.refreshing, e.lastFetch = done, now
	e.refreshes++
	key, renew, gen := e.key, e.refreshes > jwksRefreshesPerEntry, e.gen+1
	c.mu.Unlock()

	var s jwk.Set
	var err error
	if renew {
		// A new entry (fetched by its first Get); the old one, with the
		// background fetches the refreshes added, leaves the cache.
		var fresh string
		if fresh, err = c.register(raw, gen); err == nil {
			s, err = c.cache.Get(ctx, fresh)
			_ = c.cache.Unregister(key)
			c.mu.Lock()
			e.key, e.gen, e.refreshes = fresh, gen, 0
			c.mu.Unlock()
		}
	} else {
		s, err = c.cache.Refresh(ctx, key)
	}
	if err == nil && s == nil {
		err = errJWKSUnavailable
	}
	c.mu.Lock()
	e.refreshing = nil
	c.mu.Unlock()
	close(done)
	return s, true, err
}

// publicKey finds the key of raw's set that verifies a token with header
// alg and kid: its kid, a kty (and curve) that is alg's, its alg and use
// if it names them. A kid the set lacks makes it fetch the set again
// (rotation), within jwksRefreshEvery.
func (c *jwksCache) publicKey(ctx context.Context, raw, kid string, alg jwa.SignatureAlgorithm) (jwk.Key, error) {
	if c == nil || c.client == nil {
		return nil, errNoJWKSClient
	}
	ctx, cancel := context.WithTimeout(ctx, jwksWait)
	defer cancel()
	s, e, err := c.set(ctx, raw)
	if e == nil {
		c.failed(raw, err)
		return nil, err
	}
	if err == nil {
		if k := keyFor(s, kid, alg); k != nil {
			return k, nil
		}
	}
	fresh, tried, rerr := c.refresh(ctx, raw, e)
	switch {
	case !tried && err != nil:
		c.failed(raw, err)
		return nil, err
	case !tried:
		return nil, errNoKey
	case rerr != nil:
		c.failed(raw, rerr)
		return nil, rerr
	}
	if k := keyFor(fresh, kid, alg); k != nil {
		return k, nil
	}
	return nil, errNoKey
}

// keyFor is the public key of s with kid fit for alg, or nil.
func keyFor(s jwk.Set, kid string, alg jwa.SignatureAlgorithm) jwk.Key {
	if kid == "" {
		return nil
	}
	for i := range s.Len() {
		k, _ := s.Key(i)
		if k == nil || k.KeyID() != kid {
			continue
		}
		if pub := fitFor(k, alg); pub != nil {
			return pub
		}
	}
	return nil
}

// fitFor returns k's public key if k may verify alg: no alg confusion, so
// its kty and curve are alg's (an RSA key of 2048 bits or more for RS256,
// P-256 for ES256, Ed25519 for EdDSA), and its alg and use, if it names
// them, are alg and "sig".
func fitFor(k jwk.Key, alg jwa.SignatureAlgorithm) jwk.Key {
	if u := k.KeyUsage(); u != "" && u != string(jwk.ForSignature) {
		return nil
	}
	if a := k.Algorithm(); a != nil && a.String() != "" && a.String() != alg.String() {
		return nil
	}
	pub, err := jwk.PublicKeyOf(k)
	if err != nil {
		return nil
	}
	var raw any
	if err := pub.Raw(&raw); err != nil {
		return nil
	}
	ok := false
	switch alg {
	case jwa.RS256:
		r, is := raw.(*rsa.PublicKey)
		ok = is && pub.KeyType() == jwa.RSA && r.N.BitLen() >= 2048
	case jwa.ES256:
		e, is := raw.(*ecdsa.PublicKey)
		ok = is && pub.KeyType() == jwa.EC && e.Curve == elliptic.P256()
	case jwa.EdDSA:
		_, is := raw.(ed25519.PublicKey)
		ok = is && pub.KeyType() == jwa.OKP
	}
	if !ok {
		return nil
	}
	return pub
}
