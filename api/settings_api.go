package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// A project's settings and usage through the JSON API (api/openapi.yaml)
// and `relay admin`: the webhook URL and the events it is sent, the channel
// budget override and whether a client-emit secret is set, in one object
// (GET and PATCH …/settings), and the daily usage rows (GET …/usage). A
// change goes through the dashboard's operations (projects.go): the same
// checks, the same settings row, the same reload of the running project
// (SettingsChanged here, the key-change watch on nodes that learn of it from
// the store). Secrets are not in these answers: the client-emit secret has
// its own route (…/client-emit-secret), as has the webhook signing secret
// (…/webhook-secret), channel authorization and its secret theirs
// (…/authorization).

var errSettingRequired = &proto.Error{Code: proto.CodeSettingRequired}

// settingsBody is every setting of a project, as GET …/settings answers it.
type settingsBody struct {
	// WebhookURL receives the project's webhooks; null when none.
	WebhookURL *string `json:"webhookUrl"`
	// WebhookEvents: the events sent beyond connect and disconnect
	// (api/README.md › Webhooks and usage); both false without a webhook URL.
	WebhookEvents webhookEventsBody `json:"webhookEvents"`
	// ChannelRateLimit is the per-channel emit budget override, messages per
	// minute; null when the server default (EMIT_RATE_LIMIT_PER_MINUTE)
	// applies.
	ChannelRateLimit *int `json:"channelRateLimit"`
	// HistoryRetentionSeconds keeps the project's channel messages in the
	// store that long (README › Channel history); 0: no history (the default).
	HistoryRetentionSeconds int            `json:"historyRetentionSeconds"`
	ClientEmit              clientEmitBody `json:"clientEmit"`
	Links                   settingsLinks  `json:"links"`
}

type webhookEventsBody struct {
	Channel  bool `json:"channel"`  // channel_occupied, channel_vacated
	Presence bool `json:"presence"` // member_added, member_removed
}

type clientEmitBody struct {
	// SecretSet: the project has a client-emit secret (client-side emit
	// is on). The secret itself is on …/client-emit-secret.
	SecretSet bool `json:"secretSet"`
}

// settingsLinks name the routes of the settings kept apart, and the usage.
type settingsLinks struct {
	Authorization    string `json:"authorization"`
	ClientEmitSecret string `json:"clientEmitSecret"`
	WebhookSecret    string `json:"webhookSecret"`
	Usage            string `json:"usage"`
}

func toSettingsBody(p store.Project, st store.Settings) settingsBody {
	base := "/api/projects/" + p.ID
	b := settingsBody{
		WebhookEvents:           webhookEventsBody{Channel: st.WebhookChannelEvents, Presence: st.WebhookPresenceEvents},
		ClientEmit:              clientEmitBody{SecretSet: p.ClientEmitSecret != ""},
		HistoryRetentionSeconds: st.HistoryRetentionSeconds,
		Links: settingsLinks{Authorization: base + "/authorization", ClientEmitSecret: base + "/client-emit-secret",
			WebhookSecret: base + "/webhook-secret", Usage: base + "/usage"},
	}
	if st.WebhookURL != "" {
		u := st.WebhookURL
		b.WebhookURL = &u
	}
	if st.ChannelRateLimit != nil {
		n := *st.ChannelRateLimit
		b.ChannelRateLimit = &n
	}
	return b
}

// SettingsUpdate is a change of a project's settings; a nil field is left
// as it is.
type SettingsUpdate struct {
	// WebhookURL sets or changes the webhook URL (checked as the dashboard's
	// form checks it); "" (after trimming) removes the webhook, with its
	// signing secret and its choice of events.
	WebhookURL *string
	// WebhookChannelEvents and WebhookPresenceEvents choose the events sent
	// beyond connect and disconnect; the project must have a webhook URL
	// (after WebhookURL's change).
	WebhookChannelEvents, WebhookPresenceEvents *bool
	// SetChannelRateLimit sets the channel budget override to
	// ChannelRateLimit (1 to 1 000 000 000; nil: the server default).
	SetChannelRateLimit bool
	ChannelRateLimit    *int
	// HistoryRetentionSeconds sets the history retention (0 to
	// HISTORY_MAX_RETENTION_SECONDS; 0 turns history off).
	HistoryRetentionSeconds *int
}

func (u SettingsUpdate) empty() bool {
	return u.WebhookURL == nil && u.WebhookChannelEvents == nil && u.WebhookPresenceEvents == nil && !u.SetChannelRateLimit &&
		u.HistoryRetentionSeconds == nil
}

