package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/transport"
)

const usage = `usage: relay command

commands:
  serve     run the relay (make run: on :8080 with the embedded store)
  migrate   apply the store's migrations and exit
  version   print the version, VCS revision and Go version
  admin     manage users, projects and keys on the configured store (relay admin -h)
  cert      make the cluster's CA and node certificates (relay cert -h)
  healthcheck  GET /healthz of the relay on RELAY_ADDR's port here; exit 0 when it answers 200`

// usageError is a command line that cannot run: main exits 2 with it.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// runCommand parses the command line and runs it until ctx is done; what a
// command prints for its user goes to stdout (os.Stdout in main).
func runCommand(ctx context.Context, args []string, lookup func(string) (string, bool), logOut io.Writer) error {
	return runCommandTo(ctx, args, lookup, os.Stdout, logOut)
}

// runCommandTo is runCommand with the command's output going to out.
func runCommandTo(ctx context.Context, args []string, lookup func(string) (string, bool), out, logOut io.Writer) error {
	if len(args) == 0 { // never serve by accident (on every interface): serve is said
		return usageError{usage}
	}
	cmd := args[0]
	switch cmd {
	case "-h", "-help", "--help", "help":
		_, err := fmt.Fprintln(out, usage)
		return err
	case "version":
		if len(args) > 1 {
			return usageError{usage}
		}
		return printVersion(out, readBuildInfo())
	case "admin":
		return runAdmin(ctx, args[1:], lookup, out, logOut)
	case "cert":
		return runCert(args[1:], out, logOut, time.Now())
	case "healthcheck":
		if len(args) > 1 {
			return usageError{usage}
		}
		return runHealthcheck(ctx, lookup, out)
	case "serve", "migrate":
		if len(args) > 1 {
			return usageError{usage}
		}
	default:
		return usageError{usage}
	}
	cfg, err := LoadConfig(lookup)
	if err != nil {
		return err
	}
	log := newLogger(cfg, logOut)
	if cmd == "migrate" {
		st, err := openStore(ctx, cfg, log)
		if err != nil {
			return err
		}
		log.Info("migrations applied")
		return st.Close()
	}
	return run(ctx, cfg, log)
}

func newLogger(cfg Config, out io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		opts.ReplaceAttr = durationString
		return slog.New(slog.NewJSONHandler(out, opts))
	}
	return slog.New(slog.NewTextHandler(out, opts))
}

// durationString writes a duration as a Go duration string ("1m30s"), as the
// text handler does, instead of the JSON handler's nanoseconds.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

func openStore(ctx context.Context, cfg Config, log *slog.Logger) (*store.Store, error) {
	st, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("open store (DATABASE_URL): %w", err)
	}
	if err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, fmt.Errorf("migrate store: %w", err)
	}
	attrs := []any{"database", dbKind(cfg.DatabaseURL)}
	path, fresh := st.SQLiteFile()
	if path != "" {
		attrs = append(attrs, "path", path)
	}
	if fresh {
		// A relay started from another directory than usual lands here with
		// a relative DATABASE_URL: every key then answers 401.
		log.Info("created a new, empty SQLite database", "path", path)
	}
	log.Info("store ready", attrs...)
	return st, nil
}

// dashboardURL is where a browser on this host finds the dashboard of a
// listener bound to addr (an unspecified host is reached as localhost).
func dashboardURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

// run serves until ctx is done, then shuts down within cfg.ShutdownTimeout.
func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	app, err := start(ctx, cfg, log, time.Now)
	if err != nil {
		return err
	}
	var served error
	select {
	case <-ctx.Done():
	case served = <-app.served:
		log.Error("public listener failed", "err", served)
	case served = <-app.clusterLost(): // drain and exit non-zero: a supervisor restarts it as a new member
		log.Error("stopping: this node is out of the cluster", "err", served)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return errors.Join(served, app.shutdown(sctx))
}

// app is a started service: what start built and shutdown tears down.
type app struct {
	// sweepHistory deletes channel history past its project's retention,
	// bounded per run (historySweep*); a background job.
	sweepHistory func(context.Context)
	log          *slog.Logger
	now          func() time.Time
	store        *store.Store
	actors       *actors.System
	webhooks     *webhook.Dispatcher
	usage        *usageRollup
	transport    *transport.Server
	api          *api.Server
	public       *http.Server
	debug        *http.Server // nil when RELAY_DEBUG_ADDR is empty
	addr         net.Addr     // bound public address (useful when RELAY_ADDR ends in :0)
	debugAddr    net.Addr
	httpConns    *connLimit // the public listener's MAX_HTTP_CONNECTIONS and its shares per address
	served       chan error
	stopJobs     context.CancelFunc
	jobsDone     sync.WaitGroup
	cluster      *actors.Cluster // nil on one node (cluster.go)
}

