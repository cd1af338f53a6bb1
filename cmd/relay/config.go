package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/relayhq/relay/actors/clustertls"
	"github.com/relayhq/relay/api"
)

// Config is every setting of cmd/relay/README.md › Configuration, typed and validated.
// os.Getenv appears nowhere else.
type Config struct {
	Addr          string // RELAY_ADDR: public HTTP + WebSocket listener
	DebugAddr     string // RELAY_DEBUG_ADDR: operator listener; empty disables it
	DebugToken    string // RELAY_DEBUG_TOKEN: bearer token the operator listener requires; required off loopback
	DatabaseURL   string // DATABASE_URL: sqlite:PATH or postgres://…
	SessionSecret string // SESSION_SECRET: empty means generated once and kept in the store
	CookieSecure  string // COOKIE_SECURE: auto, true or false

	AllowedSignupEmails []string // ALLOWED_SIGNUP_EMAILS, lower-cased; empty means signup is closed

	EmitRatePerMinute       int           // EMIT_RATE_LIMIT_PER_MINUTE: per-channel budget
	ProjectRatePerMinute    int           // PROJECT_RATE_LIMIT_PER_MINUTE: project backstop
	ClientEmitRatePerSecond int           // CLIENT_EMIT_RATE_LIMIT_PER_SECOND: per clientId
	ClientEmitTokenMaxTTL   time.Duration // CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS
	ReplayTTL               time.Duration // REPLAY_BUFFER_TTL_SECONDS
	IdleTimeout             time.Duration // IDLE_TIMEOUT_SECONDS
	ConnectionMaxLifetime   time.Duration // CONNECTION_MAX_LIFETIME_SECONDS
	WebhookTimeout          time.Duration // WEBHOOK_TIMEOUT_MS
	WebhookAllowPrivate     bool          // WEBHOOK_ALLOW_PRIVATE_ADDRESSES: let webhooks reach loopback/private addresses
	UsageRollup             time.Duration // USAGE_ROLLUP_SECONDS
	ShutdownTimeout         time.Duration // SHUTDOWN_TIMEOUT_SECONDS
	ActorDormancy           time.Duration // ACTOR_DORMANCY_SECONDS: quiet period after which an idle channel or project actor stops

	// Abuse limits (cmd/relay/OPERATING.md › Abuse limits and faults).
	MaxSubscriptions int // MAX_SUBSCRIPTIONS_PER_CONNECTION
	MaxConnections   int // MAX_CONNECTIONS_PER_PROJECT (per node)
	LoginAttempts    int // LOGIN_ATTEMPTS_PER_MINUTE: failed logins per email and address (3× per address, an IPv6 address by its /64); past it per email, delayed
	SignupAttempts   int // SIGNUP_ATTEMPTS_PER_MINUTE: per address and per email

	// Bounds on what one client or tenant can make the server hold (cmd/relay/OPERATING.md › Abuse limits).
	MaxClientIDBytes         int           // MAX_CLIENT_ID_BYTES: a presence clientId's length
	MaxPresenceMembers       int           // MAX_PRESENCE_MEMBERS_PER_CHANNEL: distinct clientIds (bounds a sync frame)
	MaxChannelsPerProject    int           // MAX_CHANNELS_PER_PROJECT: live channels of a project, per node
	MaxReplayBytesPerProject int           // MAX_REPLAY_BYTES_PER_PROJECT: replay rings of a project together, per node
	MaxConnectionsPerAddress int           // MAX_CONNECTIONS_PER_ADDRESS: per project and client address, per node
	MaxProjectsPerUser       int           // MAX_PROJECTS_PER_USER
	MaxRevocationsPerProject int           // MAX_REVOCATIONS_PER_PROJECT: stored, unexpired token revocations
	HistoryMaxRetention      time.Duration // HISTORY_MAX_RETENTION_SECONDS: a project's channel history retention at most
	HistoryMaxBytes          int           // HISTORY_MAX_BYTES_PER_PROJECT: the channel history a project keeps in the store at most
	RevokesPerMinute         int           // REVOKE_REQUESTS_PER_MINUTE: revoke endpoint calls per project
	MaxQueuedBytes           int           // MAX_QUEUED_BYTES_PER_CONNECTION: write queue of a socket; past it the peer is a slow consumer
	// The public HTTP listener (cmd/relay/OPERATING.md › Abuse limits).
	HTTPIdleTimeout time.Duration // HTTP_IDLE_TIMEOUT_SECONDS: an idle keep-alive HTTP connection is closed after this
	MaxHTTPConns    int           // MAX_HTTP_CONNECTIONS: open HTTP connections (upgraded WebSockets not counted)
	// MAX_HTTP_CONNECTIONS_PER_ADDRESS: of those, from one TCP peer address
	// (IPv6 by /64); a peer in TRUSTED_PROXIES has no share of its own.
	MaxHTTPConnsPerAddr int
	TrustedProxies      []netip.Prefix // TRUSTED_PROXIES: peers whose X-Forwarded-For names the client
	// Webhook queues, fair between projects (api/README.md › Webhooks and usage).
	WebhookWorkers         int // WEBHOOK_WORKERS: deliveries at once over all projects
	WebhookQueueTotal      int // WEBHOOK_QUEUE_TOTAL: events waiting over all projects
	WebhookQueuePerProject int // WEBHOOK_QUEUE_PER_PROJECT: events waiting for one project
	WebhookInFlightPerProj int // WEBHOOK_IN_FLIGHT_PER_PROJECT: deliveries of one project at once
	// Webhook retries (api/README.md › Webhooks and usage).
	WebhookRetryAttempts int           // WEBHOOK_RETRY_MAX_ATTEMPTS: attempts per event, the first included (1: no retry)
	WebhookRetryFor      time.Duration // WEBHOOK_RETRY_MAX_SECONDS: no attempt starts later than this after the first

	LogFormat string     // LOG_FORMAT: text or json
	LogLevel  slog.Level // LOG_LEVEL: debug, info, warn, error

	// Several nodes as one relay (cmd/relay/CLUSTER.md).
	ClusterEtcd []string // RELAY_CLUSTER_ETCD: etcd endpoints; empty: one node, no cluster code started
	ClusterAddr string   // RELAY_CLUSTER_ADDR: host:port the actor remote listens on and advertises
	ClusterName string   // RELAY_CLUSTER_NAME
	// The cluster's wire (cluster_tls.go): file paths as given, and what was loaded from them.
	ClusterTLSCA, ClusterTLSCert, ClusterTLSKey string                  // RELAY_CLUSTER_TLS_CA, _CERT, _KEY
	ClusterInsecure                             bool                    // RELAY_CLUSTER_INSECURE: a remote without TLS (loopback tests)
	ClusterTLS                                  *clustertls.Credentials // nil on one node and with ClusterInsecure
	EtcdCA, EtcdCert, EtcdKey                   string                  // RELAY_CLUSTER_ETCD_CA, _CERT, _KEY
	EtcdUsername, EtcdPassword                  string                  // RELAY_CLUSTER_ETCD_USERNAME, _PASSWORD
	EtcdTLS                                     *tls.Config             // nil: plain TCP to etcd
}

