package main

// Tests of LoadConfig against cmd/relay/README.md › Configuration, and of how the
// command reports configuration at start.

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// cfgEnv turns a map into a lookup function; a key present with "" is set
// but empty, an absent key is unset.
func cfgEnv(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// cfgField is one checked field of a Config.
type cfgField struct {
	name      string
	got, want any
}

func cfgFields(c Config) map[string]any {
	return map[string]any{
		"RELAY_ADDR":                        c.Addr,
		"RELAY_DEBUG_ADDR":                  c.DebugAddr,
		"RELAY_DEBUG_TOKEN":                 c.DebugToken,
		"DATABASE_URL":                      c.DatabaseURL,
		"SESSION_SECRET":                    c.SessionSecret,
		"COOKIE_SECURE":                     c.CookieSecure,
		"ALLOWED_SIGNUP_EMAILS":             len(c.AllowedSignupEmails),
		"EMIT_RATE_LIMIT_PER_MINUTE":        c.EmitRatePerMinute,
		"PROJECT_RATE_LIMIT_PER_MINUTE":     c.ProjectRatePerMinute,
		"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": c.ClientEmitRatePerSecond,
		"CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS": c.ClientEmitTokenMaxTTL,
		"REPLAY_BUFFER_TTL_SECONDS":         c.ReplayTTL,
		"IDLE_TIMEOUT_SECONDS":              c.IdleTimeout,
		"CONNECTION_MAX_LIFETIME_SECONDS":   c.ConnectionMaxLifetime,
		"WEBHOOK_TIMEOUT_MS":                c.WebhookTimeout,
		"WEBHOOK_ALLOW_PRIVATE_ADDRESSES":   c.WebhookAllowPrivate,
		"MAX_SUBSCRIPTIONS_PER_CONNECTION":  c.MaxSubscriptions,
		"MAX_CONNECTIONS_PER_PROJECT":       c.MaxConnections,
		"LOGIN_ATTEMPTS_PER_MINUTE":         c.LoginAttempts,
		"SIGNUP_ATTEMPTS_PER_MINUTE":        c.SignupAttempts,
		"USAGE_ROLLUP_SECONDS":              c.UsageRollup,
		"SHUTDOWN_TIMEOUT_SECONDS":          c.ShutdownTimeout,
		"ACTOR_DORMANCY_SECONDS":            c.ActorDormancy,
		"MAX_CLIENT_ID_BYTES":               c.MaxClientIDBytes,
		"MAX_PRESENCE_MEMBERS_PER_CHANNEL":  c.MaxPresenceMembers,
		"MAX_CHANNELS_PER_PROJECT":          c.MaxChannelsPerProject,
		"MAX_REPLAY_BYTES_PER_PROJECT":      c.MaxReplayBytesPerProject,
		"MAX_CONNECTIONS_PER_ADDRESS":       c.MaxConnectionsPerAddress,
		"MAX_PROJECTS_PER_USER":             c.MaxProjectsPerUser,
		"MAX_REVOCATIONS_PER_PROJECT":       c.MaxRevocationsPerProject,
		"REVOKE_REQUESTS_PER_MINUTE":        c.RevokesPerMinute,
		"HISTORY_MAX_RETENTION_SECONDS":     c.HistoryMaxRetention,
		"HISTORY_MAX_BYTES_PER_PROJECT":     c.HistoryMaxBytes,
		"MAX_QUEUED_BYTES_PER_CONNECTION":   c.MaxQueuedBytes,
		"WEBHOOK_WORKERS":                   c.WebhookWorkers,
		"WEBHOOK_QUEUE_TOTAL":               c.WebhookQueueTotal,
		"WEBHOOK_QUEUE_PER_PROJECT":         c.WebhookQueuePerProject,
		"WEBHOOK_IN_FLIGHT_PER_PROJECT":     c.WebhookInFlightPerProj,
		"WEBHOOK_RETRY_MAX_ATTEMPTS":        c.WebhookRetryAttempts,
		"WEBHOOK_RETRY_MAX_SECONDS":         c.WebhookRetryFor,
		"LOG_FORMAT":                        c.LogFormat,
		"LOG_LEVEL":                         c.LogLevel,
		"TRUSTED_PROXIES":                   prefixList(c.TrustedProxies),
		"HTTP_IDLE_TIMEOUT_SECONDS":         c.HTTPIdleTimeout,
		"MAX_HTTP_CONNECTIONS":              c.MaxHTTPConns,
		"MAX_HTTP_CONNECTIONS_PER_ADDRESS":  c.MaxHTTPConnsPerAddr,
		"RELAY_CLUSTER_ETCD":                strings.Join(c.ClusterEtcd, ","),
		"RELAY_CLUSTER_ADDR":                c.ClusterAddr,
		"RELAY_CLUSTER_NAME":                c.ClusterName,
		"RELAY_CLUSTER_TLS_CA":              c.ClusterTLSCA,
		"RELAY_CLUSTER_TLS_CERT":            c.ClusterTLSCert,
		"RELAY_CLUSTER_TLS_KEY":             c.ClusterTLSKey,
		"RELAY_CLUSTER_INSECURE":            c.ClusterInsecure,
		"RELAY_CLUSTER_ETCD_CA":             c.EtcdCA,
		"RELAY_CLUSTER_ETCD_CERT":           c.EtcdCert,
		"RELAY_CLUSTER_ETCD_KEY":            c.EtcdKey,
		"RELAY_CLUSTER_ETCD_USERNAME":       c.EtcdUsername,
		"RELAY_CLUSTER_ETCD_PASSWORD":       c.EtcdPassword,
	}
}

// cfgDefaults is cmd/relay/README.md › Configuration's default column.
var cfgDefaults = map[string]any{
	"RELAY_ADDR":                        ":8080",
	"RELAY_DEBUG_ADDR":                  "127.0.0.1:6060",
	"RELAY_DEBUG_TOKEN":                 "", // no token: the operator listener must then be on loopback
	"DATABASE_URL":                      "sqlite:data/relay.db",
	"SESSION_SECRET":                    "", // generated once and kept in the store
	"COOKIE_SECURE":                     "auto",
	"ALLOWED_SIGNUP_EMAILS":             0, // empty: signup closed
	"EMIT_RATE_LIMIT_PER_MINUTE":        600,
	"PROJECT_RATE_LIMIT_PER_MINUTE":     6000,
	"CLIENT_EMIT_RATE_LIMIT_PER_SECOND": 15,
	"CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS": 600 * time.Second,
	"REPLAY_BUFFER_TTL_SECONDS":         20 * time.Second,
	"IDLE_TIMEOUT_SECONDS":              600 * time.Second,
	"CONNECTION_MAX_LIFETIME_SECONDS":   86400 * time.Second,
	"WEBHOOK_TIMEOUT_MS":                2500 * time.Millisecond,
	"WEBHOOK_ALLOW_PRIVATE_ADDRESSES":   false,
	"MAX_SUBSCRIPTIONS_PER_CONNECTION":  200,
	"MAX_CONNECTIONS_PER_PROJECT":       10000,
	"LOGIN_ATTEMPTS_PER_MINUTE":         10,
	"SIGNUP_ATTEMPTS_PER_MINUTE":        20,
	"USAGE_ROLLUP_SECONDS":              300 * time.Second,
	"SHUTDOWN_TIMEOUT_SECONDS":          15 * time.Second,
	"ACTOR_DORMANCY_SECONDS":            30 * time.Second,
	"MAX_CLIENT_ID_BYTES":               128,
	"MAX_PRESENCE_MEMBERS_PER_CHANNEL":  1000,
	"MAX_CHANNELS_PER_PROJECT":          10000,
	"MAX_REPLAY_BYTES_PER_PROJECT":      32 << 20,
	"MAX_CONNECTIONS_PER_ADDRESS":       500,
	"MAX_PROJECTS_PER_USER":             100,
	"MAX_REVOCATIONS_PER_PROJECT":       10000,
	"REVOKE_REQUESTS_PER_MINUTE":        600,
	"HISTORY_MAX_RETENTION_SECONDS":     7 * 86400 * time.Second,
	"HISTORY_MAX_BYTES_PER_PROJECT":     1 << 30,
	"MAX_QUEUED_BYTES_PER_CONNECTION":   2 << 20,
	"WEBHOOK_WORKERS":                   32,
	"WEBHOOK_QUEUE_TOTAL":               10000,
	"WEBHOOK_QUEUE_PER_PROJECT":         1000,
	"WEBHOOK_IN_FLIGHT_PER_PROJECT":     2,
	"WEBHOOK_RETRY_MAX_ATTEMPTS":        10,
	"WEBHOOK_RETRY_MAX_SECONDS":         300 * time.Second,
	"LOG_FORMAT":                        "text",
	"LOG_LEVEL":                         slog.LevelInfo,
	"TRUSTED_PROXIES":                   "", // X-Forwarded-For ignored
	"HTTP_IDLE_TIMEOUT_SECONDS":         60 * time.Second,
	"MAX_HTTP_CONNECTIONS":              4096,
	"MAX_HTTP_CONNECTIONS_PER_ADDRESS":  512, // an eighth of MAX_HTTP_CONNECTIONS
	"RELAY_CLUSTER_ETCD":                "",  // one node
	"RELAY_CLUSTER_ADDR":                "",
	"RELAY_CLUSTER_NAME":                "relay",
	"RELAY_CLUSTER_TLS_CA":              "", // required in a cluster
	"RELAY_CLUSTER_TLS_CERT":            "",
	"RELAY_CLUSTER_TLS_KEY":             "",
	"RELAY_CLUSTER_INSECURE":            false,
	"RELAY_CLUSTER_ETCD_CA":             "", // plain TCP to etcd
	"RELAY_CLUSTER_ETCD_CERT":           "",
	"RELAY_CLUSTER_ETCD_KEY":            "",
	"RELAY_CLUSTER_ETCD_USERNAME":       "",
	"RELAY_CLUSTER_ETCD_PASSWORD":       "",
}

func cfgCheck(t *testing.T, c Config, want map[string]any) {
	t.Helper()
	got := cfgFields(c)
	for name, w := range want {
		if g := got[name]; !reflect.DeepEqual(g, w) {
			t.Errorf("%s: got %v (%T), want %v (%T)", name, g, g, w, w)
		}
	}
}

func TestLoadConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := LoadConfig(cfgEnv(nil))
	if err != nil {
		t.Fatalf("no variables set: %v", err)
	}
	cfgCheck(t, c, cfgDefaults)
	if c.AllowedSignupEmails != nil && len(c.AllowedSignupEmails) != 0 {
		t.Errorf("ALLOWED_SIGNUP_EMAILS default %q, want empty", c.AllowedSignupEmails)
	}
	// Every variable the config reads is one the tests know about.
	fields := cfgFields(c)
	for _, v := range configVars {
		if _, ok := fields[v]; !ok {
			t.Errorf("configVars lists %s, which these tests do not check", v)
		}
	}
	for v := range cfgDefaults {
		found := false
		for _, cv := range configVars {
			found = found || cv == v
		}
		if !found {
			t.Errorf("%s is not in configVars", v)
		}
	}
}