// start opens the store, binds the listener and serves in the background. It
// prints one line per listener once ready (relaytest waits for these lines). now
// is the clock of the windows and timestamps the service keeps (budgets,
// throttles, sessions, tokens, replay, usage days, revocation pruning):
// time.Now, or a test's clock.
func start(ctx context.Context, cfg Config, log *slog.Logger, now func() time.Time) (*app, error) {
	log.Info("starting", cfg.redacted()...)
	if len(cfg.AllowedSignupEmails) == 0 {
		log.Info("signup is closed: ALLOWED_SIGNUP_EMAILS is empty; set it to your email (ALLOWED_SIGNUP_EMAILS=you@example.com make run) to sign up, or create a user with relay admin")
	}
	st, err := openStore(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	key, err := sessionKey(ctx, cfg, st)
	if err != nil {
		st.Close()
		return nil, err
	}
	// Key changes stored from now on are applied as they come
	// (WatchKeyChanges); nothing is cached yet that older ones could touch.
	keyChangesSeen, err := st.LastKeyChange(ctx)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("read key changes: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("listen on RELAY_ADDR %s: %w", cfg.Addr, err)
	}
	tr, err := transport.New(transport.Config{
		// Well above the message cap, so an oversize client-emit still gets
		// its payload_too_large answer rather than a 1009 close.
		MaxMessageBytes: 2 * proto.MaxMessageBytes,
		IdleTimeout:     cfg.IdleTimeout,
		MaxLifetime:     cfg.ConnectionMaxLifetime,
		QueueBytes:      cfg.MaxQueuedBytes,
		Logger:          log.With("component", "transport"),
	})
	if err != nil {
		ln.Close()
		st.Close()
		return nil, fmt.Errorf("start transport: %w", err)
	}
	hooks := webhook.New(webhook.Config{
		Timeout: cfg.WebhookTimeout, AllowPrivate: cfg.WebhookAllowPrivate,
		Workers: cfg.WebhookWorkers, QueueSize: cfg.WebhookQueueTotal,
		ProjectQueue: cfg.WebhookQueuePerProject, ProjectInFlight: cfg.WebhookInFlightPerProj,
		MaxAttempts: cfg.WebhookRetryAttempts, RetryFor: cfg.WebhookRetryFor,
		Logger: log.With("component", "webhook"),
	})
	sys := actors.NewSystem(actors.Config{
		EmitRatePerMinute:       cfg.EmitRatePerMinute,
		ProjectRatePerMinute:    cfg.ProjectRatePerMinute,
		ReplayTTL:               cfg.ReplayTTL,
		ClientEmitRatePerSecond: cfg.ClientEmitRatePerSecond,
		TokenMaxTTL:             cfg.ClientEmitTokenMaxTTL,
		ActorDormancy:           cfg.ActorDormancy,

		MaxClientIDBytes:         cfg.MaxClientIDBytes,
		MaxPresenceMembers:       cfg.MaxPresenceMembers,
		MaxChannelsPerProject:    cfg.MaxChannelsPerProject,
		MaxReplayBytesPerProject: cfg.MaxReplayBytesPerProject,
		MaxConnectionsPerAddress: cfg.MaxConnectionsPerAddress,
		LoadSettings:             settingsLoader(st, now),
		History:                  historyStore{st},
		Webhooks:                 webhookSender(hooks),
		MaxSubscriptions:         cfg.MaxSubscriptions,
		MaxConnections:           cfg.MaxConnections,
		Logger:                   log.With("component", "actors"),
		Now:                      now,
		// The projects' JWKS are fetched as webhooks are sent: same timeout,
		// and private addresses refused unless WEBHOOK_ALLOW_PRIVATE_ADDRESSES.
		JWKSClient: webhook.BoundedGetter{Client: webhook.NewClient(cfg.WebhookTimeout, cfg.WebhookAllowPrivate), Max: actors.JWKSMaxBody},
	})
	metrics := api.NewMetrics(api.MetricSources{Actors: sys, Transport: tr, Webhooks: hooks})
	metrics.Registry.MustRegister(buildInfoGauge(readBuildInfo()))
	st.ObserveQueries(metrics.ObserveQuery)
	handler := api.New(api.Options{
		Store: st, Logger: log, SessionKey: key, CookieSecure: cfg.CookieSecure,
		AllowedSignupEmails: cfg.AllowedSignupEmails,
		Actors:              sys, Transport: tr, TokenMaxTTL: cfg.ClientEmitTokenMaxTTL,
		Metrics: metrics, Webhooks: hooks,

		LoginAttemptsPerMinute: cfg.LoginAttempts,
		SignupsPerMinute:       cfg.SignupAttempts,

		MaxProjectsPerUser:       cfg.MaxProjectsPerUser,
		MaxRevocationsPerProject: cfg.MaxRevocationsPerProject,
		HistoryMaxRetention:      cfg.HistoryMaxRetention,
		HistoryMaxBytes:          int64(cfg.HistoryMaxBytes),
		RevokesPerMinute:         cfg.RevokesPerMinute,
		TrustedProxies:           cfg.TrustedProxies,
		KeyChangesSeen:           keyChangesSeen,
		Now:                      now,
	})
	usage := newUsageRollup(st, sys, log)
	usage.now = now
	a := &app{
		log: log, now: now, api: handler, store: st, actors: sys, transport: tr, webhooks: hooks, usage: usage, addr: ln.Addr(), served: make(chan error, 1),
		public: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       cfg.HTTPIdleTimeout,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}
	if err := a.joinCluster(cfg, metrics); err != nil { // before serving: a node serves only as a member
		ln.Close()
		a.stopJobs = func() {}
		a.shutdown(context.Background())
		return nil, err
	}
	limited := newConnLimit(ln, cfg.MaxHTTPConns, cfg.MaxHTTPConnsPerAddr, cfg.TrustedProxies, log)
	a.public.ConnState = limited.connState
	a.httpConns = limited
	go func() { a.served <- a.public.Serve(limited) }()
	log.Info("listening", "listener", "public", "addr", ln.Addr().String())
	log.Info("dashboard", "url", dashboardURL(ln.Addr()))

	jobs, stopJobs := context.WithCancel(context.Background())
	a.stopJobs = stopJobs
	a.every(jobs, 10*time.Minute, a.pruner("token revocations", a.store.PruneRevocations))
	a.every(jobs, 10*time.Minute, a.pruner("session revocations", a.store.PruneSessionRevocations))
	a.every(jobs, cfg.UsageRollup, a.usage.flush)
	// Keys: last uses written once a minute, sockets of keys whose overlap
	// window ended closed (README › Keys).
	a.every(jobs, time.Second, a.api.KeyTick)
	// Keys revoked or rotated by another process (relay admin, a node of
	// another cluster) are refused here within about a second.
	a.every(jobs, time.Second, a.api.WatchKeyChanges)
	// Channel history past its retention or its project's size cap, beside
	// the emits (which never wait for it): short statements, a bounded run;
	// then each project's stored bytes into its usage row of the day.
	a.sweepHistory = a.pruner("channel history", func(ctx context.Context, now time.Time) (int64, error) {
		n, err := a.store.SweepHistory(ctx, now, int64(cfg.HistoryMaxBytes), historySweepBatch, historySweepMax)
		if err == nil {
			err = a.store.RecordHistoryUsage(ctx, now.UTC().Format(time.DateOnly))
		}
		return n, err
	})
	a.every(jobs, historySweepEvery, a.sweepHistory)
	a.every(jobs, 10*time.Minute, a.pruner("key changes", func(ctx context.Context, now time.Time) (int64, error) {
		return a.store.PruneKeyChanges(ctx, now.Add(-keyChangesKept))
	}))
	if cfg.DebugAddr != "" {
		dln, err := net.Listen("tcp", cfg.DebugAddr)
		if err != nil {
			a.shutdown(context.Background())
			return nil, fmt.Errorf("listen on RELAY_DEBUG_ADDR %s: %w", cfg.DebugAddr, err)
		}
		a.debug = &http.Server{
			Handler:           api.NewOperator(api.OperatorOptions{Actors: sys, Transport: tr, Metrics: metrics, Logger: log, Token: cfg.DebugToken}),
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		go a.debug.Serve(dln)
		a.debugAddr = dln.Addr()
		log.Info("listening", "listener", "debug", "addr", dln.Addr().String())
	}

	return a, nil
}

// keyChangesKept is how long the store keeps a key change for the nodes to
// read: a node that cannot read the store for longer drops every cached key
// when it can again (WatchKeyChanges).
const keyChangesKept = 24 * time.Hour

// every runs job every period until ctx is done.
func (a *app) every(ctx context.Context, period time.Duration, job func(context.Context)) {
	a.jobsDone.Add(1)
	go func() {
		defer a.jobsDone.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				job(ctx)
			}
		}
	}()
}

