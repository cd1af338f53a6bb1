-- Durable channel history (issue 33), off by default: how long a project's
-- channel messages are kept in channel_messages, in seconds; 0 keeps none
-- (the replay ring alone, as SPEC.md says).
ALTER TABLE project_settings ADD COLUMN history_retention_seconds INTEGER NOT NULL DEFAULT 0;