// TestLoadConfigEmptyMeansDefault: a variable set to "" (or blanks) counts as
// unset, except RELAY_DEBUG_ADDR where empty disables the debug listener.
func TestLoadConfigEmptyMeansDefault(t *testing.T) {
	t.Parallel()
	for _, blank := range []string{"", "   "} {
		vars := map[string]string{}
		for _, v := range configVars {
			vars[v] = blank
		}
		c, err := LoadConfig(cfgEnv(vars))
		if err != nil {
			t.Fatalf("all variables %q: %v", blank, err)
		}
		want := map[string]any{}
		for k, v := range cfgDefaults {
			want[k] = v
		}
		want["RELAY_DEBUG_ADDR"] = ""
		cfgCheck(t, c, want)
	}
}

// TestLoadConfigBlankSessionSecret: a SESSION_SECRET of blanks is no secret.
// Every other variable treats blanks as unset; here the blanks must not
// become the HS256 key of every session (anyone could sign a cookie with
// "   "). Either refuse it, naming the variable, or treat it as unset (the
// cmd/relay/README.md default: generated once and kept in the store).
func TestLoadConfigBlankSessionSecret(t *testing.T) {
	t.Parallel()
	for _, blank := range []string{" ", "   ", "\t", " \n "} {
		t.Run(fmt.Sprintf("%q", blank), func(t *testing.T) {
			c, err := LoadConfig(cfgEnv(map[string]string{"SESSION_SECRET": blank}))
			if err != nil {
				if !strings.Contains(err.Error(), "SESSION_SECRET") {
					t.Fatalf("error %q does not name SESSION_SECRET", err)
				}
				return
			}
			if c.SessionSecret != "" {
				t.Fatalf("SESSION_SECRET=%q accepted as the session signing key %q", blank, c.SessionSecret)
			}
		})
	}
}

