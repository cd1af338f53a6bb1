package api

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// controlPlane serves SPEC.md › Control plane.
type controlPlane struct {
	*Server
}

// Wire shapes of the control plane.
type (
	credentials struct {
		Email    string `json:"email"`
		Password string `json:"password"`
	}
	userBody struct {
		ID    string `json:"id"`
		Email string `json:"email"`
	}
	projectBody struct {
		ID          string `json:"id"`
		Name        string `json:"name"`
		OwnerUserID string `json:"ownerUserId"`
		CreatedAt   string `json:"createdAt"`
	}
	keyBody struct {
		ID        string  `json:"id"`
		KeyType   string  `json:"keyType"`
		KeyPrefix string  `json:"keyPrefix"`
		CreatedAt string  `json:"createdAt"`
		RevokedAt *string `json:"revokedAt"`
	}
	rotatedKeyBody struct {
		ID        string `json:"id"`
		KeyType   string `json:"keyType"`
		KeyPrefix string `json:"keyPrefix"`
		Raw       string `json:"raw"`
	}
)

func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func toProjectBody(p store.Project) projectBody {
	return projectBody{ID: p.ID, Name: p.Name, OwnerUserID: p.OwnerUserID, CreatedAt: timestamp(p.CreatedAt)}
}

func toKeyBody(k store.APIKey) keyBody {
	b := keyBody{ID: k.ID, KeyType: k.KeyType, KeyPrefix: k.KeyPrefix, CreatedAt: timestamp(k.CreatedAt)}
	if k.RevokedAt != nil {
		s := timestamp(*k.RevokedAt)
		b.RevokedAt = &s
	}
	return b
}

func (c controlPlane) routes(mux *http.ServeMux) {
	auth := c.sessions.requireUser
	mux.Handle("/api/auth/signup", methods{http.MethodPost: c.handleSignup})
	mux.Handle("/api/auth/login", methods{http.MethodPost: c.handleLogin})
	mux.Handle("/api/auth/logout", methods{http.MethodPost: c.handleLogout})
	mux.Handle("/api/projects", methods{
		http.MethodGet:  auth(c.handleListProjects),
		http.MethodPost: auth(c.handleCreateProject),
	})
	mux.Handle("/api/projects/{projectId}", methods{
		http.MethodGet:    auth(c.handleGetProject),
		http.MethodPatch:  auth(c.handleRenameProject),
		http.MethodDelete: auth(c.handleDeleteProject),
	})
	mux.Handle("/api/projects/{projectId}/keys", methods{
		http.MethodGet:  auth(c.handleListKeys),
		http.MethodPost: auth(c.handleRotateKey),
	})
	mux.Handle("/api/projects/{projectId}/keys/{keyId}/revoke", methods{
		http.MethodPost: auth(c.handleRevokeKey),
	})
	mux.Handle("/api/projects/{projectId}/client-emit-secret", methods{
		http.MethodPatch: auth(c.handleClientEmitSecret),
	})
	mux.HandleFunc("/api/", notFound)
}

// handleSignup counts the attempt against the address before reading the
// body, and against the email once it is known (signupPerIP holds both kinds
// of key, under the same SIGNUP_ATTEMPTS_PER_MINUTE).
func (c controlPlane) handleSignup(w http.ResponseWriter, r *http.Request) {
	if ok, retry := c.signupPerIP.take(addrKey(r)); !ok {
		writeThrottled(w, retry)
		return
	}
	var in credentials
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return
	}
	email := strings.TrimSpace(in.Email)
	if email != "" {
		if ok, retry := c.signupPerIP.take(emailKey(email)); !ok {
			writeThrottled(w, retry)
			return
		}
	}
	switch {
	case email == "" || in.Password == "":
		writeError(w, proto.CodeEmailAndPasswordRequired)
		return
	case len([]rune(in.Password)) < proto.MinPasswordLen:
		writeError(w, proto.CodePasswordTooShort)
		return
	case !c.signupAllowed(email):
		writeError(w, proto.CodeEmailNotAllowed)
		return
	}
	hash, ok, err := hashPasswordLimited(r.Context(), in.Password)
	if !ok {
		writeThrottled(w, 1)
		return
	}
	if err != nil {
		writeInternal(w, c.log, "hash password", err)
		return
	}
	u, err := c.store.CreateUser(r.Context(), email, hash)
	if errors.Is(err, store.ErrDuplicate) {
		writeError(w, proto.CodeEmailAlreadyRegistered)
		return
	}
	if err != nil {
		writeInternal(w, c.log, "create user", err)
		return
	}
	if !c.startSession(w, r, u.ID) {
		return
	}
	writeJSON(w, http.StatusCreated, userBody{ID: u.ID, Email: u.Email})
}