// The sweep of channel history (its retention and HISTORY_MAX_BYTES_PER_PROJECT):
// every historySweepEvery, rows deleted historySweepBatch a statement, at
// most historySweepMax a run (a backlog takes several runs).
const (
	historySweepEvery = 30 * time.Second
	historySweepBatch = 1000
	historySweepMax   = 20000
)

// pruner deletes stored rows that can no longer matter at the app's now:
// token revocations no token can match, ended sessions whose cookies are
// refused for their age anyway.
func (a *app) pruner(what string, prune func(context.Context, time.Time) (int64, error)) func(context.Context) {
	return func(ctx context.Context) {
		n, err := prune(ctx, a.now())
		if err != nil {
			a.log.Warn("prune "+what, "err", err)
			return
		}
		if n > 0 {
			a.log.Debug("pruned "+what, "count", n)
		}
	}
}

// shutdown refuses new WebSocket handshakes (503), closes every connection
// with 1001 after what is queued for it, lets HTTP requests in flight (emits)
// finish, stops the actors and closes the store.
func (a *app) shutdown(ctx context.Context) error {
	a.log.Info("shutting down", "connections", a.transport.Len())
	// Reaching SHUTDOWN_TIMEOUT_SECONDS is not a failure: what had not
	// finished by then (a peer that stopped reading, a slow webhook receiver)
	// is dropped with a warning, and the process still exits 0 once the rest
	// is done. Other errors make the exit status 1.
	bounded := func(step string, err error) error {
		if errors.Is(err, context.DeadlineExceeded) {
			a.log.Warn("shutdown bound reached; the rest was dropped", "step", step)
			return nil
		}
		return err
	}
	// New emits and handshakes get 503 at once; those in flight finish (an
	// emit whose body is still arriving, up to the bound).
	drained := bounded("finishing emits in flight", a.api.Drain(ctx))
	// In a cluster: hand the channel grains to their next owners and
	// deregister while the sockets are still open, so that the clients,
	// closed next, resume elsewhere with nothing missing from the rings.
	err := errors.Join(drained, bounded("handing off channels", a.handOff(ctx)))
	err = errors.Join(err, bounded("closing connections", a.transport.Shutdown(ctx)))
	if a.debug != nil {
		defer a.debug.Close() // operators can watch the shutdown to the end
	}
	err = errors.Join(err, bounded("finishing HTTP requests", a.public.Shutdown(ctx)))
	select {
	case serr := <-a.served:
		if serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
	default: // run() already took the listener's error
	}
	a.stopJobs()
	a.jobsDone.Wait()
	// After the last connect and emit: no count is lost. The drain may have
	// used up ctx (a peer that never read); the flush still gets a moment of
	// its own, or the counts since the last rollup would go without a word.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	a.usage.flush(fctx)
	a.api.FlushKeyUse(fctx)
	err = errors.Join(err, bounded("leaving the cluster", a.leaveCluster(ctx)))
	err = errors.Join(err, bounded("stopping actors", a.actors.Shutdown(ctx)))
	err = errors.Join(err, bounded("sending queued webhooks", a.webhooks.Close(ctx)))
	err = errors.Join(err, a.store.Close())
	a.log.Info("stopped")
	return err
}

// sessionKey is SESSION_SECRET, or a key generated once and kept in the store
// so that sessions survive restarts and are shared by every node.
func sessionKey(ctx context.Context, cfg Config, st *store.Store) ([]byte, error) {
	if cfg.SessionSecret != "" {
		return []byte(cfg.SessionSecret), nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	v, err := st.MetaSetIfAbsent(ctx, "session_secret", hex.EncodeToString(b))
	if err != nil {
		return nil, fmt.Errorf("load session secret: %w", err)
	}
	return []byte(v), nil
}
