-- Channel authorization (proto/PROTOCOL.md › Channel authorization), an
-- extension off by default. auth_secret signs the connection and subscribe
-- tokens ('' until first made); after a rotation with an overlap the secret
-- it replaced stays valid until auth_secret_previous_until. "authorization"
-- is quoted: PostgreSQL reserves the word.
ALTER TABLE projects ADD COLUMN "authorization" BOOLEAN NOT NULL DEFAULT FALSE;
--bun:split
ALTER TABLE projects ADD COLUMN auth_secret TEXT NOT NULL DEFAULT '';
--bun:split
ALTER TABLE projects ADD COLUMN auth_secret_previous TEXT NOT NULL DEFAULT '';
--bun:split
ALTER TABLE projects ADD COLUMN auth_secret_previous_until {{.TS}};
