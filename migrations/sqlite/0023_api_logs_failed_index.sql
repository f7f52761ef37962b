-- Every request-log row paid for two status indexes, `(status, created_at_ms)` and
-- `((status / 100), created_at_ms)`, although a status filter is selective only for failures: a
-- `2xx` page is most of the log and walks `api_logs_created_at` with the status checked on its
-- rows. One partial index over the rows that failed (a status of 400 or more) serves a `4xx`/`5xx`
-- class or an exact failing status, walked newest first with the status checked on its rows; an
-- answered request, most rows, writes no status index at all.
DROP INDEX IF EXISTS api_logs_status;
DROP INDEX IF EXISTS api_logs_status_class;
CREATE INDEX IF NOT EXISTS api_logs_failed ON api_logs (created_at_ms) WHERE status >= 400;
