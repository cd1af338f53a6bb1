package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/api/backend"
)

const adminUsage = `usage: relay admin <command> [flags]

Works on the store DATABASE_URL names (migrated first, as serve does); prints JSON on stdout.

commands:
  create-user    --email E --password P
  create-project --email E --name N              prints the project and its raw keys (shown once)
  rotate-key     --project ID --type public|secret prints the new raw key (shown once)
  revoke-key     --project ID --key KEYID
  list-users                                     every account, with how many projects it owns
  show-user      --email E                       the account and its projects
  list-projects  [--email E]                     every project, or those of one account
  show-project   --project ID                    the project, its owner, settings, authorization
                 (without secrets) and keys (masked)
  list-keys      --project ID                    the keys, masked, each with its status
                 (active, overlap, expired, revoked)
  mint-token     --project ID --channel C --client-id X --types a,b [--ttl 5m]
                 a client-emit token signed with the project's client-emit secret
  project authorization --project ID [--on | --off | --rotate-secret [--overlap S]] [--jwks-url URL] [--private-channels LIST]
                 channel authorization (off by default), printed as GET
                 /api/projects/{id}/authorization answers it: --on makes its secret the
                 first time, --off keeps the secret, --rotate-secret makes a new one (the
                 old one valid S more seconds, 0 to 86400; 0: stops at once); --jwks-url
                 sets the JWKS of the project's own keys (RS256/ES256/EdDSA), "" removes it;
                 --private-channels sets the channels marked private besides private-
                 ones (comma-separated names, or prefixes ending in *), "" removes them
  project settings --project ID [--webhook-url U] [--webhook-channel-events on|off]
                 [--webhook-presence-events on|off] [--channel-rate-limit N|default]
                 [--history-retention S]
                 the project's settings, printed as GET /api/projects/{id}/settings answers
                 them, changed first (all or none, as PATCH …/settings) when a flag is given:
                 --webhook-url "" removes the webhook (its secret and events too); the events
                 need a webhook URL; --channel-rate-limit 1 to 1000000000, or default;
                 --history-retention keeps channel messages S seconds (0: off, at most
                 HISTORY_MAX_RETENTION_SECONDS)
  project webhook-secret --project ID [--regenerate]
                 the webhook signing secret, printed as GET /api/projects/{id}/webhook-secret
                 answers it; --regenerate replaces it first (as POST …/webhook-secret; no
                 overlap). Refused while the project has no webhook URL
  project usage  --project ID [--from YYYY-MM-DD] [--to YYYY-MM-DD]
                 the daily usage rows (the last 30 UTC days by default), as GET
                 /api/projects/{id}/usage answers them

Every relay running on the same store refuses a revoked or rotated-out key, and closes its
sockets (4001), within about 2 seconds (cmd/relay/README.md › Version and admin command line); a change of
channel authorization reaches their WebSocket handshakes in the same time, and a change of
settings their running projects.`

// adminRun does an admin command with the store's operations; it returns
// what to print as JSON.
type adminRun func(ctx context.Context, a *api.Admin, cfg Config) (any, error)

// adminSetup registers a command's flags on fs and returns the flags it
// requires, a check of their values before the store is opened (nil: none)
// and the command.
type adminSetup func(fs *flag.FlagSet) (required []string, check func() error, run adminRun)

