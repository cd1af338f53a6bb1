package api

import (
	"errors"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// Projects, keys and the client-emit secret: the same store calls and live
// notifications as the control plane's JSON routes.

// projectView is the project page.
type projectView struct {
	ID, Name, Created string
	Keys              []keyRow
	NewKeys           []newKey // raw keys, shown on this one page only

	ClientEmitSecret string

	WebhookURL    string
	WebhookSecret string
	Budget        string // the override, "" when the server default applies

	// What the user typed, kept in the form that came back with an error
	// (ErrorForm: rename, webhook or budget); the others show stored values.
	ErrorForm    string
	RenameInput  string
	WebhookInput string
	BudgetInput  string
}

type keyRow struct {
	ID, Type, Prefix, Created, Revoked string
	Active                             bool
}

type newKey struct {
	Type, Raw string
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
func (d dashboard) project(w http.ResponseWriter, r *http.Request, v *viewer) (store.Project, bool) {
	p, err := d.store.ProjectOfOwner(r.Context(), r.PathValue("projectId"), v.user.ID)
	if errors.Is(err, store.ErrNotFound) {
		d.fail(w, r, v, codeErr(proto.CodeProjectNotFound))
		return p, false
	}
	if err != nil {
		d.internal(w, r, v, "load project", err)
		return p, false
	}
	return p, true
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
	pv.WebhookURL, pv.WebhookSecret = st.WebhookURL, st.WebhookSecret
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
	// Active keys first (public, then secret), then the revoked history,
	// most recently revoked first.
	sort.SliceStable(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		switch {
		case a.Active() != b.Active():
			return a.Active()
		case a.Active():
			return a.KeyType < b.KeyType
		default:
			return a.RevokedAt.After(*b.RevokedAt)
		}
	})
	for _, k := range keys {
		row := keyRow{ID: k.ID, Type: k.KeyType, Prefix: k.KeyPrefix, Created: showTime(k.CreatedAt), Active: k.Active()}
		if k.RevokedAt != nil {
			row.Revoked = showTime(*k.RevokedAt)
		}
		pv.Keys = append(pv.Keys, row)
	}
	pg := d.page(r, v, p.Name)
	pg.Project = pv
	if pe != nil {
		pg.Error = pe.msg
	}
	if notice != "" {
		pg.Notice = notice
	}
	d.render(w, r, v, status, "project", pg)
}

func (d dashboard) handleProject(w http.ResponseWriter, r *http.Request, v *viewer) {
	if p, ok := d.project(w, r, v); ok {
		d.showProject(w, r, v, p, http.StatusOK, nil, "", nil)
	}
}

// done redirects to the project page with a notice (Post/Redirect/Get).
func done(w http.ResponseWriter, r *http.Request, projectID, notice string) {
	http.Redirect(w, r, "/projects/"+projectID+"?done="+notice, http.StatusSeeOther)
}

func (d dashboard) handleCreate(w http.ResponseWriter, r *http.Request, v *viewer) {
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" {
		pe := codeErr(proto.CodeNameRequired)
		d.showHome(w, r, v, pe.status, pe.msg, r.PostFormValue("name"))
		return
	}
	pub, sec := newRawKey(PublicKeyPrefix), newRawKey(SecretKeyPrefix)
	p, err := d.store.CreateProject(r.Context(), v.user.ID, name,
		store.APIKey{KeyType: "public", KeyHash: HashKey(pub), KeyPrefix: maskKey(pub)},
		store.APIKey{KeyType: "secret", KeyHash: HashKey(sec), KeyPrefix: maskKey(sec)},
	)
	if err != nil {
		d.internal(w, r, v, "create project", err)
		return
	}
	// The raw keys exist only in this response: rendered here, not redirected.
	d.showProject(w, r, v, p, http.StatusCreated, nil,
		"Project created. Copy both keys now: they are shown only once and cannot be shown again.",
		&projectView{NewKeys: []newKey{{"public", pub}, {"secret", sec}}})
}