// TestLoadConfigSessionSecretLength: SESSION_SECRET is the HS256 key of every
// session (an HS256 JWT); RFC 7518 §3.2 wants at least 256 bits, so a
// shorter value is refused at start, naming the variable but never echoing
// the secret. 32 bytes or more are kept verbatim, blanks included.
func TestLoadConfigSessionSecretLength(t *testing.T) {
	t.Parallel()
	for _, short := range []string{"x", "hunter2", strings.Repeat("k", 31), " padded-but-short "} {
		t.Run(fmt.Sprintf("%d bytes", len(short)), func(t *testing.T) {
			_, err := LoadConfig(cfgEnv(map[string]string{"SESSION_SECRET": short}))
			if err == nil {
				t.Fatalf("SESSION_SECRET of %d bytes accepted", len(short))
			}
			if !strings.Contains(err.Error(), "SESSION_SECRET") {
				t.Fatalf("error %q does not name SESSION_SECRET", err)
			}
			if strings.Contains(err.Error(), strings.TrimSpace(short)) {
				t.Fatalf("error %q shows the secret", err)
			}
		})
	}
	for _, good := range []string{strings.Repeat("k", 32), " k3y-0f-32-bytes-or-more-for-hs256! ", strings.Repeat("s3cret ", 20)} {
		c, err := LoadConfig(cfgEnv(map[string]string{"SESSION_SECRET": good}))
		if err != nil || c.SessionSecret != good {
			t.Fatalf("SESSION_SECRET of %d bytes: %q, %v; want it verbatim", len(good), c.SessionSecret, err)
		}
	}
}

func TestLoadConfigDebugAddr(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		vars  map[string]string
		want  string
		debug bool
	}{
		{"unset", nil, "127.0.0.1:6060", true},
		{"empty disables", map[string]string{"RELAY_DEBUG_ADDR": ""}, "", false},
		{"blank disables", map[string]string{"RELAY_DEBUG_ADDR": "  "}, "", false},
		{"set", map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:7070"}, "127.0.0.1:7070", true},
		{"port 0", map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:0"}, "127.0.0.1:0", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig(cfgEnv(tc.vars))
			if err != nil {
				t.Fatal(err)
			}
			if c.DebugAddr != tc.want {
				t.Fatalf("DebugAddr %q, want %q", c.DebugAddr, tc.want)
			}
			if (c.DebugAddr != "") != tc.debug {
				t.Fatalf("debug listener enabled=%v, want %v", c.DebugAddr != "", tc.debug)
			}
		})
	}
	// An empty RELAY_ADDR is not "disabled": the public listener always exists.
	c, err := LoadConfig(cfgEnv(map[string]string{"RELAY_ADDR": ""}))
	if err != nil || c.Addr != ":8080" {
		t.Fatalf("empty RELAY_ADDR: %q, %v; want the default :8080", c.Addr, err)
	}
}

func TestLoadConfigValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, value string
		want        any
	}{
		{"RELAY_ADDR", "127.0.0.1:9000", "127.0.0.1:9000"},
		{"RELAY_ADDR", "[::1]:0", "[::1]:0"},
		{"RELAY_ADDR", " :9090 ", ":9090"},
		{"RELAY_DEBUG_ADDR", "localhost:6061", "localhost:6061"},
		{"RELAY_DEBUG_ADDR", "[::1]:6061", "[::1]:6061"},
		{"RELAY_DEBUG_ADDR", "127.0.0.2:6061", "127.0.0.2:6061"},
		{"RELAY_DEBUG_TOKEN", "operator-token-0123456789", "operator-token-0123456789"},
		{"DATABASE_URL", "sqlite:/tmp/x/relay.db", "sqlite:/tmp/x/relay.db"},
		{"DATABASE_URL", "postgres://u:p@db.internal:5432/relay?sslmode=disable", "postgres://u:p@db.internal:5432/relay?sslmode=disable"},
		{"DATABASE_URL", "postgresql://u@localhost/relay", "postgresql://u@localhost/relay"},
		{"SESSION_SECRET", "s3cret with spaces inside, 32+ bytes", "s3cret with spaces inside, 32+ bytes"},
		{"COOKIE_SECURE", "true", "true"},
		{"COOKIE_SECURE", "false", "false"},
		{"COOKIE_SECURE", "auto", "auto"},
		{"COOKIE_SECURE", "TRUE", "true"},
		{"COOKIE_SECURE", " False ", "false"},
		{"EMIT_RATE_LIMIT_PER_MINUTE", "42", 42},
		{"EMIT_RATE_LIMIT_PER_MINUTE", " 1 ", 1},
		{"PROJECT_RATE_LIMIT_PER_MINUTE", "100000", 100000},
		{"CLIENT_EMIT_RATE_LIMIT_PER_SECOND", "3", 3},
		{"CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS", "60", 60 * time.Second},
		{"REPLAY_BUFFER_TTL_SECONDS", "1", time.Second},
		{"IDLE_TIMEOUT_SECONDS", "30", 30 * time.Second},
		{"CONNECTION_MAX_LIFETIME_SECONDS", "3600", time.Hour},
		{"WEBHOOK_TIMEOUT_MS", "100", 100 * time.Millisecond},
		{"USAGE_ROLLUP_SECONDS", "5", 5 * time.Second},
		{"SHUTDOWN_TIMEOUT_SECONDS", "2", 2 * time.Second},
		{"LOG_FORMAT", "json", "json"},
		{"LOG_FORMAT", "JSON", "json"},
		{"LOG_FORMAT", "text", "text"},
		{"LOG_LEVEL", "debug", slog.LevelDebug},
		{"LOG_LEVEL", "warn", slog.LevelWarn},
		{"LOG_LEVEL", "ERROR", slog.LevelError},
		{"LOG_LEVEL", "info", slog.LevelInfo},
		{"TRUSTED_PROXIES", "10.0.0.0/8", "10.0.0.0/8"},
		{"TRUSTED_PROXIES", " 10.0.0.0/8 , 192.168.1.0/24,", "10.0.0.0/8,192.168.1.0/24"},
		{"TRUSTED_PROXIES", "127.0.0.1", "127.0.0.1/32"},
		{"TRUSTED_PROXIES", "::1", "::1/128"},
		{"TRUSTED_PROXIES", "2001:db8::/32,fd00::/8", "2001:db8::/32,fd00::/8"},
		{"TRUSTED_PROXIES", "10.1.2.3/8", "10.0.0.0/8"},
		{"TRUSTED_PROXIES", "::ffff:10.0.0.0/104", "10.0.0.0/8"},
		{"HTTP_IDLE_TIMEOUT_SECONDS", "5", 5 * time.Second},
		{"MAX_HTTP_CONNECTIONS", "100", 100},
		{"MAX_HTTP_CONNECTIONS_PER_ADDRESS", "1", 1},
		{"MAX_HTTP_CONNECTIONS_PER_ADDRESS", "4096", 4096},
		{"RELAY_CLUSTER_NAME", "eu-west_1.relay", "eu-west_1.relay"},
	}
	for _, tc := range cases {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			c, err := LoadConfig(cfgEnv(map[string]string{tc.name: tc.value}))
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]any{}
			for k, v := range cfgDefaults {
				want[k] = v
			}
			want[tc.name] = tc.want
			if tc.name == "MAX_HTTP_CONNECTIONS" { // the share's default follows it
				want["MAX_HTTP_CONNECTIONS_PER_ADDRESS"] = tc.want.(int) / 8
			}
			cfgCheck(t, c, want)
		})
	}
}

// TestLoadConfigHTTPShare: MAX_HTTP_CONNECTIONS_PER_ADDRESS defaults to an
// eighth of MAX_HTTP_CONNECTIONS (at least 1), and may not exceed it.
func TestLoadConfigHTTPShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		total, share string
		want         int
	}{
		{"8", "", 1},
		{"7", "", 1},
		{"1", "", 1},
		{"17", "", 2},
		{"3", "3", 3},
		{"100", "99", 99},
	} {
		c, err := LoadConfig(cfgEnv(map[string]string{"MAX_HTTP_CONNECTIONS": tc.total, "MAX_HTTP_CONNECTIONS_PER_ADDRESS": tc.share}))
		if err != nil {
			t.Fatalf("MAX_HTTP_CONNECTIONS=%s MAX_HTTP_CONNECTIONS_PER_ADDRESS=%q: %v", tc.total, tc.share, err)
		}
		if c.MaxHTTPConnsPerAddr != tc.want {
			t.Errorf("MAX_HTTP_CONNECTIONS=%s MAX_HTTP_CONNECTIONS_PER_ADDRESS=%q: share %d, want %d", tc.total, tc.share, c.MaxHTTPConnsPerAddr, tc.want)
		}
	}
	_, err := LoadConfig(cfgEnv(map[string]string{"MAX_HTTP_CONNECTIONS": "10", "MAX_HTTP_CONNECTIONS_PER_ADDRESS": "11"}))
	want := `bad configuration: MAX_HTTP_CONNECTIONS_PER_ADDRESS="11": want at most MAX_HTTP_CONNECTIONS (10)`
	if err == nil || err.Error() != want {
		t.Fatalf("a share over the total: %v, want %q", err, want)
	}
}

