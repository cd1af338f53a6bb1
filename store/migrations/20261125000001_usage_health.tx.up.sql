-- Delivery health in the daily usage rows (README.md › Delivery health).
ALTER TABLE usage_daily ADD COLUMN deliveries BIGINT NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE usage_daily ADD COLUMN dropped BIGINT NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE usage_daily ADD COLUMN slow_consumers_closed BIGINT NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE usage_daily ADD COLUMN channel_rate_limited BIGINT NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE usage_daily ADD COLUMN project_rate_limited BIGINT NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE usage_daily ADD COLUMN client_emit_rate_limited BIGINT NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE usage_daily ADD COLUMN latency_p99_ms DOUBLE PRECISION NOT NULL DEFAULT 0;
