-- What a key change makes stale on the nodes that read it: their cached
-- keys (a key revoked or rotated, a project deleted, channel authorization
-- changed: the handshake reads it with the public key) and/or the project's
-- live settings (a settings change, channel authorization, a deletion).
-- Rows recorded before these columns (or by an older binary during an
-- upgrade) made both stale: so does the default.
ALTER TABLE key_changes ADD COLUMN keys_stale BOOLEAN NOT NULL DEFAULT TRUE;
--bun:split
ALTER TABLE key_changes ADD COLUMN settings_stale BOOLEAN NOT NULL DEFAULT TRUE;
