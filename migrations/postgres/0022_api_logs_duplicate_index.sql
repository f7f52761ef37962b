-- `api_logs_model_created_at` (0004, for the RouteWise bootstrap) and `api_logs_model` (0018, for
-- the log's pages) index the same columns, (model, created_at_ms), and every request-log insert
-- paid for both. `api_logs_model` serves both readers.
DROP INDEX IF EXISTS api_logs_model_created_at;