// updateSettingsWith applies u in one change, all or nothing: every value
// is checked first (errInvalidWebhookURL, errInvalidBudget,
// errInvalidRetention), then the
// webhook URL, the events (errNoWebhookURL without a URL) and the budget are
// saved together, and the running project reloads its settings. It returns
// the settings as saved.
func (p ownedProject) updateSettingsWith(ctx context.Context, u SettingsUpdate) (store.Settings, error) {
	if u.empty() {
		return store.Settings{}, errSettingRequired
	}
	var changes []settingsChange
	if u.WebhookURL != nil {
		if strings.TrimSpace(*u.WebhookURL) == "" {
			changes = append(changes, removeWebhookChange)
		} else {
			change, err := webhookURLChange(*u.WebhookURL)
			if err != nil {
				return store.Settings{}, err
			}
			changes = append(changes, change)
		}
	}
	if u.SetChannelRateLimit {
		change, err := channelBudgetChange(u.ChannelRateLimit)
		if err != nil {
			return store.Settings{}, err
		}
		changes = append(changes, change)
	}
	if u.HistoryRetentionSeconds != nil {
		change, err := p.ops.historyRetentionChange(*u.HistoryRetentionSeconds)
		if err != nil {
			return store.Settings{}, err
		}
		changes = append(changes, change)
	}
	if u.WebhookChannelEvents != nil || u.WebhookPresenceEvents != nil {
		changes = append(changes, webhookEventsChange(u.WebhookChannelEvents, u.WebhookPresenceEvents))
	}
	return p.changeSettings(ctx, "save settings", changes...)
}

// settings loads the project's settings as GET …/settings answers them.
func (p ownedProject) settings(ctx context.Context) (settingsBody, error) {
	st, err := p.ops.store.Settings(ctx, p.ID)
	if err != nil {
		return settingsBody{}, fmt.Errorf("load settings: %w", err)
	}
	return toSettingsBody(p.Project, st), nil
}

// The JSON routes.

// settingsPatch is PATCH …/settings' body: any subset of the settings.
type settingsPatch struct {
	// WebhookURL: a string sets it, null or "" removes the webhook.
	WebhookURL optionalField `json:"webhookUrl"`
	// WebhookEvents: either or both; null is as absent.
	WebhookEvents *struct {
		Channel  *bool `json:"channel"`
		Presence *bool `json:"presence"`
	} `json:"webhookEvents"`
	// ChannelRateLimit: a whole number, or null for the server default;
	// anything else is invalid_channel_rate_limit (parseBudget, as the
	// dashboard's field).
	ChannelRateLimit json.RawMessage `json:"channelRateLimit"`
	// HistoryRetentionSeconds: a whole number of seconds from 0 to
	// HISTORY_MAX_RETENTION_SECONDS; anything else (null too) is
	// invalid_history_retention.
	HistoryRetentionSeconds json.RawMessage `json:"historyRetentionSeconds"`
}

// update is the patch as a SettingsUpdate, or errInvalidBudget or
// errInvalidRetention.
func (in settingsPatch) update() (SettingsUpdate, error) {
	var u SettingsUpdate
	u.WebhookURL = in.WebhookURL.change()
	if in.WebhookEvents != nil {
		u.WebhookChannelEvents, u.WebhookPresenceEvents = in.WebhookEvents.Channel, in.WebhookEvents.Presence
	}
	if raw := strings.TrimSpace(string(in.ChannelRateLimit)); raw != "" {
		u.SetChannelRateLimit = true
		if raw != "null" {
			n, err := parseBudget(raw)
			if err != nil || n == nil {
				return u, errInvalidBudget
			}
			u.ChannelRateLimit = n
		}
	}
	if raw := strings.TrimSpace(string(in.HistoryRetentionSeconds)); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil {
			return u, errInvalidRetention
		}
		u.HistoryRetentionSeconds = &n
	}
	return u, nil
}

func (c controlPlane) handleGetSettings(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	b, err := p.settings(r.Context())
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (c controlPlane) handleSetSettings(w http.ResponseWriter, r *http.Request) {
	in, p, ok := ownedWithBody[settingsPatch](c, w, r)
	if !ok {
		return
	}
	u, err := in.update()
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	st, err := p.updateSettingsWith(r.Context(), u)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toSettingsBody(p.Project, st))
}

// Usage.

// usageCountsBody is one day's counters, or their total.
type usageCountsBody struct {
	Connections               int64 `json:"connections"`
	Messages                  int64 `json:"messages"`
	PeakConcurrentConnections int64 `json:"peakConcurrentConnections"`
	Deliveries                int64 `json:"deliveries"`
	Dropped                   int64 `json:"dropped"`
	SlowConsumersClosed       int64 `json:"slowConsumersClosed"`
	ChannelRateLimited        int64 `json:"channelRateLimited"`
	ProjectRateLimited        int64 `json:"projectRateLimited"`
	ClientEmitRateLimited     int64 `json:"clientEmitRateLimited"`
	// LatencyP99Ms is the worst fan-out latency p99 of one rollup interval
	// on one node; null without a sample.
	LatencyP99Ms *float64 `json:"latencyP99Ms"`
	// HistoryBytes is the most channel history the project held in the
	// store that day, sampled after each sweep (a total is the max).
	HistoryBytes int64 `json:"historyBytes"`
}

