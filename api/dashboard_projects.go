package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/relayhq/relay/store"
)

// Projects, keys and the client-emit secret: the pages of the project
// operations (projects.go) that the control plane's JSON routes also call.

// projectView is the project page.
type projectView struct {
	ID, Name, Created string
	Keys              []keyRow
	NewKeys           []newKey // raw keys, shown on this one view only (dashboard_newkeys.go)

	// Code to start with, the project's values filled in (dashboard_snippets.go);
	// KeyHint says which key a placeholder stands for.
	Snippets []snippet
	KeyHint  string

	ClientEmitSecret string

	// Channel authorization (authorization.go): on or off, its secret ("" if
	// none yet) and, while the previous secret is still valid, its end.
	Authorization     bool
	AuthSecret        string
	AuthPreviousUntil string
	AuthJWKSURL       string // "" when none

	WebhookURL    string
	WebhookSecret string
	// The events sent beyond connect and disconnect (api/README.md › Webhooks and usage).
	WebhookChannelEvents, WebhookPresenceEvents bool
	WebhookDeliveries                           []deliveryRow // newest first (webhook_deliveries.go)
	Budget                                      string        // the override, "" when the server default applies
	HistoryRetention                            int           // seconds; 0: no history
	HistoryMax                                  int           // HISTORY_MAX_RETENTION_SECONDS
	HistorySize, HistorySizeCap                 string        // bytes stored now, HISTORY_MAX_BYTES_PER_PROJECT; "" when none or unread

	// What the user typed, kept in the form that came back with an error
	// (ErrorForm: rename, webhook, budget, history or jwks); the others show stored values.
	ErrorForm    string
	RenameInput  string
	WebhookInput string
	BudgetInput  string
	HistoryInput string
	JWKSInput    string
}

type keyRow struct {
	ID, Type, Prefix, Created, Revoked string
	Active                             bool   // authenticates now (also in an overlap window)
	Until                              string // the end of its overlap window, while in it
	Expired                            bool   // refused since its window ended (Revoked says when)
	LastUsed                           string // "" when never used
}

type newKey struct {
	Type string `json:"t"`
	Raw  string `json:"r"`
}

// confirmView is the confirmation step before an action that cannot be
// undone: the page posts the same form again with confirm=yes.
type confirmView struct {
	ProjectID, ProjectName string
	Heading, Message       string
	Action, Button         string
	Danger                 bool
}

// project loads v's project named in the path, or shows a 404 page (also
// for someone else's project, as the JSON routes do).
func (d dashboard) project(w http.ResponseWriter, r *http.Request, v *viewer) (ownedProject, bool) {
	p, err := d.ops.owned(r.Context(), v.user.ID, r.PathValue("projectId"))
	if err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return p, false
	}
	return p, true
}

// opFailed shows why a project operation on p failed: the project page
// with the refusal and what the user typed (pv), an error page when the
// project is gone, or a 500 page for our own fault.
func (d dashboard) opFailed(w http.ResponseWriter, r *http.Request, v *viewer, p store.Project, err error, pv *projectView) {
	pe, refused := refusalPage(err)
	switch {
	case !refused:
		d.internal(w, r, v, "project operation", err)
	case errors.Is(err, errProjectNotFound):
		d.fail(w, r, v, pe)
	default:
		d.showProject(w, r, v, p, pe.status, &pe, "", pv)
	}
}

