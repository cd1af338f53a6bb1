ALTER TABLE usage_daily DROP COLUMN history_bytes;
--bun:split
DROP TABLE history_usage;
--bun:split
ALTER TABLE channel_messages DROP COLUMN size;
