package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// OperatorOptions wire the operator listener (RELAY_DEBUG_ADDR, never the
// public one).
type OperatorOptions struct {
	Actors    *actors.System
	Transport *transport.Server
	Metrics   *Metrics
	Logger    *slog.Logger
	// Token is RELAY_DEBUG_TOKEN: when set, every route requires
	// "Authorization: Bearer <Token>".
	Token string
}

// NewOperator serves /metrics, /debug/actors (JSON), /debug/ (the same for
// a person) and /debug/pprof/, behind the bearer token when one is set.
func NewOperator(o OperatorOptions) http.Handler {
	op := operator{o}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/actors", op.handleActors)
	mux.HandleFunc("GET /debug/{$}", op.handlePage)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/", notFound)
	if o.Token == "" {
		return loopbackHost(mux)
	}
	return requireBearer(o.Token, mux)
}

// loopbackHost guards a listener without a token, which only a loopback
// address may have: a request must name a loopback host. A web page whose
// own name an attacker points at 127.0.0.1 (DNS rebinding) would otherwise
// read these pages from the operator's browser; its requests carry its own
// name.
func loopbackHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsLoopback(r.Host) {
			writeError(w, proto.CodeUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// IsLoopback reports whether host (HOST or HOST:PORT: a Host header or a
// listen address) names only this machine: localhost or a loopback IP. An
// empty host (every interface) and any other name do not.
func IsLoopback(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// requireBearer answers 401 {error: unauthorized} unless the request carries
// "Authorization: Bearer <token>". The comparison is of SHA-256 digests in
// constant time, so neither the token's bytes nor its length leak by timing.
func requireBearer(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !strings.EqualFold(scheme, "Bearer") {
			w.Header().Set("WWW-Authenticate", `Bearer realm="relay operator"`)
			writeError(w, proto.CodeUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

type operator struct{ OperatorOptions }

// actorsView is the /debug/actors body.
type actorsView struct {
	actors.Inspection
	Transport transport.Stats `json:"transport"`
	At        string          `json:"at"`
}

// maxPage bounds one answer, so the endpoint stays cheap whatever the load.
const maxPage = 500

func (op operator) inspect(r *http.Request) (actorsView, int, error) {
	q := r.URL.Query()
	offset, _ := strconv.Atoi(q.Get("offset"))
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit <= 0 || limit > maxPage {
		limit = 50
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	in, err := op.Actors.Inspect(ctx, q.Get("project"), q.Get("channel"), max(offset, 0), limit)
	if err != nil {
		return actorsView{}, http.StatusServiceUnavailable, err
	}
	return actorsView{Inspection: in, Transport: op.Transport.Stats(), At: timestamp(time.Now())}, http.StatusOK, nil
}

// handleActors: ?project=ID narrows to one project (then the page runs over
// its channels), ?channel=NAME or PREFIX* or * lists channels, ?offset= and
// ?limit= (at most 500) page.
func (op operator) handleActors(w http.ResponseWriter, r *http.Request) {
	v, status, err := op.inspect(r)
	if err != nil {
		writeError(w, proto.CodeUnavailable)
		return
	}
	writeJSON(w, status, v)
}

//go:embed operator.html
var operatorPage string

var operatorTemplate = template.Must(template.New("debug").Parse(operatorPage))

func (op operator) handlePage(w http.ResponseWriter, r *http.Request) {
	v, _, err := op.inspect(r)
	if err != nil {
		http.Error(w, "actors did not answer: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := operatorTemplate.Execute(w, v); err != nil && op.Logger != nil {
		op.Logger.Warn("render /debug/", "err", err)
	}
}
