ALTER TABLE project_settings DROP COLUMN history_retention_seconds;
