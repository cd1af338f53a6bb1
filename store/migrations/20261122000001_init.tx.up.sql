CREATE TABLE users (
    id            {{.UUID}} PRIMARY KEY,
    email         TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    created_at    {{.TS}} NOT NULL
);
--bun:split
CREATE UNIQUE INDEX users_email_key ON users (lower(email));
--bun:split
CREATE TABLE projects (
    id                 {{.UUID}} PRIMARY KEY,
    owner_user_id      {{.UUID}} NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name               TEXT NOT NULL,
    client_emit_secret TEXT NOT NULL DEFAULT '',
    created_at         {{.TS}} NOT NULL
);
--bun:split
CREATE INDEX projects_owner_idx ON projects (owner_user_id, created_at);
--bun:split
CREATE TABLE api_keys (
    id         {{.UUID}} PRIMARY KEY,
    project_id {{.UUID}} NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    key_type   TEXT NOT NULL CHECK (key_type IN ('public', 'secret')),
    key_hash   TEXT NOT NULL,
    key_prefix TEXT NOT NULL,
    created_at {{.TS}} NOT NULL,
    revoked_at {{.TS}}
);
--bun:split
CREATE UNIQUE INDEX api_keys_hash_key ON api_keys (key_hash);
--bun:split
CREATE INDEX api_keys_project_idx ON api_keys (project_id, created_at);
--bun:split
-- Per-project settings the dashboard edits: channel budget override and webhook.
CREATE TABLE project_settings (
    project_id         {{.UUID}} PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    channel_rate_limit INTEGER,
    webhook_url        TEXT NOT NULL DEFAULT '',
    webhook_secret     TEXT NOT NULL DEFAULT '',
    updated_at         {{.TS}} NOT NULL
);
--bun:split
-- Daily usage rows; day is a UTC 'YYYY-MM-DD' string so both stores compare it alike.
CREATE TABLE usage_daily (
    project_id                  {{.UUID}} NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    day                         TEXT NOT NULL,
    connection_count            BIGINT NOT NULL DEFAULT 0,
    message_count               BIGINT NOT NULL DEFAULT 0,
    peak_concurrent_connections BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, day)
);
--bun:split
-- Client-emit token revocations, by jti or by clientId; kept until expires_at,
-- after which no token they could match can still be valid.
CREATE TABLE emit_token_revocations (
    project_id {{.UUID}} NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    kind       TEXT NOT NULL CHECK (kind IN ('jti', 'client')),
    value      TEXT NOT NULL,
    revoked_at {{.TS}} NOT NULL,
    expires_at {{.TS}} NOT NULL,
    PRIMARY KEY (project_id, kind, value)
);
--bun:split
CREATE INDEX emit_token_revocations_expiry_idx ON emit_token_revocations (expires_at);
--bun:split
-- Small process-wide values, such as the generated session secret.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