// showProject renders the project page; pv may carry what a form left
// (raw keys, inputs); its other fields are filled from the store.
func (d dashboard) showProject(w http.ResponseWriter, r *http.Request, v *viewer, p store.Project, status int, pe *pageErr, notice string, pv *projectView) {
	ctx := r.Context()
	keys, err := d.store.Keys(ctx, p.ID)
	if err != nil {
		d.internal(w, r, v, "list keys", err)
		return
	}
	st, err := d.store.Settings(ctx, p.ID)
	if err != nil {
		d.internal(w, r, v, "load settings", err)
		return
	}
	if pv == nil {
		pv = &projectView{}
	}
	pv.ID, pv.Name, pv.Created = p.ID, p.Name, showTime(p.CreatedAt)
	pv.ClientEmitSecret = p.ClientEmitSecret
	pv.Authorization, pv.AuthSecret, pv.AuthJWKSURL = p.Authorization, p.AuthSecret, p.AuthJWKSURL
	if p.PreviousAuthSecretValidAt(d.now()) {
		pv.AuthPreviousUntil = showSeconds(*p.AuthSecretPreviousUntil)
	}
	pv.WebhookURL, pv.WebhookSecret = st.WebhookURL, st.WebhookSecret
	pv.WebhookChannelEvents, pv.WebhookPresenceEvents = st.WebhookChannelEvents, st.WebhookPresenceEvents
	pv.WebhookDeliveries = d.deliveryRows(p.ID)
	if st.ChannelRateLimit != nil {
		pv.Budget = strconv.Itoa(*st.ChannelRateLimit)
	}
	if pv.ErrorForm != "rename" {
		pv.RenameInput = p.Name
	}
	if pv.ErrorForm != "webhook" {
		pv.WebhookInput = pv.WebhookURL
	}
	if pv.ErrorForm != "budget" {
		pv.BudgetInput = pv.Budget
	}
	pv.HistoryRetention, pv.HistoryMax = st.HistoryRetentionSeconds, int(d.ops.historyCap()/time.Second)
	if n, err := d.store.HistoryBytes(r.Context(), p.ID); err != nil {
		d.log.Warn("history size not read", "project", p.ID, "err", err)
	} else if n > 0 || st.HistoryRetentionSeconds > 0 {
		pv.HistorySize = showBytes(n)
		if d.ops.maxHistoryBytes > 0 {
			pv.HistorySizeCap = showBytes(d.ops.maxHistoryBytes)
		}
	}
	if pv.ErrorForm != "history" {
		pv.HistoryInput = strconv.Itoa(st.HistoryRetentionSeconds)
	}
	if pv.ErrorForm != "jwks" {
		pv.JWKSInput = pv.AuthJWKSURL
	}
	// Valid keys first (public, then secret; the active key before one in
	// its overlap window), then the history, most recently ended first.
	now := d.now()
	ended := func(k store.APIKey) time.Time {
		if k.RevokedAt != nil {
			return *k.RevokedAt
		}
		return *k.ExpiresAt
	}
	sort.SliceStable(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		switch {
		case a.ValidAt(now) != b.ValidAt(now):
			return a.ValidAt(now)
		case a.ValidAt(now) && a.KeyType != b.KeyType:
			return a.KeyType < b.KeyType
		case a.ValidAt(now):
			return a.ExpiresAt == nil && b.ExpiresAt != nil
		default:
			return ended(a).After(ended(b))
		}
	})
	for _, k := range keys {
		row := keyRow{ID: k.ID, Type: k.KeyType, Prefix: k.KeyPrefix, Created: showTime(k.CreatedAt), Active: k.ValidAt(now)}
		switch {
		case k.RevokedAt != nil:
			row.Revoked = showTime(*k.RevokedAt)
		case row.Active && k.ExpiresAt != nil:
			row.Until = showSeconds(*k.ExpiresAt)
		case !row.Active:
			row.Expired, row.Revoked = true, showSeconds(*k.ExpiresAt)
		}
		if k.LastUsedAt != nil {
			row.LastUsed = showTime(*k.LastUsedAt)
		}
		pv.Keys = append(pv.Keys, row)
	}
	pv.fillSnippets(requestOrigin(r), keys, now)
	pg := d.page(r, v, p.Name)
	pg.Project = pv
	pg.Health = d.healthView(p.ID)
	if pe != nil {
		pg.Error = pe.msg
	}
	if notice != "" {
		pg.Notice = notice
	}
	d.render(w, r, v, status, "project", pg)
}

// handleProject shows the project page, with the raw keys of a creation or
// rotation that just redirected here, once.
func (d dashboard) handleProject(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if r.Method == http.MethodGet { // not HEAD: that would use up the one view
		if sk, ok := d.takeKeys(w, r, v, p.ID); ok {
			d.showProject(w, r, v, p.Project, http.StatusOK, nil, sk.Notice, &projectView{NewKeys: sk.Keys})
			return
		}
	}
	d.showProject(w, r, v, p.Project, http.StatusOK, nil, "", nil)
}

