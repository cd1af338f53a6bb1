package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// Channel authorization (proto/PROTOCOL.md › Channel authorization), an
// extension off by default: the project setting and its secret, one set of
// operations for the JSON routes, the dashboard and `relay admin`. The
// WebSocket handshake reads the project's authorization through the key
// index, the project actor through its Settings: every change drops the
// project's cached keys (here, and on the other nodes of a cluster) and
// makes the running actors reload their settings.

var (
	errAuthorizationRequired = &proto.Error{Code: proto.CodeAuthorizationRequired}
	errInvalidJWKSURL        = &proto.Error{Code: proto.CodeInvalidJWKSURL}
	errInvalidPrivate        = &proto.Error{Code: proto.CodeInvalidPrivateChannels}
)

// maxPrivatePatterns bounds the channels a project marks private.
const maxPrivatePatterns = 100

// privateChannelsOf reads the stored patterns (comma-separated).
func privateChannelsOf(stored string) []string {
	if stored == "" {
		return nil
	}
	return strings.Split(stored, ",")
}

// storedPrivateChannels checks patterns (each a channel name, or a prefix
// of one ending in *; at most maxPrivatePatterns) and joins them for the
// store, sorted and without repeats.
func storedPrivateChannels(patterns []string) (string, error) {
	if len(patterns) > maxPrivatePatterns {
		return "", errInvalidPrivate
	}
	for _, p := range patterns {
		name, prefix := strings.CutSuffix(p, "*")
		if !proto.ValidChannel(name) && !(prefix && name == "") {
			return "", errInvalidPrivate
		}
	}
	out := slices.Compact(slices.Sorted(slices.Values(patterns)))
	return strings.Join(out, ","), nil
}

// authorizationBody is the setting as the API answers it.
type authorizationBody struct {
	Authorization bool `json:"authorization"`
	// Secret signs the tokens; null until it is first turned on (or a
	// secret rotated).
	Secret *string `json:"secret"`
	// PreviousSecretExpiresAt is the end of the overlap of the secret the
	// last rotation replaced, while it is still valid; null otherwise.
	PreviousSecretExpiresAt *string `json:"previousSecretExpiresAt"`
	// JWKSURL is the project's JWKS, which tokens signed with its own keys
	// (RS256, ES256, EdDSA) are verified against; null when none.
	JWKSURL *string `json:"jwksUrl"`
	// PrivateChannels are the channels marked private besides the
	// private- ones: names, or prefixes ending in *.
	PrivateChannels []string `json:"privateChannels"`
}

// toAuthorizationBody is p's setting as shown at now.
func toAuthorizationBody(p store.Project, now time.Time) authorizationBody {
	b := authorizationBody{Authorization: p.Authorization, PrivateChannels: privateChannelsOf(p.PrivateChannels)}
	if b.PrivateChannels == nil {
		b.PrivateChannels = []string{}
	}
	if p.AuthJWKSURL != "" {
		u := p.AuthJWKSURL
		b.JWKSURL = &u
	}
	if p.AuthSecret != "" {
		s := p.AuthSecret
		b.Secret = &s
	}
	if p.PreviousAuthSecretValidAt(now) {
		b.PreviousSecretExpiresAt = optTimestamp(p.AuthSecretPreviousUntil)
	}
	return b
}

// setAuthorization turns channel authorization on or off; turning it on
// makes the project's first authorization secret (newSecret, as the
// client-emit secret) if it has none. It returns the project as stored.
func (p ownedProject) setAuthorization(ctx context.Context, on bool) (store.Project, error) {
	return p.updateAuthorization(ctx, AuthorizationChange{On: &on})
}

// jwksURLOf checks a JWKS URL as a webhook URL is checked (an absolute
// http or https URL without user name or password, at most maxWebhookURL
// bytes); "" (after trimming) removes it.
func jwksURLOf(raw string) (string, error) {
	url := strings.TrimSpace(raw)
	if url == "" {
		return "", nil
	}
	if !validTargetURL(url) {
		return "", errInvalidJWKSURL
	}
	return url, nil
}

// AuthorizationChange is a change of the setting (the JSON API's PATCH,
// relay admin); a nil field stays as it is.
type AuthorizationChange struct {
	On              *bool
	JWKSURL         *string   // "" removes it
	PrivateChannels *[]string // replaces them
}

