-- What each request cost and how it was routed (issue 17): the cost in USD from the upstreams'
-- `pricing` (NULL when no attempt's upstream has one), the served attempt's prompt-cache reads and
-- writes, every attempt (JSON array: endpoint, status, tokens, cost, latency; also failed attempts,
-- fallbacks and hedges) and the strategy's decision (JSON: strategy, order, seed). Numbered after the
-- issue, like 0017. Older rows keep NULL in every new column.
ALTER TABLE api_logs ADD COLUMN cost_usd REAL;
ALTER TABLE api_logs ADD COLUMN cached_tokens INTEGER;
ALTER TABLE api_logs ADD COLUMN cache_write_tokens INTEGER;
ALTER TABLE api_logs ADD COLUMN attempt_log TEXT;
ALTER TABLE api_logs ADD COLUMN decision TEXT;
-- GET /admin/logs pages newest first (created_at_ms, then id) under one filter or several: one index
-- per filter column, ordered by time within each value, so a page is a short walk of one index
-- (endpoint_id and request_id have theirs since 0001 and 0017). The status class (`5xx`) is an
-- equality on `status / 100`, so it walks its own expression index instead of sorting a range.
CREATE INDEX IF NOT EXISTS api_logs_model ON api_logs (model, created_at_ms);
CREATE INDEX IF NOT EXISTS api_logs_consumer ON api_logs (consumer, created_at_ms);
CREATE INDEX IF NOT EXISTS api_logs_route ON api_logs (route, created_at_ms);
CREATE INDEX IF NOT EXISTS api_logs_status ON api_logs (status, created_at_ms);
CREATE INDEX IF NOT EXISTS api_logs_status_class ON api_logs ((status / 100), created_at_ms);
