package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/api/web"
	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/transport"
)

// Options wires a Server. Store, Logger and SessionKey are required.
type Options struct {
	Store               *store.Store
	Logger              *slog.Logger
	SessionKey          []byte
	CookieSecure        string   // auto, true or false
	AllowedSignupEmails []string // lower-cased
	Now                 func() time.Time

	// The connection plane; both are required for /emit and /ws. Without
	// Actors, control-plane changes have nothing live to tell.
	Actors    *actors.System
	Transport *transport.Server
	// TokenMaxTTL is CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS: how long a stored
	// revocation can matter.
	TokenMaxTTL time.Duration
	Metrics     *Metrics // nil: nothing observed
	// Webhooks sends the projects' webhooks: its recent deliveries and test
	// events (webhook_deliveries.go). nil: none listed, tests refused.
	Webhooks *webhook.Dispatcher
	// LoginAttemptsPerMinute caps failed logins per email from one client
	// address (and three times that per address), and past it delays those
	// for the email from anywhere (Server.login); SignupsPerMinute caps
	// signups that reach the hash, per address and per email. Zero means no
	// cap.
	LoginAttemptsPerMinute int
	SignupsPerMinute       int
	// Bounds on what one tenant can make the store hold; zero means no cap.
	MaxProjectsPerUser       int // MAX_PROJECTS_PER_USER
	MaxRevocationsPerProject int // MAX_REVOCATIONS_PER_PROJECT: stored, unexpired
	RevokesPerMinute         int // REVOKE_REQUESTS_PER_MINUTE: revoke endpoint calls per project
	// HistoryMaxRetention (HISTORY_MAX_RETENTION_SECONDS) caps a project's
	// history retention; zero: DefaultHistoryMaxRetention.
	HistoryMaxRetention time.Duration
	// HistoryMaxBytes (HISTORY_MAX_BYTES_PER_PROJECT) is shown beside a
	// project's history size on its page; the sweep enforces it.
	HistoryMaxBytes int64
	// TrustedProxies (TRUSTED_PROXIES): from a peer in them, the client
	// address comes from X-Forwarded-For (clientAddr).
	TrustedProxies []netip.Prefix
	// KeyChangesSeen is the number of the last key change stored before the
	// server started (store.LastKeyChange): WatchKeyChanges applies those
	// after it.
	KeyChangesSeen int64
}

// Server is the public HTTP surface.
type Server struct {
	store         *store.Store
	log           *slog.Logger
	sessions      *sessions
	allowedEmails []string
	ops           *projectOps
	handler       http.Handler

	keys      *keyIndex // the API keys the connection plane authenticates
	life      keyLife   // KeyTick's state
	watch     keyWatch  // WatchKeyChanges' state
	actors    *actors.System
	transport *transport.Server
	metrics   *Metrics
	webhooks  *webhook.Dispatcher
	date      httpDate // POST /emit's Date header

	loginPerEmail, loginPerIP, signupPerIP *throttle
	revokesPerProject                      *throttle // the revoke endpoint's budget
	loginPerPair                           *throttle // an email from an address
	signupInvalid                          *throttle // signups refused before the hash, per address
	trustedProxies                         []netip.Prefix

	// draining refuses new connection-plane requests once shutdown begins;
	// inflight counts each emit, handshake and revoke in progress, so that
	// Drain can wait for them (idle wakes it when the last one leaves). A
	// count, not a lock: a drain waiting on a slow request must not hold up
	// the 503s of the requests that come meanwhile. /readyz and
	// /readyz/traffic read draining without touching either.
	inflight atomic.Int64
	idle     chan struct{} // capacity 1
	leave    func()        // s.leaveOne, bound once: enter hands it to every request
	draining atomic.Bool
	now      func() time.Time

	ready readiness // /readyz's cached write check
}