func (c controlPlane) signupAllowed(email string) bool {
	email = strings.ToLower(email)
	for _, a := range c.allowedEmails {
		if a == email {
			return true
		}
	}
	return false
}

// handleLogin: one attempt under the brute-force limits (Server.login).
func (c controlPlane) handleLogin(w http.ResponseWriter, r *http.Request) {
	var in credentials
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return
	}
	email := strings.TrimSpace(in.Email)
	if email == "" || in.Password == "" {
		writeError(w, proto.CodeEmailAndPasswordRequired)
		return
	}
	u, out, retry, err := c.login(r, email, in.Password)
	switch out {
	case loginThrottled:
		writeThrottled(w, retry)
	case loginStoreFailed:
		writeInternal(w, c.log, "look up user", err)
	case loginRefused:
		writeError(w, proto.CodeInvalidCredentials)
	case loginOK:
		if c.startSession(w, r, u.ID) {
			writeJSON(w, http.StatusOK, userBody{ID: u.ID, Email: u.Email})
		}
	}
}

func (c controlPlane) startSession(w http.ResponseWriter, r *http.Request, userID string) bool {
	token, err := c.sessions.issue(userID)
	if err != nil {
		writeInternal(w, c.log, "issue session", err)
		return false
	}
	c.sessions.setCookie(w, r, token)
	return true
}

func (c controlPlane) handleLogout(w http.ResponseWriter, r *http.Request) {
	c.sessions.clearCookie(w, r)
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

func (c controlPlane) handleListProjects(w http.ResponseWriter, r *http.Request) {
	ps, err := c.store.ProjectsByOwner(r.Context(), userID(r))
	if err != nil {
		writeInternal(w, c.log, "list projects", err)
		return
	}
	out := make([]projectBody, 0, len(ps))
	for _, p := range ps {
		out = append(out, toProjectBody(p))
	}
	writeJSON(w, http.StatusOK, map[string]any{"projects": out})
}

type nameBody struct {
	Name string `json:"name"`
}

func (c controlPlane) handleCreateProject(w http.ResponseWriter, r *http.Request) {
	var in nameBody
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return
	}
	name := strings.TrimSpace(in.Name)
	if name == "" {
		writeError(w, proto.CodeNameRequired)
		return
	}
	pub, sec := newRawKey(PublicKeyPrefix), newRawKey(SecretKeyPrefix)
	p, err := c.store.CreateProject(r.Context(), userID(r), name,
		store.APIKey{KeyType: "public", KeyHash: HashKey(pub), KeyPrefix: maskKey(pub)},
		store.APIKey{KeyType: "secret", KeyHash: HashKey(sec), KeyPrefix: maskKey(sec)},
	)
	if err != nil {
		writeInternal(w, c.log, "create project", err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{
		"project": toProjectBody(p),
		"keys":    map[string]string{"publicKey": pub, "secretKey": sec},
	})
}

// ownedProject loads the caller's project or answers 404 project_not_found,
// also for someone else's project, so ids of others are not confirmed.
func (c controlPlane) ownedProject(w http.ResponseWriter, r *http.Request) (store.Project, bool) {
	p, err := c.store.ProjectOfOwner(r.Context(), r.PathValue("projectId"), userID(r))
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, proto.CodeProjectNotFound)
		return p, false
	}
	if err != nil {
		writeInternal(w, c.log, "load project", err)
		return p, false
	}
	return p, true
}

func (c controlPlane) handleGetProject(w http.ResponseWriter, r *http.Request) {
	if p, ok := c.ownedProject(w, r); ok {
		writeJSON(w, http.StatusOK, map[string]any{"project": toProjectBody(p)})
	}
}

