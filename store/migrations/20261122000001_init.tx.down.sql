DROP TABLE meta;
--bun:split
DROP TABLE emit_token_revocations;
--bun:split
DROP TABLE usage_daily;
--bun:split
DROP TABLE project_settings;
--bun:split
DROP TABLE api_keys;
--bun:split
DROP TABLE projects;
--bun:split
DROP TABLE users;
