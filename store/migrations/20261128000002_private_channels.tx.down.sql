ALTER TABLE projects DROP COLUMN private_channels;
