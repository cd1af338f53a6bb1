-- Opt-in webhook events beyond connect and disconnect (README.md › Webhooks
-- and usage): channel_occupied/channel_vacated, and member_added/member_removed.
ALTER TABLE project_settings ADD COLUMN webhook_channel_events BOOLEAN NOT NULL DEFAULT FALSE;
--bun:split
ALTER TABLE project_settings ADD COLUMN webhook_presence_events BOOLEAN NOT NULL DEFAULT FALSE;