// done redirects to the project page with a notice (Post/Redirect/Get).
func done(w http.ResponseWriter, r *http.Request, projectID, notice string) {
	http.Redirect(w, r, "/projects/"+projectID+"?done="+notice, http.StatusSeeOther)
}

func (d dashboard) handleCreate(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, pub, sec, err := d.ops.create(r.Context(), v.user.ID, r.PostFormValue("name"))
	if pe, refused := refusalPage(err); refused {
		d.showHome(w, r, v, pe.status, pe.msg, r.PostFormValue("name"))
		return
	}
	if err != nil {
		d.internal(w, r, v, "project operation", err)
		return
	}
	// Post/Redirect/Get: the raw keys go along sealed in a cookie, so that
	// reloading the page shows them no more and creates nothing.
	d.showKeysNext(w, r, v, p.ID,
		"Project created. Copy both keys now: they are shown only once and cannot be shown again.",
		[]newKey{{"public", pub}, {"secret", sec}})
}

func (d dashboard) handleRename(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if _, err := p.rename(r.Context(), r.PostFormValue("name")); err != nil {
		d.opFailed(w, r, v, p.Project, err, &projectView{ErrorForm: "rename", RenameInput: r.PostFormValue("name")})
		return
	}
	done(w, r, p.ID, "renamed")
}

// confirmed reports whether a POST carries the confirmation; otherwise it
// shows the confirmation page (also for GET), and the caller stops.
func (d dashboard) confirmed(w http.ResponseWriter, r *http.Request, v *viewer, p ownedProject, cv confirmView) bool {
	if r.Method == http.MethodPost && r.PostFormValue("confirm") == "yes" {
		return true
	}
	cv.ProjectID, cv.ProjectName, cv.Action = p.ID, p.Name, r.URL.Path
	pg := d.page(r, v, cv.Heading)
	pg.Confirm = &cv
	d.render(w, r, v, http.StatusOK, "confirm", pg)
	return false
}

func (d dashboard) handleDelete(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok || !d.confirmed(w, r, v, p, confirmView{
		Heading: "Delete project “" + p.Name + "”?",
		Message: "This deletes the project with all its keys and usage rows, and closes its live connections. " +
			"Backends and browsers using its keys stop working at once. This cannot be undone.",
		Button: "Delete project", Danger: true,
	}) {
		return
	}
	if err := p.remove(r.Context()); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	http.Redirect(w, r, "/?done=deleted", http.StatusSeeOther)
}

func (d dashboard) handleRotate(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	keyType := r.PostFormValue("keyType")
	overlap, err := overlapOf(json.RawMessage(strings.TrimSpace(r.PostFormValue("overlapSeconds"))))
	if err != nil && keyType != "public" && keyType != "secret" {
		err = errInvalidKeyType // the key type is checked first
	}
	if err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	k, raw, until, err := p.rotateKey(r.Context(), keyType, overlap)
	if err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	notice := "New " + k.KeyType + " key issued; the previous " + k.KeyType + " key is revoked and stopped working now. "
	if !until.IsZero() {
		notice = "New " + k.KeyType + " key issued; the previous " + k.KeyType + " key stays valid until " +
			showSeconds(until) + ", then stops working. "
	}
	d.showKeysNext(w, r, v, p.ID, notice+"Copy the new key: it is shown only once.", []newKey{{k.KeyType, raw}})
}

func (d dashboard) handleRevoke(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if err := p.revokeKey(r.Context(), r.PathValue("keyId")); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "key-revoked")
}

// handleGenerateClientEmitSecret creates the first client-emit secret; an
// existing one is kept (regeneration has its own confirmed route).
func (d dashboard) handleGenerateClientEmitSecret(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if _, err := p.ensureClientEmitSecret(r.Context()); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "ces-generated")
}

func (d dashboard) handleRegenerateClientEmitSecret(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok || !d.confirmed(w, r, v, p, confirmView{
		Heading: "Regenerate the client-emit secret?",
		Message: "Every client-emit token signed with the current secret stops working at once, with no overlap. " +
			"Your backend must mint tokens with the new secret.",
		Button: "Regenerate secret", Danger: true,
	}) {
		return
	}
	if _, err := p.regenerateClientEmitSecret(r.Context()); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "ces-regenerated")
}
