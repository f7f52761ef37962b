-- Budgets (issue 20): how much a consumer, or a consumer group together, may spend per period.
-- The spend itself is not stored here: it is the request log's `cost_usd`, summed since the
-- period's start when a process starts, then counted in memory (or in the fleet's Redis).
-- Timestamps are Unix milliseconds, like `api_logs.created_at_ms` the spend is measured against.
CREATE TABLE budgets (
    id            TEXT PRIMARY KEY,
    -- `consumer` (subject: a consumer id) or `group` (subject: a consumer group's name).
    scope         TEXT NOT NULL,
    subject       TEXT NOT NULL,
    -- `day`, `week`, `month` or `never`, in UTC.
    period        TEXT NOT NULL,
    -- `hard` (refused past the limit) or `soft` (warned).
    mode          TEXT NOT NULL DEFAULT 'hard',
    limit_usd     DOUBLE PRECISION NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
CREATE UNIQUE INDEX budgets_scope_subject ON budgets (scope, subject);
