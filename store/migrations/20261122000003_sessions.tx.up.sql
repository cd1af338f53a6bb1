-- Server-side state of service_session cookies (the cookie stays a signed JWT).
-- Logging out everywhere starts a new epoch for the user: a cookie minted in
-- an older epoch is refused.
CREATE TABLE session_epochs (
    user_id    {{.UUID}} PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    epoch      BIGINT NOT NULL,
    updated_at {{.TS}} NOT NULL
);
--bun:split
-- Sessions ended by a logout, by session id (the cookie's jti); kept until
-- expires_at, after which the cookie is refused for its age anyway.
CREATE TABLE session_revocations (
    session_id TEXT PRIMARY KEY,
    revoked_at {{.TS}} NOT NULL,
    expires_at {{.TS}} NOT NULL
);
--bun:split
CREATE INDEX session_revocations_expiry_idx ON session_revocations (expires_at);