// configVars lists every variable LoadConfig reads, for the tests: TestSettingsDocumented
// wants one row for each in cmd/relay/README.md › Configuration.
var configVars = []string{
	"RELAY_ADDR", "RELAY_DEBUG_ADDR", "DATABASE_URL", "SESSION_SECRET", "COOKIE_SECURE",
	"ALLOWED_SIGNUP_EMAILS", "EMIT_RATE_LIMIT_PER_MINUTE", "PROJECT_RATE_LIMIT_PER_MINUTE",
	"CLIENT_EMIT_RATE_LIMIT_PER_SECOND", "CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS",
	"REPLAY_BUFFER_TTL_SECONDS", "IDLE_TIMEOUT_SECONDS", "CONNECTION_MAX_LIFETIME_SECONDS",
	"WEBHOOK_TIMEOUT_MS", "WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "USAGE_ROLLUP_SECONDS", "SHUTDOWN_TIMEOUT_SECONDS", "ACTOR_DORMANCY_SECONDS",
	"MAX_SUBSCRIPTIONS_PER_CONNECTION", "MAX_CONNECTIONS_PER_PROJECT", "LOGIN_ATTEMPTS_PER_MINUTE", "SIGNUP_ATTEMPTS_PER_MINUTE",
	"MAX_CLIENT_ID_BYTES", "MAX_PRESENCE_MEMBERS_PER_CHANNEL", "MAX_CHANNELS_PER_PROJECT", "MAX_REPLAY_BYTES_PER_PROJECT",
	"MAX_CONNECTIONS_PER_ADDRESS", "MAX_PROJECTS_PER_USER", "MAX_REVOCATIONS_PER_PROJECT", "REVOKE_REQUESTS_PER_MINUTE",
	"HISTORY_MAX_RETENTION_SECONDS", "HISTORY_MAX_BYTES_PER_PROJECT",
	"MAX_QUEUED_BYTES_PER_CONNECTION",
	"WEBHOOK_WORKERS", "WEBHOOK_QUEUE_TOTAL", "WEBHOOK_QUEUE_PER_PROJECT", "WEBHOOK_IN_FLIGHT_PER_PROJECT",
	"WEBHOOK_RETRY_MAX_ATTEMPTS", "WEBHOOK_RETRY_MAX_SECONDS",
	"LOG_FORMAT", "LOG_LEVEL",
	"RELAY_DEBUG_TOKEN",
	"TRUSTED_PROXIES", "HTTP_IDLE_TIMEOUT_SECONDS", "MAX_HTTP_CONNECTIONS", "MAX_HTTP_CONNECTIONS_PER_ADDRESS",
	"RELAY_CLUSTER_ETCD", "RELAY_CLUSTER_ADDR", "RELAY_CLUSTER_NAME",
	"RELAY_CLUSTER_TLS_CA", "RELAY_CLUSTER_TLS_CERT", "RELAY_CLUSTER_TLS_KEY", "RELAY_CLUSTER_INSECURE",
	"RELAY_CLUSTER_ETCD_CA", "RELAY_CLUSTER_ETCD_CERT", "RELAY_CLUSTER_ETCD_KEY", "RELAY_CLUSTER_ETCD_USERNAME", "RELAY_CLUSTER_ETCD_PASSWORD",
}