// TestLoadConfigRejects: every bad value stops LoadConfig with an error that
// names the variable (cmd/relay/README.md › Configuration).
func TestLoadConfigRejects(t *testing.T) {
	t.Parallel()
	type bad struct{ name, value string }
	var cases []bad
	positives := []string{
		"EMIT_RATE_LIMIT_PER_MINUTE", "PROJECT_RATE_LIMIT_PER_MINUTE", "CLIENT_EMIT_RATE_LIMIT_PER_SECOND",
		"CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS", "REPLAY_BUFFER_TTL_SECONDS", "IDLE_TIMEOUT_SECONDS",
		"CONNECTION_MAX_LIFETIME_SECONDS", "WEBHOOK_TIMEOUT_MS", "USAGE_ROLLUP_SECONDS", "SHUTDOWN_TIMEOUT_SECONDS",
		"HTTP_IDLE_TIMEOUT_SECONDS", "MAX_HTTP_CONNECTIONS", "MAX_HTTP_CONNECTIONS_PER_ADDRESS",
		"WEBHOOK_WORKERS", "WEBHOOK_QUEUE_TOTAL", "WEBHOOK_QUEUE_PER_PROJECT", "WEBHOOK_IN_FLIGHT_PER_PROJECT",
		"WEBHOOK_RETRY_MAX_ATTEMPTS", "WEBHOOK_RETRY_MAX_SECONDS",
		"ACTOR_DORMANCY_SECONDS", "MAX_CLIENT_ID_BYTES", "MAX_PRESENCE_MEMBERS_PER_CHANNEL", "MAX_CHANNELS_PER_PROJECT",
		"MAX_REPLAY_BYTES_PER_PROJECT", "MAX_CONNECTIONS_PER_ADDRESS", "MAX_PROJECTS_PER_USER", "MAX_REVOCATIONS_PER_PROJECT",
		"REVOKE_REQUESTS_PER_MINUTE", "MAX_QUEUED_BYTES_PER_CONNECTION", "HISTORY_MAX_RETENTION_SECONDS", "HISTORY_MAX_BYTES_PER_PROJECT",
	}
	for _, name := range positives {
		for _, v := range []string{"abc", "-1", "-600", "0", "00", "1.5", "10s", "1e3", "0x10", "5 minutes", "99999999999999999999999"} {
			cases = append(cases, bad{name, v})
		}
	}
	// The budgets travel between a cluster's members as 32-bit integers.
	for _, name := range []string{"EMIT_RATE_LIMIT_PER_MINUTE", "PROJECT_RATE_LIMIT_PER_MINUTE", "CLIENT_EMIT_RATE_LIMIT_PER_SECOND"} {
		cases = append(cases, bad{name, "1000000001"}, bad{name, "3000000000"})
	}
	cases = append(cases,
		bad{"DATABASE_URL", "mysql://u:p@localhost/relay"},
		bad{"DATABASE_URL", "http://localhost/relay"},
		bad{"DATABASE_URL", "sqlite:"},
		bad{"DATABASE_URL", "data/relay.db"},
		bad{"DATABASE_URL", "sqlite3:data/relay.db"},
		bad{"DATABASE_URL", "postgres:relay"},
		bad{"DATABASE_URL", "postgres://u:p@localhost:port/relay"},
		bad{"DATABASE_URL", "postgres://u:p@localhost/relay?sslmode=sometimes"},
		bad{"COOKIE_SECURE", "yes"},
		bad{"COOKIE_SECURE", "1"},
		bad{"COOKIE_SECURE", "on"},
		bad{"COOKIE_SECURE", "secure"},
		bad{"LOG_FORMAT", "xml"},
		bad{"LOG_FORMAT", "logfmt"},
		bad{"LOG_LEVEL", "verbose"},
		bad{"LOG_LEVEL", "trace"},
		bad{"LOG_LEVEL", "loud"},
		bad{"RELAY_ADDR", "8080"},
		bad{"RELAY_ADDR", "localhost"},
		bad{"RELAY_ADDR", ":99999"},
		bad{"RELAY_ADDR", ":-1"},
		bad{"RELAY_ADDR", ":http"},
		bad{"RELAY_ADDR", "a:b:c"},
		bad{"RELAY_DEBUG_ADDR", "nope"},
		bad{"RELAY_DEBUG_ADDR", "127.0.0.1:65536"},
		// Off loopback without RELAY_DEBUG_TOKEN (TestDebugAddrOffLoopbackNeedsToken).
		bad{"RELAY_DEBUG_ADDR", ":6060"},
		bad{"RELAY_DEBUG_ADDR", "0.0.0.0:6060"},
		bad{"RELAY_DEBUG_ADDR", "[::]:6060"},
		bad{"RELAY_DEBUG_ADDR", "10.0.0.5:6060"},
		bad{"RELAY_DEBUG_ADDR", "ops.example.com:6060"},
		bad{"RELAY_DEBUG_TOKEN", "short"},
		bad{"RELAY_DEBUG_TOKEN", "fifteen-bytes!!"},
		bad{"ALLOWED_SIGNUP_EMAILS", "alice"},
		bad{"ALLOWED_SIGNUP_EMAILS", "alice@example.com,bob"},
		bad{"TRUSTED_PROXIES", "10.0.0.0/33"},
		bad{"TRUSTED_PROXIES", "10.0.0/8"},
		bad{"TRUSTED_PROXIES", "proxy.internal"},
		bad{"TRUSTED_PROXIES", "10.0.0.0/8,nope"},
		bad{"TRUSTED_PROXIES", "10.0.0.0/8 192.168.0.0/16"},
		bad{"TRUSTED_PROXIES", "2001:db8::/129"},
		bad{"TRUSTED_PROXIES", "fe80::1%eth0"},
		bad{"TRUSTED_PROXIES", "*"},
		bad{"MAX_HTTP_CONNECTIONS_PER_ADDRESS", "4097"}, // over MAX_HTTP_CONNECTIONS
		// Alone, RELAY_CLUSTER_ETCD is refused: the default store is SQLite,
		// and RELAY_CLUSTER_ADDR is missing (TestLoadConfigCluster).
		bad{"RELAY_CLUSTER_ETCD", "127.0.0.1:2379"},
		bad{"RELAY_CLUSTER_ETCD", "https://etcd.internal:2379"},
		bad{"RELAY_CLUSTER_ETCD", "etcd.internal"},
		bad{"RELAY_CLUSTER_ETCD", ","},
		bad{"RELAY_CLUSTER_ADDR", "10.0.0.5:7946"}, // without RELAY_CLUSTER_ETCD
		bad{"RELAY_CLUSTER_ADDR", "nope"},
		bad{"RELAY_CLUSTER_NAME", "a/b"},
		bad{"RELAY_CLUSTER_NAME", "two words"},
		bad{"RELAY_CLUSTER_NAME", strings.Repeat("n", 65)},
	)
	for _, tc := range cases {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			c, err := LoadConfig(cfgEnv(map[string]string{tc.name: tc.value}))
			if err == nil {
				t.Fatalf("accepted, giving %v", cfgFields(c)[tc.name])
			}
			if !strings.Contains(err.Error(), tc.name) {
				t.Fatalf("error %q does not name %s", err, tc.name)
			}
			if !reflect.DeepEqual(c, Config{}) {
				t.Fatalf("a failed load returned a usable-looking Config: %+v", c)
			}
		})
	}
}

