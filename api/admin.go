package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// Admin is the project operations for the command line (`relay admin`): the
// same code as the control plane and the dashboard, acting as the operator
// (no owner check) and with no connection plane to tell: a running relay on
// the same store learns of its key changes from the store within about a
// second (WatchKeyChanges; cmd/relay/README.md › Version and admin command line).
type Admin struct {
	ops *projectOps
}

// NewAdmin returns the operations on st. maxProjects is MAX_PROJECTS_PER_USER
// (0: no cap).
func NewAdmin(st *store.Store, maxProjects int) *Admin {
	return &Admin{ops: &projectOps{
		store: st, keys: newKeyIndex(storeKeys(st), 1), live: noLive{}, now: time.Now, maxProjects: maxProjects,
	}}
}

// SetHistoryMaxRetention is HISTORY_MAX_RETENTION_SECONDS for the settings
// the command line changes (zero: DefaultHistoryMaxRetention).
func (a *Admin) SetHistoryMaxRetention(d time.Duration) { a.ops.maxRetention = d }

// Refusals of the command line that have no error code.
var errUserNotFound = errors.New("no user with this email")

// CreateUser creates an account with the checks and password hash of signup,
// except the signup allowlist (the operator chooses who gets an account).
func (a *Admin) CreateUser(ctx context.Context, email, password string) (store.User, error) {
	email = strings.TrimSpace(email)
	if code := newCredentialsRefusal(email, password); code != "" {
		return store.User{}, &proto.Error{Code: code}
	}
	hash, err := hashPassword(password)
	if err != nil {
		return store.User{}, fmt.Errorf("hash password: %w", err)
	}
	return createAccount(ctx, a.ops.store, email, hash)
}

// CreateProject creates a project owned by the user with this email, with
// its public and secret keys; the raw keys exist only in this answer.
func (a *Admin) CreateProject(ctx context.Context, email, name string) (p store.Project, publicKey, secretKey string, err error) {
	u, err := a.ops.store.UserByEmail(ctx, strings.TrimSpace(email))
	if errors.Is(err, store.ErrNotFound) {
		return p, "", "", errUserNotFound
	}
	if err != nil {
		return p, "", "", fmt.Errorf("load user: %w", err)
	}
	return a.ops.create(ctx, u.ID, name)
}

// project loads a project whoever owns it, as the operator may.
func (a *Admin) project(ctx context.Context, projectID string) (ownedProject, error) {
	p, err := a.ops.store.Project(ctx, projectID)
	if errors.Is(err, store.ErrNotFound) {
		return ownedProject{}, errProjectNotFound
	}
	if err != nil {
		return ownedProject{}, fmt.Errorf("load project: %w", err)
	}
	return ownedProject{Project: p, ops: a.ops}, nil
}

// RotateKey issues a new key of keyType ("public" or "secret"), revoking the
// active one, and returns its row and the raw key, shown only once.
func (a *Admin) RotateKey(ctx context.Context, projectID, keyType string) (store.APIKey, string, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return store.APIKey{}, "", err
	}
	k, raw, _, err := p.rotateKey(ctx, keyType, 0)
	return k, raw, err
}

// RevokeKey revokes one key of the project.
func (a *Admin) RevokeKey(ctx context.Context, projectID, keyID string) error {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return err
	}
	return p.revokeKey(ctx, keyID)
}

// ClientEmitSecret is the project's client-emit secret, "" when none is set
// (the dashboard or PATCH …/client-emit-secret sets the first one).
func (a *Admin) ClientEmitSecret(ctx context.Context, projectID string) (store.Project, string, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return store.Project{}, "", err
	}
	return p.Project, p.ClientEmitSecret, nil
}

// The JSON the command line prints: the bodies the control plane answers.

// UserJSON is a user as POST /api/auth/signup answers it.
func UserJSON(u store.User) any { return userBody{ID: u.ID, Email: u.Email} }

// CreatedProjectJSON is a new project with its raw keys, as POST
// /api/projects answers it.
func CreatedProjectJSON(p store.Project, publicKey, secretKey string) any {
	return map[string]any{
		"project": toProjectBody(p),
		"keys":    map[string]string{"publicKey": publicKey, "secretKey": secretKey},
	}
}

// RotatedKeyJSON is a new key with its raw value, as POST …/keys/rotate
// answers it.
func RotatedKeyJSON(k store.APIKey, raw string) any {
	return rotatedJSON(k, raw, time.Time{})
}

// rotatedJSON is RotatedKeyJSON, with previousValidUntil when the rotation
// left the keys it replaced valid until then (an overlap window).
func rotatedJSON(k store.APIKey, raw string, until time.Time) any {
	out := map[string]any{"key": rotatedKeyBody{ID: k.ID, KeyType: k.KeyType, KeyPrefix: k.KeyPrefix, Raw: raw}}
	if !until.IsZero() {
		out["previousValidUntil"] = timestamp(until)
	}
	return out
}