// runAdmin is `relay admin …`: exit status 2 (usageError) for a bad command
// line, 1 for a failure.
func runAdmin(ctx context.Context, args []string, lookup func(string) (string, bool), out, logOut io.Writer) error {
	if len(args) == 0 {
		return usageError{adminUsage}
	}
	name := args[0]
	if name == "-h" || name == "--help" || name == "help" {
		_, err := fmt.Fprintln(out, adminUsage)
		return err
	}
	if len(args) > 1 { // a command of two words: project authorization
		if _, ok := adminCommands[name+" "+args[1]]; ok {
			name, args = name+" "+args[1], args[1:]
		}
	}
	setup, ok := adminCommands[name]
	if !ok {
		return usageError{fmt.Sprintf("unknown admin command %q\n%s", name, adminUsage)}
	}
	fs := flag.NewFlagSet("relay admin "+name, flag.ContinueOnError)
	fs.SetOutput(logOut)
	required, check, run := setup(fs)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError{fmt.Sprintf("admin %s: %v", name, err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("admin %s: unexpected argument %q", name, fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, r := range required {
		if !set[r] {
			return usageError{fmt.Sprintf("admin %s: --%s is required\n%s", name, r, adminUsage)}
		}
	}
	if check != nil {
		if err := check(); err != nil {
			return usageError{fmt.Sprintf("admin %s: %v", name, err)}
		}
	}
	cfg, err := LoadConfig(lookup)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg, newLogger(cfg, logOut))
	if err != nil {
		return err
	}
	defer st.Close()
	adm := api.NewAdmin(st, cfg.MaxProjectsPerUser)
	adm.SetHistoryMaxRetention(cfg.HistoryMaxRetention)
	res, err := run(ctx, adm, cfg)
	if err != nil {
		return fmt.Errorf("admin %s: %w", name, err)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// adminCommands are the subcommands by name.
var adminCommands = map[string]adminSetup{
	"create-user": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		email := fs.String("email", "", "the account's email")
		password := fs.String("password", "", "its password (at least 8 characters)")
		return []string{"email", "password"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			u, err := a.CreateUser(ctx, *email, *password)
			return api.UserJSON(u), err
		}
	},
	"create-project": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		email := fs.String("email", "", "the owner's email")
		name := fs.String("name", "", "the project's name")
		return []string{"email", "name"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			p, pub, sec, err := a.CreateProject(ctx, *email, *name)
			return api.CreatedProjectJSON(p, pub, sec), err
		}
	},
	"rotate-key": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		keyType := fs.String("type", "", "public or secret")
		check := func() error {
			if *keyType != "public" && *keyType != "secret" {
				return fmt.Errorf("--type must be public or secret, not %q", *keyType)
			}
			return nil
		}
		return []string{"project", "type"}, check, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			k, raw, err := a.RotateKey(ctx, *project, *keyType)
			return api.RotatedKeyJSON(k, raw), err
		}
	},
	"revoke-key": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		key := fs.String("key", "", "the key's id (not the raw key)")
		return []string{"project", "key"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			return map[string]bool{"ok": true}, a.RevokeKey(ctx, *project, *key)
		}
	},
	"list-users": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		return nil, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) { return a.ListUsers(ctx) }
	},
	"show-user": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		email := fs.String("email", "", "the account's email")
		return []string{"email"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) { return a.ShowUser(ctx, *email) }
	},
	"list-projects": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		email := fs.String("email", "", "only the projects of the account with this email")
		return nil, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) { return a.ListProjects(ctx, *email) }
	},
	"show-project": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		return []string{"project"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) { return a.ShowProject(ctx, *project) }
	},
	"list-keys": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		return []string{"project"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) { return a.ListKeys(ctx, *project) }
	},
	"project settings": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		webhookURL := fs.String("webhook-url", "", `the webhook URL (http or https); "" removes the webhook`)
		channelEvents := fs.String("webhook-channel-events", "", "on or off: send channel_occupied and channel_vacated")
		presenceEvents := fs.String("webhook-presence-events", "", "on or off: send member_added and member_removed")
		limit := fs.String("channel-rate-limit", "", "the per-channel emit budget override (messages per minute), or default")
		retention := fs.String("history-retention", "", "keep channel messages this many seconds (0: no history)")
		var u api.SettingsUpdate
		onOff := func(flagName, v string) (*bool, error) {
			switch v {
			case "on":
				return &[]bool{true}[0], nil
			case "off":
				return new(bool), nil
			}
			return nil, fmt.Errorf("--%s must be on or off, not %q", flagName, v)
		}
		check := func() error {
			var err error
			fs.Visit(func(f *flag.Flag) {
				if err != nil {
					return
				}
				switch f.Name {
				case "webhook-url":
					u.WebhookURL = webhookURL
				case "webhook-channel-events":
					u.WebhookChannelEvents, err = onOff(f.Name, *channelEvents)
				case "webhook-presence-events":
					u.WebhookPresenceEvents, err = onOff(f.Name, *presenceEvents)
				case "channel-rate-limit":
					u.SetChannelRateLimit = true
					if *limit != "default" {
						n, perr := strconv.Atoi(strings.TrimSpace(*limit))
						if perr != nil {
							err = fmt.Errorf("--channel-rate-limit must be a whole number or default, not %q", *limit)
							return
						}
						u.ChannelRateLimit = &n
					}
				case "history-retention":
					n, perr := strconv.Atoi(strings.TrimSpace(*retention))
					if perr != nil {
						err = fmt.Errorf("--history-retention must be a whole number of seconds, not %q", *retention)
						return
					}
					u.HistoryRetentionSeconds = &n
				}
			})
			return err
		}
		return []string{"project"}, check, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			if u == (api.SettingsUpdate{}) {
				return a.Settings(ctx, *project)
			}
			return a.UpdateSettings(ctx, *project, u)
		}
	},
	"project webhook-secret": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		regenerate := fs.Bool("regenerate", false, "replace the secret first")
		return []string{"project"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			return a.WebhookSecret(ctx, *project, *regenerate)
		}
	},
	"project usage": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		from := fs.String("from", "", "the first day (YYYY-MM-DD, UTC; default: 29 days before --to)")
		to := fs.String("to", "", "the last day (YYYY-MM-DD, UTC; default: today)")
		return []string{"project"}, nil, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			return a.Usage(ctx, *project, *from, *to)
		}
	},
	"project authorization": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		on := fs.Bool("on", false, "turn channel authorization on (making its secret the first time)")
		off := fs.Bool("off", false, "turn channel authorization off (the secret is kept)")
		rotate := fs.Bool("rotate-secret", false, "replace the authorization secret")
		overlap := fs.Int("overlap", 0, "with --rotate-secret: seconds the old secret stays valid (0 to 86400)")
		jwksURL := fs.String("jwks-url", "", `the JWKS URL of the project's own keys (RS256, ES256, EdDSA tokens); "" removes it`)
		private := fs.String("private-channels", "", `channels marked private besides private- ones, comma-separated (names, or prefixes ending in *); "" removes them`)
		jwksSet, privateSet := false, false
		check := func() error {
			n, overlapSet := 0, false
			fs.Visit(func(f *flag.Flag) {
				switch f.Name {
				case "on", "off", "rotate-secret":
					if f.Value.String() == "true" {
						n++
					}
				case "overlap":
					overlapSet = true
				case "jwks-url":
					jwksSet = true
				case "private-channels":
					privateSet = true
				}
			})
			switch max := int(api.MaxKeyOverlap / time.Second); {
			case n > 1:
				return errors.New("--on, --off and --rotate-secret exclude each other")
			case (jwksSet || privateSet) && *rotate:
				return errors.New("--jwks-url and --private-channels exclude --rotate-secret")
			case overlapSet && !*rotate:
				return errors.New("--overlap goes with --rotate-secret")
			case *overlap < 0 || *overlap > max:
				return fmt.Errorf("--overlap must be from 0 to %d seconds, not %d", max, *overlap)
			}
			return nil
		}
		return []string{"project"}, check, func(ctx context.Context, a *api.Admin, _ Config) (any, error) {
			switch {
			case jwksSet || privateSet:
				var c api.AuthorizationChange
				if *on || *off {
					c.On = on
				}
				if jwksSet {
					c.JWKSURL = jwksURL
				}
				if privateSet {
					list := []string{}
					if *private != "" {
						list = strings.Split(*private, ",")
					}
					c.PrivateChannels = &list
				}
				return a.UpdateAuthorization(ctx, *project, c)
			case *on, *off:
				return a.SetAuthorization(ctx, *project, *on)
			case *rotate:
				return a.RotateAuthSecret(ctx, *project, time.Duration(*overlap)*time.Second)
			}
			return a.Authorization(ctx, *project)
		}
	},
	"mint-token": func(fs *flag.FlagSet) ([]string, func() error, adminRun) {
		project := fs.String("project", "", "the project's id")
		channel := fs.String("channel", "", "the channel the token may emit on")
		clientID := fs.String("client-id", "", "the clientId the token is for")
		types := fs.String("types", "", "comma-separated event types the token may emit")
		ttl := fs.Duration("ttl", 5*time.Minute, "lifetime (at most CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS)")
		var list []string
		check := func() error {
			for _, t := range strings.Split(*types, ",") {
				if t = strings.TrimSpace(t); t != "" {
					list = append(list, t)
				}
			}
			switch {
			case *channel == "" || *clientID == "":
				return errors.New("--channel and --client-id must not be empty")
			case len(list) == 0:
				return errors.New("--types names no event type")
			case *ttl <= 0:
				return errors.New("--ttl must be positive")
			}
			return nil
		}
		return []string{"project", "channel", "client-id", "types"}, check, func(ctx context.Context, a *api.Admin, cfg Config) (any, error) {
			if *ttl > cfg.ClientEmitTokenMaxTTL {
				return nil, fmt.Errorf("--ttl %v is longer than CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS (%v): the relay would refuse the token", *ttl, cfg.ClientEmitTokenMaxTTL)
			}
			p, secret, err := a.ClientEmitSecret(ctx, *project)
			if err != nil {
				return nil, err
			}
			if secret == "" {
				return nil, errors.New("the project has no client-emit secret yet: set one in the dashboard or with PATCH /api/projects/{id}/client-emit-secret")
			}
			now := time.Now()
			tok, err := backend.MintClientEmitToken(backend.TokenOptions{
				Secret: secret, ProjectID: p.ID, Channel: *channel, ClientID: *clientID, Types: list, TTL: *ttl, Now: now,
			})
			if err != nil {
				return nil, err
			}
			return map[string]any{
				"token": tok, "projectId": p.ID, "channel": *channel, "clientId": *clientID, "types": list,
				"expiresAt": now.Add(*ttl).UTC().Format(time.RFC3339),
			}, nil
		}
	},
}