// TestDatabaseURLPasswordNeverShown: a DATABASE_URL is repeated in a refusal
// and named in the start logs, but its password never is, whatever shape the
// value has; a URL the driver could not parse is refused at start rather than
// making it panic (quoting the URL) later.
func TestDatabaseURLPasswordNeverShown(t *testing.T) {
	t.Parallel()
	const secret = "Sup3rS3cret"
	refused := []string{
		"mysql://admin:" + secret + "@db.internal/relay",
		"mysql://admin:" + secret + "@db.internal:3306/relay?password=" + secret,
		"mysql:admin:" + secret + "@db.internal",                          // no //: an opaque URL
		"mysql://admin:p@" + secret + "@db.internal/relay",                // an @ left unescaped
		"postgres://admin:" + secret + "@db.internal:port/relay",          // a bad port
		"postgres://admin:" + secret + "%zz@db.internal/relay",            // a bad escape
		"postgres://admin:" + secret + "#x@db.internal/relay",             // a # left unescaped
		"postgres://admin:" + secret + "/x@db.internal/relay",             // a / left unescaped
		"postgres://admin:" + secret + "@db.internal/relay?sslmode=maybe", // an sslmode the driver refuses
		"postgres://admin@db.internal/relay?sslmode=maybe&password=" + secret,
		"host=db.internal user=admin password=" + secret + " dbname=relay", // a key=value DSN
	}
	for _, v := range refused {
		t.Run(v, func(t *testing.T) {
			_, err := LoadConfig(cfgEnv(map[string]string{"DATABASE_URL": v}))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), "DATABASE_URL") {
				t.Fatalf("error %q does not name DATABASE_URL", err)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "S3cret") {
				t.Fatalf("error %q shows the password", err)
			}
		})
	}

	// An accepted URL: not in the logged config summary, not in the error nor
	// the logs of a start that cannot reach the database.
	v := "postgres://admin:" + secret + "@127.0.0.1:1/relay?sslmode=disable&connect_timeout=2"
	c, err := LoadConfig(cfgEnv(map[string]string{"DATABASE_URL": v}))
	if err != nil || c.DatabaseURL != v {
		t.Fatalf("a valid URL: %v %q", err, c.DatabaseURL)
	}
	if s := fmt.Sprint(c.redacted()...); strings.Contains(s, secret) {
		t.Fatalf("the config summary shows the password: %s", s)
	}
	logs := &relaytest.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = runCommand(ctx, []string{"serve"}, cfgEnv(map[string]string{
		"RELAY_ADDR": "127.0.0.1:0", "RELAY_DEBUG_ADDR": "", "DATABASE_URL": v,
	}), logs)
	if err == nil {
		t.Fatal("serve started on an unreachable database")
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(logs.String(), secret) {
		t.Fatalf("the password shows in the error %q or the logs:\n%s", err, logs)
	}
	if !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("error %q does not name DATABASE_URL", err)
	}
}

// TestLoadConfigRejectsOverflowingDurations: a number of seconds (or ms) too
// large for the server to represent is a bad value knowable at start; it must
// not wrap around into a negative or tiny duration that misbehaves later
// (nothing fails later for a reason that was knowable at start).
func TestLoadConfigRejectsOverflowingDurations(t *testing.T) {
	t.Parallel()
	units := map[string]time.Duration{
		"CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS": time.Second,
		"REPLAY_BUFFER_TTL_SECONDS":         time.Second,
		"IDLE_TIMEOUT_SECONDS":              time.Second,
		"CONNECTION_MAX_LIFETIME_SECONDS":   time.Second,
		"WEBHOOK_TIMEOUT_MS":                time.Millisecond,
		"WEBHOOK_RETRY_MAX_SECONDS":         time.Second,
		"USAGE_ROLLUP_SECONDS":              time.Second,
		"SHUTDOWN_TIMEOUT_SECONDS":          time.Second,
		"HTTP_IDLE_TIMEOUT_SECONDS":         time.Second,
	}
	for name, unit := range units {
		value := fmt.Sprint(int64(math.MaxInt64/unit) + 1)
		t.Run(name+"="+value, func(t *testing.T) {
			c, err := LoadConfig(cfgEnv(map[string]string{name: value}))
			if err == nil {
				t.Fatalf("accepted, giving %v", cfgFields(c)[name])
			}
			if !strings.Contains(err.Error(), name) {
				t.Fatalf("error %q does not name %s", err, name)
			}
		})
	}
}

