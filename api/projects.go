package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// The project operations, one set for both front-ends (the JSON control plane
// and the dashboard), whose handlers only decode and render. Each operation
// writes the store first, then tells the live connection plane (the key index,
// the project actor) before it returns, so the change has reached the live
// project before the HTTP answer: a revoked or rotated key fails on the very
// next request, a new client-emit secret or revocation applies to the next
// frame.
//
// A refusal is a typed error: a *proto.Error for the refusals with an error
// code (the JSON routes answer the code, the dashboard says it in words), or
// one of the dashboard-only errors below. Any other error is our own fault,
// wrapped with what was being done.

// Refusals with an error code (api/openapi.yaml).
var (
	errProjectNotFound = &proto.Error{Code: proto.CodeProjectNotFound}
	errKeyNotFound     = &proto.Error{Code: proto.CodeKeyNotFound}
	errNameRequired    = &proto.Error{Code: proto.CodeNameRequired}
	errInvalidKeyType  = &proto.Error{Code: proto.CodeInvalidKeyType}
	errInvalidOverlap  = &proto.Error{Code: proto.CodeInvalidOverlap}
)

// MaxKeyOverlap is the longest overlap window a rotation may leave the
// replaced key valid for.
const MaxKeyOverlap = 24 * time.Hour

// Refusals of the settings (the dashboard's forms, PATCH …/settings and
// `relay admin project settings`: settings_api.go).
var (
	errInvalidWebhookURL = &proto.Error{Code: proto.CodeInvalidWebhookURL}
	errNoWebhookURL      = &proto.Error{Code: proto.CodeWebhookURLRequired}
	errInvalidBudget     = &proto.Error{Code: proto.CodeInvalidChannelRateLimit}
	errInvalidRetention  = &proto.Error{Code: proto.CodeInvalidHistoryRetention}
)

// DefaultHistoryMaxRetention is HISTORY_MAX_RETENTION_SECONDS' default: the
// longest a project may keep its channel history.
const DefaultHistoryMaxRetention = 7 * 24 * time.Hour

// maxWebhookURL bounds what we store and send to.
const maxWebhookURL = 2048

// maxChannelBudget keeps the override inside the store's integer column.
const maxChannelBudget = 1_000_000_000

// liveProjects is what the operations tell the actor system (*actors.System).
type liveProjects interface {
	ProjectDeleted(projectID string)
	SettingsChanged(projectID string)
	ClientEmitSecretChanged(projectID, secret string)
	Revoke(projectID string, revs []actors.Revocation)
	KeysRevoked(projectID string, keyHashes []string)
	AuthorizationChanged(ctx context.Context, projectID string, az actors.ProjectAuthz)
}

// noLive stands in when there is no connection plane to tell.
type noLive struct{}

func (noLive) ProjectDeleted(string)                                             {}
func (noLive) SettingsChanged(string)                                            {}
func (noLive) ClientEmitSecretChanged(string, string)                            {}
func (noLive) Revoke(string, []actors.Revocation)                                {}
func (noLive) AuthorizationChanged(context.Context, string, actors.ProjectAuthz) {}
func (noLive) KeysRevoked(string, []string)                                      {}

// projectOps changes projects. It holds no state of its own.
type projectOps struct {
	store    *store.Store
	keys     *keyIndex
	live     liveProjects
	now      func() time.Time
	tokenTTL time.Duration // CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS

	maxProjects     int           // per user (checked by the store, in the creating transaction); 0: no cap
	maxRevocations  int           // stored per project; 0: no cap
	maxRetention    time.Duration // HISTORY_MAX_RETENTION_SECONDS: a project's history retention at most
	maxHistoryBytes int64         // HISTORY_MAX_BYTES_PER_PROJECT, for display
}

// Refusals of the bounds on what one tenant can make the store hold.
var (
	errTooManyProjects    = &proto.Error{Code: proto.CodeTooManyProjects}
	errTooManyRevocations = &proto.Error{Code: proto.CodeTooManyRevocations}
)