// LoadConfig reads the environment through lookup (os.LookupEnv in main) and
// validates all of it, so that nothing knowable at start fails later.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) {
	p := envParser{lookup: lookup}
	c := Config{
		Addr:          p.addr("RELAY_ADDR", ":8080", false),
		DebugAddr:     p.addr("RELAY_DEBUG_ADDR", "127.0.0.1:6060", true),
		DebugToken:    p.secret("RELAY_DEBUG_TOKEN", minDebugToken),
		DatabaseURL:   p.databaseURL("DATABASE_URL", "sqlite:data/relay.db"),
		SessionSecret: p.secret("SESSION_SECRET", 32),
		CookieSecure:  p.oneOf("COOKIE_SECURE", "auto", "auto", "true", "false"),

		AllowedSignupEmails: p.emails("ALLOWED_SIGNUP_EMAILS"),

		EmitRatePerMinute:       p.budget("EMIT_RATE_LIMIT_PER_MINUTE", 600),
		ProjectRatePerMinute:    p.budget("PROJECT_RATE_LIMIT_PER_MINUTE", 6000),
		ClientEmitRatePerSecond: p.budget("CLIENT_EMIT_RATE_LIMIT_PER_SECOND", 15),
		ClientEmitTokenMaxTTL:   p.duration("CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS", 600, time.Second),
		ReplayTTL:               p.duration("REPLAY_BUFFER_TTL_SECONDS", 20, time.Second),
		IdleTimeout:             p.duration("IDLE_TIMEOUT_SECONDS", 600, time.Second),
		ConnectionMaxLifetime:   p.duration("CONNECTION_MAX_LIFETIME_SECONDS", 86400, time.Second),
		WebhookTimeout:          p.duration("WEBHOOK_TIMEOUT_MS", 2500, time.Millisecond),
		WebhookAllowPrivate:     p.oneOf("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "false", "true", "false") == "true",
		UsageRollup:             p.duration("USAGE_ROLLUP_SECONDS", 300, time.Second),
		ShutdownTimeout:         p.duration("SHUTDOWN_TIMEOUT_SECONDS", 15, time.Second),
		ActorDormancy:           p.duration("ACTOR_DORMANCY_SECONDS", 30, time.Second),

		MaxSubscriptions: p.positive("MAX_SUBSCRIPTIONS_PER_CONNECTION", 200),
		MaxConnections:   p.positive("MAX_CONNECTIONS_PER_PROJECT", 10000),
		LoginAttempts:    p.positive("LOGIN_ATTEMPTS_PER_MINUTE", 10),
		SignupAttempts:   p.positive("SIGNUP_ATTEMPTS_PER_MINUTE", 20),

		MaxClientIDBytes:         p.positive("MAX_CLIENT_ID_BYTES", 128),
		MaxPresenceMembers:       p.positive("MAX_PRESENCE_MEMBERS_PER_CHANNEL", 1000),
		MaxChannelsPerProject:    p.positive("MAX_CHANNELS_PER_PROJECT", 10000),
		MaxReplayBytesPerProject: p.positive("MAX_REPLAY_BYTES_PER_PROJECT", 32<<20),
		MaxConnectionsPerAddress: p.positive("MAX_CONNECTIONS_PER_ADDRESS", 500),
		MaxProjectsPerUser:       p.positive("MAX_PROJECTS_PER_USER", 100),
		MaxRevocationsPerProject: p.positive("MAX_REVOCATIONS_PER_PROJECT", 10000),
		HistoryMaxRetention:      p.duration("HISTORY_MAX_RETENTION_SECONDS", 7*86400, time.Second),
		HistoryMaxBytes:          p.positive("HISTORY_MAX_BYTES_PER_PROJECT", 1<<30),
		RevokesPerMinute:         p.positive("REVOKE_REQUESTS_PER_MINUTE", 600),
		// Two full replay rings: a reconnect's replay always fits.
		MaxQueuedBytes:         p.positive("MAX_QUEUED_BYTES_PER_CONNECTION", 2<<20),
		HTTPIdleTimeout:        p.duration("HTTP_IDLE_TIMEOUT_SECONDS", 60, time.Second),
		MaxHTTPConns:           p.positive("MAX_HTTP_CONNECTIONS", 4096),
		TrustedProxies:         p.prefixes("TRUSTED_PROXIES"),
		WebhookWorkers:         p.positive("WEBHOOK_WORKERS", 32),
		WebhookQueueTotal:      p.positive("WEBHOOK_QUEUE_TOTAL", 10000),
		WebhookQueuePerProject: p.positive("WEBHOOK_QUEUE_PER_PROJECT", 1000),
		WebhookInFlightPerProj: p.positive("WEBHOOK_IN_FLIGHT_PER_PROJECT", 2),
		WebhookRetryAttempts:   p.positive("WEBHOOK_RETRY_MAX_ATTEMPTS", 10),
		WebhookRetryFor:        p.duration("WEBHOOK_RETRY_MAX_SECONDS", 300, time.Second),

		LogFormat: p.oneOf("LOG_FORMAT", "text", "text", "json"),
		LogLevel:  p.level("LOG_LEVEL"),

		ClusterEtcd: p.etcdEndpoints("RELAY_CLUSTER_ETCD"),
		ClusterAddr: p.clusterAddr("RELAY_CLUSTER_ADDR"),
		ClusterName: p.clusterName("RELAY_CLUSTER_NAME", "relay"),
	}
	if c.DebugAddr != "" && c.DebugToken == "" && !api.IsLoopback(c.DebugAddr) {
		p.fail("RELAY_DEBUG_ADDR", c.DebugAddr, "not a loopback address, and RELAY_DEBUG_TOKEN is not set: "+
			"set RELAY_DEBUG_TOKEN (the operator listener then requires it as a bearer token) or listen on 127.0.0.1")
	}
	c.MaxHTTPConnsPerAddr = p.httpShare("MAX_HTTP_CONNECTIONS_PER_ADDRESS", c.MaxHTTPConns)
	p.clusterNeeds(c)                 // cluster_config.go
	p.clusterSecurity(&c, time.Now()) // cluster_tls.go
	if len(p.errs) > 0 {
		return Config{}, fmt.Errorf("bad configuration: %s", strings.Join(p.errs, "; "))
	}
	return c, nil
}

