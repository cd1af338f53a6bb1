ALTER TABLE projects DROP COLUMN auth_secret_previous_until;
--bun:split
ALTER TABLE projects DROP COLUMN auth_secret_previous;
--bun:split
ALTER TABLE projects DROP COLUMN auth_secret;
--bun:split
ALTER TABLE projects DROP COLUMN "authorization";
