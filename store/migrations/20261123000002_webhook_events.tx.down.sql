ALTER TABLE project_settings DROP COLUMN webhook_presence_events;
--bun:split
ALTER TABLE project_settings DROP COLUMN webhook_channel_events;