// httpShareDivisor makes MAX_HTTP_CONNECTIONS_PER_ADDRESS's default: an
// eighth of MAX_HTTP_CONNECTIONS, so that one address leaves most of the
// listener to the others.
const httpShareDivisor = 8

// httpShare is one address's share of the total connections: at most total
// (more could never be used, and is refused as a mistake), an eighth of it
// by default.
func (p *envParser) httpShare(name string, total int) int {
	return p.positiveAtMost(name, max(1, total/httpShareDivisor), total, fmt.Sprintf("want at most MAX_HTTP_CONNECTIONS (%d)", total))
}

// minDebugToken is the shortest RELAY_DEBUG_TOKEN accepted: enough that it
// cannot be guessed over the network.
const minDebugToken = 16

// envParser collects every problem so one start reports them all.
type envParser struct {
	lookup func(string) (string, bool)
	errs   []string
}

func (p *envParser) raw(name string) string {
	v, _ := p.lookup(name)
	return v
}

func (p *envParser) fail(name, value, why string) {
	p.errs = append(p.errs, fmt.Sprintf("%s=%q: %s", name, value, why))
}

func (p *envParser) get(name string) (string, bool) {
	v := strings.TrimSpace(p.raw(name))
	return v, v != ""
}

func (p *envParser) positive(name string, def int) int {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		p.fail(name, v, "want a whole number greater than 0")
		return def
	}
	return n
}

