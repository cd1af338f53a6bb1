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
	"time"

	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/store"
)

const usage = "usage: relay [serve|migrate]"

// runCommand parses the command line and runs it until ctx is done.
func runCommand(ctx context.Context, args []string, lookup func(string) (string, bool), logOut io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	if len(args) > 1 || (cmd != "serve" && cmd != "migrate") {
		return errors.New(usage)
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
		return slog.New(slog.NewJSONHandler(out, opts))
	}
	return slog.New(slog.NewTextHandler(out, opts))
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
	log.Info("store ready", "database", dbKind(cfg.DatabaseURL))
	return st, nil
}

// run serves until ctx is done, then shuts down within cfg.ShutdownTimeout.
func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	app, err := start(ctx, cfg, log)
	if err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return app.shutdown(sctx)
}

// app is a started service: what start built and shutdown tears down.
type app struct {
	log    *slog.Logger
	store  *store.Store
	public *http.Server
	addr   net.Addr // bound public address (useful when RELAY_ADDR ends in :0)
	served chan error
}

// start opens the store, binds the listener and serves in the background. It
// prints one line per listener once ready (CONTRACT.md › Build and run).
func start(ctx context.Context, cfg Config, log *slog.Logger) (*app, error) {
	log.Info("starting", cfg.redacted()...)
	if len(cfg.AllowedSignupEmails) == 0 {
		log.Info("signup is closed: ALLOWED_SIGNUP_EMAILS is empty")
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
	handler := api.New(api.Options{
		Store: st, Logger: log, SessionKey: key, CookieSecure: cfg.CookieSecure,
		AllowedSignupEmails: cfg.AllowedSignupEmails,
	})
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("listen on RELAY_ADDR %s: %w", cfg.Addr, err)
	}
	a := &app{
		log: log, store: st, addr: ln.Addr(), served: make(chan error, 1),
		public: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       120 * time.Second,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}
	go func() { a.served <- a.public.Serve(ln) }()
	log.Info("listening", "listener", "public", "addr", ln.Addr().String())
	return a, nil
}

// shutdown stops accepting, lets requests in flight finish, and closes the store.
func (a *app) shutdown(ctx context.Context) error {
	a.log.Info("shutting down")
	err := a.public.Shutdown(ctx)
	if serr := <-a.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
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
