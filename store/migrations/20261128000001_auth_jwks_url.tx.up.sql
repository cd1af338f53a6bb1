-- Channel authorization with the project's own keys (proto/PROTOCOL.md ›
-- Channel authorization): the URL of the JWKS that RS256, ES256 and EdDSA
-- tokens are verified against ('' for none: HS256 with auth_secret only).
ALTER TABLE projects ADD COLUMN auth_jwks_url TEXT NOT NULL DEFAULT '';