// maxBudget bounds the emit budgets: a cluster's members send them to each
// other as 32-bit integers, and the dashboard's per-project override has
// the same bound.
const maxBudget = 1_000_000_000

// budget is a rate limit: a whole number from 1 to maxBudget.
func (p *envParser) budget(name string, def int) int {
	return p.positiveAtMost(name, def, maxBudget, fmt.Sprintf("want a whole number from 1 to %d", maxBudget))
}

// positiveAtMost is positive, refused (why) above most.
func (p *envParser) positiveAtMost(name string, def, most int, why string) int {
	n := p.positive(name, def)
	if n > most {
		v, _ := p.get(name)
		p.fail(name, v, why)
		return def
	}
	return n
}

// secret is a signing key, used verbatim. Blank counts as unset, like every
// variable; a value shorter than minLen bytes is refused rather than becoming
// a guessable key.
func (p *envParser) secret(name string, minLen int) string {
	v, _ := p.lookup(name)
	if strings.TrimSpace(v) == "" {
		return ""
	}
	if len(v) < minLen {
		p.fail(name, "(hidden)", fmt.Sprintf("want at least %d bytes", minLen))
		return ""
	}
	return v
}

func (p *envParser) duration(name string, def int, unit time.Duration) time.Duration {
	n := p.positive(name, def)
	if int64(n) > int64(math.MaxInt64/unit) {
		v, _ := p.get(name)
		p.fail(name, v, "too large")
		return time.Duration(def) * unit
	}
	return time.Duration(n) * unit
}