func (d dashboard) handleRename(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" {
		pe := codeErr(proto.CodeNameRequired)
		d.showProject(w, r, v, p, pe.status, &pe, "", &projectView{ErrorForm: "rename", RenameInput: r.PostFormValue("name")})
		return
	}
	_, err := d.store.RenameProject(r.Context(), p.ID, v.user.ID, name)
	if errors.Is(err, store.ErrNotFound) {
		d.fail(w, r, v, codeErr(proto.CodeProjectNotFound))
		return
	}
	if err != nil {
		d.internal(w, r, v, "rename project", err)
		return
	}
	done(w, r, p.ID, "renamed")
}

// confirmed reports whether a POST carries the confirmation; otherwise it
// shows the confirmation page (also for GET), and the caller stops.
func (d dashboard) confirmed(w http.ResponseWriter, r *http.Request, v *viewer, p store.Project, cv confirmView) bool {
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
	err := d.store.DeleteProject(r.Context(), p.ID, v.user.ID)
	if errors.Is(err, store.ErrNotFound) {
		d.fail(w, r, v, codeErr(proto.CodeProjectNotFound))
		return
	}
	if err != nil {
		d.internal(w, r, v, "delete project", err)
		return
	}
	d.live.ProjectDeleted(p.ID)
	http.Redirect(w, r, "/?done=deleted", http.StatusSeeOther)
}

func (d dashboard) handleRotate(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	keyType := r.PostFormValue("keyType")
	var prefix string
	switch keyType {
	case "public":
		prefix = PublicKeyPrefix
	case "secret":
		prefix = SecretKeyPrefix
	default:
		pe := codeErr(proto.CodeInvalidKeyType)
		d.showProject(w, r, v, p, pe.status, &pe, "", nil)
		return
	}
	raw := newRawKey(prefix)
	if _, err := d.store.RotateKey(r.Context(), p.ID, store.APIKey{KeyType: keyType, KeyHash: HashKey(raw), KeyPrefix: maskKey(raw)}); err != nil {
		d.internal(w, r, v, "rotate key", err)
		return
	}
	d.live.KeysChanged(p.ID)
	d.showProject(w, r, v, p, http.StatusCreated, nil,
		"New "+keyType+" key issued; the previous "+keyType+" key is revoked and stopped working now. "+
			"Copy the new key: it is shown only once.",
		&projectView{NewKeys: []newKey{{keyType, raw}}})
}

func (d dashboard) handleRevoke(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	_, err := d.store.RevokeKey(r.Context(), p.ID, r.PathValue("keyId"))
	if errors.Is(err, store.ErrNotFound) {
		pe := codeErr(proto.CodeKeyNotFound)
		d.showProject(w, r, v, p, pe.status, &pe, "", nil)
		return
	}
	if err != nil {
		d.internal(w, r, v, "revoke key", err)
		return
	}
	d.live.KeysChanged(p.ID)
	done(w, r, p.ID, "key-revoked")
}

// handleGenerateClientEmitSecret creates the first client-emit secret; an
// existing one is kept (regeneration has its own confirmed route).
func (d dashboard) handleGenerateClientEmitSecret(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if p.ClientEmitSecret == "" {
		secret, err := d.store.EnsureClientEmitSecret(r.Context(), p.ID, newSecret())
		if err != nil {
			d.internal(w, r, v, "set client-emit secret", err)
			return
		}
		d.live.ClientEmitSecretChanged(p.ID, secret)
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
	secret := newSecret()
	if err := d.store.SetClientEmitSecret(r.Context(), p.ID, secret); err != nil {
		d.internal(w, r, v, "set client-emit secret", err)
		return
	}
	d.live.ClientEmitSecretChanged(p.ID, secret)
	done(w, r, p.ID, "ces-regenerated")
}