type usageDayBody struct {
	Day string `json:"day"`
	usageCountsBody
}

// usageBody is GET …/usage's answer.
type usageBody struct {
	ProjectID string          `json:"projectId"`
	From      string          `json:"from"`
	To        string          `json:"to"`
	Days      []usageDayBody  `json:"days"` // oldest first; days without a row are absent
	Total     usageCountsBody `json:"total"`
}

func toUsageCounts(u store.Usage) usageCountsBody {
	b := usageCountsBody{
		Connections: u.ConnectionCount, Messages: u.MessageCount, PeakConcurrentConnections: u.PeakConcurrentConnections,
		Deliveries: u.Deliveries, Dropped: u.Dropped, SlowConsumersClosed: u.SlowConsumersClosed,
		ChannelRateLimited: u.ChannelRateLimited, ProjectRateLimited: u.ProjectRateLimited, ClientEmitRateLimited: u.ClientEmitRateLimited,
		HistoryBytes: u.HistoryBytes,
	}
	if u.LatencyP99Ms > 0 {
		ms := u.LatencyP99Ms
		b.LatencyP99Ms = &ms
	}
	return b
}

// errInvalidUsageRange is a from or to that is not a day (YYYY-MM-DD), or
// a from after to; param names which.
type errInvalidUsageRange struct{ param string }

func (e errInvalidUsageRange) Error() string { return "invalid_query (" + e.param + ")" }

// usageRange reads from and to (YYYY-MM-DD, UTC days, both included; ""
// for the default): to defaults to today, from to usageDays-1 days before
// to, the usage page's window.
func usageRange(now time.Time, from, to string) (string, string, error) {
	end := now.UTC().Truncate(24 * time.Hour)
	if to != "" {
		t, err := time.Parse(time.DateOnly, to)
		if err != nil {
			return "", "", errInvalidUsageRange{"to"}
		}
		end = t
	}
	start := end.AddDate(0, 0, -(usageDays - 1))
	if from != "" {
		t, err := time.Parse(time.DateOnly, from)
		if err != nil || t.After(end) {
			return "", "", errInvalidUsageRange{"from"}
		}
		start = t
	}
	return start.Format(time.DateOnly), end.Format(time.DateOnly), nil
}

// usage is the project's usage rows from from to to (usageRange's).
func (p ownedProject) usage(ctx context.Context, from, to string) (usageBody, error) {
	rows, total, err := usageBetween(ctx, p.ops.store, p.ID, from, to)
	if err != nil {
		return usageBody{}, fmt.Errorf("load usage: %w", err)
	}
	b := usageBody{ProjectID: p.ID, From: from, To: to, Days: make([]usageDayBody, 0, len(rows)), Total: toUsageCounts(total)}
	for _, u := range rows {
		b.Days = append(b.Days, usageDayBody{Day: u.Day, usageCountsBody: toUsageCounts(u)})
	}
	return b, nil
}

func (c controlPlane) handleUsage(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	from, to, err := usageRange(c.now(), q.Get("from"), q.Get("to"))
	if err != nil {
		writeError(w, proto.CodeInvalidQuery, "param", err.(errInvalidUsageRange).param)
		return
	}
	b, err := p.usage(r.Context(), from, to)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// The command line.

// Settings is the project's settings, as GET /api/projects/{id}/settings
// answers them.
func (a *Admin) Settings(ctx context.Context, projectID string) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	return p.settings(ctx)
}

// UpdateSettings changes the project's settings, as PATCH
// /api/projects/{id}/settings does, and returns what it answers. Running
// relays on the same store reload them within about a second (the key
// change the store records with them).
func (a *Admin) UpdateSettings(ctx context.Context, projectID string, u SettingsUpdate) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	st, err := p.updateSettingsWith(ctx, u)
	if err != nil {
		return nil, err
	}
	return toSettingsBody(p.Project, st), nil
}

// Usage is the project's usage rows from from to to (YYYY-MM-DD, "" for
// the default: the last 30 UTC days), as GET /api/projects/{id}/usage
// answers them.
func (a *Admin) Usage(ctx context.Context, projectID, from, to string) (any, error) {
	from, to, err := usageRange(a.ops.now(), from, to)
	if err != nil {
		return nil, fmt.Errorf("--from and --to must be days (YYYY-MM-DD), from not after to: %w", err)
	}
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	return p.usage(ctx, from, to)
}