func (c controlPlane) handleRenameProject(w http.ResponseWriter, r *http.Request) {
	var in nameBody
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return
	}
	if _, ok := c.ownedProject(w, r); !ok {
		return
	}
	name := strings.TrimSpace(in.Name)
	if name == "" {
		writeError(w, proto.CodeNameRequired)
		return
	}
	p, err := c.store.RenameProject(r.Context(), r.PathValue("projectId"), userID(r), name)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, proto.CodeProjectNotFound)
		return
	}
	if err != nil {
		writeInternal(w, c.log, "rename project", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"project": map[string]string{"id": p.ID, "name": p.Name}})
}

func (c controlPlane) handleDeleteProject(w http.ResponseWriter, r *http.Request) {
	p, ok := c.ownedProject(w, r)
	if !ok {
		return
	}
	id := p.ID // canonical, as the live state knows it
	err := c.store.DeleteProject(r.Context(), id, userID(r))
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, proto.CodeProjectNotFound)
		return
	}
	if err != nil {
		writeInternal(w, c.log, "delete project", err)
		return
	}
	c.live.ProjectDeleted(id)
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

func (c controlPlane) handleListKeys(w http.ResponseWriter, r *http.Request) {
	p, ok := c.ownedProject(w, r)
	if !ok {
		return
	}
	keys, err := c.store.Keys(r.Context(), p.ID)
	if err != nil {
		writeInternal(w, c.log, "list keys", err)
		return
	}
	out := make([]keyBody, 0, len(keys))
	for _, k := range keys {
		out = append(out, toKeyBody(k))
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}

type keyTypeBody struct {
	KeyType string `json:"keyType"`
}

func (c controlPlane) handleRotateKey(w http.ResponseWriter, r *http.Request) {
	var in keyTypeBody
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return
	}
	p, ok := c.ownedProject(w, r)
	if !ok {
		return
	}
	var prefix string
	switch in.KeyType {
	case "public":
		prefix = PublicKeyPrefix
	case "secret":
		prefix = SecretKeyPrefix
	default:
		writeError(w, proto.CodeInvalidKeyType)
		return
	}
	raw := newRawKey(prefix)
	k, err := c.store.RotateKey(r.Context(), p.ID, store.APIKey{KeyType: in.KeyType, KeyHash: HashKey(raw), KeyPrefix: maskKey(raw)})
	if err != nil {
		writeInternal(w, c.log, "rotate key", err)
		return
	}
	c.live.KeysChanged(p.ID)
	writeJSON(w, http.StatusCreated, map[string]any{"key": rotatedKeyBody{ID: k.ID, KeyType: k.KeyType, KeyPrefix: k.KeyPrefix, Raw: raw}})
}

func (c controlPlane) handleRevokeKey(w http.ResponseWriter, r *http.Request) {
	p, ok := c.ownedProject(w, r)
	if !ok {
		return
	}
	_, err := c.store.RevokeKey(r.Context(), p.ID, r.PathValue("keyId"))
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, proto.CodeKeyNotFound)
		return
	}
	if err != nil {
		writeInternal(w, c.log, "revoke key", err)
		return
	}
	c.live.KeysChanged(p.ID)
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

type regenerateBody struct {
	Regenerate bool `json:"regenerate"`
}

func (c controlPlane) handleClientEmitSecret(w http.ResponseWriter, r *http.Request) {
	var in regenerateBody
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return
	}
	p, ok := c.ownedProject(w, r)
	if !ok {
		return
	}
	secret := p.ClientEmitSecret
	switch {
	case in.Regenerate:
		secret = newSecret()
		if err := c.store.SetClientEmitSecret(r.Context(), p.ID, secret); err != nil {
			writeInternal(w, c.log, "set client-emit secret", err)
			return
		}
		c.live.ClientEmitSecretChanged(p.ID, secret)
	case secret == "":
		var err error
		if secret, err = c.store.EnsureClientEmitSecret(r.Context(), p.ID, newSecret()); err != nil {
			writeInternal(w, c.log, "set client-emit secret", err)
			return
		}
		c.live.ClientEmitSecretChanged(p.ID, secret)
	}
	writeJSON(w, http.StatusOK, map[string]string{"clientEmitSecret": secret})
}
