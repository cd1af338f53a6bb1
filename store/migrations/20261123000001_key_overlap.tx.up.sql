-- Keys rotated with an overlap stay valid until expires_at while the new key
-- is the active one; last_used_at is written by the nodes at most once a
-- minute per key (off the request path).
ALTER TABLE api_keys ADD COLUMN expires_at {{.TS}};
--bun:split
ALTER TABLE api_keys ADD COLUMN last_used_at {{.TS}};
--bun:split
DROP INDEX api_keys_one_active;
--bun:split
-- At most one active key of each type per project that does not expire;
-- keys in their overlap window (expires_at set) are not counted.
CREATE UNIQUE INDEX api_keys_one_active ON api_keys (project_id, key_type) WHERE revoked_at IS NULL AND expires_at IS NULL;
--bun:split
-- The keys still in (or past) their overlap window, soonest first: what each
-- node watches to close the sockets of a public key when it expires.
CREATE INDEX api_keys_expiry_idx ON api_keys (expires_at) WHERE expires_at IS NOT NULL AND revoked_at IS NULL;