func (p *envParser) oneOf(name, def string, allowed ...string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	v = strings.ToLower(v)
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	p.fail(name, v, "want one of "+strings.Join(allowed, ", "))
	return def
}

func (p *envParser) addr(name, def string, emptyDisables bool) string {
	if raw, set := p.lookup(name); set && strings.TrimSpace(raw) == "" && emptyDisables {
		return "" // explicitly empty: disabled
	}
	v, ok := p.get(name)
	if !ok {
		return def
	}
	_, port, err := net.SplitHostPort(v)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		p.fail(name, v, "want HOST:PORT, for example :8080 or 127.0.0.1:8080")
		return def
	}
	return v
}

// databaseURL accepts sqlite:PATH or a postgres:// URL that parses, with an
// sslmode the driver knows (the driver would otherwise panic at start, the
// URL's parse error quoting it whole). A refused value is repeated with its
// password hidden.
func (p *envParser) databaseURL(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	switch {
	case strings.HasPrefix(v, "sqlite:") && len(v) > len("sqlite:"):
	case strings.HasPrefix(v, "postgres://"), strings.HasPrefix(v, "postgresql://"):
		u, err := url.Parse(v)
		if err != nil {
			// url's error quotes the whole value: say why in our own words.
			p.fail(name, redactDatabaseURL(v), "not a valid URL; want postgres://USER:PASSWORD@HOST:PORT/DB (percent-encode special characters)")
			return def
		}
		switch u.Query().Get("sslmode") {
		case "", "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
		default:
			p.fail(name, redactDatabaseURL(v), "sslmode: want disable, allow, prefer, require, verify-ca or verify-full")
			return def
		}
	default:
		p.fail(name, redactDatabaseURL(v), "want sqlite:PATH or postgres://…")
		return def
	}
	return v
}

// passwordParamRe finds password=… in a query string or a key=value DSN.
var passwordParamRe = regexp.MustCompile(`(?i)(password=)[^&\s]*`)

// redactDatabaseURL hides the password of a database URL, for messages and
// logs: the userinfo password of a URL that parses (the user stays), else
// everything between the scheme and the last @, and any password= parameter.
func redactDatabaseURL(v string) string {
	if u, err := url.Parse(v); err == nil && u.Opaque == "" {
		v = u.Redacted() // the password as "xxxxx", the user kept
	} else if at := strings.LastIndex(v, "@"); at >= 0 {
		start := 0
		if i := strings.Index(v, "://"); i >= 0 && i < at {
			start = i + len("://")
		} else if i := strings.Index(v, ":"); i >= 0 && i < at {
			start = i + 1
		}
		v = v[:start] + "xxxxx" + v[at:]
	}
	return passwordParamRe.ReplaceAllString(v, "${1}xxxxx")
}

func (p *envParser) emails(name string) []string {
	v, _ := p.get(name)
	var out []string
	for _, e := range strings.Split(v, ",") {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		if !strings.Contains(e, "@") {
			p.fail(name, e, "not an email address")
			continue
		}
		out = append(out, e)
	}
	return out
}

