package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// controlPlane serves the control plane under /api/ (api/openapi.yaml).
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
		ID        string `json:"id"`
		KeyType   string `json:"keyType"`
		KeyPrefix string `json:"keyPrefix"`
		CreatedAt string `json:"createdAt"`
		// RevokedAt is when the key stopped authenticating: revoked, or
		// the end of its overlap window once that has passed.
		RevokedAt  *string `json:"revokedAt"`
		ExpiresAt  *string `json:"expiresAt"`  // the end of its overlap window, if it has one
		LastUsedAt *string `json:"lastUsedAt"` // written at most once a minute
	}
	rotatedKeyBody struct {
		ID        string `json:"id"`
		KeyType   string `json:"keyType"`
		KeyPrefix string `json:"keyPrefix"`
		Raw       string `json:"raw"`
	}
)

func timestamp(t time.Time) string { return string(appendTimestamp(nil, t)) }

// timestampLayout: UTC with milliseconds, as every timestamp in the API.
const timestampLayout = "2006-01-02T15:04:05.000Z"

func toProjectBody(p store.Project) projectBody {
	return projectBody{ID: p.ID, Name: p.Name, OwnerUserID: p.OwnerUserID, CreatedAt: timestamp(p.CreatedAt)}
}

func optTimestamp(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := timestamp(*t)
	return &s
}

// toKeyBody is a key as listed at now.
func toKeyBody(k store.APIKey, now time.Time) keyBody {
	b := keyBody{ID: k.ID, KeyType: k.KeyType, KeyPrefix: k.KeyPrefix, CreatedAt: timestamp(k.CreatedAt),
		RevokedAt: optTimestamp(k.RevokedAt), ExpiresAt: optTimestamp(k.ExpiresAt), LastUsedAt: optTimestamp(k.LastUsedAt)}
	if k.RevokedAt == nil && !k.ValidAt(now) {
		b.RevokedAt = b.ExpiresAt // refused since its window ended, as a revoked key is
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
	mux.Handle("/api/projects/{projectId}/health", methods{
		http.MethodGet: auth(c.handleHealth),
	})
	c.webhookRoutes(mux) // …/webhook-secret, …/webhook-deliveries and …/webhook-test (webhook_deliveries.go)
	mux.Handle("/api/projects/{projectId}/client-emit-secret", methods{
		http.MethodPatch: auth(c.handleClientEmitSecret),
	})
	mux.Handle("/api/projects/{projectId}/authorization", methods{
		http.MethodGet:   auth(c.handleGetAuthorization),
		http.MethodPatch: auth(c.handleSetAuthorization),
	})
	mux.Handle("/api/projects/{projectId}/authorization/rotate-secret", methods{
		http.MethodPost: auth(c.handleRotateAuthSecret),
	})
	mux.Handle("/api/projects/{projectId}/settings", methods{ // settings_api.go
		http.MethodGet:   auth(c.handleGetSettings),
		http.MethodPatch: auth(c.handleSetSettings),
	})
	mux.Handle("/api/projects/{projectId}/usage", methods{
		http.MethodGet: auth(c.handleUsage),
	})
	mux.HandleFunc("/api/", notFound)
}

// handleSignup: one signup under the brute-force limits (Server.signup).
func (c controlPlane) handleSignup(w http.ResponseWriter, r *http.Request) {
	var in credentials
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return
	}
	u, out, code, retry, err := c.signup(r, strings.TrimSpace(in.Email), in.Password)
	switch out {
	case signupThrottled:
		writeThrottled(w, retry)
	case signupInvalid:
		writeError(w, code)
	case signupFailed:
		writeInternal(w, c.log, "sign up", err)
	case signupOK:
		if c.startSession(w, r, u.ID) {
			writeJSON(w, http.StatusCreated, userBody{ID: u.ID, Email: u.Email})
		}
	}
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
	token, err := c.sessions.start(r.Context(), userID)
	if err != nil {
		writeInternal(w, c.log, "issue session", err)
		return false
	}
	c.sessions.setCookie(w, r, token)
	return true
}

// handleLogout ends the session on the server as well as clearing the
// cookie, so a copy of the cookie is refused from then on. A cookie that does
// not verify has nothing to end. The answer is always 200 with the cookie
// cleared, as the API promises: when the end cannot be stored (the database
// is down), this node still refuses the session for as long as it caches
// it, and the failure is logged; a copy of the cookie may work elsewhere
// until it expires.
func (c controlPlane) handleLogout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(CookieName); err == nil && ck.Value != "" {
		if sess, err := c.sessions.parse(ck.Value); err == nil {
			if err := c.sessions.end(r.Context(), sess); err != nil {
				c.log.Error("logout: the session's end was not stored; the cookie is cleared, but a copy of it stays valid until it expires", "err", err)
			}
		}
	}
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
	p, pub, sec, err := c.ops.create(r.Context(), userID(r), in.Name)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, CreatedProjectJSON(p, pub, sec))
}

