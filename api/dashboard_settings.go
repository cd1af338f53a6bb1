package api

import (
	"net/http"
	"strconv"
	"strings"
)

// The webhook (api/README.md › Dashboard) and the per-project channel budget
// (an override of EMIT_RATE_LIMIT_PER_MINUTE): the pages of their project
// operations (projects.go), which save the project's settings row and make
// a running project actor reload it. PATCH …/settings and `relay admin
// project settings` change the same settings with the same checks
// (settings_api.go).

// handleSetWebhook sets or changes the URL.
func (d dashboard) handleSetWebhook(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if err := p.setWebhook(r.Context(), r.PostFormValue("url")); err != nil {
		d.opFailed(w, r, v, p.Project, err, &projectView{ErrorForm: "webhook", WebhookInput: r.PostFormValue("url")})
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
	if err := p.removeWebhook(r.Context()); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "webhook-removed")
}

// handleWebhookEvents saves the checkboxes of the events sent beyond
// connect and disconnect (an unchecked box is absent from the form).
func (d dashboard) handleWebhookEvents(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if err := p.setWebhookEvents(r.Context(), r.PostFormValue("channel") == "on", r.PostFormValue("presence") == "on"); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "webhook-events")
}

// handleRegenerateWebhookSecret offers a new signing secret only for a
// project with a webhook URL, and asks for confirmation first.
func (d dashboard) handleRegenerateWebhookSecret(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if _, err := p.webhookSecret(r.Context()); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	if !d.confirmed(w, r, v, p, confirmView{
		Heading: "Regenerate the webhook signing secret?",
		Message: "Webhooks are signed with the new secret from now on; a receiver that still checks the old one will reject them.",
		Button:  "Regenerate signing secret", Danger: true,
	}) {
		return
	}
	// Refused too when the URL was removed meanwhile, in another tab.
	if _, err := p.regenerateWebhookSecret(r.Context()); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "webhook-secret")
}

// handleBudget sets the per-channel emit budget override, or clears it when
// the field is empty.
func (d dashboard) handleBudget(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	limit, err := parseBudget(r.PostFormValue("limit"))
	if err == nil {
		err = p.setChannelBudget(r.Context(), limit)
	}
	if err != nil {
		d.opFailed(w, r, v, p.Project, err, &projectView{ErrorForm: "budget", BudgetInput: r.PostFormValue("limit")})
		return
	}
	if limit == nil {
		done(w, r, p.ID, "budget-cleared")
		return
	}
	done(w, r, p.ID, "budget-saved")
}

// parseBudget reads the budget field: empty is nil (the server default), a
// whole number is the override; anything else is errInvalidBudget.
func parseBudget(field string) (*int, error) {
	field = strings.TrimSpace(field)
	if field == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(field)
	if err != nil {
		return nil, errInvalidBudget
	}
	return &n, nil
}

// handleHistory sets the project's history retention in seconds (empty or
// 0: no history).
func (d dashboard) handleHistory(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	field := strings.TrimSpace(r.PostFormValue("seconds"))
	seconds, err := 0, error(nil)
	if field != "" {
		if seconds, err = strconv.Atoi(field); err != nil {
			err = errInvalidRetention
		}
	}
	if err == nil {
		err = p.setHistoryRetention(r.Context(), seconds)
	}
	if err != nil {
		d.opFailed(w, r, v, p.Project, err, &projectView{ErrorForm: "history", HistoryInput: r.PostFormValue("seconds")})
		return
	}
	if seconds == 0 {
		done(w, r, p.ID, "history-off")
		return
	}
	done(w, r, p.ID, "history-saved")
}