// create makes a project owned by ownerID with a fresh public and secret
// key, and returns the raw keys: they exist only in this answer.
func (o *projectOps) create(ctx context.Context, ownerID, name string) (p store.Project, publicKey, secretKey string, err error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return p, "", "", errNameRequired
	}
	pub, sec := newRawKey(PublicKeyPrefix), newRawKey(SecretKeyPrefix)
	p, err = o.store.CreateProject(ctx, ownerID, name, o.maxProjects, storedKey("public", pub), storedKey("secret", sec))
	if errors.Is(err, store.ErrLimitReached) {
		return p, "", "", errTooManyProjects
	}
	if err != nil {
		return p, "", "", fmt.Errorf("create project: %w", err)
	}
	return p, pub, sec, nil
}

// storedKey is the row of a new raw key: its hash and masked prefix, never the key.
func storedKey(keyType, raw string) store.APIKey {
	return store.APIKey{KeyType: keyType, KeyHash: HashKey(raw), KeyPrefix: maskKey(raw)}
}

// ownedProject is a project whose owner has been checked; the operations on
// one project are its methods, so none runs without that check.
type ownedProject struct {
	store.Project
	ops *projectOps
}

// owned loads ownerID's project projectID, or refuses with project_not_found,
// also for someone else's project, so ids of others are not confirmed.
func (o *projectOps) owned(ctx context.Context, ownerID, projectID string) (ownedProject, error) {
	p, err := o.store.ProjectOfOwner(ctx, projectID, ownerID)
	if errors.Is(err, store.ErrNotFound) {
		return ownedProject{}, errProjectNotFound
	}
	if err != nil {
		return ownedProject{}, fmt.Errorf("load project: %w", err)
	}
	return ownedProject{Project: p, ops: o}, nil
}

// rename renames the project and returns it as stored.
func (p ownedProject) rename(ctx context.Context, name string) (store.Project, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return store.Project{}, errNameRequired
	}
	renamed, err := p.ops.store.RenameProject(ctx, p.ID, p.OwnerUserID, name)
	if errors.Is(err, store.ErrNotFound) { // deleted meanwhile
		return store.Project{}, errProjectNotFound
	}
	if err != nil {
		return store.Project{}, fmt.Errorf("rename project: %w", err)
	}
	return renamed, nil
}

// remove deletes the project with its keys, then forgets its keys and closes
// its live connections.
func (p ownedProject) remove(ctx context.Context) error {
	err := p.ops.store.DeleteProject(ctx, p.ID, p.OwnerUserID)
	if errors.Is(err, store.ErrNotFound) {
		return errProjectNotFound
	}
	if err != nil {
		return fmt.Errorf("delete project: %w", err)
	}
	p.ops.keys.invalidate(p.ID) // p.ID is canonical, as the live state knows it
	p.ops.live.ProjectDeleted(p.ID)
	return nil
}

// rotateKey issues a new key of keyType ("public" or "secret") and returns
// its row and the raw key, shown only once. With overlap 0 the key it
// replaces is revoked at once; with an overlap (up to MaxKeyOverlap) that
// key stays valid until now + overlap, beside the new one, and is refused
// from then on, its sockets closed (KeyTick).
//
// until is the end of the window given to the keys it replaced; zero when
// it revoked them, or replaced none.
func (p ownedProject) rotateKey(ctx context.Context, keyType string, overlap time.Duration) (k store.APIKey, raw string, until time.Time, err error) {
	switch keyType {
	case "public":
		raw = newRawKey(PublicKeyPrefix)
	case "secret":
		raw = newRawKey(SecretKeyPrefix)
	default:
		return k, "", until, errInvalidKeyType
	}
	if overlap < 0 || overlap > MaxKeyOverlap {
		return k, "", until, errInvalidOverlap
	}
	if overlap == 0 {
		k, revoked, err := p.ops.store.RotateKey(ctx, p.ID, storedKey(keyType, raw))
		if err != nil {
			return k, "", until, fmt.Errorf("rotate key: %w", err)
		}
		p.ops.keys.invalidate(p.ID)
		// The sockets of the replaced key close (a secret key has none); other
		// nodes drop their cached keys.
		p.ops.live.KeysRevoked(p.ID, revoked)
		return k, raw, until, nil
	}
	end := p.ops.now().UTC().Add(overlap).Truncate(time.Microsecond)
	k, expiring, err := p.ops.store.RotateKeyUntil(ctx, p.ID, storedKey(keyType, raw), end)
	if err != nil {
		return k, "", until, fmt.Errorf("rotate key: %w", err)
	}
	p.ops.keys.invalidate(p.ID)
	// No socket closes now; every node drops its cached keys of the project
	// and caches them again with their end.
	p.ops.live.KeysRevoked(p.ID, nil)
	if len(expiring) > 0 {
		until = end
	}
	return k, raw, until, nil
}

