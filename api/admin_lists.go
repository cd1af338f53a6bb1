package api

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/relayhq/relay/store"
)

// What `relay admin` shows of accounts, projects and keys (list-users,
// show-user, list-projects, show-project, list-keys): the control plane's
// bodies, with no secret (keys masked, no client-emit, webhook or
// authorization secret).

// adminUserBody is a user as the command line lists it.
type adminUserBody struct {
	ID        string `json:"id"`
	Email     string `json:"email"`
	CreatedAt string `json:"createdAt"`
	Projects  int    `json:"projects"` // how many it owns
}

// adminKeyBody is a key as GET …/keys lists it, with its status at the
// time: active, overlap (replaced by a rotation, valid until expiresAt),
// expired (its overlap ended) or revoked.
type adminKeyBody struct {
	keyBody
	Status string `json:"status"`
}

// adminAuthorizationBody is channel authorization without its secrets.
type adminAuthorizationBody struct {
	Authorization bool    `json:"authorization"`
	SecretSet     bool    `json:"secretSet"`
	JWKSURL       *string `json:"jwksUrl"`
}

func (a *Admin) user(ctx context.Context, email string) (store.User, error) {
	u, err := a.ops.store.UserByEmail(ctx, strings.TrimSpace(email))
	if errors.Is(err, store.ErrNotFound) {
		return u, errUserNotFound
	}
	if err != nil {
		return u, fmt.Errorf("load user: %w", err)
	}
	return u, nil
}

// ListUsers lists every account, oldest first, with how many projects each
// owns.
func (a *Admin) ListUsers(ctx context.Context) (any, error) {
	us, err := a.ops.store.Users(ctx)
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	ps, err := a.ops.store.Projects(ctx)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	owned := map[string]int{}
	for _, p := range ps {
		owned[p.OwnerUserID]++
	}
	out := make([]adminUserBody, 0, len(us))
	for _, u := range us {
		out = append(out, adminUserBody{ID: u.ID, Email: u.Email, CreatedAt: timestamp(u.CreatedAt), Projects: owned[u.ID]})
	}
	return map[string]any{"users": out}, nil
}

// ShowUser is the account with this email (any case) and its projects, as
// GET /api/projects lists them for it.
func (a *Admin) ShowUser(ctx context.Context, email string) (any, error) {
	u, err := a.user(ctx, email)
	if err != nil {
		return nil, err
	}
	ps, err := a.ops.store.ProjectsByOwner(ctx, u.ID)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return map[string]any{
		"user":     adminUserBody{ID: u.ID, Email: u.Email, CreatedAt: timestamp(u.CreatedAt), Projects: len(ps)},
		"projects": projectBodies(ps),
	}, nil
}

// ListProjects lists every project, or ("" not) those of the account with
// this email, oldest first.
func (a *Admin) ListProjects(ctx context.Context, email string) (any, error) {
	var ps []store.Project
	var err error
	if email == "" {
		ps, err = a.ops.store.Projects(ctx)
	} else {
		var u store.User
		if u, err = a.user(ctx, email); err != nil {
			return nil, err
		}
		ps, err = a.ops.store.ProjectsByOwner(ctx, u.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return map[string]any{"projects": projectBodies(ps)}, nil
}

func projectBodies(ps []store.Project) []projectBody {
	out := make([]projectBody, 0, len(ps))
	for _, p := range ps {
		out = append(out, toProjectBody(p))
	}
	return out
}

// ShowProject is the project, its owner's email, its settings (as GET
// …/settings answers them), its channel authorization without the secret,
// and its keys (as ListKeys).
func (a *Admin) ShowProject(ctx context.Context, projectID string) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	owner, err := a.ops.store.UserByID(ctx, p.OwnerUserID)
	if err != nil {
		return nil, fmt.Errorf("load owner: %w", err)
	}
	settings, err := p.settings(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := a.keys(ctx, p)
	if err != nil {
		return nil, err
	}
	az := adminAuthorizationBody{Authorization: p.Authorization, SecretSet: p.AuthSecret != ""}
	if p.AuthJWKSURL != "" {
		u := p.AuthJWKSURL
		az.JWKSURL = &u
	}
	return map[string]any{
		"project":       toProjectBody(p.Project),
		"ownerEmail":    owner.Email,
		"settings":      settings,
		"authorization": az,
		"keys":          keys,
	}, nil
}

// ListKeys lists the project's keys, masked, oldest first, each with its
// status.
func (a *Admin) ListKeys(ctx context.Context, projectID string) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	keys, err := a.keys(ctx, p)
	if err != nil {
		return nil, err
	}
	return map[string]any{"keys": keys}, nil
}

func (a *Admin) keys(ctx context.Context, p ownedProject) ([]adminKeyBody, error) {
	ks, err := a.ops.store.Keys(ctx, p.ID)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	now := a.ops.now()
	out := make([]adminKeyBody, 0, len(ks))
	for _, k := range ks {
		status := "active"
		switch {
		case k.RevokedAt != nil:
			status = "revoked"
		case !k.ValidAt(now):
			status = "expired"
		case k.ExpiresAt != nil:
			status = "overlap"
		}
		out = append(out, adminKeyBody{keyBody: toKeyBody(k, now), Status: status})
	}
	return out, nil
}
