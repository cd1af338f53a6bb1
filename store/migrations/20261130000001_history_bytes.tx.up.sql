-- Channel history's size per project (issue 33): each stored message's
-- size in bytes (rows stored before this column count their length), the
-- bytes each project holds (kept by AppendHistory and SweepHistory, which
-- enforces HISTORY_MAX_BYTES_PER_PROJECT with it), and the usage rows'
-- largest figure of the day.
ALTER TABLE channel_messages ADD COLUMN size BIGINT NOT NULL DEFAULT 0;
--bun:split
UPDATE channel_messages SET size = {{.MessageOctets}};
--bun:split
CREATE TABLE history_usage (
    project_id {{.UUID}} PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    bytes      BIGINT NOT NULL DEFAULT 0
);
--bun:split
INSERT INTO history_usage (project_id, bytes) SELECT project_id, SUM(size) FROM channel_messages GROUP BY project_id;
--bun:split
ALTER TABLE usage_daily ADD COLUMN history_bytes BIGINT NOT NULL DEFAULT 0;