// New builds the public handler.
func New(o Options) *Server {
	if o.Now == nil {
		o.Now = time.Now
	}
	var live liveProjects = noLive{}
	if o.Actors != nil {
		live = o.Actors
	}
	keys := newKeyIndex(storeKeys(o.Store), maxIndexedKeys)
	keys.now = o.Now
	keys.tick(o.Now())
	sess := &sessions{key: o.SessionKey, secure: o.CookieSecure, now: o.Now, state: newSessionState(o.Store, o.Now), log: o.Logger}
	s := &Server{
		store:         o.Store,
		log:           o.Logger,
		sessions:      sess,
		allowedEmails: o.AllowedSignupEmails,
		ops: &projectOps{store: o.Store, keys: keys, live: live, now: o.Now, tokenTTL: o.TokenMaxTTL,
			maxProjects: o.MaxProjectsPerUser, maxRevocations: o.MaxRevocationsPerProject, maxRetention: o.HistoryMaxRetention, maxHistoryBytes: o.HistoryMaxBytes},
		revokesPerProject: newThrottle(o.RevokesPerMinute, o.Now),
		keys:              keys,
		actors:            o.Actors,
		transport:         o.Transport,
		metrics:           o.Metrics,
		webhooks:          o.Webhooks,
		loginPerEmail:     newThrottle(o.LoginAttemptsPerMinute, o.Now),
		loginPerIP:        newThrottle(3*o.LoginAttemptsPerMinute, o.Now),
		signupPerIP:       newThrottle(o.SignupsPerMinute, o.Now),
		now:               o.Now,
		loginPerPair:      newThrottle(o.LoginAttemptsPerMinute, o.Now),
		signupInvalid:     newThrottle(5*o.SignupsPerMinute, o.Now),

		trustedProxies: o.TrustedProxies,
	}
	s.idle = make(chan struct{}, 1)
	s.leave = s.leaveOne
	s.life.lastFlush, s.life.checked = o.Now(), o.Now()
	s.watch.last = o.KeyChangesSeen
	s.loginPerPair.failOpen = true // each address is still capped by loginPerIP
	mux := http.NewServeMux()
	controlPlane{s}.routes(mux)
	mux.Handle("/healthz", methods{http.MethodGet: s.handleHealthz})
	mux.Handle("/readyz", methods{http.MethodGet: s.handleReadyz})
	mux.Handle("/readyz/traffic", methods{http.MethodGet: s.handleReadyzTraffic})
	if s.actors != nil {
		mux.Handle("/emit", methods{http.MethodPost: s.handleEmit})
		mux.Handle("/ws", methods{http.MethodGet: s.handleWS})
		mux.Handle("/emit-tokens/revoke", methods{http.MethodPost: s.handleRevokeTokens})
		s.queryRoutes(mux)
	}
	web.Routes(mux) // /client.js and /demo
	dashboard{Server: s}.routes(mux)
	mux.HandleFunc("/", notFound)
	s.handler = securityHeaders(cleanPaths(mux))
	if s.actors != nil {
		s.handler = emitFirst(s.handler, s.handleEmit)
	}
	return s
}

// emitFirst sends POST /emit, most of the requests a relay serves, straight to
// emit, past the route table (its lookup was 2% of an emit's CPU). Any other
// form of the path (a query aside) takes the table, as before.
func emitFirst(routed http.Handler, emit http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/emit" && r.URL.RawPath == "" {
			setSecurityHeaders(w.Header())
			emit(w, r)
			return
		}
		routed.ServeHTTP(w, r)
	})
}

// Drain makes the connection plane (emit, revoke, WebSocket handshakes)
// answer 503 from now on and waits for the requests already past that check,
// so that every emit answered 200 has been handed to its subscribers' queues
// before the connections are closed; or for ctx, whose error it returns (a
// request whose body is still arriving may take up to the listener's
// ReadTimeout).
func (s *Server) Drain(ctx context.Context) error {
	s.draining.Store(true) // /readyz and /readyz/traffic answer 503 from now on
	for s.inflight.Load() > 0 {
		select {
		case <-s.idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// enter admits a connection-plane request, or answers 503 while draining.
// The caller must call the returned func when done.
func (s *Server) enter(w http.ResponseWriter) (leave func(), ok bool) {
	s.inflight.Add(1) // before the check: a Drain that began counts it, or it sees draining
	if s.draining.Load() {
		s.leaveOne()
		writeError(w, proto.CodeUnavailable)
		return nil, false
	}
	return s.leave, true
}

// leaveOne ends a request counted by enter; the last one out wakes a Drain.
func (s *Server) leaveOne() {
	if s.inflight.Add(-1) == 0 && s.draining.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReadyz answers 200 only when the store commits a write within a
// second (checked at most once a second; readiness.go).
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	// A draining node tells its load balancer at once, so that emits go
	// elsewhere while it hands off and closes its sockets.
	answerReady(w, !s.draining.Load() && s.ready.check(r.Context(), s.store, s.log) == nil)
}

// handleReadyzTraffic is the load balancer's readiness: 200 while this node
// takes emits and handshakes, 503 from the moment it drains. It does not ask
// the store: with the database down, emits and handshakes with cached keys
// still succeed, and a balancer checking /readyz would take every node out at
// once (cmd/relay/OPERATING.md › Abuse limits and faults). A cluster node that loses its
// membership drains at once (cmd/relay run), so it answers 503 too until it
// exits; before it joined, it did not listen.
func (s *Server) handleReadyzTraffic(w http.ResponseWriter, _ *http.Request) {
	answerReady(w, !s.draining.Load())
}

// answerReady writes a readiness answer: 200 {"status":"ok"}, or 503
// {"status":"unavailable"}.
func answerReady(w http.ResponseWriter, ready bool) {
	if !ready {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// securityHeaders sets the headers every response carries.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setSecurityHeaders(w.Header())
		next.ServeHTTP(w, r)
	})
}

func setSecurityHeaders(h http.Header) {
	// The canonical keys and shared values are assigned, not Set: Set
	// allocates a slice per header per response. The slices are never
	// written to (Add would append to a copy: their capacity is 1).
	h["X-Content-Type-Options"] = nosniff
	h["Referrer-Policy"] = referrerSameOrigin
	h["X-Frame-Options"] = frameDeny
	h["Content-Security-Policy"] = csp
}

var (
	nosniff            = []string{"nosniff"}
	referrerSameOrigin = []string{"same-origin"}
	frameDeny          = []string{"DENY"}
	csp                = []string{"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"}
)
