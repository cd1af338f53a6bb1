ALTER TABLE usage_daily DROP COLUMN latency_p99_ms;
--bun:split
ALTER TABLE usage_daily DROP COLUMN client_emit_rate_limited;
--bun:split
ALTER TABLE usage_daily DROP COLUMN project_rate_limited;
--bun:split
ALTER TABLE usage_daily DROP COLUMN channel_rate_limited;
--bun:split
ALTER TABLE usage_daily DROP COLUMN slow_consumers_closed;
--bun:split
ALTER TABLE usage_daily DROP COLUMN dropped;
--bun:split
ALTER TABLE usage_daily DROP COLUMN deliveries;
