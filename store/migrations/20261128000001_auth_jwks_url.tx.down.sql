ALTER TABLE projects DROP COLUMN auth_jwks_url;
