ALTER TABLE key_changes DROP COLUMN settings_stale;
--bun:split
ALTER TABLE key_changes DROP COLUMN keys_stale;