// prefixes reads comma-separated CIDRs (a bare address is its own /32 or
// /128). An IPv4-mapped IPv6 prefix becomes its IPv4 prefix, since client
// addresses are compared unmapped.
func (p *envParser) prefixes(name string) []netip.Prefix {
	v, _ := p.get(name)
	var out []netip.Prefix
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(e)
		if err != nil {
			a, aerr := netip.ParseAddr(e)
			if aerr != nil || a.Zone() != "" {
				p.fail(name, e, "want a CIDR such as 10.0.0.0/8 or 2001:db8::/32, or an address")
				continue
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		if a := pfx.Addr(); a.Is4In6() && pfx.Bits() >= 96 {
			pfx = netip.PrefixFrom(a.Unmap(), pfx.Bits()-96)
		}
		out = append(out, pfx.Masked())
	}
	return out
}

func (p *envParser) level(name string) slog.Level {
	v, ok := p.get(name)
	if !ok {
		return slog.LevelInfo
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(v)); err != nil {
		p.fail(name, v, "want debug, info, warn or error")
		return slog.LevelInfo
	}
	return l
}

// redacted is the config summary logged at start: secrets never appear.
func (c Config) redacted() []any {
	return []any{
		"addr", c.Addr, "debug_addr", c.DebugAddr, "debug_token_set", c.DebugToken != "", "database", dbKind(c.DatabaseURL),
		"session_secret_from_env", c.SessionSecret != "", "cookie_secure", c.CookieSecure,
		"signup_allowlist", len(c.AllowedSignupEmails),
		"emit_rate_per_minute", c.EmitRatePerMinute, "project_rate_per_minute", c.ProjectRatePerMinute,
		"client_emit_rate_per_second", c.ClientEmitRatePerSecond,
		"client_emit_token_max_ttl", c.ClientEmitTokenMaxTTL, "replay_ttl", c.ReplayTTL,
		"idle_timeout", c.IdleTimeout, "max_lifetime", c.ConnectionMaxLifetime,
		"webhook_timeout", c.WebhookTimeout, "webhook_allow_private", c.WebhookAllowPrivate,
		"usage_rollup", c.UsageRollup, "shutdown_timeout", c.ShutdownTimeout, "actor_dormancy", c.ActorDormancy,
		"max_subscriptions_per_connection", c.MaxSubscriptions, "max_connections_per_project", c.MaxConnections,
		"login_attempts_per_minute", c.LoginAttempts, "signup_attempts_per_minute", c.SignupAttempts,
		"max_client_id_bytes", c.MaxClientIDBytes, "max_presence_members_per_channel", c.MaxPresenceMembers,
		"max_channels_per_project", c.MaxChannelsPerProject, "max_replay_bytes_per_project", c.MaxReplayBytesPerProject,
		"max_connections_per_address", c.MaxConnectionsPerAddress, "max_projects_per_user", c.MaxProjectsPerUser,
		"max_revocations_per_project", c.MaxRevocationsPerProject, "revoke_requests_per_minute", c.RevokesPerMinute,
		"max_queued_bytes_per_connection", c.MaxQueuedBytes,
		"http_idle_timeout", c.HTTPIdleTimeout, "max_http_connections", c.MaxHTTPConns, "max_http_connections_per_address", c.MaxHTTPConnsPerAddr, "trusted_proxies", prefixList(c.TrustedProxies),
		"webhook_workers", c.WebhookWorkers, "webhook_queue_total", c.WebhookQueueTotal,
		"webhook_queue_per_project", c.WebhookQueuePerProject, "webhook_in_flight_per_project", c.WebhookInFlightPerProj,
		"webhook_retry_max_attempts", c.WebhookRetryAttempts, "webhook_retry_max", c.WebhookRetryFor,
		"log_format", c.LogFormat, "log_level", c.LogLevel,
		"cluster_etcd", strings.Join(c.ClusterEtcd, ","), "cluster_addr", c.ClusterAddr, "cluster_name", c.ClusterName,
		"cluster_tls", c.ClusterTLS != nil, "cluster_insecure", c.ClusterInsecure,
		"cluster_etcd_tls", c.EtcdTLS != nil, "cluster_etcd_user", c.EtcdUsername,
	}
}

// prefixList is TRUSTED_PROXIES as it was understood, comma-separated.
func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// dbKind names the database in logs: the SQLite path (a password=
// parameter hidden, should one be there), or just "postgres".
func dbKind(dsn string) string {
	if strings.HasPrefix(dsn, "sqlite:") {
		return passwordParamRe.ReplaceAllString(dsn, "${1}xxxxx")
	}
	return "postgres"
}
