DROP INDEX channel_messages_publish_idx;
--bun:split
ALTER TABLE channel_messages DROP COLUMN publish_id;
