package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/store"
)

// The webhook (SPEC.md › Webhook configuration: "set from the dashboard
// only") and the per-project channel budget (SPEC.md › Limits: "overridable
// per project from the dashboard"). Both live in the project's settings row;
// every change is followed by live.SettingsChanged so a running project actor
// reloads it.

// maxWebhookURL bounds what we store and send to.
const maxWebhookURL = 2048

// maxChannelBudget keeps the override inside the store's integer column.
const maxChannelBudget = 1_000_000_000

// updateSettings applies change to the project's settings row (read, modify,
// write, serialised on this node) and tells the live state.
func (d dashboard) updateSettings(r *http.Request, projectID string, change func(*store.Settings)) error {
	d.settingsMu.Lock()
	defer d.settingsMu.Unlock()
	st, err := d.store.Settings(r.Context(), projectID)
	if err != nil {
		return err
	}
	change(&st)
	if err := d.store.SaveSettings(r.Context(), st); err != nil {
		return err
	}
	d.live.SettingsChanged(projectID)
	return nil
}

// handleSetWebhook sets or changes the URL. The signing secret is generated
// when a URL is first set and kept when it changes.
func (d dashboard) handleSetWebhook(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	raw := strings.TrimSpace(r.PostFormValue("url"))
	if raw == "" || len(raw) > maxWebhookURL || !webhook.ValidURL(raw) {
		pe := errWebhookURL
		d.showProject(w, r, v, p, pe.status, &pe, "", &projectView{ErrorForm: "webhook", WebhookInput: r.PostFormValue("url")})
		return
	}
	err := d.updateSettings(r, p.ID, func(st *store.Settings) {
		st.WebhookURL = raw
		if st.WebhookSecret == "" {
			st.WebhookSecret = newSecret()
		}
	})
	if err != nil {
		d.internal(w, r, v, "save webhook", err)
		return
	}
	done(w, r, p.ID, "webhook-saved")
}

// handleRemoveWebhook clears the URL and its secret.
func (d dashboard) handleRemoveWebhook(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	err := d.updateSettings(r, p.ID, func(st *store.Settings) { st.WebhookURL, st.WebhookSecret = "", "" })
	if err != nil {
		d.internal(w, r, v, "remove webhook", err)
		return
	}
	done(w, r, p.ID, "webhook-removed")
}

func (d dashboard) handleRegenerateWebhookSecret(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	st, err := d.store.Settings(r.Context(), p.ID)
	if err != nil {
		d.internal(w, r, v, "load settings", err)
		return
	}
	if st.WebhookURL == "" {
		pe := errNoWebhook
		d.showProject(w, r, v, p, pe.status, &pe, "", nil)
		return
	}
	if !d.confirmed(w, r, v, p, confirmView{
		Heading: "Regenerate the webhook signing secret?",
		Message: "Webhooks are signed with the new secret from now on; a receiver that still checks the old one will reject them.",
		Button:  "Regenerate signing secret", Danger: true,
	}) {
		return
	}
	noURL := false
	err = d.updateSettings(r, p.ID, func(st *store.Settings) {
		if noURL = st.WebhookURL == ""; !noURL {
			st.WebhookSecret = newSecret()
		}
	})
	if err != nil {
		d.internal(w, r, v, "regenerate webhook secret", err)
		return
	}
	if noURL { // removed meanwhile, in another tab
		pe := errNoWebhook
		d.showProject(w, r, v, p, pe.status, &pe, "", nil)
		return
	}
	done(w, r, p.ID, "webhook-secret")
}

// handleBudget sets the per-channel emit budget override (messages per
// minute, replacing EMIT_RATE_LIMIT_PER_MINUTE for this project), or clears
// it when the field is empty.
func (d dashboard) handleBudget(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	in := strings.TrimSpace(r.PostFormValue("limit"))
	var limit *int
	if in != "" {
		n, err := strconv.Atoi(in)
		if err != nil || n < 1 || n > maxChannelBudget {
			pe := errBudget
			d.showProject(w, r, v, p, pe.status, &pe, "", &projectView{ErrorForm: "budget", BudgetInput: r.PostFormValue("limit")})
			return
		}
		limit = &n
	}
	if err := d.updateSettings(r, p.ID, func(st *store.Settings) { st.ChannelRateLimit = limit }); err != nil {
		d.internal(w, r, v, "save channel budget", err)
		return
	}
	if limit == nil {
		done(w, r, p.ID, "budget-cleared")
		return
	}
	done(w, r, p.ID, "budget-saved")
}