// updateAuthorization applies what is given, in one change: on (nil: as
// it is; on makes the first secret as setAuthorization does) and the JWKS
// URL (nil: as it is; "": none). It returns the project as stored.
func (p ownedProject) updateAuthorization(ctx context.Context, c AuthorizationChange) (store.Project, error) {
	on, jwksURL := c.On, c.JWKSURL
	u := store.AuthorizationUpdate{On: on}
	if c.PrivateChannels != nil {
		stored, err := storedPrivateChannels(*c.PrivateChannels)
		if err != nil {
			return store.Project{}, err
		}
		u.PrivateChannels = &stored
	}
	if on != nil && *on {
		u.Candidate = newSecret()
	}
	if jwksURL != nil {
		url, err := jwksURLOf(*jwksURL)
		if err != nil {
			return store.Project{}, err
		}
		u.JWKSURL = &url
	}
	q, err := p.ops.store.UpdateAuthorization(ctx, p.ID, u)
	if errors.Is(err, store.ErrNotFound) { // deleted meanwhile
		return q, errProjectNotFound
	}
	if err != nil {
		return q, fmt.Errorf("set authorization: %w", err)
	}
	p.AuthorizationChanged(ctx, q)
	return q, nil
}

// rotateAuthSecret replaces the authorization secret with a new one. With
// overlap 0 the old one stops at once; with an overlap (up to MaxKeyOverlap,
// as a key rotation's) tokens signed with it stay valid until now + overlap.
// It returns the project as stored.
func (p ownedProject) rotateAuthSecret(ctx context.Context, overlap time.Duration) (store.Project, error) {
	if overlap < 0 || overlap > MaxKeyOverlap {
		return store.Project{}, errInvalidOverlap
	}
	var until time.Time
	if overlap > 0 {
		until = p.ops.now().UTC().Add(overlap).Truncate(time.Microsecond)
	}
	q, err := p.ops.store.RotateAuthSecret(ctx, p.ID, newSecret(), until)
	if errors.Is(err, store.ErrNotFound) {
		return q, errProjectNotFound
	}
	if err != nil {
		return q, fmt.Errorf("rotate authorization secret: %w", err)
	}
	p.AuthorizationChanged(ctx, q)
	return q, nil
}

// AuthorizationChanged tells the live connection plane: this node's key
// index drops the project's keys (the handshake reads the authorization
// with them), the other nodes of a cluster drop theirs (no key is revoked),
// this node's live project takes q's authorization before the answer (a
// subscribe sent after it is judged by it), and the other nodes reload
// their settings. Nodes outside the cluster drop their cached keys, and
// reload, when they read the key change the store recorded with the change.
func (p ownedProject) AuthorizationChanged(ctx context.Context, q store.Project) {
	p.ops.keys.invalidate(p.ID)
	p.ops.live.KeysRevoked(p.ID, nil)
	p.ops.live.AuthorizationChanged(ctx, p.ID, ProjectAuthz(q, p.ops.now()))
}

// The JSON routes.

type authorizationPatch struct {
	Authorization   *bool         `json:"authorization"`
	JWKSURL         optionalField `json:"jwksUrl"`
	PrivateChannels *[]string     `json:"privateChannels"` // null: unchanged
}

// optionalField is a string field that may be absent (set false), null
// (set, value nil) or a string.
type optionalField struct {
	set   bool
	value *string
}

func (f *optionalField) UnmarshalJSON(b []byte) error {
	f.set = true
	return json.Unmarshal(b, &f.value)
}

// change is the field as a change: nil when absent, "" when null.
func (f optionalField) change() *string {
	if !f.set {
		return nil
	}
	v := ""
	if f.value != nil {
		v = *f.value
	}
	return &v
}

type rotateAuthSecretBody struct {
	// OverlapSeconds: as a key rotation's (overlapOf).
	OverlapSeconds json.RawMessage `json:"overlapSeconds"`
}

func (c controlPlane) handleGetAuthorization(w http.ResponseWriter, r *http.Request) {
	if p, ok := c.owned(w, r); ok {
		writeJSON(w, http.StatusOK, toAuthorizationBody(p.Project, c.now()))
	}
}

func (c controlPlane) handleSetAuthorization(w http.ResponseWriter, r *http.Request) {
	in, p, ok := ownedWithBody[authorizationPatch](c, w, r)
	if !ok {
		return
	}
	// jwksUrl or privateChannels alone change only them; a null or ""
	// jwksUrl removes it.
	if in.Authorization == nil && !in.JWKSURL.set && in.PrivateChannels == nil {
		c.writeOpError(w, errAuthorizationRequired)
		return
	}
	q, err := p.updateAuthorization(r.Context(), AuthorizationChange{On: in.Authorization, JWKSURL: in.JWKSURL.change(), PrivateChannels: in.PrivateChannels})
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toAuthorizationBody(q, c.now()))
}