// TestLoadConfigReportsEveryProblem: one start names every bad variable.
func TestLoadConfigReportsEveryProblem(t *testing.T) {
	t.Parallel()
	_, err := LoadConfig(cfgEnv(map[string]string{
		"EMIT_RATE_LIMIT_PER_MINUTE": "lots",
		"DATABASE_URL":               "mysql://x",
		"COOKIE_SECURE":              "maybe",
		"RELAY_ADDR":                 "8080",
	}))
	if err == nil {
		t.Fatal("accepted four bad values")
	}
	for _, name := range []string{"EMIT_RATE_LIMIT_PER_MINUTE", "DATABASE_URL", "COOKIE_SECURE", "RELAY_ADDR"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
}

func TestLoadConfigSignupEmails(t *testing.T) {
	t.Parallel()
	cases := []struct {
		value string
		want  []string
	}{
		{"", nil},
		{"   ", nil},
		{",", nil},
		{"alice@example.com", []string{"alice@example.com"}},
		{"alice@example.com,bob@example.com", []string{"alice@example.com", "bob@example.com"}},
		{" alice@example.com , bob@example.com ", []string{"alice@example.com", "bob@example.com"}},
		{"Alice@Example.COM,BOB@EXAMPLE.COM", []string{"alice@example.com", "bob@example.com"}},
		{"alice@example.com,,bob@example.com,", []string{"alice@example.com", "bob@example.com"}},
		{"\talice@example.com\t,\n bob@example.com", []string{"alice@example.com", "bob@example.com"}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q", tc.value), func(t *testing.T) {
			c, err := LoadConfig(cfgEnv(map[string]string{"ALLOWED_SIGNUP_EMAILS": tc.value}))
			if err != nil {
				t.Fatal(err)
			}
			got := c.AllowedSignupEmails
			if len(got) == 0 && len(tc.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRunCommandStopsOnBadConfig: `relay serve` with a bad variable returns an
// error naming it, before touching the database or binding a port.
func TestRunCommandStopsOnBadConfig(t *testing.T) {
	t.Parallel()
	serveRefused(t, map[string]string{"IDLE_TIMEOUT_SECONDS": "ten minutes"}, "IDLE_TIMEOUT_SECONDS")

	// The same holds for migrate, and a bad command line is refused.
	logs := &relaytest.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := runCommand(ctx, []string{"migrate"}, cfgEnv(map[string]string{"DATABASE_URL": "mysql://x"}), logs)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("migrate with DATABASE_URL=mysql://x: %v", err)
	}
	for _, args := range [][]string{{"bogus"}, {"serve", "extra"}} {
		if err := runCommand(ctx, args, cfgEnv(nil), logs); err == nil || !strings.Contains(err.Error(), "usage") {
			t.Fatalf("args %q: %v, want a usage error", args, err)
		}
	}
}

// serveRefused runs `relay serve` with env over a fresh SQLite path (the
// public listener on a free loopback port, the operator listener off, unless
// env says otherwise) and fails unless it stops at start, before the
// database file exists, with an error containing each of want.
func serveRefused(t *testing.T, env map[string]string, want ...string) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "relay.db")
	vars := map[string]string{"RELAY_ADDR": "127.0.0.1:0", "RELAY_DEBUG_ADDR": "", "DATABASE_URL": "sqlite:" + db}
	for k, v := range env {
		vars[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := runCommand(ctx, []string{"serve"}, cfgEnv(vars), &relaytest.Buffer{})
	if err == nil || ctx.Err() != nil {
		t.Fatalf("serve with %v: %v; want it refused at start, not run until the deadline", env, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not say %q", err, w)
		}
	}
	if _, statErr := os.Stat(db); !os.IsNotExist(statErr) {
		t.Fatalf("the database was touched before the configuration was checked (stat: %v)", statErr)
	}
}

// TestRunCommandMigrate: `relay migrate` with a good configuration creates the
// schema and returns.
func TestRunCommandMigrate(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "sub", "relay.db")
	logs := &relaytest.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := runCommand(ctx, []string{"migrate"}, cfgEnv(map[string]string{"DATABASE_URL": "sqlite:" + db}), logs); err != nil {
		t.Fatalf("migrate: %v\n%s", err, logs)
	}
	if _, err := os.Stat(db); err != nil {
		t.Fatalf("migrate did not create the database: %v", err)
	}
	if !strings.Contains(logs.String(), "migrations applied") {
		t.Fatalf("migrate logged no completion:\n%s", logs)
	}
}

// TestStartLogsClosedSignup: an empty ALLOWED_SIGNUP_EMAILS is logged at start
// (cmd/relay/README.md › Operators), and only then; the debug listener stays off when its address
// is empty.
func TestStartLogsClosedSignup(t *testing.T) {
	t.Parallel()
	closed := startServer(t, storetest.SQLiteURL(t), map[string]string{"ALLOWED_SIGNUP_EMAILS": ""})
	logs := closed.Logs.String()
	if !strings.Contains(logs, "signup is closed") || !strings.Contains(logs, "ALLOWED_SIGNUP_EMAILS") {
		t.Fatalf("start with an empty ALLOWED_SIGNUP_EMAILS did not log that signup is closed:\n%s", logs)
	}
	r := closed.Client().Do("POST", "/api/auth/signup", `{"email":"alice@example.com","password":"correct horse"}`)
	r.Expect(t, 403, `{"error":"email_not_allowed"}`)

	open := startServer(t, storetest.SQLiteURL(t), nil)
	if logs := open.Logs.String(); strings.Contains(logs, "signup is closed") {
		t.Fatalf("start with an allowlist logged that signup is closed:\n%s", logs)
	}

	// RELAY_DEBUG_ADDR is "" in startServer: one listener line, the public one.
	var listening []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "msg=listening") {
			listening = append(listening, line)
		}
	}
	if len(listening) != 1 || !strings.Contains(listening[0], closed.app.addr.String()) {
		t.Fatalf("want exactly one listener line, for %s; got %q", closed.app.addr, listening)
	}
}

// TestDebugAddrOffLoopbackNeedsToken: the operator listener (pprof, every
// project's live state) is reachable off this machine only behind
// RELAY_DEBUG_TOKEN. Without it, a non-loopback RELAY_DEBUG_ADDR stops the
// start with a message naming both variables, before the database or any
// port is touched; with it, the address is accepted.
func TestDebugAddrOffLoopbackNeedsToken(t *testing.T) {
	t.Parallel()
	const token = "operator-token-0123456789"
	for _, addr := range []string{":6060", "0.0.0.0:6060", "[::]:0", "192.168.1.10:6060", "ops.example.com:6060"} {
		t.Run(addr, func(t *testing.T) {
			_, err := LoadConfig(cfgEnv(map[string]string{"RELAY_DEBUG_ADDR": addr}))
			if err == nil {
				t.Fatal("accepted without RELAY_DEBUG_TOKEN")
			}
			for _, name := range []string{"RELAY_DEBUG_ADDR", "RELAY_DEBUG_TOKEN"} {
				if !strings.Contains(err.Error(), name) {
					t.Fatalf("error %q does not name %s", err, name)
				}
			}
			c, err := LoadConfig(cfgEnv(map[string]string{"RELAY_DEBUG_ADDR": addr, "RELAY_DEBUG_TOKEN": token}))
			if err != nil || c.DebugAddr != addr || c.DebugToken != token {
				t.Fatalf("with a token: %q %q, %v", c.DebugAddr, c.DebugToken, err)
			}
			if s := fmt.Sprint(c.redacted()...); strings.Contains(s, token) {
				t.Fatalf("the config summary shows the token: %s", s)
			}
		})
	}
	for _, addr := range []string{"127.0.0.1:6060", "localhost:6060", "LOCALHOST:0", "[::1]:6060", "127.8.9.10:6060"} {
		if _, err := LoadConfig(cfgEnv(map[string]string{"RELAY_DEBUG_ADDR": addr})); err != nil {
			t.Errorf("loopback %s without a token: %v", addr, err)
		}
	}

	// relay serve refuses to start.
	serveRefused(t, map[string]string{"RELAY_DEBUG_ADDR": "0.0.0.0:0"}, "RELAY_DEBUG_ADDR", "RELAY_DEBUG_TOKEN")
}

// TestLoadConfigCluster: the cluster settings together (cmd/relay/README.md ›
// Configuration and Running several nodes). RELAY_CLUSTER_ETCD needs
// RELAY_CLUSTER_ADDR and a PostgreSQL DATABASE_URL; each refusal names the
// variable at fault.
func TestLoadConfigCluster(t *testing.T) {
	t.Parallel()
	const pg = "postgres://u:p@db.internal:5432/relay?sslmode=disable"
	t.Run("accepted", func(t *testing.T) {
		for _, tc := range []struct {
			vars map[string]string
			etcd []string
			addr string
			name string
		}{
			{map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946",
				"RELAY_CLUSTER_INSECURE": "true"},
				[]string{"127.0.0.1:2379"}, "10.0.0.5:7946", "relay"},
			{map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": " http://e1:2379, e2:2379 ,,http://10.0.0.3:2379",
				"RELAY_CLUSTER_ADDR": "node-1.internal:7946", "RELAY_CLUSTER_NAME": "prod", "RELAY_CLUSTER_INSECURE": "true"},
				[]string{"http://e1:2379", "e2:2379", "http://10.0.0.3:2379"}, "node-1.internal:7946", "prod"},
		} {
			c, err := LoadConfig(cfgEnv(tc.vars))
			if err != nil {
				t.Fatalf("%v: %v", tc.vars, err)
			}
			if !reflect.DeepEqual(c.ClusterEtcd, tc.etcd) || c.ClusterAddr != tc.addr || c.ClusterName != tc.name {
				t.Fatalf("%v: got %q %q %q", tc.vars, c.ClusterEtcd, c.ClusterAddr, c.ClusterName)
			}
		}
	})
	for _, tc := range []struct {
		why   string
		vars  map[string]string
		names []string // every variable the error must name
		says  string
	}{
		{"SQLite", map[string]string{"DATABASE_URL": "sqlite:/tmp/x.db", "RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946"},
			[]string{"RELAY_CLUSTER_ETCD"}, "needs PostgreSQL"},
		{"SQLite by default", map[string]string{"RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946"},
			[]string{"RELAY_CLUSTER_ETCD"}, "needs PostgreSQL"},
		{"no address", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "127.0.0.1:2379"},
			[]string{"RELAY_CLUSTER_ADDR"}, "required with RELAY_CLUSTER_ETCD"},
		{"address without etcd", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ADDR": "10.0.0.5:7946"},
			[]string{"RELAY_CLUSTER_ADDR"}, "without RELAY_CLUSTER_ETCD"},
		{"unspecified address", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "0.0.0.0:7946"},
			[]string{"RELAY_CLUSTER_ADDR"}, "other nodes can reach"},
		{"no host", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": ":7946"},
			[]string{"RELAY_CLUSTER_ADDR"}, "other nodes can reach"},
		{"port 0", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:0"},
			[]string{"RELAY_CLUSTER_ADDR"}, "not port 0"},
		{"IPv6", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "[fd00::5]:7946"},
			[]string{"RELAY_CLUSTER_ADDR"}, "IPv6"},
		{"no TLS on the remote", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "https://e1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946"},
			[]string{"RELAY_CLUSTER_TLS_CA", "RELAY_CLUSTER_TLS_CERT", "RELAY_CLUSTER_TLS_KEY", "RELAY_CLUSTER_INSECURE"}, "needs"},
		{"unknown etcd scheme", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "unix://e1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946",
			"RELAY_CLUSTER_INSECURE": "true"},
			[]string{"RELAY_CLUSTER_ETCD"}, "https://HOST:PORT"},
		{"bad endpoint", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "e1:2379,e2", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946"},
			[]string{"RELAY_CLUSTER_ETCD"}, "HOST:PORT"},
		{"name with a slash", map[string]string{"DATABASE_URL": pg, "RELAY_CLUSTER_ETCD": "e1:2379", "RELAY_CLUSTER_ADDR": "10.0.0.5:7946", "RELAY_CLUSTER_NAME": "eu/west"},
			[]string{"RELAY_CLUSTER_NAME"}, "no '/'"},
		{"all at once", map[string]string{"RELAY_CLUSTER_ETCD": "e1:2379", "RELAY_CLUSTER_NAME": "eu/west"},
			[]string{"RELAY_CLUSTER_ETCD", "RELAY_CLUSTER_ADDR", "RELAY_CLUSTER_NAME"}, ""},
	} {
		t.Run(tc.why, func(t *testing.T) {
			c, err := LoadConfig(cfgEnv(tc.vars))
			if err == nil {
				t.Fatalf("accepted: %q %q %q", c.ClusterEtcd, c.ClusterAddr, c.ClusterName)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %s", err, n)
				}
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
			if strings.Contains(err.Error(), "u:p@") {
				t.Errorf("error %q shows the database password", err)
			}
		})
	}
	// relay serve stops at start, before touching the database.
	serveRefused(t, map[string]string{"RELAY_CLUSTER_ETCD": "127.0.0.1:2379", "RELAY_CLUSTER_ADDR": "127.0.0.1:7946"}, "needs PostgreSQL")
}
