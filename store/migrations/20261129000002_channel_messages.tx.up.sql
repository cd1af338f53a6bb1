-- Durable channel history (issue 33): the messages of the channels of a
-- project whose history is on (project_settings.history_retention_seconds),
-- each as the message object its subscribers got (JSON text). Reads go by
-- (project, channel, seq), forwards and backwards: the primary key. The
-- retention sweep deletes a project's oldest rows by created_at.
CREATE TABLE channel_messages (
    project_id {{.UUID}} NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    channel    TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    message    TEXT NOT NULL,
    created_at {{.TS}} NOT NULL,
    PRIMARY KEY (project_id, channel, seq)
);
--bun:split
CREATE INDEX channel_messages_age_idx ON channel_messages (project_id, created_at);