// revokeKey revokes one key of the project (again: no change).
func (p ownedProject) revokeKey(ctx context.Context, keyID string) error {
	k, err := p.ops.store.RevokeKey(ctx, p.ID, keyID)
	if errors.Is(err, store.ErrNotFound) {
		return errKeyNotFound
	}
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	p.ops.keys.invalidate(p.ID)
	// A secret key's hash closes no socket; in a cluster, other nodes drop
	// their cached keys of the project whatever the key's type.
	p.ops.live.KeysRevoked(p.ID, []string{k.KeyHash})
	return nil
}

// ensureClientEmitSecret returns the client-emit secret, generating the
// first one; an existing one is kept.
func (p ownedProject) ensureClientEmitSecret(ctx context.Context) (string, error) {
	if p.ClientEmitSecret != "" {
		return p.ClientEmitSecret, nil
	}
	// Two first requests at once both end with the one secret stored.
	secret, err := p.ops.store.EnsureClientEmitSecret(ctx, p.ID, newSecret())
	if err != nil {
		return "", fmt.Errorf("set client-emit secret: %w", err)
	}
	p.ops.live.ClientEmitSecretChanged(p.ID, secret)
	return secret, nil
}

// regenerateClientEmitSecret replaces the client-emit secret: every token
// signed with the old one stops working at once.
func (p ownedProject) regenerateClientEmitSecret(ctx context.Context) (string, error) {
	secret := newSecret()
	if err := p.ops.store.SetClientEmitSecret(ctx, p.ID, secret); err != nil {
		return "", fmt.Errorf("set client-emit secret: %w", err)
	}
	p.ops.live.ClientEmitSecretChanged(p.ID, secret)
	return secret, nil
}

// setWebhook sets or changes the webhook URL. The signing secret is
// generated when a URL is first set and kept when it changes.
func (p ownedProject) setWebhook(ctx context.Context, url string) error {
	change, err := webhookURLChange(url)
	if err != nil {
		return err
	}
	return p.updateSettings(ctx, "save webhook", change)
}

// settingsChange is one change of a project's settings row, applied in the
// store's transaction (updateSettings); an error refuses the whole change.
type settingsChange func(*store.Settings) error

// webhookURLChange checks a webhook URL (trimmed; validTargetURL) and
// returns the change that sets it: the signing secret is generated when a
// URL is first set and kept when it changes.
func webhookURLChange(raw string) (settingsChange, error) {
	url := strings.TrimSpace(raw)
	if !validTargetURL(url) {
		return nil, errInvalidWebhookURL
	}
	return func(st *store.Settings) error {
		st.WebhookURL = url
		if st.WebhookSecret == "" {
			st.WebhookSecret = newSecret()
		}
		return nil
	}, nil
}

// validTargetURL: url (trimmed) is one Relay may send to or fetch from, a
// webhook URL or a JWKS URL: an absolute http or https URL without user
// name or password, at most maxWebhookURL bytes. Private addresses are
// refused when dialled (webhook.NewClient).
func validTargetURL(url string) bool {
	return url != "" && len(url) <= maxWebhookURL && webhook.ValidURL(url)
}

