-- Without expires_at a key in its overlap window would be active again: it
-- is revoked from its expiry instead (the older code refuses it at once).
UPDATE api_keys SET revoked_at = expires_at WHERE expires_at IS NOT NULL AND revoked_at IS NULL;
--bun:split
DROP INDEX api_keys_expiry_idx;
--bun:split
DROP INDEX api_keys_one_active;
--bun:split
CREATE UNIQUE INDEX api_keys_one_active ON api_keys (project_id, key_type) WHERE revoked_at IS NULL;
--bun:split
ALTER TABLE api_keys DROP COLUMN last_used_at;
--bun:split
ALTER TABLE api_keys DROP COLUMN expires_at;
