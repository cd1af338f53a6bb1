-- At most one active key of each type per project, whatever the races.
CREATE UNIQUE INDEX api_keys_one_active ON api_keys (project_id, key_type) WHERE revoked_at IS NULL;