func (c controlPlane) handleRotateAuthSecret(w http.ResponseWriter, r *http.Request) {
	in, p, ok := ownedWithBody[rotateAuthSecretBody](c, w, r)
	if !ok {
		return
	}
	overlap, err := overlapOf(in.OverlapSeconds)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	q, err := p.rotateAuthSecret(r.Context(), overlap)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toAuthorizationBody(q, c.now()))
}

// The dashboard's forms (the project page's "Channel authorization").

// handleAuthorizationOn turns it on, after a confirmation: presence then
// needs a connection token, which pages that connect today do not send.
func (d dashboard) handleAuthorizationOn(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok || !d.confirmed(w, r, v, p, confirmView{
		Heading: "Turn on channel authorization?",
		Message: "From now on private- channels need a grant from a token signed with the authorization secret, and presence needs a connection token " +
			"whose sub is the clientId. Connections without a token can still subscribe to public channels, without presence.",
		Button: "Turn on",
	}) {
		return
	}
	if _, err := p.setAuthorization(r.Context(), true); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "auth-on")
}

// handleAuthorizationOff turns it off, after a confirmation: private-
// channels are then open to every connection. The secret is kept.
func (d dashboard) handleAuthorizationOff(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok || !d.confirmed(w, r, v, p, confirmView{
		Heading: "Turn off channel authorization?",
		Message: "Tokens are then ignored: any connection with the public key can subscribe to private- channels and join presence with any clientId. " +
			"The authorization secret is kept for when you turn it on again.",
		Button: "Turn off", Danger: true,
	}) {
		return
	}
	if _, err := p.setAuthorization(r.Context(), false); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "auth-off")
}

// handleRotateAuthSecret replaces the secret, the old one valid for the
// overlap chosen (as a key rotation's form).
func (d dashboard) handleRotateAuthSecret(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	overlap, err := overlapOf(json.RawMessage(strings.TrimSpace(r.PostFormValue("overlapSeconds"))))
	if err == nil {
		_, err = p.rotateAuthSecret(r.Context(), overlap)
	}
	if err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	if overlap > 0 {
		done(w, r, p.ID, "auth-overlap")
		return
	}
	done(w, r, p.ID, "auth-rotated")
}

// handleSetJWKSURL sets, changes or (empty) removes the JWKS URL.
func (d dashboard) handleSetJWKSURL(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	in := r.PostFormValue("url")
	q, err := p.updateAuthorization(r.Context(), AuthorizationChange{JWKSURL: &in})
	if err != nil {
		d.opFailed(w, r, v, p.Project, err, &projectView{ErrorForm: "jwks", JWKSInput: in})
		return
	}
	if q.AuthJWKSURL == "" {
		done(w, r, p.ID, "auth-jwks-removed")
		return
	}
	done(w, r, p.ID, "auth-jwks-saved")
}

// The command line.

// Authorization is the project's channel authorization, as GET
// /api/projects/{id}/authorization answers it.
func (a *Admin) Authorization(ctx context.Context, projectID string) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	return toAuthorizationBody(p.Project, a.ops.now()), nil
}

// SetAuthorization turns channel authorization on or off, as PATCH
// /api/projects/{id}/authorization does, and returns what it answers.
func (a *Admin) SetAuthorization(ctx context.Context, projectID string, on bool) (any, error) {
	return a.UpdateAuthorization(ctx, projectID, AuthorizationChange{On: &on})
}

// UpdateAuthorization applies c (on or off, the JWKS URL, the channels
// marked private), as PATCH /api/projects/{id}/authorization does, and
// returns what it answers.
func (a *Admin) UpdateAuthorization(ctx context.Context, projectID string, c AuthorizationChange) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	q, err := p.updateAuthorization(ctx, c)
	if err != nil {
		return nil, err
	}
	return toAuthorizationBody(q, a.ops.now()), nil
}

// RotateAuthSecret replaces the authorization secret, as POST
// /api/projects/{id}/authorization/rotate-secret does, and returns what it
// answers.
func (a *Admin) RotateAuthSecret(ctx context.Context, projectID string, overlap time.Duration) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	q, err := p.rotateAuthSecret(ctx, overlap)
	if err != nil {
		return nil, err
	}
	return toAuthorizationBody(q, a.ops.now()), nil
}