// removeWebhook clears the webhook URL and its secret, and the choice of
// events beyond connect and disconnect: a URL set again starts without them.
func (p ownedProject) removeWebhook(ctx context.Context) error {
	return p.updateSettings(ctx, "remove webhook", removeWebhookChange)
}

// removeWebhookChange is removeWebhook's change.
func removeWebhookChange(st *store.Settings) error {
	st.WebhookURL, st.WebhookSecret = "", ""
	st.WebhookChannelEvents, st.WebhookPresenceEvents = false, false
	return nil
}

// setWebhookEvents chooses the events sent beyond connect and disconnect:
// channel_occupied/channel_vacated (channel) and member_added/member_removed
// (presence). A project without a webhook URL (perhaps removed meanwhile) is
// refused.
func (p ownedProject) setWebhookEvents(ctx context.Context, channel, presence bool) error {
	return p.updateSettings(ctx, "save webhook events", webhookEventsChange(&channel, &presence))
}

// webhookEventsChange is setWebhookEvents' change; a nil choice keeps the
// stored one.
func webhookEventsChange(channel, presence *bool) settingsChange {
	return func(st *store.Settings) error {
		if st.WebhookURL == "" {
			return errNoWebhookURL
		}
		if channel != nil {
			st.WebhookChannelEvents = *channel
		}
		if presence != nil {
			st.WebhookPresenceEvents = *presence
		}
		return nil
	}
}

// webhookSecret is the webhook signing secret; errNoWebhookURL when the
// project has no webhook URL (and so no secret: the dashboard asks before
// offering a new one).
func (p ownedProject) webhookSecret(ctx context.Context) (string, error) {
	st, err := p.ops.store.Settings(ctx, p.ID)
	if err != nil {
		return "", fmt.Errorf("load settings: %w", err)
	}
	if st.WebhookURL == "" {
		return "", errNoWebhookURL
	}
	return st.WebhookSecret, nil
}

// regenerateWebhookSecret replaces the webhook signing secret and returns
// the new one; a project without a webhook URL (perhaps removed meanwhile)
// is refused.
func (p ownedProject) regenerateWebhookSecret(ctx context.Context) (string, error) {
	st, err := p.changeSettings(ctx, "regenerate webhook secret", func(st *store.Settings) error {
		if st.WebhookURL == "" {
			return errNoWebhookURL
		}
		st.WebhookSecret = newSecret()
		return nil
	})
	return st.WebhookSecret, err
}

// setChannelBudget sets the per-channel emit budget override (messages per
// minute, replacing EMIT_RATE_LIMIT_PER_MINUTE for this project), or clears
// it when limit is nil.
func (p ownedProject) setChannelBudget(ctx context.Context, limit *int) error {
	change, err := channelBudgetChange(limit)
	if err != nil {
		return err
	}
	return p.updateSettings(ctx, "save channel budget", change)
}

// channelBudgetChange checks a channel budget override (nil: none, the
// server default) and returns the change that saves it.
func channelBudgetChange(limit *int) (settingsChange, error) {
	if limit != nil && (*limit < 1 || *limit > maxChannelBudget) {
		return nil, errInvalidBudget
	}
	return func(st *store.Settings) error {
		st.ChannelRateLimit = limit
		return nil
	}, nil
}

// setHistoryRetention sets how long the project's channel messages are
// kept in the store (0: none, the default).
func (p ownedProject) setHistoryRetention(ctx context.Context, seconds int) error {
	change, err := p.ops.historyRetentionChange(seconds)
	if err != nil {
		return err
	}
	return p.updateSettings(ctx, "save history retention", change)
}

// historyRetentionChange checks a history retention (0 to the operator's
// cap, in seconds) and returns the change that saves it.
func (o *projectOps) historyRetentionChange(seconds int) (settingsChange, error) {
	if seconds < 0 || time.Duration(seconds)*time.Second > o.historyCap() {
		return nil, errInvalidRetention
	}
	return func(st *store.Settings) error {
		st.HistoryRetentionSeconds = seconds
		return nil
	}, nil
}