// owned loads the caller's project named in the path, or answers 404
// project_not_found (also for someone else's project).
func (c controlPlane) owned(w http.ResponseWriter, r *http.Request) (ownedProject, bool) {
	p, err := c.ops.owned(r.Context(), userID(r), r.PathValue("projectId"))
	if err != nil {
		c.writeOpError(w, err)
		return p, false
	}
	return p, true
}

// ownedWithBody decodes the request's JSON body as In and finds the
// caller's project (the path's projectId); false when it has answered
// already (a bad body, or no such project of theirs).
func ownedWithBody[In any](c controlPlane, w http.ResponseWriter, r *http.Request) (in In, p ownedProject, ok bool) {
	if err := decodeControl(w, r, &in); err != nil {
		writeDecodeError(w, err)
		return in, p, false
	}
	p, ok = c.owned(w, r)
	return in, p, ok
}

// writeOpError answers a failed project operation: a refusal with its error
// code, our own fault with 500 (503 when the database cannot be reached).
func (c controlPlane) writeOpError(w http.ResponseWriter, err error) {
	var refused *proto.Error
	if errors.As(err, &refused) {
		writeError(w, refused.Code)
		return
	}
	writeInternal(w, c.log, "project operation", err)
}

func (c controlPlane) handleGetProject(w http.ResponseWriter, r *http.Request) {
	if p, ok := c.owned(w, r); ok {
		writeJSON(w, http.StatusOK, map[string]any{"project": toProjectBody(p.Project)})
	}
}

func (c controlPlane) handleRenameProject(w http.ResponseWriter, r *http.Request) {
	in, p, ok := ownedWithBody[nameBody](c, w, r)
	if !ok {
		return
	}
	renamed, err := p.rename(r.Context(), in.Name)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"project": map[string]string{"id": renamed.ID, "name": renamed.Name}})
}

func (c controlPlane) handleDeleteProject(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	if err := p.remove(r.Context()); err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

func (c controlPlane) handleListKeys(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	keys, err := c.store.Keys(r.Context(), p.ID)
	if err != nil {
		writeInternal(w, c.log, "list keys", err)
		return
	}
	out := make([]keyBody, 0, len(keys))
	now := c.now()
	for _, k := range keys {
		out = append(out, toKeyBody(k, now))
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}

type keyTypeBody struct {
	KeyType string `json:"keyType"`
	// OverlapSeconds keeps the replaced key valid that long (0 to 86400;
	// absent or null: 0). Any other value is invalid_overlap.
	OverlapSeconds json.RawMessage `json:"overlapSeconds"`
}

// overlapOf reads overlapSeconds: an integer from 0 to MaxKeyOverlap in
// seconds, or errInvalidOverlap.
func overlapOf(raw json.RawMessage) (time.Duration, error) {
	v := strings.TrimSpace(string(raw))
	if v == "" || v == "null" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > int64(MaxKeyOverlap/time.Second) {
		return 0, errInvalidOverlap
	}
	return time.Duration(n) * time.Second, nil
}

func (c controlPlane) handleRotateKey(w http.ResponseWriter, r *http.Request) {
	in, p, ok := ownedWithBody[keyTypeBody](c, w, r)
	if !ok {
		return
	}
	overlap, err := overlapOf(in.OverlapSeconds)
	if err != nil && in.KeyType != "public" && in.KeyType != "secret" {
		err = errInvalidKeyType // the key type is checked first
	}
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	k, raw, until, err := p.rotateKey(r.Context(), in.KeyType, overlap)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, rotatedJSON(k, raw, until))
}

func (c controlPlane) handleRevokeKey(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	if err := p.revokeKey(r.Context(), r.PathValue("keyId")); err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

type regenerateBody struct {
	Regenerate bool `json:"regenerate"`
}

func (c controlPlane) handleClientEmitSecret(w http.ResponseWriter, r *http.Request) {
	in, p, ok := ownedWithBody[regenerateBody](c, w, r)
	if !ok {
		return
	}
	get := p.ensureClientEmitSecret
	if in.Regenerate {
		get = p.regenerateClientEmitSecret
	}
	secret, err := get(r.Context())
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"clientEmitSecret": secret})
}