// historyCap is the longest retention a project may set.
func (o *projectOps) historyCap() time.Duration {
	if o.maxRetention > 0 {
		return o.maxRetention
	}
	return DefaultHistoryMaxRetention
}

// updateSettings applies change to the project's settings row (read,
// modify, write in one store transaction) and makes a running project actor
// reload it. A change that refuses saves nothing.
func (p ownedProject) updateSettings(ctx context.Context, what string, change settingsChange) error {
	_, err := p.changeSettings(ctx, what, change)
	return err
}

// changeSettings is updateSettings applying changes in order, all or none
// (one refusing saves nothing), and returning the settings as saved. The
// store records the change as a key change (store.UpdateSettings), so nodes
// that learn of it only from the store (a change made by `relay admin`)
// reload them too.
func (p ownedProject) changeSettings(ctx context.Context, what string, changes ...settingsChange) (store.Settings, error) {
	var refused error
	var saved store.Settings
	err := p.ops.store.UpdateSettings(ctx, p.ID, func(st *store.Settings) error {
		for _, change := range changes {
			if refused = change(st); refused != nil {
				return refused
			}
		}
		saved = *st
		return nil
	})
	switch {
	case refused != nil:
		return saved, refused
	case err != nil:
		return saved, fmt.Errorf("%s: %w", what, err)
	}
	p.ops.live.SettingsChanged(p.ID)
	return saved, nil
}

// revokeTokens revokes client-emit tokens of a project (proto/PROTOCOL.md ›
// POST /emit-tokens/revoke): one jti, every token of a clientId issued until now,
// or both. The revocations are stored before they apply to the live
// project, so they survive a restart.
func (o *projectOps) revokeTokens(ctx context.Context, projectID string, in revokeRequest) error {
	now := o.now().UTC()
	// A token revoked now expires by now + the maximum TTL at the latest.
	expires := now.Add(o.tokenTTL + time.Minute)
	var revs []actors.Revocation
	if in.JTI != "" {
		revs = append(revs, actors.Revocation{Kind: actors.RevokeJTI, Value: in.JTI, RevokedAt: now, ExpiresAt: expires})
	}
	if in.ClientID != "" {
		revs = append(revs, actors.Revocation{Kind: actors.RevokeClient, Value: in.ClientID, RevokedAt: now, ExpiresAt: expires})
	}
	return o.addRevocations(ctx, projectID, now, revs)
}

// userTokensRevokedFor is how long a revocation of a user's tokens (a
// disconnect with revokeTokens) is kept: connection tokens have no cap of
// their own, so one minted to last longer than this works again after it.
const userTokensRevokedFor = 24 * time.Hour

// revokeUserTokens refuses userID's connection tokens (and client-emit
// tokens of that clientId) issued until now, on a project with channel
// authorization: its sockets that open or refresh with one close with 4012.
func (o *projectOps) revokeUserTokens(ctx context.Context, projectID, userID string) error {
	now := o.now().UTC()
	return o.addRevocations(ctx, projectID, now, []actors.Revocation{{Kind: actors.RevokeClient, Value: userID, RevokedAt: now,
		ExpiresAt: now.Add(max(userTokensRevokedFor, o.tokenTTL+time.Minute))}})
}

// addRevocations stores revs (all or none, under MAX_REVOCATIONS_PER_PROJECT)
// and applies them to the live project on every node.
func (o *projectOps) addRevocations(ctx context.Context, projectID string, now time.Time, revs []actors.Revocation) error {
	rows := make([]store.Revocation, len(revs))
	for i, rv := range revs {
		rows[i] = store.Revocation{Kind: rv.Kind, Value: rv.Value, RevokedAt: rv.RevokedAt, ExpiresAt: rv.ExpiresAt}
	}
	err := o.store.AddRevocations(ctx, projectID, now, o.maxRevocations, rows...)
	if errors.Is(err, store.ErrLimitReached) {
		return errTooManyRevocations
	}
	if err != nil {
		return fmt.Errorf("store revocations: %w", err)
	}
	o.live.Revoke(projectID, revs)
	return nil
}
